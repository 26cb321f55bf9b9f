"""A live replay's records, streamed to disk as their requests end: the client's memory stays flat.

A replay of 30 minutes at 80 req/s ends 144,000 requests; held as ``RequestRecord`` objects they grew the
client by about 2.4 MB a minute. ``RecordLog`` keeps none of them. Each record, as its request ends,

- is appended to ``requests.partial.jsonl`` (one JSON line, flushed at once: a client killed outright keeps
  every record it had);
- joins a buffer of at most ``chunk_rows`` rows, kept column by column, which is then written as the next
  Parquet chunk ``records-NNNNN.parquet`` — the ``requests.parquet`` columns and types, built as
  ``lbbench.rundir.layout.records_frame`` builds them, so the values are the very ones an in-memory frame
  of the records would hold.

``frame()`` writes what is buffered and scans the chunks lazily, in the order the requests ended (the order of
``requests.parquet``); ``records()`` reads them back as ``RequestRecord`` objects (tests and bench scripts).
A log given no folder writes to a temporary one, removed with the log.

The first Parquet write of a process sets polars up (its threads and buffers: about 15 MB of RSS, kept). A log
pays it when it is made, before the run's clock starts, with a one-row write to memory: not at its first chunk,
in the middle of the run, where it would stall the event loop and read as growth.
"""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path

import polars as pl

from ..core import RECORD_FIELDS, RequestRecord
from .layout import CHUNK_GLOB, CHUNK_NAME, PARTIAL_RECORDS, RECORD_SCHEMA

#: rows a chunk holds: at 80 req/s a chunk every 13 s, a few ms to build and write, about 0.5 MB buffered
CHUNK_ROWS = 1024


class RecordLog:
    """Records appended as requests end, written out in Parquet chunks (``frame()`` reads them lazily).

    ``load_workers``: the records carry ``load_worker`` (Int64), the worker that sent each request."""

    def __init__(self, out_dir: Path | None, load_workers: bool = False, chunk_rows: int | None = None):
        self._tmp = None
        if out_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="lbbench-records-")
            out_dir = Path(self._tmp.name)
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        for old in self.dir.glob(CHUNK_GLOB):  # a replay starting again in the same folder
            old.unlink()
        self.chunk_rows = chunk_rows or CHUNK_ROWS
        self.schema = {**RECORD_SCHEMA, **({"load_worker": pl.Int64} if load_workers else {})}
        self._columns: list[list] = [[] for _ in self.schema]
        pl.DataFrame({k: [None] for k in self.schema}, schema=self.schema).write_parquet(io.BytesIO())  # set-up
        self._chunks: list[Path] = []
        self.num_records = 0
        self._jsonl = open(self.dir / PARTIAL_RECORDS, "w", encoding="utf-8")  # noqa: SIM115 - open for the run

    def add(self, rec: RequestRecord, load_worker: int | None = None, **partial_only: object) -> None:
        """One request's record (``load_worker``: the worker that sent it); ``partial_only`` columns go to the
        JSON line only."""
        values = [getattr(rec, name) for name in RECORD_FIELDS]
        row = dict(zip(RECORD_FIELDS, values))
        if len(self.schema) > len(RECORD_FIELDS):
            values.append(load_worker)
            row["load_worker"] = load_worker
        row.update(partial_only)
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        for column, value in zip(self._columns, values):
            column.append(value)
        self.num_records += 1
        if len(self._columns[0]) >= self.chunk_rows:
            self.flush()

    def flush(self) -> None:
        """Write the buffered records as the next chunk."""
        if not self._columns[0]:
            return
        df = pl.DataFrame(dict(zip(self.schema, self._columns)), schema=self.schema)
        self._columns = [[] for _ in self.schema]
        path = self.dir / CHUNK_NAME.format(len(self._chunks))
        df.write_parquet(path)
        self._chunks.append(path)

    def frame(self) -> pl.LazyFrame:
        """Every record so far, in the order they were added (buffered ones written first)."""
        self.flush()
        if not self._chunks:
            return pl.DataFrame(schema=self.schema).lazy()
        return pl.scan_parquet(self._chunks)

    def records(self) -> list[RequestRecord]:
        """Every record so far as ``RequestRecord`` objects (this reads them all into memory)."""
        df = self.frame().select(RECORD_FIELDS).collect()
        return [RequestRecord(*row) for row in df.iter_rows()]

    def close(self) -> None:
        """Write what is buffered and close the JSON lines (the chunks stay readable)."""
        self.flush()
        if not self._jsonl.closed:
            self._jsonl.close()
