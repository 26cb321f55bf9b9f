"""Fidelity that transfers: calibrate a measured profile on one workload, check the simulator on others.

A simulator is worth the error it makes on traffic it was not fitted to. ``run_transfer`` replays the calibration
workload (one router) and every check workload (each router) live, ``repeats`` times, **interleaved**: repeat
``k`` runs every (workload, router) replay before repeat ``k + 1`` starts, in an order rotated by ``k``, so that
a host whose speed drifts moves the calibration and the checks alike. With ``warmup_requests`` N, the first N
requests of every workload are replayed once before repeat 1 and left out of every figure (their records are kept,
``source`` = ``warm-up``): a fresh engine's first replays have run slower than its later ones (docs/fidelity.md),
and without a warm-up that slowness lands on whichever workload the rotation puts first. It then fits the calibration
(:func:`~lbbench.profiling.calibrate.fit`: the decode-step factor to the live mean TBT, the prefill factor to the
live mean TTFT) on the calibration replays only, simulates every check workload with the calibrated profile, and
compares (:func:`~lbbench.profiling.fidelity.compare`). Each result says which workload it came from; the
calibration workload's own fit (in-sample) and the uncalibrated profile's error on each check are reported beside
the transfer figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import polars as pl

from ..core import Request, RequestRecord
from ..profiles import Profile
from ..routers import get_router
from ..sim.cluster import ClusterSim
from .calibrate import Calibration, calibrated, fit
from .fidelity import RouterFidelity, compare, live_replay, reset_prefix_caches, stats, _records_frame


@dataclass
class WorkloadCheck:
    """The fidelity of one check workload: per router, the calibrated profile's errors."""

    workload: str
    requests: int
    rank_tau: float
    routers: list[RouterFidelity]
    #: per router, the mean E2E error of the profile as given (before calibration)
    uncalibrated_mean_e2e_error_pct: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"workload": self.workload, "requests": self.requests, "rank_tau": self.rank_tau,
                "routers": [{"workload": self.workload, **r.as_dict(),
                             "uncalibrated_mean_e2e_error_pct": self.uncalibrated_mean_e2e_error_pct.get(r.router)}
                            for r in self.routers]}


@dataclass
class TransferResult:
    calibrated_on: str
    calibration: Calibration
    calibrated_profile: Profile
    #: the calibration workload itself, simulated with the calibrated profile (in-sample)
    calibration_fit: RouterFidelity
    checks: list[WorkloadCheck]
    records: pl.DataFrame
    #: requests of each workload replayed once before the repeats and left out of every figure
    warmup_requests: int = 0

    def as_dict(self) -> dict:
        return {"calibrated_on": self.calibrated_on, "warmup_requests": self.warmup_requests,
                "calibration": self.calibration.as_dict(),
                "calibration_fit": {"workload": self.calibrated_on, **self.calibration_fit.as_dict()},
                "checks": [c.as_dict() for c in self.checks]}

    def worst_mean_e2e_error_pct(self) -> float:
        return max(abs(r.mean_e2e_error_pct) for c in self.checks for r in c.routers)


def run_transfer(profile: Profile, calibrate_on: tuple[str, Sequence[Request]],
                 check_on: Sequence[tuple[str, Sequence[Request]]], routers: Sequence[str],
                 endpoints: Sequence[str], *, repeats: int = 3, seed: int = 0, calibration_seed: int = 1,
                 calibration_router: str = "round_robin", router_options: dict | None = None, out_dir=None,
                 ttft_fit: str = "mean", warmup_requests: int = 0,
                 progress: Callable[[str], None] = lambda what: None) -> TransferResult:
    """Calibrate on ``calibrate_on`` = (label, requests), check on each of ``check_on`` (label, requests); see the
    module docstring. ``seed`` seeds the routers of the checks, ``calibration_seed`` the calibration's router.
    With ``out_dir``, every record goes to ``out_dir/records.parquet`` (columns ``workload``, ``router``,
    ``source``: sim, sim-uncalibrated or live-K)."""
    opts = router_options or {}
    n = len(endpoints)
    labels = [label for label, _ in check_on]
    if calibrate_on[0] in labels or len(set(labels)) != len(labels):
        raise ValueError("check_on: every check workload must differ from the others and from the calibration's")

    def router(name: str, prof: Profile, router_seed: int):
        return get_router(name, num_instances=n, seed=router_seed, profile=prof, **opts.get(name, {}))

    cal_label, cal_requests = calibrate_on
    items = [(cal_label, calibration_router)] + [(label, name) for label in labels for name in routers]
    requests_of = {cal_label: cal_requests, **dict(check_on)}
    live: dict[tuple[str, str], list[list[RequestRecord]]] = {item: [] for item in items}
    warm: list[tuple[str, list[RequestRecord]]] = []
    if warmup_requests > 0:
        for label in [cal_label, *labels]:
            head = list(requests_of[label])[:warmup_requests]
            if profile.enable_prefix_caching:
                reset_prefix_caches(endpoints)
            records = live_replay(head, router(calibration_router, profile, calibration_seed), endpoints, profile,
                                  run_id="transfer-warm-up", seed=calibration_seed,
                                  what=f"warm-up replay of {label}")
            warm.append((label, records))
            progress(f"warm-up {label}: {len(records)} requests, mean E2E {stats(records)['mean_e2e_s']:.3f} s "
                     "(not counted)")
    for k in range(repeats):
        order = items[k % len(items):] + items[:k % len(items)]
        for label, name in order:
            if profile.enable_prefix_caching:
                reset_prefix_caches(endpoints)
            rseed = calibration_seed if label == cal_label else seed
            records = live_replay(requests_of[label], router(name, profile, rseed), endpoints, profile,
                                  run_id=f"transfer-live-{k}", seed=rseed,
                                  what=f"live replay of {label} with {name} (repeat {k + 1})")
            live[(label, name)].append(records)
            progress(f"live {label} {name} repeat {k + 1}/{repeats}: mean E2E {stats(records)['mean_e2e_s']:.3f} s")
    res = evaluate_transfer(profile, calibrate_on, check_on, routers, n, live, seed=seed,
                            calibration_seed=calibration_seed, calibration_router=calibration_router,
                            router_options=router_options, ttft_fit=ttft_fit, progress=progress)
    if warm:
        res.records = pl.concat([res.records] + [
            _records_frame(recs, calibration_router, "warm-up").with_columns(pl.lit(label).alias("workload"))
            for label, recs in warm], how="diagonal_relaxed")
        res.warmup_requests = warmup_requests
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        res.records.write_parquet(Path(out_dir) / "records.parquet")
    return res


