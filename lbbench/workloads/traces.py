"""Read LLM inference traces into one canonical frame, and turn it into requests.

The canonical frame (Polars) has one row per request, sorted by arrival:

- ``arrival_s`` (Float64, seconds, the first row at 0),
- ``prompt_tokens``, ``output_tokens`` (Int64, >= 0),
- ``task`` (String, may be null), ``prefix_hashes`` (List[Int64], may be null),
- ``failed`` (Boolean): the request cannot be replayed — BurstGPT's zero-response
  failures, and any row with a zero prompt or zero output.

``read_trace`` detects the format from the header (``trace_formats``), reads
with Polars, validates every row — a missing, non-numeric, negative or
fractional token count or arrival is an error ``FILE: row N: ...`` (N counts
data records from 1), or with ``skip_bad_rows`` the row is dropped and
counted — and sorts by arrival (stable). The frame's type lives in ``trace_frame``, below this module as
``trace_transform`` is (neither imports this one); ``trace_transform`` and ``trace_stats`` work on the
result; ``trace_to_requests`` and
``load_trace_requests`` give what ``lbbench run --trace`` replays.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import polars as pl

from ..core import Request
from .errors import TraceError
from .trace_formats import (TIME_UNITS, TraceMapping, first_record_columns, parse_mapping, resolve_mapping,
                            sniff_kind)
from .trace_frame import CANONICAL_SCHEMA, TraceFrame, empty_frame
from .trace_transform import transform_trace

_BLOCK_META_KEY = "lbbench.prefix_block_tokens"


# --------------------------------------------------------------------------- reading


def read_trace(path: str | Path, fmt: str | None = None, mapping: TraceMapping | str | None = None,
               skip_bad_rows: bool = False) -> TraceFrame:
    """Read ``path`` (format detected unless ``fmt``) into a ``TraceFrame``."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{p}: no such file")
    if isinstance(mapping, str):
        mapping = parse_mapping(mapping)
    kind = sniff_kind(p)
    block_tokens = None
    if kind == "parquet":
        try:
            columns = list(pl.read_parquet_schema(p))
            block_tokens = _parquet_block_tokens(p)
        except Exception as exc:  # polars raises several types for corrupt files
            raise TraceError(f"{p}: not a readable Parquet file ({_first_line(exc)})") from None
    elif p.stat().st_size == 0:
        raise TraceError(f"{p}: the file is empty")
    else:
        columns = first_record_columns(p, kind)
    name, full = resolve_mapping(p, columns, fmt, mapping)
    used = [c for c in (full.arrival, full.prompt, full.output, full.task, full.hashes, full.failed) if c]
    raw, skipped = _read_raw(p, kind, used, full, skip_bad_rows)
    frame, bad = _canonical(raw, full, p, skip_bad_rows)
    return TraceFrame(frame, str(p), name, skipped + bad,
                      full.block_tokens if full.block_tokens is not None else block_tokens)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _parquet_block_tokens(p: Path) -> int | None:
    try:
        meta = pl.read_parquet_metadata(p)
    except Exception:
        return None
    value = meta.get(_BLOCK_META_KEY)
    return int(value) if value and value.isdigit() else None


def _read_raw(p: Path, kind: str, used: list[str], m: TraceMapping,
              skip_bad_rows: bool) -> tuple[pl.DataFrame, int]:
    """The used columns, with a 1-based ``_row`` column; scalar CSV columns as strings."""
    try:
        if kind == "parquet":
            raw = pl.read_parquet(p, columns=used)
        elif kind == "csv":
            hashes = {m.hashes} if m.hashes else set()
            raw = pl.read_csv(p, infer_schema=False, encoding="utf8-lossy", truncate_ragged_lines=True)
            raw = raw.rename({c: c.strip() for c in raw.columns}).select(used)
            raw = raw.with_columns(pl.col(c).str.strip_chars() for c in used if c not in hashes)
        else:
            return _read_jsonl(p, used, m, skip_bad_rows)
    except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
        raise TraceError(f"{p}: cannot read as {kind.upper()} ({_first_line(exc)})") from None
    return raw.with_row_index("_row", offset=1), 0


