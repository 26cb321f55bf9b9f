"""``lbbench fidelity``: the same requests, the same routers, live and in the simulator, compared.

For each router the requests are replayed against the live endpoints ``repeats`` times (interleaved: repeat
``k`` runs every router before repeat ``k + 1`` starts, in a rotated order, so drift on a shared machine hits
every router alike) and simulated once with the profile. Per router it reports live and simulated mean, p50 and
p99 E2E and TTFT and mean TBT, the relative error of each simulated statistic against the live one (the median
over repeats of each repeat's statistic, the mean of two: robust to one replay disturbed by the host),
the per-request E2E MAPE (simulated against each live repeat, averaged), and the live run-to-run spread of the
mean E2E ((max - min) / mean over repeats): an error inside the spread is noise, not bias. ``rank_tau`` is
Kendall's τ between the routers' live and simulated mean E2E. With prefix caching on in the profile, the share of
prompt tokens served from the cache is compared too (live: the deltas of vLLM's ``vllm:prefix_cache_hits`` and
``vllm:prefix_cache_queries`` counters over each replay; simulated: the records' ``cached_prompt_tokens``).
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import polars as pl

from ..core import Request, RequestRecord
from ..engines import VLLM, Engine
from ..metrics.summary import derive
from ..profiles import Profile
from ..routers import get_router
from ..sim.cluster import ClusterSim


@dataclass
class RouterFidelity:
    router: str
    live: dict[str, float]  # median over repeats of each statistic (the mean of two)
    sim: dict[str, float]
    live_spread_pct: float
    mean_e2e_error_pct: float
    e2e_mape_pct: float
    ttft_mean_error_pct: float
    tbt_mean_error_pct: float
    live_mean_e2e_by_repeat_s: list[float] = field(default_factory=list)
    #: prefix caching on: share of prompt tokens served from the cache (live: vLLM's prefix_cache counters)
    live_prefix_hit_rate: float | None = None
    sim_prefix_hit_rate: float | None = None
    #: the per-request E2E MAPE of one live repeat against another (averaged over ordered pairs): the floor a
    #: simulator's per-request error can reach on this host; None with one repeat
    live_repeat_mape_pct: float | None = None

    def as_dict(self) -> dict:
        return {"router": self.router, "live_mean_e2e_s": self.live["mean_e2e_s"],
                "sim_mean_e2e_s": self.sim["mean_e2e_s"], "live_spread_pct": self.live_spread_pct,
                "mean_e2e_error_pct": self.mean_e2e_error_pct, "e2e_mape_pct": self.e2e_mape_pct,
                "ttft_mean_error_pct": self.ttft_mean_error_pct, "tbt_mean_error_pct": self.tbt_mean_error_pct,
                "p50_e2e_error_pct": _err(self.sim["p50_e2e_s"], self.live["p50_e2e_s"]),
                "p99_e2e_error_pct": _err(self.sim["p99_e2e_s"], self.live["p99_e2e_s"]),
                "p50_ttft_error_pct": _err(self.sim["p50_ttft_s"], self.live["p50_ttft_s"]),
                "live": self.live, "sim": self.sim, "live_mean_e2e_by_repeat_s": self.live_mean_e2e_by_repeat_s,
                "live_prefix_hit_rate": self.live_prefix_hit_rate, "sim_prefix_hit_rate": self.sim_prefix_hit_rate,
                "live_repeat_mape_pct": self.live_repeat_mape_pct}


STATS = ("mean_e2e_s", "p50_e2e_s", "p99_e2e_s", "mean_ttft_s", "p50_ttft_s", "p99_ttft_s", "mean_tbt_s")


def _frame(records: Sequence[RequestRecord]) -> pl.DataFrame:
    df = pl.DataFrame([r.as_dict() for r in records], infer_schema_length=None)
    return derive(df).filter(pl.col("error").is_null() & pl.col("finish_s").is_not_null()).collect()


def stats(records: Sequence[RequestRecord]) -> dict[str, float]:
    """The compared statistics of one run (completed requests)."""
    df = _frame(records)
    e2e, ttft = df["e2e_s"], df["ttft_s"]
    tbt = df["tbt_mean_s"].drop_nulls()
    return {"mean_e2e_s": float(e2e.mean()), "p50_e2e_s": float(e2e.quantile(0.5, "linear")),
            "p99_e2e_s": float(e2e.quantile(0.99, "linear")), "mean_ttft_s": float(ttft.mean()),
            "p50_ttft_s": float(ttft.quantile(0.5, "linear")), "p99_ttft_s": float(ttft.quantile(0.99, "linear")),
            "mean_tbt_s": float(tbt.mean()) if len(tbt) else float("nan"), "completed": df.height}


def e2e_mape_pct(sim: Sequence[RequestRecord], live: Sequence[RequestRecord]) -> float:
    """Mean over requests completed in both of |sim E2E - live E2E| / live E2E, in percent."""
    a = _frame(sim).select("request_id", pl.col("e2e_s").alias("sim"))
    b = _frame(live).select("request_id", pl.col("e2e_s").alias("live"))
    j = a.join(b, on="request_id").filter(pl.col("live") > 0)
    return float(((j["sim"] - j["live"]).abs() / j["live"]).mean() * 100.0)


def sim_hit_rate(records: Sequence[RequestRecord]) -> float | None:
    """Cached prompt tokens over prompt tokens of the completed requests (None without prefix caching)."""
    done = [r for r in records if r.error is None and r.cached_prompt_tokens is not None]
    total = sum(r.prompt_tokens for r in done)
    return sum(r.cached_prompt_tokens for r in done) / total if done and total else None


def prefix_counters(endpoints: Sequence[str], engine: Engine = VLLM) -> tuple[float, float] | None:
    """(queried, hit) prompt tokens summed over ``endpoints`` from the engine's counters; None if any lacks them."""
    if engine.prefix_queries is None or engine.prefix_hits is None:
        return None
    names = (engine.prefix_queries, engine.prefix_hits)
    sums = [0.0, 0.0]
    for url in endpoints:
        try:
            with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            return None
        found = [False, False]
        for line in text.splitlines():
            for k, name in enumerate(names):
                if line.startswith(name + "{") or line.startswith(name + " "):
                    sums[k] += float(line.rsplit(" ", 1)[1])
                    found[k] = True
        if not all(found):
            return None
    return sums[0], sums[1]


