"""Physical-bound flags on measured rows: values no GPU could have produced, or that contradict the row itself.

Each flag is one line naming the row, the column, the value, the bound and why. The bounds (physics-derived from
the model's config, ``lbbench.profiling.models``, and the GPU's datasheet figures, ``lbbench.profiling.gpus``):

- **Decode step** (``itl_mean_ms``, ``tpot_p50_ms``, ``tpot_p99_ms``): every decode step reads the weights it
  multiplies at least once, so a token after the first takes at least
  ``weight bytes read per step / (TP x memory bandwidth)`` (one token's experts for a mixture of experts). A
  request's time per output token is a sum of such steps, so its mean and every percentile obey the bound
  (speculative decoding, several tokens a step, would not; none of these sources uses it).
- **Prefill** (``ttft_*``): the first token needs the prompt's uncached tokens computed — at least the question of
  a shared-prefix workload (its system prompt may be cached), the whole mean prompt when prefix caching is off —
  at no more than the GPU's dense peak FLOP/s in the weights' dtype (2 FLOP a weight a token, attention left out),
  and no less than one read of the weights.
- **E2E** (``e2e_*``), with ``ignore_eos`` (every request generates ``output_tokens``): the prefill bound plus
  ``output_tokens - 1`` decode-step bounds.
- **Throughput** (``throughput_rps``): a stage cannot complete more than it was offered; completions above
  ``rate_rps`` by more than the noise of a stage (the larger of 2 % and 3 / sqrt(requests)) are flagged.
- **Output tokens** (``output_tok_s``): at most ``throughput_rps x output_tokens`` (``output_tokens`` is the cap);
  with ``ignore_eos``, also at least that (within 3 %) — less means the tokens were counted from the returned
  text, not generated (inference-perf's re-tokenized counts do this).

A check that cannot run (a model lbbench cannot read yet, an unknown GPU or dtype) is reported as not checked,
with the reason, never skipped silently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..profiling.gpus import UnknownGPUError, get_gpu
from .model_facts import ModelFacts
from .schema import MeasuredRow, format_cell

#: bytes a weight takes in memory
WEIGHT_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
#: the tensor-core dtype a weight dtype computes in (weight-only integer formats compute in fp16)
COMPUTE_DTYPE = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "fp8": "fp8", "int8": "fp16", "int4": "fp16"}
TOKEN_TOLERANCE = 0.03
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


@dataclass(frozen=True)
class Finding:
    """A flag (or a check not run): where, the column (None for a whole row) and what."""

    where: str
    column: str | None
    text: str

    def line(self) -> str:
        return f"{self.where}: {self.column} {self.text}" if self.column else f"{self.where}: {self.text}"


@dataclass
class CheckReport:
    flags: list[Finding] = field(default_factory=list)
    not_checked: list[Finding] = field(default_factory=list)


@dataclass(frozen=True)
class Bounds:
    """The row's physical lower bounds, seconds, with the figures behind them."""

    step_s: float
    step_why: str
    prefill_s: float
    prefill_why: str


def where_of(path: Any, n: int, row: MeasuredRow) -> str:
    return f"{path + ': ' if path else ''}row {n} (id={row.id}, stage={row.stage})"


def _is_moe_config(raw: dict | None) -> bool:
    if not raw:
        return False
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
    return any(raw.get(k) or text.get(k) for k in _MOE_KEYS)


def bounds(row: MeasuredRow, facts: ModelFacts) -> tuple[Bounds | None, str]:
    """The decode-step and prefill bounds of ``row``, or (None, why they cannot be computed)."""
    cfg, reason = facts.config(row.model)
    if cfg is None:
        return None, reason
    try:
        gpu = get_gpu(row.gpu)
    except UnknownGPUError as exc:
        return None, str(exc)
    dtype = row.weights_dtype or facts.weights_dtype(row.model)
    if dtype is None:
        return None, "weights_dtype unknown (empty, and not in the model's config)"
    is_moe = bool(getattr(cfg, "is_moe", False))
    if _is_moe_config(facts.raw(row.model)) and not is_moe:
        return None, f"{row.model} is a mixture of experts, which lbbench.profiling.models does not read yet"
    if is_moe:  # the experts one token runs, plus the output projection and final norm
        params = cfg.active_block_params + cfg.vocab_size * cfg.hidden_size + cfg.hidden_size
        what = "active weights (one token's experts)"
    else:
        params = cfg.params_read_per_step
        what = "weights"
    weight_bytes = params * WEIGHT_BYTES[dtype]
    bw = row.tp * gpu.memory_bw_bytes_s
    step_s = weight_bytes / bw
    step_why = (f"one read of the {weight_bytes / 1e9:.1f} GB of {dtype} {what} per decode step / ({row.tp} x "
                f"{gpu.memory_bw_bytes_s / 1e9:.0f} GB/s, {gpu.name})")
    compute = COMPUTE_DTYPE[dtype] if COMPUTE_DTYPE[dtype] in gpu.peak_flops else "fp16"
    peak = row.tp * gpu.peak(compute)
    if row.question_tokens:
        tokens, which = row.question_tokens, "question tokens (the shared system prompt may be cached)"
    elif row.prefix_caching is False and row.prompt_tokens_mean:
        tokens, which = row.prompt_tokens_mean, "mean prompt tokens (prefix caching off)"
    else:
        tokens, which = 1, "token (how much of the prompt was cached is unknown)"
    flops = tokens * cfg.prefill_flops_per_token(0.0)
    prefill_s = max(step_s, flops / peak)
    prefill_why = (f"{format_cell(tokens)} {which} x {cfg.prefill_flops_per_token(0.0) / 1e9:.1f} GFLOP at the "
                   f"{compute} peak of {row.tp} x {gpu.peak(compute) / 1e12:.0f} TFLOP/s, and no less than one "
                   f"read of the weights ({step_s * 1e3:.2f} ms)")
    return Bounds(step_s, step_why, prefill_s, prefill_why), ""


