"""Run-to-run comparison for regression gating (``lbbench compare``).

Routers of the baseline and candidate runs are paired by name (or by explicit
``baseline_router=candidate_router`` pairs; two single-router runs pair with each other),
and by every setting that varies inside the runs (e.g. ``chunked_prefill``). For each pair
and metric the change ``100 * (candidate - baseline) / baseline`` comes with a bootstrap
interval (``stats.bootstrap_change``: paired by seed and request where seeds match).

A metric **regresses** when it is worse by more than the threshold *and* its interval
excludes zero, so noise alone does not fail a nightly job. Unpaired comparisons with a
single seed on a side are shown but never gate: a within-seed bootstrap cannot see how much
a different seed moves the result (tail percentiles especially). Settings that differ between
the runs are reported as warnings, not errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import polars as pl

from ..errors import InputError
from ..metrics.stats import MEAN, Change, Side, Stat, bootstrap_change, side_from_rows
from ..metrics.summary import completed_expr, derive
from ..rundir import SETTING_COLUMNS, Runs, load_runs, settings_of, varying_settings


@dataclass(frozen=True)
class Metric:
    column: str  # per-request column the statistic is computed over
    stat: Stat
    lower_is_better: bool = True
    rate: bool = False  # per seed: mean * completed / (last finish - first arrival)


METRICS: dict[str, Metric] = {
    "mean_e2e_s": Metric("e2e_s", MEAN),
    "p50_e2e_s": Metric("e2e_s", Stat("quantile", 0.5)),
    "p90_e2e_s": Metric("e2e_s", Stat("quantile", 0.9)),
    "p99_e2e_s": Metric("e2e_s", Stat("quantile", 0.99)),
    "mean_ttft_s": Metric("ttft_s", MEAN),
    "p99_ttft_s": Metric("ttft_s", Stat("quantile", 0.99)),
    "mean_tbt_s": Metric("tbt_mean_s", MEAN),
    "p99_tbt_s": Metric("tbt_p99_s", Stat("quantile", 0.99)),
    "mean_router_wait_s": Metric("router_wait_s", MEAN),
    "throughput_tokens_per_s": Metric("generated_tokens", MEAN, lower_is_better=False, rate=True),
}
DEFAULT_METRICS = ("mean_e2e_s", "p99_e2e_s", "mean_ttft_s")


class CompareError(InputError):
    """The runs cannot be compared as asked (the message names the setting or the run)."""


@dataclass
class Row:
    baseline_router: str
    candidate_router: str
    settings: dict
    metric: str
    change: Change
    worse_pct: float  # change in the "worse" direction (positive = worse)
    worse_ci: tuple[float, float]
    regression: bool
    gated: bool = True  # False: one unpaired seed on a side; the interval cannot see seed spread

    @property
    def verdict(self) -> str:
        if self.regression:
            return "REGRESSION"
        if not self.gated:
            return "not gated (unpaired, 1 seed)"
        if not self.change.excludes_zero:
            return "no significant change"
        return "worse" if self.worse_pct > 0 else "better"


@dataclass
class Comparison:
    rows: list[Row]
    max_regression_pct: float
    warnings: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return any(r.regression for r in self.rows)

    def frame(self) -> pl.DataFrame:
        recs = []
        for r in self.rows:
            c = r.change
            recs.append({
                "baseline_router": r.baseline_router, "candidate_router": r.candidate_router,
                **{k: str(v) for k, v in r.settings.items()}, "metric": r.metric,
                "baseline": c.baseline, "candidate": c.candidate, "change_pct": c.change_pct,
                "ci_low_pct": c.ci_low_pct, "ci_high_pct": c.ci_high_pct,
                "paired": c.paired, "seeds": c.num_seeds, "verdict": r.verdict,
            })
        return pl.DataFrame(recs)


def parse_threshold(text: str) -> float:
    """``3%`` or ``3`` -> 3.0 (percent)."""
    t = text.strip().rstrip("%").strip()
    try:
        v = float(t)
    except ValueError:
        raise CompareError(f"max_regression: {text!r} is not a percentage like 3%") from None
    if v < 0:
        raise CompareError(f"max_regression: {text!r} must be >= 0")
    return v


def parse_pairs(items: Sequence[str]) -> list[tuple[str, str]]:
    out = []
    for it in items:
        a, sep, b = it.partition("=")
        if not sep or not a.strip() or not b.strip():
            raise CompareError(f"pair: {it!r} is not BASELINE_ROUTER=CANDIDATE_ROUTER")
        out.append((a.strip(), b.strip()))
    return out


def _sides(df: pl.DataFrame, metric: Metric) -> Side:
    """Per-seed values of one metric; requests without a value (e.g. no TBT for a
    one-token answer) are left out, as the summary's means leave out nulls."""
    if metric.rate:
        span = (df.group_by("seed")
                .agg(span=pl.col("finish_s").max() - pl.col("_first_arrival_s").min(), n=pl.len()))
        scale = {s: (n / sp if sp and sp > 0 else float("nan")) for s, sp, n in span.iter_rows()}
        vals = df[metric.column].cast(pl.Float64).fill_null(0.0)
        return side_from_rows(df["seed"].to_numpy(), df["request_id"].to_numpy(), vals.to_numpy(),
                              scale.__getitem__)
    df = df.filter(pl.col(metric.column).is_not_null() & pl.col(metric.column).is_not_nan())
    return side_from_rows(df["seed"].to_numpy(), df["request_id"].to_numpy(),
                          df[metric.column].cast(pl.Float64).to_numpy())