def reset_prefix_caches(endpoints: Sequence[str]) -> bool:
    """Empty each engine's prefix cache (vLLM's ``POST /reset_prefix_cache``, served in its dev mode), so that a
    replay does not inherit the previous one's cached prompts; False where an engine does not offer it."""
    ok = True
    for url in endpoints:
        try:
            with urllib.request.urlopen(urllib.request.Request(url + "/reset_prefix_cache", data=b"",
                                                               method="POST"), timeout=10) as resp:
                ok &= resp.status == 200
        except OSError:
            ok = False
    return ok


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's τ-a between two equally long sequences (ties count zero)."""
    n = len(x)
    if n < 2:
        return float("nan")
    s = 0
    for i in range(n):
        for j in range(i + 1, n):
            s += int(np.sign(x[i] - x[j]) * np.sign(y[i] - y[j]))
    return s / (n * (n - 1) / 2)


def _err(sim: float, live: float) -> float:
    return 100.0 * (sim - live) / live if live else float("nan")


def compare(routers: Sequence[str], sim_runs: dict[str, list[RequestRecord]],
            live_runs: dict[str, list[list[RequestRecord]]],
            live_hits: dict[str, list[float]] | None = None) -> tuple[float, list[RouterFidelity]]:
    """(rank_tau, per-router comparison) from simulated and repeated live records (and live prefix-cache hit
    rates per repeat, when measured)."""
    out = []
    for name in routers:
        sim = stats(sim_runs[name])
        reps = [stats(r) for r in live_runs[name]]
        # the median repeat, not the mean: one replay disturbed by the host (a stretch of doubled step times has
        # been seen on a shared machine) moves a mean of three by a third of its excess and a median not at all
        live = {k: float(np.median([r[k] for r in reps])) for k in STATS}
        means = [r["mean_e2e_s"] for r in reps]
        spread = 100.0 * (max(means) - min(means)) / float(np.mean(means)) if len(means) > 1 else 0.0
        mape = float(np.mean([e2e_mape_pct(sim_runs[name], r) for r in live_runs[name]]))
        runs = live_runs[name]
        pairs = [e2e_mape_pct(a, b) for i, a in enumerate(runs) for j, b in enumerate(runs) if i != j]
        out.append(RouterFidelity(
            router=name, live=live, sim={k: sim[k] for k in STATS}, live_spread_pct=spread,
            mean_e2e_error_pct=_err(sim["mean_e2e_s"], live["mean_e2e_s"]), e2e_mape_pct=mape,
            ttft_mean_error_pct=_err(sim["mean_ttft_s"], live["mean_ttft_s"]),
            tbt_mean_error_pct=_err(sim["mean_tbt_s"], live["mean_tbt_s"]), live_mean_e2e_by_repeat_s=means,
            live_prefix_hit_rate=float(np.mean(live_hits[name])) if live_hits and live_hits.get(name) else None,
            sim_prefix_hit_rate=sim_hit_rate(sim_runs[name]),
            live_repeat_mape_pct=float(np.mean(pairs)) if pairs else None))
    tau = kendall_tau([r.live["mean_e2e_s"] for r in out], [r.sim["mean_e2e_s"] for r in out])
    return tau, out


