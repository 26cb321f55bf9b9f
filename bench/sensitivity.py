"""How much routing gain survives worse output-length predictions.

Runs the paper setup (4 x llama2-7b-v100, paper-mix, 20 req/s, 2000 requests, paired
seeds) for each predictor accuracy and prints the mean-E2E improvement over round robin
of each length-aware router; writes a PNG plot with --plot.

Usage: python bench/sensitivity.py [--seeds 3] [--accuracies 1.0,0.9,0.8,0.7,0.5]
       [--routers min_min,jsq,decode_balancer,late_binding_srpt] [--plot sensitivity.png]
"""

from __future__ import annotations

import argparse

import polars as pl

from lbbench.experiment import RunConfig, simulate
from lbbench.profiles import load_profile
from lbbench.metrics.summary import summarize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--accuracies", default="1.0,0.9,0.8,0.7,0.5")
    ap.add_argument("--routers", default="min_min,jsq,decode_balancer,late_binding_srpt")
    ap.add_argument("--plot", default=None, help="write a PNG plot here")
    args = ap.parse_args()
    profile = load_profile("llama2-7b-v100")
    routers = args.routers.split(",")
    specs = ["oracle"] + [f"noisy:{a}" for a in args.accuracies.split(",")]
    rows = []
    for spec in specs:
        cfg = RunConfig(routers=["round_robin", *routers], seeds=args.seeds, predictor=spec,
                        requests=args.requests, timeline_interval_s=None)
        frames = [out.records for out in simulate(cfg, profile, run_id=f"sens-{spec}")]
        summ = summarize(pl.concat(frames))
        for r in summ.iter_rows(named=True):
            if r["router"] != "round_robin":
                rows.append({"predictor": spec, "router": r["router"],
                             "improvement_pct": r["improvement_vs_round_robin_pct"],
                             "mean_e2e_s": r["mean_e2e_s"], "p99_e2e_s": r["p99_e2e_s"]})
    table = pl.DataFrame(rows).pivot(on="router", index="predictor", values="improvement_pct")
    print(f"mean E2E improvement over round robin (%), {args.seeds} paired seeds, 4 x llama2-7b-v100, "
          f"paper-mix, 20 req/s, {args.requests} requests")
    with pl.Config(tbl_rows=-1, tbl_cols=-1, float_precision=1, tbl_hide_dataframe_shape=True):
        print(table)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.2))
        accs = [1.0 if s == "oracle" else float(s.split(":")[1]) for s in specs]
        for router in routers:
            ys = [next(r["improvement_pct"] for r in rows if r["predictor"] == s and r["router"] == router)
                  for s in specs[1:]]
            ax.plot(accs[1:], ys, marker="o", label=router)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel("predictor bucket accuracy")
        ax.set_ylabel("mean E2E improvement over round robin (%)")
        ax.set_title("Routing gain vs output-length prediction accuracy\n4 x llama2-7b-v100, paper-mix, 20 req/s")
        ax.invert_xaxis()
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
