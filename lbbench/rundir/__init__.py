"""The run directory, on the ground floor: its format, and the one writer and reader of it.

A run directory holds

- ``run.toml``: the resolved ``RunConfig`` under ``[config]``, the seeds, the profile (the first instance's),
  the fleet under ``[fleet]`` (``Fleet.to_toml_dict``: its spec and one entry per profile), the git revision and
  library versions, ``complete`` (false while the run is going and after an interrupted one), ``wall_s``, and
  ``[[units]]`` (each unit written: its label, whether it completed, its rows per table);
- ``requests.parquet``: one row per request, every simulated and live run alike (``RECORD_SCHEMA`` and the
  run-level ``SETTING_COLUMNS``);
- ``timeline.parquet``: per-instance samples over time (``TIMELINE_SCHEMA``) — simulated, or scraped from live
  ``/metrics`` (older live runs wrote them to ``metrics.parquet``, which is still read);
- ``summary.parquet``: the summary (``lbbench.metrics.summary``) with the gain against the strongest baseline;
- ``decisions.parquet`` (``--decisions``): one row per routing decision of every unit (``DECISION_SCHEMA``,
  with the unit's columns);
- ``partial/<unit>/`` (live runs): ``requests.partial.jsonl``, each record appended as its request ends, so an
  interrupted run keeps everything it measured, and the same records in Parquet chunks
  (``records-NNNNN.parquet``), which ``requests.parquet`` is written from: the client never holds a live
  run's records in memory.

Modules: ``layout`` (file names, schemas, the frames in them), ``runtoml`` (``run.toml``), ``writer``
(``RunDir``: ``start`` → ``add`` per unit → ``finish``), ``records`` (``RecordLog``: a live unit's streamed
records), ``reader`` (one run's tables, and lazy scans over many). Nothing else in lbbench names a run file or
reads or writes one. This package sits below both ``lbbench.experiment`` (which writes runs through it) and
``lbbench.reports`` (which reads them); it imports only ``core``, ``errors``, ``profiles``, ``fleet`` and
``metrics``.
"""

from .layout import (CHUNK_GLOB, DECISION_SCHEMA, DECISIONS_FILE, HEADROOM_FILE, METRICS_FILE, PARTIAL_DIR,
                     PARTIAL_RECORDS, RECORD_SCHEMA, REQUESTS_FILE, RUN_TOML, SETTING_COLUMNS, SUMMARY_FILE,
                     TIMELINE_FILE, TIMELINE_SCHEMA, records_frame, timeline_frame)
from .reader import (RunDirError, RunInfo, Runs, group_keys, has_decisions, load_runs, read_decisions, read_requests,
                     read_summary, read_unit_tables, scan_requests, settings_of, varying_settings)
from .records import RecordLog
from .runtoml import clean, config_record, now_utc, profile_record, read_run_toml, write_run_doc, write_run_toml
from .writer import RunDir, summarize_requests, write_requests, write_tables

__all__ = [
    "CHUNK_GLOB", "DECISION_SCHEMA", "DECISIONS_FILE", "HEADROOM_FILE", "METRICS_FILE", "PARTIAL_DIR",
    "PARTIAL_RECORDS", "RECORD_SCHEMA", "REQUESTS_FILE", "RUN_TOML", "SETTING_COLUMNS", "SUMMARY_FILE", "TIMELINE_FILE",
    "TIMELINE_SCHEMA", "RecordLog", "RunDir", "RunDirError", "RunInfo", "Runs", "clean", "config_record", "group_keys",
    "has_decisions", "now_utc", "profile_record",
    "load_runs", "read_decisions", "read_requests", "read_run_toml", "read_summary", "read_unit_tables",
    "records_frame", "scan_requests", "settings_of", "summarize_requests", "timeline_frame", "varying_settings",
    "write_requests", "write_run_doc", "write_run_toml", "write_tables",
]
