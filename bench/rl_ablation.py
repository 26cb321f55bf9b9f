"""Ablation of the RL router's formulation: one row per fix, what each buys.

Each row trains ``wgrl`` (4 x llama2-7b-v100, paper-mix, 20 req/s by default)
with the fixes of the rows above it switched on, then evaluates the exported
network with ``lbbench run`` on paired evaluation seeds 0..N-1 (disjoint from
the training and validation seeds) with ``--predictor noisy:0.79``. The rows:

1. ``before``: lbbench's earlier formulation — literal guidance schedule (the
   weight grows to γ), γ per decision, the interference estimator, exact
   output lengths in training;
2. ``+fading``: the heuristic-guided RL schedule (guidance fades, TD discount λ_kγ);
3. ``+time``: one decision epoch per Δt, γ per epoch (the paper's MDP);
4. ``+paper-mix``: the paper's mixing estimator r_mix;
5. ``+predictor``: training and validation with the evaluation predictor
   (rows 1-5 together are the paper's formulation, the default);
6. ``+centering``: reward centering (deviation);
7. ``+guidance``: β_d = 0.1 and guidance scale 10 (slower fading, a stronger heuristic pull);
8. ``+shared``: the permutation-equivariant Q-network (deviation);
9. ``+no-defer``: no defer action while an instance is up (deviation; rows 6-9
   are the shipped ``wgrl`` recipe).

Side rows apply to the row above them and are not carried on:
``+permute`` (instance-permutation augmentation of the MLP, after row 7) and
``+bootstrap`` (no terminal at the end of an episode's routing, after row 9).

The network itself is evaluated (``gate=false``: the validation gate, which
may hand a checkpoint to its heuristic, is off here); the table also shows the
network's and the heuristic's mean E2E on the gate's fresh validation seeds.

Prints a Markdown table with mean E2E ± std, the change against round robin,
p99, router wait and the training wall time of each row.

    python bench/rl_ablation.py --episodes 30 --seeds 5 --jobs 2 --out runs/ablation
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

from _common import train_config, train_workload_args  # bench/_common.py, beside this script

from lbbench.distributed import get_executor
from lbbench.routers.rl.policy import QPolicy

ROWS: list[tuple[str, dict, bool]] = [  # (name, change, carried on to the next rows)
    ("before", dict(guidance_schedule="literal", discount="decision", estimator="interference",
                    predictor="oracle"), True),
    ("+fading", dict(guidance_schedule="fading"), True),
    ("+time", dict(discount="time"), True),
    ("+paper-mix", dict(estimator="paper"), True),
    ("+predictor", dict(predictor="noisy:0.79"), True),
    ("+centering", dict(reward_centering=True), True),
    ("+guidance", dict(beta_d=0.1, guidance_scale=10.0), True),
    ("+permute", dict(permute_instances=True), False),
    ("+shared", dict(network="shared"), True),
    ("+no-defer", dict(max_defer_s=0.0), True),
    ("+bootstrap", dict(bootstrap_end=True), False),
]


def evaluate(ckpt: Path, args: argparse.Namespace) -> dict[str, dict]:
    exe = str(Path(sys.executable).with_name("lbbench"))
    cmd = [exe, "run", "--profile", args.profile, "--instances", str(args.instances), "--workload", "paper-mix",
           "--rate", str(args.rate), "--requests", str(args.requests), "--router", "round_robin,wgrl",
           "--checkpoint", str(ckpt), "--router-opt", "wgrl.gate=false", "--predictor", "noisy:0.79", "--seeds", str(args.seeds),
           "--format", "json", "--out", str(ckpt / "eval")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"evaluation failed: {res.stderr.strip()[-400:]}")
    return {r["router"]: r for r in json.loads(res.stdout)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    train_workload_args(ap, requests=2000)
    ap.add_argument("--episodes", type=int, default=30)
    ap.add_argument("--explore-episodes", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--rows", default="", help="comma-separated row names (default: all)")
    ap.add_argument("--out", default="runs/rl-ablation")
    ap.add_argument("--jobs", type=int, default=1, help="rows trained in parallel processes")
    args = ap.parse_args()

    cfg = train_config(args, router="wgrl", episodes=args.episodes, explore_episodes=args.explore_episodes)
    wanted = set(filter(None, args.rows.split(",")))
    plan = []
    for name, change, carried in ROWS:
        row_cfg = dataclasses.replace(cfg, **change)
        if carried:
            cfg = row_cfg
        if not wanted or name in wanted:
            plan.append((name, row_cfg, Path(args.out) / name.lstrip("+"), args))
    print("| row | mean E2E (s) | vs round robin | p99 E2E (s) (rr) | router wait (s) "
          "| validation: network / heuristic (s) | training (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    lines: dict[int, str] = {}
    shown = 0
    with get_executor(args.jobs, batch_size=1) as ex:  # rows in parallel (spawn processes), printed in order
        for i, line in ex.submit(plan, run_row):
            lines[i] = line
            while shown in lines:
                print(lines.pop(shown), flush=True)
                shown += 1


def run_row(job: tuple) -> str:
    """Train one row and evaluate it; its Markdown line."""
    from lbbench.training.rounds import train

    name, cfg, out, args = job
    t0 = time.perf_counter()
    train(cfg, out, progress=False)
    wall_s = time.perf_counter() - t0
    rows = evaluate(out, args)
    w, rr = rows["wgrl"], rows["round_robin"]
    v = QPolicy.load(out).meta.get("validation") or {}
    val = f"{v['network_e2e_s']:.1f} / {v['heuristic_e2e_s']:.1f}" if v else ""
    return (f"| {name} | {w['mean_e2e_s']:.1f} ± {w['mean_e2e_std_s']:.1f} | "
            f"{w['improvement_vs_round_robin_pct']:+.1f} % | {w['p99_e2e_s']:.1f} ({rr['p99_e2e_s']:.1f}) | "
            f"{w['mean_router_wait_s']:.2f} | {val} | {wall_s:.0f} |")


if __name__ == "__main__":
    main()
