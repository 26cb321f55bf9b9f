"""The measured-runs table: its columns, a typed row, and the rules every row obeys.

One row is one measured load stage of one experiment (a benchmark run against one engine setup), in the schema of
``../shared/gpu-measurements/SCHEMA.md``. Units are those of the schema, so a row reads like the CSV it came from:
latencies in milliseconds (``*_ms``), lengths in tokens (``*_tokens``), rates in requests per second (``*_rps``).
An empty cell is ``None``: unknown (for an engine limit, the engine's default for that version and GPU).

**Required columns** — what a simulation of the row cannot be built without, so a file lacking one is refused
whole, and a row with an empty one is refused (reported, never dropped silently):

- ``id`` and ``stage``: which experiment and which load stage; the pair identifies the row;
- ``model``, ``gpu``, ``tp``: the hardware and the weights, hence every step time;
- ``arrival``, ``rate_rps``: the offered load (``rate_rps`` may be empty for a ``burst``, all sent at once);
- ``output_tokens``: the decode length, which sets E2E and the batch a step runs.

Everything else may be empty: engine limits fall back to the engine's defaults, prompt lengths to what the
workload describes, and a metric that was not measured is simply not compared.

**Row rules** beyond each cell's type and range: percentiles do not decrease (p50 <= p90 <= p99), no TTFT figure
exceeds the matching E2E figure (per request TTFT <= E2E, so every mean and percentile obeys it too), the mean
prompt is at most the longest, and a row carries at least one measured metric. ``(id, stage)`` is unique in a file.

**Metric definitions** (what each source's importer maps to these, ``docs/measured.md``):
``ttft_*`` request sent to first token; ``e2e_*`` request sent to last token; ``itl_mean_ms`` the mean over
requests of the time per output token after the first, ``(E2E - TTFT) / (output tokens - 1)`` (equal to the mean
gap between tokens when every request has the same output length); ``tpot_p50_ms`` / ``tpot_p99_ms`` percentiles
of that per-request figure; ``throughput_rps`` completed requests per second; ``output_tok_s`` generated tokens
per second.

Unknown extra columns are kept (``MeasuredRow.extra``) and written back after the schema's, so a user's own notes
survive a round trip; a column whose name is close to a schema column (``ttft_mean`` for ``ttft_mean_ms``) is
refused as the typo it most likely is.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable, Mapping

from ..errors import InputError

ARRIVALS = ("poisson", "constant", "burst")
WEIGHTS_DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")
KV_DTYPES = ("auto", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2")
_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f"}


class MeasuredError(InputError):
    """A measured-runs file (or raw result) that cannot be read; the message names the file."""


class MeasuredRowError(MeasuredError):
    """One bad row: the message names the file, the row (1-based data row, its id and stage) and the column."""

    def __init__(self, path: Any, problem: str, *, row: int | None = None, id: Any = None, stage: Any = None,
                 column: str | None = None):
        self.path, self.row, self.id, self.stage, self.column, self.detail = path, row, id, stage, column, problem
        where = [f"row {row}"] if row is not None else []
        where.append(f"(id={'?' if id in (None, '') else id}, stage={'?' if stage in (None, '') else stage})")
        text = f"{path}: {' '.join(where)}"
        text += f", column {column}: {problem}" if column else f": {problem}"
        super().__init__(text)


@dataclass(frozen=True)
class Column:
    """One column: its Python type, whether a row needs it, its allowed values and its meaning."""

    name: str
    kind: type  # str, int, float or bool
    doc: str
    required: bool = False
    choices: tuple[str, ...] = ()
    low: float | None = None  # smallest allowed value (inclusive unless ``open_low``)
    open_low: bool = False
    high: float | None = None  # largest allowed value (inclusive)


def _c(name: str, kind: type, doc: str, **kw: Any) -> Column:
    return Column(name, kind, doc, **kw)


_LAT = "measured latency, ms"
#: The columns, in the schema's (and the written CSV's) order.
COLUMNS: tuple[Column, ...] = (
    _c("id", str, "experiment name", required=True),
    _c("stage", int, "load-stage index (0, 1, ...)", required=True, low=0),
    _c("source", str, "where the measurement comes from"),
    _c("model", str, "Hugging Face model id", required=True),
    _c("gpu", str, "GPU name (h100 = H100 SXM 80 GB, a100-80gb, l40s, h200, l4, ...)", required=True),
    _c("tp", int, "tensor-parallel degree", required=True, low=1),
    _c("replicas", int, "engine replicas behind the client", low=1),
    _c("weights_dtype", str, "weight dtype", choices=WEIGHTS_DTYPES),
    _c("kv_dtype", str, "KV-cache dtype (auto = the model dtype)", choices=KV_DTYPES),
    _c("engine", str, "serving engine (vllm, sglang, ...)"),
    _c("engine_version", str, "engine version"),
    _c("max_num_seqs", int, "engine limit as launched", low=1),
    _c("max_num_batched_tokens", int, "engine limit as launched", low=1),
    _c("max_model_len", int, "engine limit as launched", low=1),
    _c("gpu_memory_utilization", float, "engine limit as launched", low=0.0, open_low=True, high=1.0),
    _c("long_prefill_token_threshold", int, "engine limit as launched", low=0),
    _c("prefix_caching", bool, "prefix caching on/off"),
    _c("cpu_offload_gib", float, "CPU KV offload size, GiB per GPU", low=0.0),
    _c("gpu_kv_blocks", int, "KV blocks of 16 tokens the engine reported", low=1),
    _c("arrival", str, "arrival process of the stage", required=True, choices=ARRIVALS),
    _c("rate_rps", float, "the stage's offered rate, req/s", required=True, low=0.0, open_low=True),
    _c("duration_s", float, "the stage's length, s", low=0.0, open_low=True),
    _c("requests", int, "requests sent in the stage", low=1),
    _c("prompt_tokens_mean", float, "measured mean prompt length", low=0.0, open_low=True),
    _c("prompt_tokens_max", int, "measured longest prompt", low=1),
    _c("prefix_groups", int, "shared-prefix groups (one system prompt each)", low=1),
    _c("prompts_per_group", int, "users per shared-prefix group", low=1),
    _c("system_prompt_tokens", int, "shared system prompt length", low=0),
    _c("question_tokens", int, "per-request question length", low=0),
    _c("multi_turn", bool, "multi-turn chat (each user's history resent)"),
    _c("output_tokens", int, "output length asked for", required=True, low=1),
    _c("ignore_eos", bool, "generation ran to output_tokens"),
    *(_c(f"ttft_{s}_ms", float, _LAT, low=0.0, open_low=True) for s in ("mean", "p50", "p90", "p99")),
    _c("itl_mean_ms", float, "mean over requests of (E2E - TTFT) / (output tokens - 1), ms", low=0.0,
       open_low=True),
    _c("tpot_p50_ms", float, "median of the per-request time per output token after the first, ms", low=0.0,
       open_low=True),
    _c("tpot_p99_ms", float, "99th percentile of the per-request time per output token after the first, ms",
       low=0.0, open_low=True),
    *(_c(f"e2e_{s}_ms", float, _LAT, low=0.0, open_low=True) for s in ("mean", "p50", "p90", "p99")),
    _c("throughput_rps", float, "measured completed requests per second", low=0.0),
    _c("output_tok_s", float, "measured output tokens per second", low=0.0),
)
COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)
BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}
REQUIRED: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.required)
#: the measured metrics; a row needs at least one
METRIC_COLUMNS: tuple[str, ...] = COLUMN_NAMES[COLUMN_NAMES.index("ttft_mean_ms"):]
#: (lower, higher) pairs that must not decrease
ORDERED: tuple[tuple[str, str], ...] = (
    ("ttft_p50_ms", "ttft_p90_ms"), ("ttft_p90_ms", "ttft_p99_ms"), ("ttft_p50_ms", "ttft_p99_ms"),
    ("e2e_p50_ms", "e2e_p90_ms"), ("e2e_p90_ms", "e2e_p99_ms"), ("e2e_p50_ms", "e2e_p99_ms"),
    ("tpot_p50_ms", "tpot_p99_ms"),
    *((f"ttft_{s}_ms", f"e2e_{s}_ms") for s in ("mean", "p50", "p90", "p99")),
)


@dataclass(frozen=True)
class MeasuredRow:
    """One measured load stage; a field per column (``None`` = empty cell), unknown columns in ``extra``."""

    id: str
    stage: int
    model: str
    gpu: str
    tp: int
    arrival: str
    rate_rps: float | None
    output_tokens: int
    source: str | None = None
    replicas: int | None = None
    weights_dtype: str | None = None
    kv_dtype: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    long_prefill_token_threshold: int | None = None
    prefix_caching: bool | None = None
    cpu_offload_gib: float | None = None
    gpu_kv_blocks: int | None = None
    duration_s: float | None = None
    requests: int | None = None
    prompt_tokens_mean: float | None = None
    prompt_tokens_max: int | None = None
    prefix_groups: int | None = None
    prompts_per_group: int | None = None
    system_prompt_tokens: int | None = None
    question_tokens: int | None = None
    multi_turn: bool | None = None
    ignore_eos: bool | None = None
    ttft_mean_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_mean_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    e2e_mean_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p90_ms: float | None = None
    e2e_p99_ms: float | None = None
    throughput_rps: float | None = None
    output_tok_s: float | None = None
    #: unknown columns of the file, (name, cell text) in file order
    extra: tuple[tuple[str, str], ...] = field(default=())

    @property
    def key(self) -> tuple[str, int]:
        return (self.id, self.stage)

    def values(self) -> dict[str, Any]:
        """Column name -> value, in the schema's order (``extra`` left out)."""
        return {name: getattr(self, name) for name in COLUMN_NAMES}


