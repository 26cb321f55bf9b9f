"""``lbbench profile calibrate``: fit a measured profile to the regime of a replay.

``profile measure`` times lone requests and decode batches that run on an otherwise quiet engine. A replay is not
that regime: the front end streams many requests at once, requests join and leave batches, and on a small host the
engines, the API servers and the client share cores. Calibration keeps the measured *shape* of each half of the
step model and fits two factors to live replays of a calibration workload, each on the quantity it governs:

- ``decode_scale``, the factor on the per-step costs (``base_s``, ``decode_seq_s``, ``context_token_s``, and the
  mixing estimator's ``grad2`` and Δt, which are the same costs), fitted so that the simulated mean time between
  tokens equals the live one;
- ``prefill_scale``, the factor on the per-prefill-token cost (``prefill_token_s`` and the estimator's ``grad1``),
  fitted so that the simulated mean time to first token equals the live one.

The two are not independent (a prefill chunk in a step delays every decode in it; a queued prefill waits for the
decode steps ahead of it), so they are solved together: bisection on a log scale for each in turn, with the other
held, until neither moves. The front end's latency (``api_overhead_s``) stays as measured.

One factor on all the costs (the first version of this command) cannot fit both: on a 2-core host running two CPU
engines and the client, decode steps slow down under a replay about twice as much as prefill does, so a single
factor fitted to the time between tokens over-charged every prefill (the simulated engine's time to first token
alone exceeded the live one) and under-charged the decode steps of other request mixes (docs/fidelity.md).

``ttft="split"`` (``--ttft-fit split``) fits the time to first token by its dependence on the prompt's length
instead of by its mean: the prefill factor and the front end's latency (``api_overhead_s``, a per-request offset
the simulator adds to every first token and finish) together, to the mean TTFT of the shorter and of the longer half
of the calibration prompts (least squares over the two; the overhead is the mean of the two halves' remainders, at
least 0). The per-token cost is then what makes TTFT grow with the prompt, the overhead the intercept. A mean
fitted by the per-token factor alone turns every per-request cost of the live path (HTTP, tokenization, the
client's own scheduling) into a per-token charge: right on the calibration workload's mix of lengths, too high on a
workload with longer prompts and too low on one with shorter (docs/fidelity.md).

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
from ..errors import InputError
from ..profiles import Profile
from .fidelity import live_replay, stats

#: the bracket of scales searched (each factor)
MIN_SCALE, MAX_SCALE = 1 / 16, 32.0
#: the joint fit stops when neither factor moved by more than this (relative) in a round: the simulator is
#: event-driven, so its means move in small steps with the costs and the fixed point is found to about 1 %
TOLERANCE = 0.02
MAX_ROUNDS = 16
#: from this round on each factor moves halfway (in log space) toward its new fit: a damped fixed-point iteration,
#: so that two factors that pull on each other's statistic settle instead of trading places round after round
DAMP_AFTER_ROUNDS = 4


def _damped(old: float, new: float, rounds: int) -> float:
    return math.sqrt(old * new) if rounds > DAMP_AFTER_ROUNDS else new
#: the step costs each factor multiplies (``[step]`` keys, then ``[mixing]`` keys)
DECODE_STEP_KEYS, DECODE_MIXING_KEYS = ("base_s", "decode_seq_s", "context_token_s"), ("grad2", "min_step_s")
PREFILL_STEP_KEYS, PREFILL_MIXING_KEYS = ("prefill_token_s",), ("grad1",)


class CalibrationError(InputError):
    """A calibration cannot be fitted (the message says why)."""


@dataclass
class Calibration:
    prefill_scale: float
    decode_scale: float
    #: as measured (the front end's latency is not fitted)
    api_overhead_s: float
    live_mean_tbt_s: float
    live_mean_ttft_s: float
    live_mean_e2e_s: float
    #: the simulator on the calibration requests, before and after
    sim_before: dict[str, float]
    sim_after: dict[str, float]
    rounds: int = 0
    #: ``mean`` or ``split`` (see the module docstring); with ``split`` the API overhead is fitted
    ttft_fit: str = "mean"

    def as_dict(self) -> dict:
        return {"prefill_scale": self.prefill_scale, "decode_scale": self.decode_scale,
                "api_overhead_s": self.api_overhead_s, "live_mean_tbt_s": self.live_mean_tbt_s,
                "live_mean_ttft_s": self.live_mean_ttft_s, "live_mean_e2e_s": self.live_mean_e2e_s,
                "sim_before": self.sim_before, "sim_after": self.sim_after, "rounds": self.rounds,
                "ttft_fit": self.ttft_fit}


def calibrated(profile: Profile, cal: Calibration) -> Profile:
    """``profile`` with the calibration applied (both factors, and the fitted API overhead with ``split``)."""
    return scaled(profile, cal.prefill_scale, cal.decode_scale).with_overrides(api_overhead_s=cal.api_overhead_s)


def scaled(profile: Profile, prefill_scale: float, decode_scale: float | None = None) -> Profile:
    """``profile`` with its per-prefill-token costs times ``prefill_scale`` and its per-step costs times
    ``decode_scale`` (the same factor for both when it is not given), the mixing estimator's copies with them."""
    sp, sd = prefill_scale, prefill_scale if decode_scale is None else decode_scale
    over = {k: getattr(profile, k) * sd for k in DECODE_STEP_KEYS + DECODE_MIXING_KEYS}
    over.update({k: getattr(profile, k) * sp for k in PREFILL_STEP_KEYS + PREFILL_MIXING_KEYS})
    return profile.with_overrides(**over)