def _read_jsonl(p: Path, used: list[str], m: TraceMapping, skip_bad_rows: bool) -> tuple[pl.DataFrame, int]:
    try:
        raw = pl.read_ndjson(p, infer_schema_length=None).select(used)
        return raw.with_row_index("_row", offset=1), 0
    except (pl.exceptions.PolarsError, ValueError):
        pass  # a bad line or mixed types: fall back to reading line by line to say where
    cols: dict[str, list[Any]] = {c: [] for c in used}
    rows: list[int] = []
    skipped = 0
    row = 0
    with open(p, "r", encoding="utf-8-sig", errors="replace") as fh:
        for line in fh:
            if not line.strip():
                continue
            row += 1
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    raise ValueError
            except ValueError:
                if skip_bad_rows:
                    skipped += 1
                    continue
                raise TraceError(f"{p}: row {row}: not a JSON object") from None
            rows.append(row)
            for c in used:
                v = obj.get(c)
                if c == m.hashes:
                    cols[c].append(v if isinstance(v, list) else None)
                else:
                    cols[c].append(None if v is None else (json.dumps(v) if isinstance(v, (list, dict))
                                                           else str(v)))
    schema = {c: (pl.List(pl.Int64) if c == m.hashes else pl.String) for c in used}
    try:
        raw = pl.DataFrame(cols, schema=schema, strict=False)
    except (pl.exceptions.PolarsError, TypeError, ValueError) as exc:
        raise TraceError(f"{p}: cannot read as JSONL ({_first_line(exc)})") from None
    return raw.with_columns(pl.Series("_row", rows, dtype=pl.UInt32)).select("_row", *used), skipped


# --------------------------------------------------------------------------- validation

_OK, _MISSING, _NOT_NUMBER, _NEGATIVE, _FRACTION, _NOT_TIME = 0, 1, 2, 3, 4, 5
_WHAT = {_MISSING: "is missing", _NOT_NUMBER: "is not a number", _NEGATIVE: "is negative",
         _FRACTION: "is not a whole number", _NOT_TIME: "is not a date-time"}


def _numeric(col: str, dtype: pl.DataType) -> tuple[pl.Expr, pl.Expr]:
    """(value as Float64, problem code) for a numeric field."""
    src = pl.col(col)
    if dtype == pl.String:
        val = src.cast(pl.Float64, strict=False)
        missing = src.is_null()
    elif dtype.is_numeric() or dtype == pl.Boolean:
        val = src.cast(pl.Float64)
        missing = src.is_null()
    else:
        val = pl.lit(None, dtype=pl.Float64).alias(col)
        missing = src.is_null()
    code = (pl.when(missing).then(_MISSING)
            .when(val.is_null() | val.is_nan() | val.is_infinite()).then(_NOT_NUMBER)
            .when(val < 0).then(_NEGATIVE)
            .otherwise(_OK))
    return val, code


_TZ_SUFFIX = r"(?:Z|[+-]\d\d:?\d\d| UTC)$"


def _datetime_ns(col: str, dtype: pl.DataType, sample: str | None) -> tuple[pl.Expr, pl.Expr]:
    """(nanoseconds since the epoch as Int64, problem code) for a date-time field.

    Strings are ``YYYY-MM-DD HH:MM:SS[.fraction]`` (any number of fractional
    digits up to 9); an ISO ``T`` separator and a UTC offset suffix are accepted
    when the first value has them (checked once, to keep large files fast).
    """
    src = pl.col(col)
    if isinstance(dtype, pl.Datetime):
        ns = src.dt.cast_time_unit("ns").dt.replace_time_zone(None).cast(pl.Int64)
    elif dtype == pl.String:
        text = src
        if sample is not None and re.search(_TZ_SUFFIX, sample):
            text = text.str.replace(_TZ_SUFFIX, "")
        if sample is not None and "T" in sample:
            text = text.str.replace("T", " ", literal=True)
        ns = text.str.to_datetime("%Y-%m-%d %H:%M:%S%.f", time_unit="ns", strict=False, cache=False
                                  ).cast(pl.Int64)
    else:
        ns = pl.lit(None, dtype=pl.Int64)
    code = pl.when(src.is_null()).then(_MISSING).when(ns.is_null()).then(_NOT_TIME).otherwise(_OK)
    return ns, code