assert {f.name for f in fields(MeasuredRow)} == set(COLUMN_NAMES) | {"extra"}


# ---------------------------------------------------------------------------------------------- cells
class CellError(ValueError):
    """A cell's problem, in words that follow the column name (``"'two' is not an integer"``)."""


def parse_cell(column: str, text: str) -> Any:
    """The typed value of one cell of ``column`` (``None`` for an empty cell); ``CellError`` when malformed."""
    col = BY_NAME[column]
    s = text.strip()
    if s == "":
        return None
    if col.kind is str:
        return s
    if col.kind is bool:
        low = s.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise CellError(f"{s!r} is not true or false")
    try:
        x = float(s)
    except ValueError:
        raise CellError(f"{s!r} is not {'an integer' if col.kind is int else 'a number'}") from None
    if not math.isfinite(x):
        raise CellError(f"{s!r} is not a finite number")
    if col.kind is int:
        if x != int(x):
            raise CellError(f"{s!r} is not an integer")
        return int(x)
    return x


def check_value(column: str, value: Any) -> Any:
    """``value`` for ``column`` after the range and choice checks (an int given for a float column becomes a float,
    an integral float for an int column an int); ``CellError`` when it breaks one."""
    col = BY_NAME[column]
    if value is None:
        return None
    if col.kind is bool:
        if not isinstance(value, bool):
            raise CellError(f"{value!r} is not true or false")
        return value
    if col.kind is str:
        if not isinstance(value, str) or not value.strip():
            raise CellError(f"{value!r} is not a non-empty text")
        value = value.strip()
        if col.choices and value not in col.choices:
            what = "arrival kind" if column == "arrival" else column
            raise CellError(f"unknown {what} {value!r} (known: {', '.join(col.choices)})")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CellError(f"{value!r} is not {'an integer' if col.kind is int else 'a number'}")
    if not math.isfinite(value):
        raise CellError(f"{value!r} is not a finite number")
    if col.kind is int:
        if value != int(value):
            raise CellError(f"{value!r} is not an integer")
        value = int(value)
    else:
        value = float(value)
    if col.low is not None and (value <= col.low if col.open_low else value < col.low):
        raise CellError(f"{format_cell(value)} must be {'>' if col.open_low else '>='} {format_cell(col.low)}")
    if col.high is not None and value > col.high:
        raise CellError(f"{format_cell(value)} must be <= {format_cell(col.high)}")
    return value