def _means(records_runs: Sequence[Sequence[RequestRecord]]) -> dict[str, float]:
    """The median over runs (the mean of two) of each run's mean TBT, TTFT and E2E: one replay disturbed by the
    host does not move the calibration (as :func:`~lbbench.profiling.fidelity.compare` does not move the live side)."""
    per_run = [stats(recs) for recs in records_runs]
    return {k: float(np.median([r[k] for r in per_run])) for k in ("mean_tbt_s", "mean_ttft_s", "mean_e2e_s")}


def _live_means(live_runs: Sequence[Sequence[RequestRecord]]) -> dict[str, float]:
    """``_means`` of the live replays, refused where there is nothing to fit (no records, no TBT)."""
    if not live_runs or not all(live_runs):
        raise CalibrationError("calibration needs at least one live replay with records")
    live = _means(live_runs)
    if not (math.isfinite(live["mean_tbt_s"]) and live["mean_tbt_s"] > 0):
        raise CalibrationError("the calibration replay has no time between tokens (give outputs of 2+ tokens)")
    return live


def _settle(one_round: Callable[[float, float, int], tuple[float, float, float]]) -> tuple[float, float, int]:
    """Rounds of ``one_round(prefill, decode, rounds) -> (prefill, decode, moved)`` from factors 1 and 1 until
    one moves them by less than ``TOLERANCE``: the factors and the rounds taken."""
    sp = sd = 1.0
    for rounds in range(1, MAX_ROUNDS + 1):
        sp, sd, moved = one_round(sp, sd, rounds)
        if moved < TOLERANCE:
            return sp, sd, rounds
    raise CalibrationError(f"the prefill and decode factors did not settle in {MAX_ROUNDS} rounds "
                           f"(last x{sp:.3g} / x{sd:.3g})")


def _bisect(f: Callable[[float], float], target: float, what: str, *, iterations: int) -> float:
    """The factor in [MIN_SCALE, MAX_SCALE] at which the increasing ``f`` equals ``target`` (log-scale bisection);
    :class:`CalibrationError` when the bracket does not hold it."""
    lo, hi = math.log(MIN_SCALE), math.log(MAX_SCALE)
    if f(math.exp(lo)) > target or f(math.exp(hi)) < target:
        raise CalibrationError(what)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if f(math.exp(mid)) < target:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


TTFT_FITS = ("mean", "split")


def _ttft_halves(runs: Sequence[Sequence[RequestRecord]], threshold: int) -> tuple[float, float]:
    """Mean TTFT of the completed requests with prompts <= ``threshold`` tokens and of the longer ones: each run's,
    then the median over runs (the mean of two), as :func:`_means`."""
    halves = []
    for recs in runs:
        short, long_ = [], []
        for r in recs:
            if r.error is None and r.first_token_s is not None and r.finish_s is not None:
                (short if r.prompt_tokens <= threshold else long_).append(r.first_token_s - r.arrival_s)
        if short and long_:
            halves.append((float(np.mean(short)), float(np.mean(long_))))
    if not halves:
        raise CalibrationError("ttft split: the calibration prompts all have one length; give a workload whose "
                               "prompt lengths vary, or fit the mean")
    return float(np.median([h[0] for h in halves])), float(np.median([h[1] for h in halves]))