def _arrival_unit(raw: pl.DataFrame, m: TraceMapping) -> str:
    if m.unit is not None:
        return m.unit
    dtype = raw.schema[m.arrival]
    if isinstance(dtype, pl.Datetime):
        return "datetime"
    if dtype == pl.String:
        first = raw.get_column(m.arrival).drop_nulls().head(1)
        if first.len() and first.cast(pl.Float64, strict=False).is_null().all():
            return "datetime"
    return "s"


def _canonical(raw: pl.DataFrame, m: TraceMapping, p: Path, skip_bad_rows: bool) -> tuple[pl.DataFrame, int]:
    schema = raw.schema
    unit = _arrival_unit(raw, m)
    if unit == "datetime":
        first = raw.get_column(m.arrival).drop_nulls().head(1).to_list()
        sample = first[0] if first and isinstance(first[0], str) else None
        t_val, t_code = _datetime_ns(m.arrival, schema[m.arrival], sample)
    else:
        t_val, t_code = _numeric(m.arrival, schema[m.arrival])
        t_val = t_val * TIME_UNITS[unit]
    p_val, p_code = _numeric(m.prompt, schema[m.prompt])
    o_val, o_code = _numeric(m.output, schema[m.output])
    p_code = pl.when(p_code == _OK).then(pl.when(p_val != p_val.floor()).then(_FRACTION).otherwise(_OK)
                                         ).otherwise(p_code)
    o_code = pl.when(o_code == _OK).then(pl.when(o_val != o_val.floor()).then(_FRACTION).otherwise(_OK)
                                         ).otherwise(o_code)
    exprs = [pl.col("_row"), t_val.alias("_t"), t_code.alias("_tc"), p_val.alias("_p"), p_code.alias("_pc"),
             o_val.alias("_o"), o_code.alias("_oc")]
    exprs.append(pl.col(m.task).cast(pl.String).alias("task") if m.task else pl.lit(None, pl.String).alias("task"))
    exprs.append(_hashes_expr(m.hashes, schema))
    exprs.append(_failed_expr(m.failed, schema))
    df = raw.select(exprs)
    bad = (pl.col("_tc") != _OK) | (pl.col("_pc") != _OK) | (pl.col("_oc") != _OK)
    n_bad = df.select(bad.sum()).item()
    if n_bad:
        if not skip_bad_rows:
            first = df.filter(bad).row(0, named=True)
            raise TraceError(_bad_row_message(p, first, raw, m))
        df = df.filter(~bad)
    time_col = pl.col("_t")
    if unit == "datetime":
        arrival = (time_col - time_col.min()).cast(pl.Float64) / 1e9
    else:
        arrival = time_col - time_col.min()
    out = df.select(
        arrival.alias("arrival_s"),
        pl.col("_p").cast(pl.Int64).alias("prompt_tokens"),
        pl.col("_o").cast(pl.Int64).alias("output_tokens"),
        pl.col("task"),
        pl.col("prefix_hashes"),
        (pl.col("failed").fill_null(False) | (pl.col("_p") == 0) | (pl.col("_o") == 0)).alias("failed"),
    ).sort("arrival_s", maintain_order=True)
    return out.cast(CANONICAL_SCHEMA), int(n_bad)


