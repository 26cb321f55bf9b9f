"""``predicted_latency`` against the issue's targets: warm prediction error, decision cost, and its cold-start
fallback on a prefix-heavy run.

- ``mape``: each WORKLOAD (a ``--workload`` spec) on ``--instances`` x ``--profile`` (a uniform fleet) routed by
  ``predicted_latency``; prints the MAPE of the TTFT and TPOT predictions it acted on after 500 completions
  (target: TTFT <= 10 %), and the F1 of the SLO classification they imply (predicted TTFT over the SLO vs actual
  over it) at SLOs of the warm TTFTs' median and 90th percentile.
- ``decision``: a fitted router (trained on ``--train`` completions of a run) timed on the run's cluster state
  against ``least_requests``, interleaved: median and p99 of ``route`` in microseconds (target: median <= 200 us),
  and scikit-learn's own ``predict`` on the same rows for comparison.
- ``fallback``: ``predicted_latency`` and ``least_requests`` (its cold-start policy) on paired seeds of a
  prefix-heavy WORKLOAD: mean +- std over seeds of the mean E2E, p99 E2E, and the paired difference (target: never
  worse than least_requests by more than 2 % mean E2E).

Usage:
  python bench/bench_predicted_latency.py mape --profile PROFILE.toml --rate 14 agentic paper-mix
  python bench/bench_predicted_latency.py decision --profile PROFILE.toml --rate 14 agentic
  python bench/bench_predicted_latency.py fallback --profile PROFILE.toml --rate 14 --seeds 0-4 agentic
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace

import numpy as np
from _common import log  # bench/_common.py, beside this script

from lbbench.experiment.config import RunConfig
from lbbench.experiment.workload import build_requests
from lbbench.profiles import load_profile
from lbbench.routers import get_router
from lbbench.routers.latency_model import mape, slo_f1
from lbbench.sim.cluster import ClusterSim


def requests_of(workload: str, profile, rate: float, n: int, seed: int):
    """A ``--workload`` spec, ``poisson/PROMPT/OUTPUT``, or ``trace:PATH`` (prompts cut to 7,000 tokens, rescaled to ``rate``; a seed
    ``k`` starts ``k`` x ``n`` requests into the trace: windows stand in for seeds)."""
    if workload.startswith("trace:"):
        reqs = build_requests(RunConfig(trace=workload[6:], rate_per_s=rate, requests=n * (seed + 1),
                                        trace_options={"max_prompt_tokens": 7000, "prompt_overflow": "truncate"}),
                              profile, seed, None)[n * seed:]
        t0 = reqs[0].arrival_s
        return [replace(r, request_id=i, arrival_s=r.arrival_s - t0) for i, r in enumerate(reqs)]
    if workload.startswith("poisson/"):  # poisson/PROMPT/OUTPUT with lbbench's length specs (N or MEAN:CV)
        _, prompt, output = workload.split("/")
        return build_requests(RunConfig(workload="poisson", rate_per_s=rate, requests=n, prompt_tokens=prompt,
                                        output_tokens=output), profile, seed, None)
    return build_requests(RunConfig(workload=workload, rate_per_s=rate, requests=n), profile, seed, None)


def simulate(profile, instances: int, reqs, router, scheduler: str):
    sim = ClusterSim(profile, instances, reqs, instance_scheduler=scheduler, prefix_caching=True)
    return sim, sim.run(router)


def e2e(records) -> np.ndarray:
    return np.array([r.finish_s - r.arrival_s for r in records if r.error is None and r.finish_s is not None])


def cmd_mape(args, profile) -> None:
    print(f"predicted_latency warm prediction error ({args.instances} x {profile.name}, {args.scheduler} engines, "
          f"{args.requests} requests at {args.rate:g} req/s, seed {args.seed}; after 500 completions)")
    for w in args.workloads:
        reqs = requests_of(w, profile, args.rate, args.requests, args.seed)
        router = get_router("predicted_latency", num_instances=args.instances, seed=args.seed, profile=profile,
                            instance_scheduler=args.scheduler, **args.opts)
        t0 = time.process_time()
        _, recs = simulate(profile, args.instances, reqs, router, args.scheduler)
        cpu = time.process_time() - t0
        warm = router.warm_pairs["ttft"]
        if not warm:
            print(f"  {w:<32} no warm predictions ({router.completions} completions)")
            continue
        actual = np.array([a for _, a in warm])
        line = [f"  {w:<32} TTFT MAPE {mape(warm):5.1f} %  TPOT MAPE {_pct(mape(router.warm_pairs['tpot']))}  "
                f"({len(warm)} warm predictions, mean TTFT {actual.mean():.3f} s)"]
        for q in (50, 90):
            slo = float(np.percentile(actual, q))
            f1 = slo_f1(warm, slo)
            line.append(f"F1 at SLO {slo:.3f} s (p{q}) {'n/a' if f1 is None else f'{f1:.2f}'}")
        print("; ".join(line) + f"; {router.num_fits} fits, {cpu:.0f} s CPU")


def _pct(v: float | None) -> str:
    return "  n/a" if v is None else f"{v:5.1f} %"


def cmd_decision(args, profile) -> None:
    import copy

    from threadpoolctl import threadpool_limits

    w = args.workloads[0]
    reqs = requests_of(w, profile, args.rate, args.train, args.seed)
    router = get_router("predicted_latency", num_instances=args.instances, seed=args.seed, profile=profile,
                        instance_scheduler=args.scheduler, **args.opts)
    simulate(profile, args.instances, reqs, router, args.scheduler)
    assert router.fitted
    # a loaded cluster state: the same workload, routed least_requests up to mid-run, one request at the head
    state = ClusterSim(profile, args.instances, requests_of(w, profile, args.rate, 400, args.seed + 1),
                       instance_scheduler=args.scheduler, prefix_caching=True)
    least = get_router("least_requests", num_instances=args.instances)
    mid = state.requests[len(state.requests) // 2].arrival_s
    for r in state.requests:
        if r.arrival_s > mid:
            break
        state.advance(r.arrival_s)
        while len(state.queue) > 1:
            state.dispatch(0, least.route(state.queue, state.view(), state.now_s).instance)
    queue, view, now = state.queue, state.view(), state.now_s
    busy = sum(iv.num_outstanding for iv in view.instances)
    # the same fitted router predicting through scikit-learn's own predict (one call per model) instead
    with_sklearn = copy.deepcopy(router)
    models = _sk_models(router)
    model = with_sklearn.model

    def sk_predict(x, queued):
        per = len(model.targets)
        raw = np.stack([m.predict(x) for m in models], axis=1)
        if model.gated:
            raw = np.where(queued[:, None], raw[:, per:], raw[:, :per])
        return np.exp(raw) if model.loss == "relative" else raw
    model.predict = sk_predict
    fns = {"least_requests": lambda: least.route(queue, view, now),
           "predicted_latency": lambda: router.route(queue, view, now),
           "predicted_latency, sklearn predict": lambda: with_sklearn.route(queue, view, now)}
    print(f"decision cost ({args.instances} x {profile.name}, {busy} requests in flight, fitted on {args.train} "
          f"requests of {w}: {router.model.describe()}; {args.repeats} interleaved rounds per pair)")
    # two interleaved pairs: the router against its fallback, and its flattened trees against sklearn's predict
    # (kept apart: sklearn's heavy calls slow whatever runs right after them)
    for pair in (("least_requests", "predicted_latency"), ("predicted_latency", "predicted_latency, sklearn predict")):
        timings: dict[str, list[float]] = {name: [] for name in pair}
        with threadpool_limits(1):
            for _ in range(args.repeats):  # interleaved: one call of each per round
                for name in pair:
                    t = time.perf_counter()
                    fns[name]()
                    timings[name].append(time.perf_counter() - t)
        for name, ts in timings.items():
            us = np.array(ts) * 1e6
            print(f"  {name:<40} median {np.median(us):8.1f} us   p99 {np.percentile(us, 99):8.1f} us")


def _sk_models(router):
    """The fitted scikit-learn models behind the router's flattened trees, refit here on its samples (one per
    target and regime, as ``LatencyModel.fit`` does), for timing their own ``predict``."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    from lbbench.routers.latency_model import TREE_PARAMS
    m = router.model
    out = []
    for t in m.targets:
        for q in ((False, True) if m.gated else (None,)):
            x, y = m._samples(t, q)
            out.append(HistGradientBoostingRegressor(**TREE_PARAMS).fit(x, y))
    return out


