"""Measured runs as data: the measured-runs schema, its one reader and writer, importers, physical-bound checks.

Every source of measured serving results — MLPerf loadgen logs, inference-perf experiment folders, inference-sim's
tables, ``vllm bench serve`` JSON, GuideLLM and AIPerf exports, lbbench's own live runs — goes through an importer
(``lbbench.measured.importers``) into rows of one schema (``lbbench.measured.schema``, the columns of
``../shared/gpu-measurements/SCHEMA.md``). ``read_measured`` is the one reader of such files;
``lbbench.measured.checks`` flags values that break a physical bound. ``docs/measured.md`` has each source's
metric definitions.
"""

from .schema import (COLUMN_NAMES, COLUMNS, REQUIRED, MeasuredError, MeasuredRow, MeasuredRowError)
from .table import MeasuredTable, read_measured, write_measured

__all__ = ["COLUMNS", "COLUMN_NAMES", "REQUIRED", "MeasuredError", "MeasuredRow", "MeasuredRowError",
           "MeasuredTable", "read_measured", "write_measured"]