def format_cell(value: Any) -> str:
    """The CSV text of a value: empty for ``None``, ``true``/``false``, the shortest exact text of a number."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


# ---------------------------------------------------------------------------------------------- rows
ErrorFactory = Callable[..., MeasuredRowError]


def build_row(values: Mapping[str, Any], extra: Iterable[tuple[str, str]] = (), *,
              error: ErrorFactory) -> MeasuredRow:
    """A ``MeasuredRow`` from typed ``values`` (column -> value, missing = empty) after every cell and row rule.

    ``error(problem, column=...)`` makes the exception raised for the first rule broken, so that the caller's
    message names its file and row."""
    clean: dict[str, Any] = {}
    for col in COLUMNS:
        try:
            clean[col.name] = check_value(col.name, values.get(col.name))
        except CellError as exc:
            raise error(str(exc), column=col.name) from None
    for name in REQUIRED:
        if clean[name] is None and not (name == "rate_rps" and clean["arrival"] == "burst"):
            raise error("empty, but required" + (" (a poisson or constant stage has a rate)"
                                                  if name == "rate_rps" else ""), column=name)
    for low, high in ORDERED:
        a, b = clean[low], clean[high]
        if a is not None and b is not None and b < a:
            raise error(f"{format_cell(b)} is below {low} {format_cell(a)}: "
                        + ("a TTFT cannot exceed the E2E it is part of" if low.startswith("ttft")
                           and high.startswith("e2e") else "percentiles must not decrease"), column=high)
    pm, px = clean["prompt_tokens_mean"], clean["prompt_tokens_max"]
    if pm is not None and px is not None and pm > px:
        raise error(f"{format_cell(px)} is below prompt_tokens_mean {format_cell(pm)}", column="prompt_tokens_max")
    if all(clean[m] is None for m in METRIC_COLUMNS):
        raise error("no measured metric (every column from ttft_mean_ms to output_tok_s is empty)")
    return MeasuredRow(**clean, extra=tuple(extra))


_UNIT_SUFFIXES = ("", "ms", "s", "rps", "tokens", "gib")


def _squash(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _one_edit_apart(a: str, b: str) -> bool:
    """True when ``b`` is ``a`` with one character changed, added or removed."""
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) == 1
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    return any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


def close_column(name: str) -> str | None:
    """The schema column an unknown header name most likely misspells — the same name in other case or
    punctuation, without its unit suffix (``ttft_mean`` for ``ttft_mean_ms``), or one character off — else None
    (a column of its own, such as ``notes`` or ``prompt_tokens_min``)."""
    sq = _squash(name)
    for col in COLUMN_NAMES:
        target = _squash(col)
        if any(sq + suffix == target for suffix in _UNIT_SUFFIXES) or _one_edit_apart(name.strip().lower(), col):
            return col
    return None