def _ms(x: float) -> str:
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def check_row(row: MeasuredRow, where: str, facts: ModelFacts, report: CheckReport) -> None:
    """Append ``row``'s flags and its checks not run to ``report``."""
    b, reason = bounds(row, facts)
    if b is None:
        report.not_checked.append(Finding(where, None, f"decode, prefill and E2E bounds not checked: {reason}"))
    else:
        for col in ("itl_mean_ms", "tpot_p50_ms", "tpot_p99_ms"):
            v = getattr(row, col)
            if v is not None and v < b.step_s * 1e3:
                report.flags.append(Finding(where, col, f"{format_cell(v)} is below {_ms(b.step_s * 1e3)} ms, "
                                                        f"{b.step_why}"))
        for col in ("ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms"):
            v = getattr(row, col)
            if v is not None and v < b.prefill_s * 1e3:
                report.flags.append(Finding(where, col, f"{format_cell(v)} is below {_ms(b.prefill_s * 1e3)} ms, "
                                                        f"one prefill: {b.prefill_why}"))
        if row.ignore_eos:
            e2e_s = b.prefill_s + (row.output_tokens - 1) * b.step_s
            for col in ("e2e_mean_ms", "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms"):
                v = getattr(row, col)
                if v is not None and v < e2e_s * 1e3:
                    report.flags.append(Finding(
                        where, col, f"{format_cell(v)} is below {_ms(e2e_s * 1e3)} ms: the prefill bound plus "
                                    f"{row.output_tokens - 1} decode steps of at least {_ms(b.step_s * 1e3)} ms "
                                    f"(ignore_eos: every request generates {row.output_tokens} tokens)"))
    _rates(row, where, report)


def _rates(row: MeasuredRow, where: str, report: CheckReport) -> None:
    thr = row.throughput_rps
    if thr is not None and row.rate_rps is not None:
        tol = max(0.02, 3 / math.sqrt(row.requests)) if row.requests else 0.05
        if thr > row.rate_rps * (1 + tol):
            report.flags.append(Finding(
                where, "throughput_rps", f"{format_cell(thr)} is above the offered rate_rps "
                                         f"{format_cell(row.rate_rps)} by {100 * (thr / row.rate_rps - 1):.1f} %, more "
                                         f"than a stage's noise ({100 * tol:.1f} %): a stage cannot complete more "
                                         "than it was sent"))
    tok = row.output_tok_s
    if tok is None or thr is None or thr <= 0:
        return
    cap = thr * row.output_tokens
    if tok > cap * (1 + TOKEN_TOLERANCE):
        report.flags.append(Finding(
            where, "output_tok_s", f"{format_cell(tok)} is above throughput_rps x output_tokens = {cap:.1f} by "
                                   f"{100 * (tok / cap - 1):.1f} %: more tokens than the completed requests may "
                                   "generate"))
    elif row.ignore_eos and tok < cap * (1 - TOKEN_TOLERANCE):
        report.flags.append(Finding(
            where, "output_tok_s", f"{format_cell(tok)} is {100 * (1 - tok / cap):.1f} % below throughput_rps x "
                                   f"output_tokens = {cap:.1f}, what ignore_eos makes the completed requests "
                                   "generate: the tokens were counted from the returned text, not generated"))


def check_rows(rows: Sequence[MeasuredRow], *, facts: ModelFacts | None = None, path: Any = "",
               numbers: Sequence[int] | None = None) -> CheckReport:
    """Every row's flags and checks not run (module docstring); ``numbers`` are the rows' data-row numbers in
    their file (``MeasuredTable.numbers``; default 1, 2, ...)."""
    facts = facts or ModelFacts()
    report = CheckReport()
    for n, row in zip(numbers or range(1, len(rows) + 1), rows):
        check_row(row, where_of(path, n, row), facts, report)
    return report
