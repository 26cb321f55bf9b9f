"""``lbbench profile calibrate``: fit a measured profile to the regime of a replay.

``profile measure`` times lone requests and decode batches that run on an otherwise quiet engine. A replay is not
that regime: the front end streams many requests at once, requests join and leave batches, and on a small host the
engine, the API server and the client share cores. Calibration keeps the measured *shape* of the step model (the
ratios of the base, per-prefill-token, per-decode-sequence and per-context-token costs) and fits two numbers to a
live replay of a calibration workload, each on the quantity it governs:

- ``step_scale``, the factor on all four step coefficients (and on the mixing estimator's ``grad1``, ``grad2`` and
  Δt, which are the same costs), so that the simulated mean time between tokens equals the live one. The front end
  latency does not enter the time between tokens, so this fit is one-dimensional; it is solved by bisection on a
  log scale (the simulated mean TBT grows with the scale).
- ``api_overhead_s``, the latency the serving front end adds to every client-observed time. Given the scaled step
  model, the simulated mean TTFT is the simulated engine TTFT plus that constant, so it is solved in closed form:
  the live mean TTFT minus the simulated engine mean TTFT (never below zero).

The end-to-end latency is fitted on neither, and a calibration is meant to be validated on different requests
(another seed, another router) than it was fitted on: ``lbbench fidelity`` on the calibrated profile does that.
The calibrated profile's ``[source]`` names the calibration workload, its seed and router, and both fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..core import Request, RequestRecord
from ..profiles import Profile
from .fidelity import stats

#: the bracket of step scales searched
MIN_SCALE, MAX_SCALE = 1 / 16, 16.0


class CalibrationError(ValueError):
    """A calibration cannot be fitted (the message says why)."""


@dataclass
class Calibration:
    step_scale: float
    api_overhead_s: float
    live_mean_tbt_s: float
    live_mean_ttft_s: float
    live_mean_e2e_s: float
    #: the simulator on the calibration requests, before and after
    sim_before: dict[str, float]
    sim_after: dict[str, float]

    def as_dict(self) -> dict:
        return {"step_scale": self.step_scale, "api_overhead_s": self.api_overhead_s,
                "live_mean_tbt_s": self.live_mean_tbt_s, "live_mean_ttft_s": self.live_mean_ttft_s,
                "live_mean_e2e_s": self.live_mean_e2e_s, "sim_before": self.sim_before, "sim_after": self.sim_after}


def scaled(profile: Profile, step_scale: float, api_overhead_s: float | None = None) -> Profile:
    """``profile`` with every step cost (and the mixing estimator's copies of them) times ``step_scale``."""
    s = step_scale
    return profile.with_overrides(
        base_s=profile.base_s * s, prefill_token_s=profile.prefill_token_s * s,
        decode_seq_s=profile.decode_seq_s * s, context_token_s=profile.context_token_s * s,
        grad1=profile.grad1 * s, grad2=profile.grad2 * s, min_step_s=profile.min_step_s * s,
        api_overhead_s=profile.api_overhead_s if api_overhead_s is None else api_overhead_s)


def _means(records_runs: Sequence[Sequence[RequestRecord]]) -> dict[str, float]:
    """The mean over runs of each statistic of :func:`stats` (each run's statistics computed once)."""
    per_run = [stats(recs) for recs in records_runs]
    return {k: float(np.mean([r[k] for r in per_run])) for k in ("mean_tbt_s", "mean_ttft_s", "mean_e2e_s")}


def fit(profile: Profile, live_runs: Sequence[Sequence[RequestRecord]],
        simulate: Callable[[Profile], Sequence[RequestRecord]], *, iterations: int = 40) -> Calibration:
    """Fit ``step_scale`` and ``api_overhead_s`` to ``live_runs`` (live replays of one request set).

    ``simulate(profile)`` runs the simulator on the same requests with the same router and returns its records.
    """
    if not live_runs or not all(live_runs):
        raise CalibrationError("calibration needs at least one live replay with records")
    live = _means(live_runs)
    live_tbt, live_ttft, live_e2e = live["mean_tbt_s"], live["mean_ttft_s"], live["mean_e2e_s"]
    if not (math.isfinite(live_tbt) and live_tbt > 0):
        raise CalibrationError("the calibration replay has no time between tokens (give outputs of 2+ tokens)")
    zero_api = profile.with_overrides(api_overhead_s=0.0)

    def sim_tbt(s: float) -> float:
        return stats(simulate(scaled(zero_api, s)))["mean_tbt_s"]

    lo, hi = math.log(MIN_SCALE), math.log(MAX_SCALE)
    if sim_tbt(math.exp(lo)) > live_tbt or sim_tbt(math.exp(hi)) < live_tbt:
        raise CalibrationError(f"the live mean TBT ({live_tbt * 1e3:.2f} ms) is outside what step scales "
                               f"{MIN_SCALE:g}-{MAX_SCALE:g} of profile {profile.name} give")
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if sim_tbt(math.exp(mid)) < live_tbt:
            lo = mid
        else:
            hi = mid
    s = math.exp((lo + hi) / 2)
    engine_ttft = stats(simulate(scaled(zero_api, s)))["mean_ttft_s"]
    api = max(0.0, live_ttft - engine_ttft)
    return Calibration(step_scale=s, api_overhead_s=api, live_mean_tbt_s=live_tbt, live_mean_ttft_s=live_ttft,
                       live_mean_e2e_s=live_e2e, sim_before=stats(simulate(profile)),
                       sim_after=stats(simulate(scaled(profile, s, api))))


def calibrated_toml(doc: dict, cal: Calibration, *, what: str) -> dict:
    """The profile TOML ``doc`` (as loaded) rewritten with the calibration applied, ``[calibration]`` and
    ``[source]`` lines saying what it was fitted on (``what``: the workload, seed, router and endpoints)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in doc.items()}
    s = cal.step_scale
    step = out.setdefault("step", {})
    for k in ("base_s", "prefill_token_s", "decode_seq_s", "context_token_s"):
        step[k] = float(f"{step[k] * s:.5g}")
    step["api_overhead_s"] = float(f"{cal.api_overhead_s:.5g}")
    mixing = out.setdefault("mixing", {})
    for k in ("grad1", "grad2", "min_step_s"):
        if k in mixing:
            mixing[k] = float(f"{mixing[k] * s:.5g}")
    out["calibration"] = {
        "step_scale": float(f"{s:.5g}"), "api_overhead_s": step["api_overhead_s"],
        "live_mean_tbt_s": float(f"{cal.live_mean_tbt_s:.5g}"),
        "live_mean_ttft_s": float(f"{cal.live_mean_ttft_s:.5g}"),
        "live_mean_e2e_s": float(f"{cal.live_mean_e2e_s:.5g}"),
        "sim_mean_e2e_before_s": float(f"{cal.sim_before['mean_e2e_s']:.5g}"),
        "sim_mean_e2e_after_s": float(f"{cal.sim_after['mean_e2e_s']:.5g}"),
    }
    src = out.setdefault("source", {})
    for k in ("base_s", "prefill_token_s", "decode_seq_s", "context_token_s"):
        src[k] = f"{src.get(k, 'as measured')}; then x{s:.4g} (calibrated: live mean TBT of {what})"
    src["api_overhead_s"] = (f"calibrated: live mean TTFT of {what} ({cal.live_mean_ttft_s * 1e3:.1f} ms) less "
                             f"the simulated engine's")
    src["calibration"] = (f"lbbench profile calibrate on {what}: step scale {s:.4g} from the mean TBT, API "
                          f"overhead {cal.api_overhead_s * 1e3:.2f} ms from the mean TTFT; mean E2E not fitted "
                          f"(live {cal.live_mean_e2e_s:.3f} s, simulated {cal.sim_before['mean_e2e_s']:.3f} s "
                          f"before, {cal.sim_after['mean_e2e_s']:.3f} s after)")
    return out


def live_replays(requests: Sequence[Request], router_factory: Callable[[], object], endpoints: Sequence[str],
                 profile: Profile, *, repeats: int, seed: int,
                 progress: Callable[[str], None] = lambda what: None) -> list[list[RequestRecord]]:
    """``repeats`` live replays of ``requests`` with a fresh router each time."""
    from ..harness.replay import run_replay

    specs = [profile.instance_spec()] * len(endpoints)
    runs = []
    for k in range(repeats):
        res = run_replay(requests, router_factory(), endpoints, specs=specs, run_id=f"calibrate-live-{k}",
                         seed=seed, min_step_s=profile.min_step_s, scrape_interval_s=None)
        if not res.complete:
            raise CalibrationError(f"calibration replay {k + 1} did not complete")
        runs.append(res.records)
        progress(f"calibration replay {k + 1}/{repeats}: mean E2E {stats(res.records)['mean_e2e_s']:.3f} s")
    return runs