def evaluate_transfer(profile: Profile, calibrate_on: tuple[str, Sequence[Request]],
                      check_on: Sequence[tuple[str, Sequence[Request]]], routers: Sequence[str], num_instances: int,
                      live: dict[tuple[str, str], list[list[RequestRecord]]], *, seed: int = 0,
                      calibration_seed: int = 1, calibration_router: str = "round_robin",
                      router_options: dict | None = None, ttft_fit: str = "mean",
                      progress: Callable[[str], None] = lambda what: None) -> TransferResult:
    """The analysis half of :func:`run_transfer`, on live replays already taken: ``live[(workload, router)]`` is
    the list of replays (records) of that workload's requests through that router. Fits the calibration on the
    calibration workload's replays, simulates every workload with the calibrated profile and compares."""
    opts = router_options or {}
    n = num_instances
    labels = [label for label, _ in check_on]
    cal_label, cal_requests = calibrate_on
    requests_of = {cal_label: cal_requests, **dict(check_on)}

    def router(name: str, prof: Profile, router_seed: int):
        return get_router(name, num_instances=n, seed=router_seed, profile=prof, **opts.get(name, {}))

    def simulate(prof: Profile, label: str, name: str, rseed: int) -> list[RequestRecord]:
        return ClusterSim(prof, n, requests_of[label], seed=rseed, run_id="transfer-sim").run(router(name, prof, rseed))

    cal = fit(profile, live[(cal_label, calibration_router)],
              lambda p: simulate(p, cal_label, calibration_router, calibration_seed), ttft=ttft_fit)
    cal_prof = calibrated(profile, cal)
    progress(f"calibrated on {cal_label}: decode x{cal.decode_scale:.3f}, prefill x{cal.prefill_scale:.3f}, "
             f"API overhead {cal.api_overhead_s * 1e3:.1f} ms ({ttft_fit} TTFT fit)")
    cal_sim = simulate(cal_prof, cal_label, calibration_router, calibration_seed)
    _, (cal_fit,) = compare([calibration_router], {calibration_router: cal_sim},
                            {calibration_router: live[(cal_label, calibration_router)]})
    frames = [_records_frame(cal_sim, calibration_router, "sim").with_columns(pl.lit(cal_label).alias("workload"))]
    frames += [_records_frame(recs, calibration_router, f"live-{k}").with_columns(pl.lit(cal_label).alias("workload"))
               for k, recs in enumerate(live[(cal_label, calibration_router)])]
    checks = []
    for label in labels:
        sims = {name: simulate(cal_prof, label, name, seed) for name in routers}
        raw = {name: simulate(profile, label, name, seed) for name in routers}
        lives = {name: live[(label, name)] for name in routers}
        tau, rows = compare(routers, sims, lives)
        _, raw_rows = compare(routers, raw, lives)
        checks.append(WorkloadCheck(label, len(requests_of[label]), tau, rows,
                                    {r.router: r.mean_e2e_error_pct for r in raw_rows}))
        for name in routers:
            w = pl.lit(label).alias("workload")
            frames.append(_records_frame(sims[name], name, "sim").with_columns(w))
            frames.append(_records_frame(raw[name], name, "sim-uncalibrated").with_columns(w))
            frames += [_records_frame(recs, name, f"live-{k}").with_columns(w) for k, recs in enumerate(lives[name])]
    records = pl.concat(frames, how="diagonal_relaxed")
    return TransferResult(cal_label, cal, cal_prof, cal_fit, checks, records)