def _argmin_log(f: Callable[[float], float], *, iterations: int, grid: int = 25) -> float:
    """The factor in [MIN_SCALE, MAX_SCALE] minimising ``f``: a log-spaced grid, then golden-section search
    around its best point. Queueing makes the halves' TTFT a non-monotone function of the prefill cost (a long
    prefill delays the short prompts behind it too), so this is a search for the best fit, not a bisection."""
    xs = np.linspace(math.log(MIN_SCALE), math.log(MAX_SCALE), grid)
    values = [f(math.exp(x)) for x in xs]
    i = int(np.argmin(values))
    lo, hi = xs[max(i - 1, 0)], xs[min(i + 1, grid - 1)]
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = f(math.exp(a)), f(math.exp(b))
    for _ in range(iterations // 2):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = f(math.exp(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = f(math.exp(b))
    best = min((values[i], xs[i]), (fa, a), (fb, b))
    return math.exp(best[1])


def fit(profile: Profile, live_runs: Sequence[Sequence[RequestRecord]],
        simulate: Callable[[Profile], Sequence[RequestRecord]], *, iterations: int = 30,
        ttft: str = "mean") -> Calibration:
    """Fit ``prefill_scale`` to the live mean TTFT and ``decode_scale`` to the live mean TBT of ``live_runs``
    (live replays of one request set).

    ``simulate(profile)`` runs the simulator on the same requests with the same router and returns its records.
    ``ttft="split"`` fits the prefill factor and the API overhead to the TTFT's dependence on prompt length
    instead (module docstring).
    """
    if ttft not in TTFT_FITS:
        raise CalibrationError(f"ttft fit {ttft!r}: choose from {', '.join(TTFT_FITS)}")
    if ttft == "split":
        return _fit_split(profile, live_runs, simulate, iterations=iterations)
    live = _live_means(live_runs)
    live_tbt, live_ttft, live_e2e = live["mean_tbt_s"], live["mean_ttft_s"], live["mean_e2e_s"]
    bracket = f"factors {MIN_SCALE:g}-{MAX_SCALE:g} of profile {profile.name}"

    def sim(sp: float, sd: float, key: str) -> float:
        return stats(simulate(scaled(profile, sp, sd)))[key]

    def one_round(sp: float, sd: float, rounds: int) -> tuple[float, float, float]:
        new_sd = _bisect(lambda x: sim(sp, x, "mean_tbt_s"), live_tbt, iterations=iterations,
                         what=f"the live mean TBT ({live_tbt * 1e3:.2f} ms) is outside what decode-step {bracket} "
                              f"give (with the prefill costs x{sp:.3g})")
        new_sp = _bisect(lambda x: sim(x, new_sd, "mean_ttft_s"), live_ttft, iterations=iterations,
                         what=f"the live mean TTFT ({live_ttft * 1e3:.1f} ms) is outside what prefill {bracket} give "
                              f"(with the decode-step costs x{new_sd:.3g} and the measured API overhead "
                              f"{profile.api_overhead_s * 1e3:.2f} ms)")
        new_sd, new_sp = _damped(sd, new_sd, rounds), _damped(sp, new_sp, rounds)
        return new_sp, new_sd, max(abs(new_sd / sd - 1), abs(new_sp / sp - 1))

    sp, sd, rounds = _settle(one_round)
    return Calibration(prefill_scale=sp, decode_scale=sd, api_overhead_s=profile.api_overhead_s,
                       live_mean_tbt_s=live_tbt, live_mean_ttft_s=live_ttft, live_mean_e2e_s=live_e2e,
                       sim_before=stats(simulate(profile)), sim_after=stats(simulate(scaled(profile, sp, sd))),
                       rounds=rounds)


def _fit_split(profile: Profile, live_runs: Sequence[Sequence[RequestRecord]],
               simulate: Callable[[Profile], Sequence[RequestRecord]], *, iterations: int) -> Calibration:
    live = _live_means(live_runs)
    live_tbt = live["mean_tbt_s"]
    threshold = int(np.median([r.prompt_tokens for r in live_runs[0]]))
    live_short, live_long = _ttft_halves(live_runs, threshold)
    bracket = f"factors {MIN_SCALE:g}-{MAX_SCALE:g} of profile {profile.name}"
    base = profile.with_overrides(api_overhead_s=0.0)

    def sim(sp: float, sd: float) -> Sequence[RequestRecord]:
        return simulate(scaled(base, sp, sd))

    def one_round(sp: float, sd: float, rounds: int) -> tuple[float, float, float]:
        # the API overhead shifts every first token and finish alike: it moves neither the TBT nor the difference
        new_sd = _bisect(lambda x: stats(sim(sp, x))["mean_tbt_s"], live_tbt, iterations=iterations,
                         what=f"the live mean TBT ({live_tbt * 1e3:.2f} ms) is outside what decode-step {bracket} "
                              f"give (with the prefill costs x{sp:.3g})")

        def misfit(x: float) -> float:
            short, long_ = _ttft_halves([sim(x, new_sd)], threshold)
            overhead = max(0.0, ((live_short - short) + (live_long - long_)) / 2)
            return (live_short - short - overhead) ** 2 + (live_long - long_ - overhead) ** 2
        new_sp = _argmin_log(misfit, iterations=iterations)
        # the prefill factor is a best fit on a misfit the event-driven simulator makes flat and ragged near its
        # minimum; it follows the decode factor, so the rounds stop when the decode factor settles
        damped_sd = _damped(sd, new_sd, rounds)
        return new_sp, damped_sd, abs(damped_sd / sd - 1)

    sp, sd, rounds = _settle(one_round)
    sim_short, sim_long = _ttft_halves([sim(sp, sd)], threshold)
    overhead = max(0.0, ((live_short - sim_short) + (live_long - sim_long)) / 2)
    after = profile.with_overrides(api_overhead_s=overhead)
    return Calibration(prefill_scale=sp, decode_scale=sd, api_overhead_s=overhead, live_mean_tbt_s=live_tbt,
                       live_mean_ttft_s=live["mean_ttft_s"], live_mean_e2e_s=live["mean_e2e_s"],
                       sim_before=stats(simulate(profile)), sim_after=stats(simulate(scaled(after, sp, sd))),
                       rounds=rounds, ttft_fit="split")


def calibrated_toml(doc: dict, cal: Calibration, *, what: str) -> dict:
    """The profile TOML ``doc`` (as loaded) rewritten with the calibration applied, ``[calibration]`` and
    ``[source]`` lines saying what it was fitted on (``what``: the workload, seed, router and endpoints)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in doc.items()}
    step = out.setdefault("step", {})
    mixing = out.setdefault("mixing", {})
    src = out.setdefault("source", {})
    for keys, mkeys, s, on in ((DECODE_STEP_KEYS, DECODE_MIXING_KEYS, cal.decode_scale, "TBT"),
                               (PREFILL_STEP_KEYS, PREFILL_MIXING_KEYS, cal.prefill_scale, "TTFT")):
        for k in keys:
            step[k] = float(f"{step[k] * s:.5g}")
            src[k] = f"{src.get(k, 'as measured')}; then x{s:.4g} (calibrated: live mean {on} of {what})"
        for k in mkeys:
            if k in mixing:
                mixing[k] = float(f"{mixing[k] * s:.5g}")
    if cal.ttft_fit == "split":
        step["api_overhead_s"] = float(f"{cal.api_overhead_s:.5g}")
        src["api_overhead_s"] = (f"calibrated: the mean TTFT of the shorter half of the prompts of {what}, less the "
                                 "simulated engine's (the per-request intercept)")
    out["calibration"] = {
        "prefill_scale": float(f"{cal.prefill_scale:.5g}"), "decode_scale": float(f"{cal.decode_scale:.5g}"),
        "ttft_fit": cal.ttft_fit, "live_mean_tbt_s": float(f"{cal.live_mean_tbt_s:.5g}"),
        "live_mean_ttft_s": float(f"{cal.live_mean_ttft_s:.5g}"),
        "live_mean_e2e_s": float(f"{cal.live_mean_e2e_s:.5g}"),
        "sim_mean_e2e_before_s": float(f"{cal.sim_before['mean_e2e_s']:.5g}"),
        "sim_mean_e2e_after_s": float(f"{cal.sim_after['mean_e2e_s']:.5g}"),
    }
    src["calibration"] = (f"lbbench profile calibrate on {what}: decode-step costs x{cal.decode_scale:.4g} from the "
                          f"mean TBT ({cal.live_mean_tbt_s * 1e3:.2f} ms), prefill costs x{cal.prefill_scale:.4g} "
                          f"from the mean TTFT ({cal.live_mean_ttft_s * 1e3:.1f} ms), API overhead as measured; "
                          f"mean E2E not fitted (live {cal.live_mean_e2e_s:.3f} s, simulated "
                          f"{cal.sim_before['mean_e2e_s']:.3f} s before, {cal.sim_after['mean_e2e_s']:.3f} s after)")
    return out


def live_replays(requests: Sequence[Request], router_factory: Callable[[], object], endpoints: Sequence[str],
                 profile: Profile, *, repeats: int, seed: int,
                 progress: Callable[[str], None] = lambda what: None) -> list[list[RequestRecord]]:
    """``repeats`` live replays of ``requests`` with a fresh router each time."""
    runs = []
    for k in range(repeats):
        try:
            records = live_replay(requests, router_factory(), endpoints, profile, run_id=f"calibrate-live-{k}",
                                  seed=seed, what=f"calibration replay {k + 1}")
        except RuntimeError as e:
            raise CalibrationError(str(e)) from None
        runs.append(records)
        progress(f"calibration replay {k + 1}/{repeats}: mean E2E {stats(records)['mean_e2e_s']:.3f} s")
    return runs
