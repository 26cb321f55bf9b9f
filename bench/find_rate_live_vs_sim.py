"""``lbbench run --find-rate`` live against emulated instances and in the simulator: do they find the same rate?

Issue 32: against ``serve-sim`` instances of one profile, the live search's rate should lie within 10 % of the
simulator's, or the difference be explained. Both searches are the same command (``planning.find_rate``: an
exponential probe from ``--start``, geometric bisection to ``--tol``, each probe's seeds run one at a time and
stopped once the rest cannot change whether it meets the target), the same profile, instances, workload, SLO,
attainment target and seeds; the simulated one runs in virtual time, the live one against ``lbbench serve-sim``
(whose instances are the simulator's instance model on the wall clock) through the HTTP client. Live, each seed
is a repeat of the same arrivals (the seed's workload), so the two searches probe the same requests and a
difference comes from the live path alone (client lag, HTTP and streaming overhead, the emulator's clock).

The default workload is shortened so that the live search fits in about 5-10 minutes at rates a 2-core host
sends: Poisson arrivals of 2,000-token prompts and 32-token outputs (few streamed chunks), 300 requests a
probe, 2 seeds, TTFT <= 1 s for 95 % of requests, tolerance 5 %. On two ``llama3.1-8b-a100-v0`` instances the
simulator finds about 12 req/s.

Prints each search's rate, bracket, probes (rate -> attainment, seeds run) and wall time, then live / sim and
whether it is within 10 %, the attainments of the rates both probed side by side, and, per rate and seed run
in both, how far each live request's TTFT lies from the same request's simulated TTFT and how many requests the
TTFT limit judged differently (checking on the way that every live probe's run.toml says it ran live).

Usage: python bench/find_rate_live_vs_sim.py [--requests 300] [--seeds 2] [--slo ttft=1] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import log
from bench_proxy import wait_healthy  # bench/ is on the path when run as a script

LBBENCH = [sys.executable, "-m", "lbbench.cli"]


def find_rate(a: argparse.Namespace, out: Path, endpoints: list[str]) -> tuple[dict, float]:
    """``lbbench run --find-rate`` (live when ``endpoints``): its one row and the command's wall time."""
    eps = [x for u in endpoints for x in ("--endpoint", u)]
    args = ["run", "--profile", a.profile, "--instances", str(a.instances), "--workload", "poisson",
            "--prompt-tokens", str(a.prompt_tokens), "--output-tokens", str(a.output_tokens),
            "--requests", str(a.requests), "--seeds", str(a.seeds), "--router", a.router, "--find-rate",
            "--slo", a.slo, "--attainment", str(a.attainment), "--find-rate-start", str(a.start),
            "--find-rate-tol", str(a.tol), "--timeline-interval", "0", "--format", "json", "--out", str(out)] + eps
    t0 = time.perf_counter()
    got = subprocess.run(LBBENCH + args, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(got)["rows"][0], time.perf_counter() - t0


def paired_ttft(sim_dir: Path, live_dir: Path, limit_s: float | None) -> list[str]:
    """Per rate and seed run in both: the live requests' TTFT minus the simulated ones' (paired by request id),
    median and p99 in ms, and how many requests the TTFT limit judged differently; checks every live probe ran
    live (run.toml's backend)."""
    import tomllib

    import polars as pl

    out = []
    for live_toml in sorted(live_dir.glob("*/rate*/seed*/run.toml"),
                            key=lambda p: (float(p.parent.parent.name[4:]), p.parent.name)):
        if tomllib.loads(live_toml.read_text())["config"].get("backend") != "live":
            raise SystemExit(f"{live_toml} did not run live")
        sim_req = sim_dir / live_toml.parent.relative_to(live_dir) / "requests.parquet"
        if not sim_req.exists():
            continue
        ttft = (pl.col("first_token_s") - pl.col("arrival_s")).alias("ttft_s")
        both = pl.read_parquet(live_toml.parent / "requests.parquet").select("request_id", ttft).join(
            pl.read_parquet(sim_req).select("request_id", ttft), on="request_id", suffix="_sim")
        d = (both["ttft_s"] - both["ttft_s_sim"]) * 1000
        flips = 0 if limit_s is None else int(((both["ttft_s"] <= limit_s) != (both["ttft_s_sim"] <= limit_s)).sum())
        out.append(f"{live_toml.parent.parent.name[4:]}/{live_toml.parent.name}: {d.median():+.1f} / "
                   f"{d.quantile(0.99):+.1f} ms, {flips} of {both.height} judged differently")
    return out


def fmt_rate(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def describe(name: str, row: dict, wall: float) -> str:
    lo, hi = row["bracket"]
    probes = ", ".join(f"{p['rate_per_s']:g}: {100 * p['attainment']:.1f} % ({p['seeds_run']}/{p['seeds']})"
                       for p in row["probes"])
    return (f"| {name} | {fmt_rate(row['rate_per_s'])} | [{fmt_rate(lo)}, {fmt_rate(hi) if hi else '>'}] | "
            f"{len(row['probes'])} | {sum(p['seeds_run'] for p in row['probes'])} | {wall:.0f} | {probes} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="The module docstring says what is compared.")
    ap.add_argument("--profile", default="llama3.1-8b-a100-v0")
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=300, help="requests per probe and seed")
    ap.add_argument("--seeds", type=int, default=2, help="paired seeds (live: repeats of the same arrivals)")
    ap.add_argument("--router", default="round_robin")
    ap.add_argument("--slo", default="ttft=1")
    ap.add_argument("--attainment", type=float, default=0.95)
    ap.add_argument("--start", type=float, default=8.0, help="--find-rate-start, req/s")
    ap.add_argument("--tol", type=float, default=0.05, help="--find-rate-tol")
    ap.add_argument("--port", type=int, default=8480)
    ap.add_argument("--quick", action="store_true",
                    help="smoke test (about 2 minutes): 120 requests a probe, 1 seed, tolerance 20 %%")
    ap.add_argument("--json", type=Path, help="also write both rows here")
    a = ap.parse_args()
    if a.quick:
        a.requests, a.seeds, a.tol = 120, 1, 0.2
    load0 = os.getloadavg()
    log(f"load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}")
    with tempfile.TemporaryDirectory() as tmpname:
        tmp = Path(tmpname)
        sim, sim_wall = find_rate(a, tmp / "sim", [])
        log(f"simulator: {fmt_rate(sim['rate_per_s'])} req/s, bracket {sim['bracket']} ({sim_wall:.1f} s)")
        urls = [f"http://127.0.0.1:{a.port + i}" for i in range(a.instances)]
        server = subprocess.Popen(LBBENCH + ["serve-sim", "--profile", a.profile, "--instances", str(a.instances),
                                             "--port", str(a.port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for u in urls:
                wait_healthy(u)
            live, live_wall = find_rate(a, tmp / "live", urls)
        finally:
            server.terminate()
            server.wait(10)
        limit = dict(kv.split("=") for kv in a.slo.split(",")).get("ttft")
        pairs = paired_ttft(tmp / "sim", tmp / "live", None if limit is None else float(limit))
    load1 = os.getloadavg()
    print(f"lbbench run --find-rate --profile {a.profile} --instances {a.instances} --workload poisson "
          f"--prompt-tokens {a.prompt_tokens} --output-tokens {a.output_tokens} --requests {a.requests} "
          f"--seeds {a.seeds} --slo {a.slo} --attainment {a.attainment:g} --find-rate-start {a.start:g} "
          f"--find-rate-tol {a.tol:g} [--endpoint ... x{a.instances}]")
    print("| search | rate (req/s) | bracket (req/s) | probes | seed runs | wall (s) | probes: rate: attainment "
          "(seeds run) |")
    print("|---|---:|---|---:|---:|---:|---|")
    print(describe("simulator", sim, sim_wall))
    print(describe("live (serve-sim)", live, live_wall))
    if sim["rate_per_s"] and live["rate_per_s"]:
        ratio = live["rate_per_s"] / sim["rate_per_s"]
        slo, shi = sim["bracket"]
        llo, lhi = live["bracket"]
        overlap = (lhi is None or slo < lhi) and (shi is None or llo < shi)
        print(f"live / sim = {ratio:.3f} ({100 * (ratio - 1):+.1f} %; within 10 %: {abs(ratio - 1) <= 0.10}); "
              f"brackets overlap: {overlap}")
    else:
        print("one of the searches found no rate meeting the target")
    s_pts = {p["rate_per_s"]: p for p in sim["probes"]}
    both = [(p, s_pts[p["rate_per_s"]]) for p in live["probes"] if p["rate_per_s"] in s_pts]
    if both:
        print("rates both probed (attainment live / sim, seeds run live / sim): " + "; ".join(
            f"{lp['rate_per_s']:g}: {100 * lp['attainment']:.1f} / {100 * sp['attainment']:.1f} % "
            f"({lp['seeds_run']}/{sp['seeds_run']})" for lp, sp in both))
    print("live TTFT - simulated TTFT of the same requests, median / p99, and requests the TTFT limit judged "
          "differently (rate/seed): " + "; ".join(pairs))
    print(f"load average {load0[0]:.2f} at the start, {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} at the end")
    if a.json:
        a.json.write_text(json.dumps({"sim": sim, "sim_wall_s": sim_wall, "live": live, "live_wall_s": live_wall,
                                      "load_avg": [load0, load1]}, indent=2) + "\n")


if __name__ == "__main__":
    main()
