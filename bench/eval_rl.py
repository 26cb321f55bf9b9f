"""Evaluate the RL routers against round robin and print the paper-style table.

Runs ``lbbench run`` (the same command a user types; paired seeds 0..N-1,
disjoint from the training and validation seeds) and prints one Markdown row
per router: mean E2E ± std over the seeds, the change against round robin, p50
/ p99 E2E, preemptions per run and mean router wait. Each learned router also
reports how often its out-of-distribution guard handed the decision to the
guidance heuristic (replayed through ``ClusterSim`` on the same workloads).

    python bench/eval_rl.py                       # 4 x V100, paper-mix, 20 req/s, noisy:0.79, 5 seeds
    python bench/eval_rl.py --checkpoint wgrl=DIR --routers round_robin,wgrl
    python bench/eval_rl.py --trace FILE --profile llama3.1-8b-a100-v0 --rate 8 --extra "--max-prompt-tokens 1000"
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LEARNED = ("baseline_rl", "wa_rl", "wgrl")


def run_cli(args: argparse.Namespace, out_dir: str) -> tuple[list[dict], list[str], float]:
    cmd = ["lbbench", "run", "--profile", args.profile, "--instances", str(args.instances),
           "--router", args.routers, "--predictor", args.predictor, "--seeds", str(args.seeds),
           "--format", "json"]
    if args.trace:
        cmd += ["--trace", args.trace]
    else:
        cmd += ["--workload", args.workload]
    if args.rate:
        cmd += ["--rate", str(args.rate)]
    if args.requests:
        cmd += ["--requests", str(args.requests)]
    if args.checkpoint:
        cmd += ["--checkpoint", args.checkpoint]
    cmd += shlex.split(args.extra)
    t0 = time.perf_counter()
    exe = str(Path(sys.executable).with_name("lbbench"))
    res = subprocess.run([exe, *cmd[1:], "--out", out_dir], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"lbbench run failed ({res.returncode}): {res.stderr.strip()[-400:]}")
    return json.loads(res.stdout), cmd, time.perf_counter() - t0


def fallback_share(args: argparse.Namespace, router: str) -> float | None:
    """Share of decisions the OOD guard handed to the heuristic, over the run's seeds."""
    from lbbench.experiment import RunConfig, build_requests
    from lbbench.predict import annotate, load_predictor
    from lbbench.profiles import load_profile
    from lbbench.routers import get_router
    from lbbench.sim.cluster import ClusterSim

    prof = load_profile(args.profile)
    opts: dict = {}
    for part in (args.checkpoint or "").split(","):
        name, eq, path = part.partition("=")
        if eq and name == router:
            opts["checkpoint"] = path
        elif part and not eq:
            opts["checkpoint"] = part
    trace_opts = {}
    extra = shlex.split(args.extra)
    if "--max-prompt-tokens" in extra:
        trace_opts["max_prompt_tokens"] = int(extra[extra.index("--max-prompt-tokens") + 1])
    if "--window" in extra:
        start, _, end = extra[extra.index("--window") + 1].partition(":")
        trace_opts["window"] = (float(start or 0.0), float(end or "inf"))
    cfg = RunConfig(profile=prof.name, instances=args.instances, workload=args.workload, trace=args.trace,
                    trace_options=trace_opts, rate_per_s=args.rate or None, requests=args.requests)
    if not args.trace:
        opts.setdefault("workload", args.workload)
    else:
        opts.setdefault("workload", f"trace:{Path(args.trace).name}")
    pred = load_predictor(args.predictor, profile=prof, seed=0)
    fb = dec = 0
    for seed in range(args.seeds):
        r = get_router(router, num_instances=args.instances, seed=seed, profile=prof, **opts)
        ClusterSim(prof, args.instances, annotate(build_requests(cfg, prof, seed, None), pred), seed=seed).run(r)
        fb, dec = fb + r.num_fallbacks, dec + r.num_decisions
    return fb / dec if dec else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="llama2-7b-v100")
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--workload", default="paper-mix")
    ap.add_argument("--trace", default=None)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--routers", default="round_robin,baseline_rl,wa_rl,wgrl")
    ap.add_argument("--predictor", default="noisy:0.79")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--checkpoint", default=None, help="as lbbench run --checkpoint")
    ap.add_argument("--extra", default="", help="further lbbench run flags, quoted")
    ap.add_argument("--no-fallback-share", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows, cmd, wall_s = run_cli(args, tmp)
    print("command: " + " ".join(shlex.quote(c) for c in cmd))
    print(f"wall time: {wall_s:.0f} s\n")
    print("| router | mean E2E (s) | vs round robin | p50 / p99 E2E (s) | preemptions | router wait (s) "
          "| OOD fallbacks |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        share = ""
        if r["router"] in LEARNED and not args.no_fallback_share:
            s = fallback_share(args, r["router"])
            share = "" if s is None else f"{100 * s:.1f} %"
        print(f"| {r['router']} | {r['mean_e2e_s']:.1f} ± {r['mean_e2e_std_s']:.1f} | "
              f"{r['improvement_vs_round_robin_pct']:+.1f} % | {r['p50_e2e_s']:.1f} / {r['p99_e2e_s']:.1f} | "
              f"{r['preemptions']:.0f} | {r['mean_router_wait_s']:.2f} | {share} |")


if __name__ == "__main__":
    main()
