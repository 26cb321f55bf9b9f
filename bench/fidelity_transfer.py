"""Re-analyse a recorded transfer check: the same live replays, calibrated each way, with the residual tables.

``lbbench fidelity --calibrate-on ... --check-on ... --out DIR`` keeps every live record. This script rebuilds the
requests of each workload from them (arrival, prompt and output tokens), re-fits the calibration on the calibration
workload's live replays with each ``--ttft-fit`` (``mean``: the prefill factor to the mean TTFT; ``split``: the
prefill factor and a per-request API overhead to the shorter and longer prompts' TTFT), simulates every workload
with the result and prints the transfer table and the residuals by prompt length and by batch size. No live engine
is needed, so the fits are compared on exactly the same live data.

    python bench/fidelity_transfer.py DIR --profile MEASURED.toml [--ttft-fit mean,split] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import polars as pl

from lbbench.core import Request, RequestRecord
from lbbench.profiles import load_profile
from lbbench.profiling.residuals import residual_tables
from lbbench.profiling.transfer import evaluate_transfer

RECORD_FIELDS = {f.name for f in dataclasses.fields(RequestRecord)}


def _records(df: pl.DataFrame) -> list[RequestRecord]:
    return [RequestRecord(**{k: v for k, v in row.items() if k in RECORD_FIELDS}) for row in df.iter_rows(named=True)]


def _requests(df: pl.DataFrame) -> list[Request]:
    rows = df.sort("request_id").select("request_id", "arrival_s", "prompt_tokens", "output_tokens")
    return [Request(**row) for row in rows.iter_rows(named=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--profile", required=True, help="the profile as measured (not calibrated)")
    ap.add_argument("--ttft-fit", default="mean,split")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    run = Path(args.run_dir)
    report = json.loads((run / "fidelity.json").read_text())
    recs = pl.read_parquet(run / "records.parquet")
    cal_label = report["calibrated_on"]
    check_labels = [c["workload"] for c in report["checks"]]
    cal_router = report["calibration_fit"]["router"]
    routers = sorted({r["router"] for c in report["checks"] for r in c["routers"]})
    live_rows = recs.filter(pl.col("source").str.starts_with("live-"))
    live = {}
    for (label, router, source), part in live_rows.group_by(["workload", "router", "source"], maintain_order=True):
        live.setdefault((label, router), []).append((source, _records(part)))
    live = {k: [r for _, r in sorted(v)] for k, v in live.items()}

    def first_live(label: str) -> pl.DataFrame:
        return live_rows.filter((pl.col("workload") == label) & (pl.col("source") == "live-0")).unique("request_id")

    prof = load_profile(args.profile)
    instances = int(live_rows["instance"].max()) + 1
    out = {}
    for ttft_fit in args.ttft_fit.split(","):
        res = evaluate_transfer(prof, (cal_label, _requests(first_live(cal_label))),
                                [(label, _requests(first_live(label))) for label in check_labels], routers,
                                instances, live, calibration_router=cal_router, ttft_fit=ttft_fit)
        c = res.calibration
        print(f"\n== {ttft_fit} TTFT fit: decode x{c.decode_scale:.3f}, prefill x{c.prefill_scale:.3f}, "
              f"API overhead {c.api_overhead_s * 1e3:.1f} ms")
        print(f"{'workload':<60} {'router':<12} {'E2E err':>8} {'p50 err':>8} {'TTFT err':>9} {'TBT err':>8} "
              f"{'spread':>7} {'uncal':>7}")
        rows = [("calibrated on " + cal_label, res.calibration_fit, None)]
        rows += [("checked on " + ch.workload, r, ch.uncalibrated_mean_e2e_error_pct.get(r.router))
                 for ch in res.checks for r in ch.routers]
        for label, r, uncal in rows:
            d = r.as_dict()
            print(f"{label[:60]:<60} {r.router:<12} {r.mean_e2e_error_pct:>+7.1f}% {d['p50_e2e_error_pct']:>+7.1f}% "
                  f"{r.ttft_mean_error_pct:>+8.1f}% {r.tbt_mean_error_pct:>+7.1f}% {r.live_spread_pct:>6.1f}% "
                  f"{'-' if uncal is None else f'{uncal:+.1f}%':>7}")
        tables = residual_tables(res.records)
        for by, df in tables.items():
            print(f"-- residuals by {by}")
            with pl.Config(tbl_rows=100, tbl_width_chars=200, fmt_str_lengths=40):
                print(df.with_columns(pl.col("workload").str.slice(0, 40))
                      .select("workload", by, "requests", "e2e_error_pct", "ttft_error_pct",
                              "live_ttft_s", "sim_ttft_s"))
        out[ttft_fit] = {**res.as_dict(), "residuals": {k: v.to_dicts() for k, v in tables.items()}}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