def cmd_fallback(args, profile) -> None:
    w = args.workloads[0]
    lo, _, hi = args.seeds.partition("-")
    seeds = list(range(int(lo), int(hi or lo) + 1))
    res: dict[str, list[tuple[float, float]]] = {"least_requests": [], "predicted_latency": []}
    for seed in seeds:
        reqs = requests_of(w, profile, args.rate, args.requests, seed)
        for name in res:  # the same requests for both (paired)
            opts = args.opts if name == "predicted_latency" else {}
            router = get_router(name, num_instances=args.instances, seed=seed, profile=profile,
                                instance_scheduler=args.scheduler, **opts)
            _, recs = simulate(profile, args.instances, reqs, router, args.scheduler)
            x = e2e(recs)
            res[name].append((float(x.mean()), float(np.percentile(x, 99))))
            log(f"seed {seed} {name}: mean E2E {x.mean():.3f} s, p99 {np.percentile(x, 99):.2f} s")
    print(f"predicted_latency vs least_requests ({args.instances} x {profile.name}, {args.scheduler} engines, "
          f"prefix caching on, {w}, {args.requests} requests at {args.rate:g} req/s, seeds {args.seeds})")
    for name, v in res.items():
        means = [m for m, _ in v]
        print(f"  {name:<18} mean E2E {statistics.mean(means):.3f} +- {statistics.stdev(means) if len(means) > 1 else 0:.3f} s"
              f"   p99 E2E {statistics.mean(p for _, p in v):.2f} s")
    diff = [100 * (p[0] - l[0]) / l[0] for p, l in zip(res["predicted_latency"], res["least_requests"])]
    print(f"  paired difference (predicted_latency - least_requests) / least_requests: "
          f"{statistics.mean(diff):+.2f} % (per seed: {', '.join(f'{d:+.1f}' for d in diff)})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("mape", "decision", "fallback"))
    ap.add_argument("workloads", nargs="+")
    ap.add_argument("--profile", required=True)
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--rate", type=float, default=14.0)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--scheduler", default="fcfs", choices=("fcfs", "priority"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", default="0-4", help="fallback: paired seeds A-B")
    ap.add_argument("--train", type=int, default=1500, help="decision: requests the router trains on first")
    ap.add_argument("--repeats", type=int, default=3000)
    ap.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                    help="a predicted_latency option (repeatable), e.g. loss=squared")
    args = ap.parse_args(argv)
    args.opts = {}
    for item in args.opt:
        k, _, v = item.partition("=")
        args.opts[k] = (v == "true") if v in ("true", "false") else (float(v) if v.replace(".", "").isdigit() and "." in v
                                                                    else int(v) if v.isdigit() else v)
    profile = load_profile(args.profile)
    {"mape": cmd_mape, "decision": cmd_decision, "fallback": cmd_fallback}[args.command](args, profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