def _completed(runs: Runs, keys: list[str], cols: set[str]) -> pl.DataFrame:
    lf = derive(runs.requests).with_columns(
        _first_arrival_s=pl.col("arrival_s").min().over([*keys, "seed"]))
    return (lf.filter(completed_expr())
            .select([*keys, "seed", "request_id", "finish_s", "_first_arrival_s", *sorted(cols)])
            .collect())


def compare_runs(baseline: str | Path, candidate: str | Path, metrics: Sequence[str] = DEFAULT_METRICS,
                 max_regression_pct: float = 3.0, pairs: Sequence[tuple[str, str]] = (),
                 num_resamples: int = 1000, level: float = 0.95, seed: int = 0) -> Comparison:
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise CompareError(f"metric: unknown metric(s) {', '.join(unknown)} "
                           f"(known: {', '.join(METRICS)})")
    b_runs, c_runs = load_runs([baseline]), load_runs([candidate])
    b_vary, c_vary = varying_settings(b_runs.requests), varying_settings(c_runs.requests)
    inner = [k for k in SETTING_COLUMNS if k in b_vary or k in c_vary]
    keys = ["router", *inner]
    warnings: list[str] = []
    b_set, c_set = settings_of(b_runs.requests), settings_of(c_runs.requests)
    for k in SETTING_COLUMNS:
        if k in inner or k not in b_set or k not in c_set:
            continue
        if b_set[k] != c_set[k]:
            warnings.append(f"setting {k} differs: baseline {_show(b_set[k])}, "
                            f"candidate {_show(c_set[k])}")
    cols = {METRICS[m].column for m in metrics}
    b_df, c_df = _completed(b_runs, keys, cols), _completed(c_runs, keys, cols)
    b_routers = b_df["router"].unique(maintain_order=True).to_list()
    c_routers = c_df["router"].unique(maintain_order=True).to_list()
    if pairs:
        for a, b in pairs:
            if a not in b_routers:
                raise CompareError(f"pair: router {a!r} not in baseline {baseline} "
                                   f"(has {', '.join(b_routers)})")
            if b not in c_routers:
                raise CompareError(f"pair: router {b!r} not in candidate {candidate} "
                                   f"(has {', '.join(c_routers)})")
        router_pairs = list(pairs)
    else:
        router_pairs = [(r, r) for r in b_routers if r in c_routers]
        if not router_pairs and len(b_routers) == 1 and len(c_routers) == 1:
            router_pairs = [(b_routers[0], c_routers[0])]
            warnings.append(f"no common router; comparing baseline {b_routers[0]} with "
                            f"candidate {c_routers[0]}")
        if not router_pairs:
            raise CompareError(f"no router in both runs (baseline: {', '.join(b_routers)}; "
                               f"candidate: {', '.join(c_routers)}); pair them (A=B)")
    b_groups = b_df.partition_by(keys, as_dict=True, maintain_order=True)
    c_groups = c_df.partition_by(keys, as_dict=True, maintain_order=True)
    rows: list[Row] = []
    for a, b in router_pairs:
        for bkey, bg in b_groups.items():
            if bkey[0] != a:
                continue
            cg = c_groups.get((b, *bkey[1:]))
            settings = dict(zip(inner, bkey[1:]))
            if cg is None:
                warnings.append(f"candidate has no rows for {b} {settings or ''}".rstrip())
                continue
            shared = set(bg["seed"].unique()) & set(cg["seed"].unique())
            if not shared:
                msg = "no shared seeds between the runs; intervals are unpaired"
                if msg not in warnings:
                    warnings.append(msg)
            for m in metrics:
                spec = METRICS[m]
                try:
                    ch = bootstrap_change(_sides(bg, spec), _sides(cg, spec), spec.stat,
                                          num_resamples, level, seed)
                except ValueError as exc:
                    warnings.append(f"{a} vs {b} {m}: {exc}")
                    continue
                sign = 1.0 if spec.lower_is_better else -1.0
                worse = sign * ch.change_pct
                lo, hi = sorted((sign * ch.ci_low_pct, sign * ch.ci_high_pct))
                gated = ch.paired or ch.num_seeds >= 2
                rows.append(Row(a, b, settings, m, ch, worse, (lo, hi),
                                gated and worse > max_regression_pct and lo > 0, gated))
                if not gated and _UNGATED not in warnings:
                    warnings.append(_UNGATED)
    return Comparison(rows, max_regression_pct, warnings)


_UNGATED = ("runs share no seed and one side has a single seed: the seed-to-seed spread is "
            "unknown, so changes are shown but never fail; rerun with the same seeds (paired) "
            "or with 2+ seeds on each side")


def _show(vals: list) -> str:
    return ", ".join(map(str, vals)) if vals else "-"
