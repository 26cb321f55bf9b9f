"""A live load sweep far past capacity: the saturation stop keeps its saturated steps short (issue 32).

Issue 32 asks that a live sweep of 5, 10, 20 and 40 x capacity over emulated instances finish in under 2x the
time of its unsaturated points, with the saturated steps marked. The reading used here: the sweep is one
``lbbench run --rate a,b,...`` whose steps all replay the same number of requests; its *unsaturated points* are
the steps below capacity (by default one, at 0.5 x); the whole sweep must take under twice what those steps
take, i.e.

    sweep / unsaturated = 1 + (sum of the saturated steps' wall times) / (sum of the unsaturated steps') < 2

so the four saturated steps together must cost less than the unsaturated ones (``saturated / unsaturated`` < 1;
both ratios are printed). Without the stop this cannot hold: a saturated step must serve all N of its requests
at capacity C, at least N / C seconds whatever its rate, while the step at 0.5 x takes about 2 N / C, so four
saturated steps give at least 2 N / C more (sweep / unsaturated >= 2, and every queue makes it worse; the script
prints the simulator's makespans of the same steps as that no-stop baseline). With the stop a saturated step
lasts about the detection window plus, with ``drain``, the time to serve what it sent meanwhile (about rate / C
x the window), or with ``cancel`` next to nothing more.

Steps:

1. **Capacity.** The simulator (same profile, instances and request lengths) replays ``--requests`` requests
   all arriving at once (1000 req/s); capacity C = requests / makespan: the throughput of a cluster that is
   never idle.
2. **The sweep in the simulator** at 0.5 C, 5 C, 10 C, 20 C, 40 C (rates rounded to 3 digits): its saturation
   marks, each step's makespan (what a live step takes without the stop) and the request ids of every step.
3. **The live sweep**: ``lbbench serve-sim`` emulated instances, then ``lbbench run --endpoint ... --rate
   ...`` (one command) with ``--saturation-window`` and ``--on-saturation`` (one sweep per mode given). Each
   step's wall time is read from its records on its own run clock: from the step's start to its last event
   (a finish, a first token, a send, or the saturation mark, at which ``cancel`` ends every request in flight);
   the sum of the steps is checked against the command's wall time.
4. **Nothing dropped**: every request id of each step's trace (the simulator's records of that step) is in
   ``requests.parquet`` exactly once, either sent (dispatched to an instance: completed, failed or
   ``cancelled: saturated``) or recorded ``not sent: saturated``, never both. A cancelled request's record has
   no send time (the client aborts it, possibly in a load worker), so "sent" counts dispatched requests.

The default request shape (6,000 prompt tokens, 1 output token, two L4 instances) puts capacity near
1.8 req/s, so that 40 x capacity (about 70 req/s) is a rate a 2-core host can send; two A100 instances serve such
prompts at 4.8 req/s (40 x would be 190 req/s). One output token makes a request end at its prefill: the
profile's v0 scheduler runs waiting prefills before decodes, so with longer outputs every request of a burst
stays in flight until the burst's prefills are done, and a short window then marks bursts at 0.5 x capacity
saturated (6,000/2 tokens: 6 of 6 seeds at 0.5 x with a 4 s window in the simulator; 6,000/1: none of 6). The
window (default 4 s, about 3.5 prefills) is short so that the unsaturated step stays a few minutes: a step must
hold more requests than 40 C x window for the stop to fire at 40 x before everything was sent; with the default
30 s window that is over 2,000 requests a step and a 40-minute step at 0.5 x.

**Aborts.** ``cancel`` frees the instances only if they abort a request whose client went away, as vLLM does;
``serve-sim`` did not until this benchmark (aiohttp keeps a handler running after its client disconnects), so
each step after a cancelled one started on a cluster still serving the cancelled requests. After each sweep the
script reads the instances' running and waiting gauges: they must be 0. With load workers the driver does not
tell a worker to abort a cancelled request; its stream closes when the step's workers stop, right after.

Usage: python bench/saturation_sweep.py [--requests 400] [--window 4] [--on-saturation cancel,drain] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
from _common import log
from bench_proxy import wait_healthy  # bench/ is on the path when run as a script

NOT_SENT = "not sent: saturated"
CANCELLED = "cancelled: saturated"
LBBENCH = [sys.executable, "-m", "lbbench.cli"]


def lbbench(args: list[str]) -> tuple[str, float]:
    """Run ``lbbench ARGS``; its stdout and wall time (stderr goes to ours)."""
    t0 = time.perf_counter()
    out = subprocess.run(LBBENCH + args, check=True, stdout=subprocess.PIPE, text=True).stdout
    return out, time.perf_counter() - t0


def rate3(x: float) -> float:
    return float(f"{x:.3g}")


def workload_args(a: argparse.Namespace) -> list[str]:
    return ["run", "--profile", a.profile, "--instances", str(a.instances), "--workload", "poisson",
            "--prompt-tokens", str(a.prompt_tokens), "--output-tokens", str(a.output_tokens),
            "--requests", str(a.requests), "--seed", str(a.seed), "--timeline-interval", "0"]


def capacity(a: argparse.Namespace, tmp: Path) -> float:
    out, _ = lbbench(workload_args(a) + ["--rate", "1000", "--format", "json", "--out", str(tmp / "capacity")])
    row = json.loads(out)[0]
    return row["completed"] / row["makespan_s"]


def sim_sweep(a: argparse.Namespace, rates: list[float], tmp: Path) -> pl.DataFrame:
    """Per rate: the simulator's saturated mark, makespan and the step's request ids."""
    d = tmp / "sim"
    lbbench(workload_args(a) + ["--rate", ",".join(f"{r:g}" for r in rates), "--saturation-window",
                                str(a.window), "--format", "json", "--out", str(d)])
    df = pl.read_parquet(d / "requests.parquet")
    if "saturated" not in df.columns:
        df = df.with_columns(pl.lit(False).alias("saturated"))
    return df.group_by("rate_per_s").agg(
        pl.col("saturated").any().alias("sim_saturated"),
        (pl.col("finish_s").max() - pl.col("arrival_s").min()).alias("sim_makespan_s"),
        pl.col("request_id").sort().alias("ids")).sort("rate_per_s")


def left_on_servers(urls: list[str]) -> int:
    """Requests the emulated instances still run or queue (their vLLM gauges), summed."""
    import urllib.request

    total = 0.0
    for u in urls:
        with urllib.request.urlopen(u + "/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
                    total += float(line.rsplit(" ", 1)[1])
    return int(total)


def live_sweep(a: argparse.Namespace, rates: list[float], mode: str, urls: list[str], tmp: Path
               ) -> tuple[pl.DataFrame, float, float]:
    """The live sweep's per-step rows, the command's wall time and run.toml's ``wall_s``."""
    d = tmp / f"live-{mode}"
    eps = [x for u in urls for x in ("--endpoint", u)]
    _, wall = lbbench(workload_args(a) + eps + ["--rate", ",".join(f"{r:g}" for r in rates),
                                                "--saturation-window", str(a.window), "--on-saturation", mode,
                                                "--load-workers", a.load_workers, "--format", "json",
                                                "--out", str(d)])
    import tomllib

    run_wall = tomllib.loads((d / "run.toml").read_text()).get("wall_s", float("nan"))
    df = pl.read_parquet(d / "requests.parquet")
    if "saturated" not in df.columns:
        df = df.with_columns(pl.lit(False).alias("saturated"), pl.lit(None, pl.Float64).alias("saturated_at_s"))
    summary = pl.read_parquet(d / "summary.parquet")
    marked = (summary.group_by("rate_per_s").agg(pl.col("saturated").any().alias("summary_saturated"))
              if "saturated" in summary.columns else
              summary.select("rate_per_s").unique().with_columns(pl.lit(False).alias("summary_saturated")))
    err = pl.col("error")
    last = pl.max_horizontal("finish_s", "first_token_s", "dispatch_s", "actual_send_s", "saturated_at_s")
    steps = df.group_by("rate_per_s").agg(
        pl.len().alias("recorded"),
        pl.col("dispatch_s").is_not_null().sum().alias("sent"),
        (err == NOT_SENT).sum().alias("not_sent"),
        (err == CANCELLED).sum().alias("cancelled"),
        (err.is_not_null() & (err != NOT_SENT) & (err != CANCELLED)).sum().alias("failed"),
        err.is_null().sum().alias("completed"),
        pl.col("saturated").any().alias("records_saturated"),
        pl.col("saturated_at_s").max().alias("saturated_at_s"),
        last.max().alias("step_s"),
        pl.col("request_id").sort().alias("live_ids"),
        pl.col("request_id").n_unique().alias("unique_ids"),
        (pl.col("dispatch_s").is_not_null() ^ (err == NOT_SENT).fill_null(False)).all().alias("sent_or_marked"),
    )
    return steps.join(marked, on="rate_per_s", how="left").sort("rate_per_s"), wall, run_wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="The module docstring says what is measured and how the ratio is read.")
    ap.add_argument("--profile", default="llama3.1-8b-l4-v0")
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=6000)
    ap.add_argument("--output-tokens", type=int, default=1)
    ap.add_argument("--requests", type=int, default=400, help="requests per step (every step the same)")
    ap.add_argument("--unsaturated", default="0.5", help="comma-separated multiples of capacity below it")
    ap.add_argument("--factors", default="5,10,20,40", help="comma-separated multiples of capacity past it")
    ap.add_argument("--window", type=float, default=4.0, help="--saturation-window, seconds")
    ap.add_argument("--on-saturation", default="cancel", help="drain, cancel or both (comma-separated): a sweep each")
    ap.add_argument("--load-workers", default="auto", help="lbbench run --load-workers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="keep the run directories here (default: a temporary directory)")
    ap.add_argument("--port", type=int, default=8470)
    ap.add_argument("--quick", action="store_true",
                    help="smoke test (about 3 minutes): 120 requests a step, window 2 s, steps 0.5, 5 and 20 x, cancel")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the emulated instances on kill too
    if a.quick:
        a.requests, a.window, a.unsaturated, a.factors, a.on_saturation = 120, 2.0, "0.5", "5,20", "cancel"
    below = [float(x) for x in a.unsaturated.split(",")]
    above = [float(x) for x in a.factors.split(",")]
    load = os.getloadavg()
    log(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    with tempfile.TemporaryDirectory() as tmpname:
        tmp = a.out or Path(tmpname)
        cap = capacity(a, tmp)
        rates = [rate3(f * cap) for f in below + above]
        factor_of = dict(zip(rates, below + above))
        log(f"capacity {cap:.3f} req/s ({a.profile} x{a.instances}, {a.prompt_tokens}/{a.output_tokens} tokens); "
            f"rates {', '.join(f'{r:g}' for r in rates)}")
        sim = sim_sweep(a, rates, tmp)
        urls = [f"http://127.0.0.1:{a.port + i}" for i in range(a.instances)]
        results = []
        for mode in a.on_saturation.split(","):  # a fresh set of instances per sweep
            server = subprocess.Popen(LBBENCH + ["serve-sim", "--profile", a.profile, "--instances",
                                                 str(a.instances), "--port", str(a.port)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                for u in urls:
                    wait_healthy(u)
                try:
                    steps, wall, run_wall = live_sweep(a, rates, mode, urls, tmp)
                except subprocess.CalledProcessError as e:
                    print(f"\n{mode}: the sweep failed (exit {e.returncode}); its error is above")
                    continue
                left = left_on_servers(urls)
                results.append((mode, steps.join(sim, on="rate_per_s", how="left"), wall, run_wall, left))
            finally:
                server.terminate()
                server.wait(10)
    load = os.getloadavg()
    report = {"capacity_per_s": cap, "rates": rates, "load_avg_end": load, "sweeps": []}
    for mode, df, wall, run_wall, left in results:
        print(f"\n{mode}: lbbench run --rate {','.join(f'{r:g}' for r in rates)} --saturation-window {a.window:g} "
              f"--on-saturation {mode}; {a.requests} requests a step; capacity {cap:.3f} req/s")
        print("| rate (req/s) | x capacity | step wall (s) | no-stop (sim) (s) | sent | recorded | not sent | "
              "cancelled | completed | saturated (summary / sim) | all present |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
        t_sat = t_unsat = t_sat_nostop = t_unsat_nostop = 0.0
        ok_all = True
        rows = []
        for r in df.iter_rows(named=True):
            f = factor_of[r["rate_per_s"]]
            present = (r["recorded"] == a.requests and r["unique_ids"] == a.requests and r["sent_or_marked"]
                       and r["live_ids"] == r["ids"])
            ok_all &= present
            sat_summary = bool(r["summary_saturated"])
            at = "" if r["saturated_at_s"] is None else f" (at {r['saturated_at_s']:.1f} s)"
            print(f"| {r['rate_per_s']:g} | {f:g} | {r['step_s']:.1f} | {r['sim_makespan_s']:.1f} | {r['sent']} | "
                  f"{r['recorded']} | {r['not_sent']} | {r['cancelled']} | {r['completed']} | "
                  f"{'yes' if sat_summary else 'no'}{at} / "
                  f"{'yes' if r['sim_saturated'] else 'no'} | {'yes' if present else 'NO'} |")
            if f < 1:
                t_unsat += r["step_s"]
                t_unsat_nostop += r["sim_makespan_s"]
            else:
                t_sat += r["step_s"]
                t_sat_nostop += r["sim_makespan_s"]
            rows.append({k: v for k, v in r.items() if k not in ("ids", "live_ids")} | {"x_capacity": f})
        ratio = t_sat / t_unsat if t_unsat else float("inf")
        ratio_nostop = t_sat_nostop / t_unsat_nostop if t_unsat_nostop else float("inf")
        marked = all(bool(r["summary_saturated"]) == (factor_of[r["rate_per_s"]] > 1)
                     for r in df.iter_rows(named=True))
        print(f"saturated steps {t_sat:.1f} s / unsaturated {t_unsat:.1f} s = {ratio:.2f}; sweep / unsaturated "
              f"{1 + ratio:.2f} (target < 2: {'met' if ratio < 1 else 'MISSED'}); without the stop (simulator "
              f"makespans) {t_sat_nostop:.1f} / {t_unsat_nostop:.1f} = {ratio_nostop:.2f}, sweep / unsaturated "
              f"{1 + ratio_nostop:.2f}")
        print(f"command wall {wall:.1f} s (run.toml wall_s {run_wall:.1f}; steps' sum {t_sat + t_unsat:.1f}); "
              f"saturated marked exactly above capacity: {marked}; every trace request in requests.parquet, "
              f"sent or `{NOT_SENT}`: {ok_all}; requests still on the instances after the sweep: {left}")
        report["sweeps"].append({"mode": mode, "rows": rows, "ratio": ratio, "ratio_without_stop": ratio_nostop,
                                 "wall_s": wall, "run_wall_s": run_wall, "marked": marked, "all_present": ok_all,
                                 "left_on_servers": left})
    print(f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if a.json:
        a.json.write_text(json.dumps(report, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
