"""Calibration that transfers: a few physical efficiency factors fitted to measured runs, checked on the rest.

``lbbench profile fit --measured FILE`` fits, for all the rows given (one GPU family, or all GPUs together), the
factors of :class:`~lbbench.roofline.RooflineEfficiency` that the serving measurements identify, plus the front
end's latency:

- ``weight_bw_util`` (the level of every decode step), ``kv_bw_util`` (how a step grows with the context read),
- ``step_overhead_s`` and ``layer_overhead_s`` (fixed costs per step and per layer: the scheduler, sampler and
  launches; norms and activations),
- ``allreduce_latency_s`` (what tensor parallelism adds per layer),
- ``api_overhead_s`` (the server's front end: intake, tokenization, streaming; a constant on every TTFT and E2E).

The factors a serving measurement cannot separate from these (``prefill_mfu``, ``sharpness``, ``attn_mfu``: GEMM
and attention kernel efficiency) stay as measured on kernels (``lbbench/profiling/data``). Never per row: one set
for all the rows fitted.

The loss is the mean over stages of ``|log(predicted / measured)|`` of mean E2E, mean TTFT and mean ITL (each
metric a third): scale-free, so a 100 ms TTFT counts as much as a 100 s E2E, and bounded growth. Stages the
measurement cut short (overloaded: it completed fewer than 90 % of the requests it scheduled) are left out of the
loss, as the training set of inference-sim's own fit leaves them out: what they measured depends on when the tool
stopped, not only on the engine. They are still simulated and reported. Rows whose prompt lengths the source does not
publish (MLPerf's, simulated under a stated assumption) are left out of the fit too: a calibration must not
absorb an assumption about the workload; they are checks. The search is coordinate descent: for each factor in turn a golden-section
search on a log scale inside its bounds, the others held, for a few rounds. A calibration run can simulate only the
first ``max_stage_s`` seconds of each stage (the result is then checked on full runs).

:func:`cross_validate` refits with each model (or GPU, or TP) held out and predicts the held-out rows: the error
on rows the factors never saw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import polars as pl

from ..roofline import RooflineEfficiency
from .setup import value, workload_assumed
from .simulate import simulate_rows, stage_was_cut

#: what is fitted, with the bounds of the search (the efficiency factors' physical range, overheads in seconds)
FIT_BOUNDS: dict[str, tuple[float, float]] = {
    "weight_bw_util": (0.4, 0.98),
    "kv_bw_util": (0.3, 0.98),
    "step_overhead_s": (1e-5, 0.01),
    "layer_overhead_s": (1e-7, 1e-4),
    "allreduce_latency_s": (1e-7, 1e-4),
    "api_overhead_s": (1e-4, 0.1),
}
LOSS_METRICS = ("e2e_mean_ms", "ttft_mean_ms", "itl_mean_ms")
_PHI = (math.sqrt(5) - 1) / 2


@dataclass
class FitResult:
    eff: RooflineEfficiency
    api_overhead_s: float
    loss: float
    history: list[dict[str, float]] = field(default_factory=list)
    rows_fitted: int = 0
    #: experiments those rows belong to (the overloaded ones and those with assumed prompts left out)
    experiments_fitted: int = 0

    def params(self) -> dict[str, float]:
        return {**{k: getattr(self.eff, k) for k in FIT_BOUNDS if k != "api_overhead_s"},
                "api_overhead_s": self.api_overhead_s}


def loss_of(frame: pl.DataFrame) -> float:
    """Mean |log(predicted / measured)| over the stages and :data:`LOSS_METRICS` (a missing prediction counts
    as a factor of 10)."""
    d = frame.filter(pl.col("metric").is_in(LOSS_METRICS) & pl.col("measured").is_not_null())
    if "cut" in d.columns:
        d = d.filter(~pl.col("cut").fill_null(False))
    if d.is_empty():
        return float("nan")
    errs = []
    for meas, pred in d.select("measured", "predicted").iter_rows():
        errs.append(abs(math.log(pred / meas)) if pred and meas and pred > 0 and meas > 0 else math.log(10))
    return sum(errs) / len(errs)


def _with(eff: RooflineEfficiency, api: float, name: str, v: float) -> tuple[RooflineEfficiency, float]:
    if name == "api_overhead_s":
        return eff, v
    return replace(eff, **{name: v}), api


def fit(rows: Sequence[Any], start: RooflineEfficiency, *, api_overhead_s: float = 0.01,
        params: Sequence[str] = tuple(FIT_BOUNDS), rounds: int = 3, steps: int = 7, max_stage_s: float | None = None,
        executor: Any = None, progress: Callable[[str], None] | None = None) -> FitResult:
    """Coordinate descent of ``params`` from ``start`` on ``rows`` (see the module docstring)."""
    cache: dict[tuple, float] = {}
    cut_ids = {str(value(r, "id")) for r in rows if stage_was_cut(r) or workload_assumed(r)}
    rows = [r for r in rows if str(value(r, "id")) not in cut_ids]  # not in the loss: no need to simulate them

    def evaluate(eff: RooflineEfficiency, api: float) -> float:
        key = (tuple(sorted(eff.as_dict().items())), api)
        if key not in cache:
            frame = simulate_rows(rows, eff, api_overhead_s=api, max_stage_s=max_stage_s, executor=executor)
            cache[key] = loss_of(frame)
        return cache[key]

    eff, api = start, api_overhead_s
    best = evaluate(eff, api)
    history = [{"round": 0, "loss": best, **FitResult(eff, api, best).params()}]
    for rnd in range(1, rounds + 1):
        before = best
        for name in params:
            lo, hi = (math.log(b) for b in FIT_BOUNDS[name])
            cur = math.log(getattr(eff, name) if name != "api_overhead_s" else api)
            # golden section on [lo, hi] in log space, seeded with the current value's loss
            a, b = lo, hi
            c, d = b - _PHI * (b - a), a + _PHI * (b - a)
            fc = evaluate(*_with(eff, api, name, math.exp(c)))
            fd = evaluate(*_with(eff, api, name, math.exp(d)))
            for _ in range(steps):
                if fc < fd:
                    b, d, fd = d, c, fc
                    c = b - _PHI * (b - a)
                    fc = evaluate(*_with(eff, api, name, math.exp(c)))
                else:
                    a, c, fc = c, d, fd
                    d = a + _PHI * (b - a)
                    fd = evaluate(*_with(eff, api, name, math.exp(d)))
            x, fx = (c, fc) if fc < fd else (d, fd)
            if fx < best:
                eff, api = _with(eff, api, name, float(f"{math.exp(x):.4g}"))
                best = evaluate(eff, api)
            else:
                eff, api = _with(eff, api, name, math.exp(cur))
            if progress is not None:
                progress(f"round {rnd} {name}: {math.exp(x):.4g} (loss {best:.4f})")
        history.append({"round": rnd, "loss": best, **FitResult(eff, api, best).params()})
        if before - best < 1e-3:
            break
    return FitResult(eff, api, best, history, rows_fitted=len(rows),
                     experiments_fitted=len({str(value(r, "id")) for r in rows}))


def cross_validate(rows: Sequence[Any], start: FitResult, by: str = "model", *, rounds: int = 1,
                   params: Sequence[str] = tuple(FIT_BOUNDS), max_stage_s: float | None = None, executor: Any = None,
                   progress: Callable[[str], None] | None = None) -> pl.DataFrame:
    """For each value of column ``by``: fit ``params`` on the other rows (from ``start``), simulate the held-out
    rows in full; the frame of :func:`~lbbench.validation.simulate.simulate_rows` with a ``held_out`` column."""
    groups = sorted({str(value(r, by)) for r in rows})
    frames = []
    for g in groups:
        train = [r for r in rows if str(value(r, by)) != g]
        test = [r for r in rows if str(value(r, by)) == g]
        res = fit(train, start.eff, api_overhead_s=start.api_overhead_s, params=params, rounds=rounds,
                  max_stage_s=max_stage_s, executor=executor) if train else start
        if progress is not None:
            progress(f"held out {by}={g}: loss on the rest {res.loss:.4f}")
        frames.append(simulate_rows(test, res.eff, api_overhead_s=res.api_overhead_s, executor=executor)
                      .with_columns(pl.lit(f"{by}={g}").alias("held_out")))
    return pl.concat(frames) if frames else pl.DataFrame()