def _hashes_expr(col: str | None, schema: pl.Schema) -> pl.Expr:
    if col is None:
        return pl.lit(None, dtype=pl.List(pl.Int64)).alias("prefix_hashes")
    dtype = schema[col]
    if isinstance(dtype, (pl.List, pl.Array)):
        e = pl.col(col).cast(pl.List(pl.Int64), strict=False)
    elif dtype == pl.String:
        e = pl.col(col).str.extract_all(r"-?\d+").cast(pl.List(pl.Int64), strict=False)
    else:
        e = pl.lit(None, dtype=pl.List(pl.Int64))
    return e.alias("prefix_hashes")


def _failed_expr(col: str | None, schema: pl.Schema) -> pl.Expr:
    if col is None:
        return pl.lit(False).alias("failed")
    dtype = schema[col]
    if dtype == pl.Boolean:
        e = pl.col(col)
    elif dtype == pl.String:
        e = pl.col(col).str.to_lowercase().is_in(["true", "1", "yes", "t", "y"])
    else:
        e = pl.col(col).cast(pl.Float64, strict=False).fill_null(0) != 0
    return e.alias("failed")


def _bad_row_message(p: Path, row: dict[str, Any], raw: pl.DataFrame, m: TraceMapping) -> str:
    raw_row = raw.filter(pl.col("_row") == row["_row"]).row(0, named=True)
    for code_key, col in (("_tc", m.arrival), ("_pc", m.prompt), ("_oc", m.output)):
        code = row[code_key]
        if code != _OK:
            value = raw_row[col]
            shown = "" if code == _MISSING else f" ({value!r})"
            return f"{p}: row {row['_row']}: {col} {_WHAT[code]}{shown}"
    return f"{p}: row {row['_row']}: malformed"


# --------------------------------------------------------------------------- output


def write_canonical(frame: TraceFrame | pl.DataFrame, out_path: str | Path) -> Path:
    """Write the canonical columns to Parquet (what ``read_trace`` reads back unchanged)."""
    tf = frame if isinstance(frame, TraceFrame) else None
    df = tf.frame if tf is not None else frame
    out = Path(out_path)
    meta = {_BLOCK_META_KEY: str(tf.block_tokens)} if tf is not None and tf.block_tokens else None
    try:
        df.select(list(CANONICAL_SCHEMA)).cast(CANONICAL_SCHEMA).write_parquet(out, metadata=meta)
    except OSError as exc:
        raise TraceError(f"{out}: cannot write ({exc.strerror or exc})") from None
    return out


def trace_to_requests(frame: TraceFrame | pl.DataFrame) -> list[Request]:
    """Requests in arrival order with ids ``0..n-1``; failed rows are left out."""
    df = frame.frame if isinstance(frame, TraceFrame) else frame
    block = frame.block_tokens if isinstance(frame, TraceFrame) else None  # tokens per prefix hash
    df = df.filter(~pl.col("failed")).sort("arrival_s", maintain_order=True)
    cols = [df.get_column(c).to_list() for c in ("arrival_s", "prompt_tokens", "output_tokens", "task",
                                                  "prefix_hashes")]
    return [Request(request_id=i, arrival_s=float(t), prompt_tokens=int(pr), output_tokens=int(o), task=task,
                    prefix_hashes=tuple(h) if h is not None else None,
                    prefix_block_tokens=block if h is not None else None)
            for i, (t, pr, o, task, h) in enumerate(zip(*cols))]


def load_trace_requests(path: str | Path, fmt: str | None = None, mapping: TraceMapping | str | None = None,
                        skip_bad_rows: bool = False, **transforms: Any) -> list[Request]:
    """``read_trace`` + ``transform_trace(**transforms)`` + ``trace_to_requests``.

    Raises ``TraceError`` when nothing is left to replay.
    """
    tf = transform_trace(read_trace(path, fmt=fmt, mapping=mapping, skip_bad_rows=skip_bad_rows), **transforms)
    requests = trace_to_requests(tf)
    if not requests:
        raise TraceError(f"{path}: no requests left to replay after reading and transforming the trace")
    return requests