def live_replay(requests: Sequence[Request], router, endpoints: Sequence[str], profile: Profile, *, run_id: str,
                seed: int, what: str) -> list[RequestRecord]:
    """One live replay of ``requests`` through ``router`` as fidelity and calibration run it: every instance given
    the profile's ``InstanceSpec`` (the simulator gives the routers the same one), the profile's decision epoch,
    no metrics scraping (it would load the host the engines share); ``RuntimeError`` naming ``what`` when the
    replay did not complete."""
    # lazy: start-up time (aiohttp and the replay client, ~160 ms)
    from ..harness.replay import ReplaySettings, run_replay

    specs = [profile.instance_spec()] * len(endpoints)
    res = run_replay(requests, router, endpoints,
                     ReplaySettings(specs=specs, run_id=run_id, seed=seed, min_step_s=profile.min_step_s,
                                    scrape_interval_s=None))
    if not res.complete:
        raise RuntimeError(f"{what} did not complete")
    return res.records


def run_fidelity(profile: Profile, requests: Sequence[Request], routers: Sequence[str], endpoints: Sequence[str],
                 *, repeats: int = 3, seed: int = 0, router_options: dict | None = None,
                 out_dir=None,
                 progress: Callable[[str], None] = lambda what: None) -> tuple[float, list[RouterFidelity]]:
    """Replay ``requests`` live ``repeats`` times per router (interleaved) and once in the simulator; with
    ``out_dir``, every run's records go to ``out_dir/records.parquet`` (column ``source``: sim or live-K)."""
    opts = router_options or {}
    n = len(endpoints)

    def router(name: str):
        return get_router(name, num_instances=n, seed=seed, profile=profile, **opts.get(name, {}))

    sim_runs = {}
    for name in routers:
        sim_runs[name] = ClusterSim(profile, n, requests, seed=seed, run_id="fidelity-sim").run(router(name))
    live_runs: dict[str, list[list[RequestRecord]]] = {name: [] for name in routers}
    live_hits: dict[str, list[float]] = {name: [] for name in routers}
    for k in range(repeats):
        order = list(routers[k % len(routers):]) + list(routers[:k % len(routers)])
        for name in order:
            if profile.enable_prefix_caching:
                reset_prefix_caches(endpoints)
            before = prefix_counters(endpoints) if profile.enable_prefix_caching else None
            records = live_replay(requests, router(name), endpoints, profile, run_id=f"fidelity-live-{k}",
                                  seed=seed, what=f"live replay of {name} (repeat {k + 1})")
            live_runs[name].append(records)
            after = prefix_counters(endpoints) if before is not None else None
            if after is not None and after[0] > before[0]:
                live_hits[name].append((after[1] - before[1]) / (after[0] - before[0]))
            progress(f"live {name} repeat {k + 1}/{repeats}: mean E2E {stats(records)['mean_e2e_s']:.3f} s")
    if out_dir is not None:
        frames = [_records_frame(recs, name, "sim") for name, recs in sim_runs.items()]
        frames += [_records_frame(recs, name, f"live-{k}") for name, runs in live_runs.items()
                   for k, recs in enumerate(runs)]
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        pl.concat(frames, how="diagonal_relaxed").write_parquet(Path(out_dir) / "records.parquet")
    return compare(routers, sim_runs, live_runs, live_hits)


def _records_frame(records: Sequence[RequestRecord], router: str, source: str) -> pl.DataFrame:
    df = pl.DataFrame([r.as_dict() for r in records], infer_schema_length=None)
    return df.with_columns(pl.lit(router).alias("router"), pl.lit(source).alias("source"))
