"""The production-router baselines beside lbbench's routers, on every platform setup (issue 31).

    python bench/platform_routers.py v100-7 v100-20                  # 4 x V100 physics, paper-mix, 7 and 20 req/s
    python bench/platform_routers.py a100 --find-rate                # least_requests' saturation rate R (seeds 1000-1001)
    python bench/platform_routers.py a100-50 a100-90 --sat-rate 255  # 4 x A100 paper-mix at 0.5 R and 0.9 R
    python bench/platform_routers.py azure mooncake f1               # the traces (windows) and the mixed fleet F1
    python bench/platform_routers.py all --sat-rate 255
    python bench/platform_routers.py mooncake agentic shared-prefix --instances 4,8   # prefix-heavy, V1 engine
    python bench/platform_routers.py mooncake agentic shared-prefix --tune             # the same on tuning data

The A100 setups run ``--profile`` (default ``llama3.1-8b-a100``: vLLM V1 with chunked prefill, calibrated; the
earlier tables used ``llama3.1-8b-a100-v0``), every title says which. The prefix-heavy setups (``mooncake``,
``agentic``, ``shared-prefix``) run with prefix caching on and the prefix routers (``PREFIX_ROUTERS``); the
Mooncake trace's evaluation windows are its last three quarters and its tuning window the first quarter, the
workloads' evaluation seeds 0..N-1 and tuning seeds 1000..; every seed (window) is its own run, so TTFT has a std
too. Where round robin and ``kv_overlap`` (Dynamo's KV router) both ran, the table adds their mean TTFT and E2E
ratios (round robin / ``kv_overlap``), Dynamo's published A/B figure.

Every setup is `lbbench run` with `--instance-scheduler fcfs,priority --predictor noisy:0.79` (printed before it
runs). Paper-mix setups use paired seeds 0..N-1 (`--seeds`); a trace replays the same arrivals whatever the seed, so
its paired runs are windows of the trace, window k with seed k. One table per setup: mean ± std (over seeds or
windows) of the per-run mean E2E, p50 and p99 E2E and mean TTFT averaged over the runs, the best deployable
combination and the best new baseline marked, then the verdict "lbbench's best vs the best new baseline" on the
headline metric (mean E2E; mean TTFT on the Mooncake trace): win, within 2 %, or loss, with the p99 beside it.
`predicted_latency` prints its TTFT / TPOT MAPE per run as a note (over the whole run, after its cold start); the
table gives the mean and the range over its runs (both engines, every seed or window).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

LBBENCH = os.environ["LBBENCH"].split() if os.environ.get("LBBENCH") else [sys.executable, "-m", "lbbench"]

NEW = ("predicted_latency", "token_affinity", "kv_overlap")                       # the new production baselines
PRODUCTION = ("round_robin", "least_requests", "prefix_load", "cache_aware")      # earlier production baselines
OWN = ("jsq", "mcu", "jsq_speed", "least_work_speed", "cache_length_aware", "late_binding_srpt", "wgrl")  # lbbench's, the paper's
NOT_DEPLOYABLE = ("lookahead",)
OWN += ("online_ttft",)                                                           # lbbench's learned (online) router
PREFIX_ROUTERS = ",".join(("round_robin", "least_requests", "prefix_load", "cache_aware", "token_affinity", "kv_overlap",
                           "predicted_latency", "precise_prefix", "cache_length_aware", "online_ttft"))
NEW += ("precise_prefix",)
#: the baselines a prefix-heavy table's verdict compares lbbench's best with (issue 38)
PREFIX_BASELINES = ("prefix_load", "cache_aware", "token_affinity", "kv_overlap", "predicted_latency", "precise_prefix")
AGENTIC = "agentic"
SHARED_PREFIX = "inference-perf:groups=10,users=10,system=2000,question=200,output=100,multi_turn=1"
ROUTERS = ",".join(PRODUCTION + NEW + OWN)
F1_ROUTERS = ",".join(("least_requests",) + NEW + ("mcu", "jsq_speed", "least_work_speed", "late_binding_srpt", "wgrl"))
F1 = "llama3.1-8b-a100-v0:2,llama3.1-8b-l4-v0:2"
V100 = ["--profile", "llama2-7b-v100", "--instances", "4"]
TRACE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "traces")
MAPE_RE = re.compile(r"predicted_latency: prediction error over the run: TTFT MAPE ([\d.]+) % .*TPOT MAPE ([\d.]+) %")


def lbbench_json(args: list[str]) -> tuple[list[dict], list[tuple[float, float]]]:
    print("$ lbbench run " + " ".join(args), flush=True)
    out = subprocess.run(LBBENCH + ["run", *args, "--format", "json"], check=True, capture_output=True, text=True)
    mape = [(float(m.group(1)), float(m.group(2))) for m in MAPE_RE.finditer(out.stderr)]
    rows = json.loads(out.stdout)
    return (rows["rows"] if isinstance(rows, dict) else rows), mape


def pool(runs: list[list[dict]]) -> list[dict]:
    """One row per router x engine from several runs (windows): mean ± std of the per-run means."""
    per: dict = {}
    for rows in runs:
        for r in rows:
            per.setdefault((r["router"], r.get("instance_scheduler", "fcfs")), []).append(r)
    out = []
    for (router, eng), rs in per.items():
        m = [r["mean_e2e_s"] for r in rs]
        t = [r["mean_ttft_s"] for r in rs]
        out.append({"router": router, "instance_scheduler": eng, "mean_e2e_s": statistics.mean(m),
                    "mean_e2e_std_s": statistics.stdev(m) if len(m) > 1 else 0.0,
                    "mean_ttft_std_s": statistics.stdev(t) if len(t) > 1 else 0.0,
                    **{k: statistics.mean(r[k] for r in rs)
                       for k in ("p50_e2e_s", "p99_e2e_s", "mean_ttft_s", "p99_ttft_s", "completed")}})
    return out


def kv_vs_rr(rows: list[dict]) -> list[str]:
    """Round robin's mean TTFT and E2E over ``kv_overlap``'s, per engine (Dynamo's KV-router A/B figure)."""
    out = []
    for eng in ("fcfs", "priority"):
        rr = [r for r in rows if r["router"] == "round_robin" and r.get("instance_scheduler", "fcfs") == eng]
        kv = [r for r in rows if r["router"] == "kv_overlap" and r.get("instance_scheduler", "fcfs") == eng]
        if rr and kv:
            out.append(f"round robin / kv_overlap ({eng}): mean TTFT {rr[0]['mean_ttft_s'] / kv[0]['mean_ttft_s']:.2f}x, "
                       f"mean E2E {rr[0]['mean_e2e_s'] / kv[0]['mean_e2e_s']:.2f}x (Dynamo's published A/B: 24.6x / "
                       f"4.9x, Qwen3-32B, 8 workers, Mooncake tool-agent trace at 0.8x speed)")
    return out


def pooled_runs(base: list[str], samples: list[list[str]], out: str) -> tuple[list[dict], list[tuple[float, float]]]:
    """One run per sample (a seed or a window: extra args), pooled to mean ± std over the samples."""
    runs, mape = [], []
    for k, extra in enumerate(samples):
        rows, m = lbbench_json([*base, *extra, "--out", f"{out}-{k}"])
        runs.append(rows)
        mape += m
    return pool(runs), mape


def table(rows: list[dict], mape: list[tuple[float, float]], title: str, headline: str = "mean_e2e_s",
          baselines: tuple[str, ...] = NEW) -> str:
    p99 = "p99_e2e_s" if headline == "mean_e2e_s" else "p99_ttft_s"
    dep = [r for r in rows if r["router"] not in NOT_DEPLOYABLE]
    best = min(dep, key=lambda r: r[headline])
    new = [r for r in rows if r["router"] in baselines]
    what = "best new baseline" if baselines == NEW else "best baseline"
    own = [r for r in rows if r["router"] in OWN]
    best_new = min(new, key=lambda r: r[headline]) if new else None
    best_own = min(own, key=lambda r: r[headline]) if own else None
    ttft_std = headline == "mean_ttft_s"
    lines = [f"**{title}**", "",
             "| router | engine | mean E2E (s) | p50 (s) | p99 (s) | mean TTFT (s) | p99 TTFT (s) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r.get("instance_scheduler", "fcfs"), r[headline])):
        marks = [m for m, hit in (("best", r is best), (what, r is best_new)) if hit]
        mark = f" **({', '.join(marks)})**" if marks else ""
        ttft = f"{r['mean_ttft_s']:.3f}" + (f" ± {r.get('mean_ttft_std_s', 0):.3f}" if ttft_std else "")
        lines.append(f"| {r['router']}{mark} | {r.get('instance_scheduler', 'fcfs')} | {r['mean_e2e_s']:.2f} ± "
                     f"{r['mean_e2e_std_s']:.2f} | {r['p50_e2e_s']:.2f} | {r['p99_e2e_s']:.1f} | {ttft} | "
                     f"{r['p99_ttft_s']:.2f} |")
    lines.append("")
    if mape:
        tt, tp = [m[0] for m in mape], [m[1] for m in mape]
        lines.append(f"predicted_latency MAPE over {len(mape)} runs: TTFT {statistics.mean(tt):.1f} % "
                     f"({min(tt):.1f}-{max(tt):.1f}), TPOT {statistics.mean(tp):.1f} % ({min(tp):.1f}-{max(tp):.1f}); "
                     f"target <= 10 %: TTFT {'met' if max(tt) <= 10 else 'missed'}, "
                     f"TPOT {'met' if max(tp) <= 10 else 'missed'}")
    if best_own and best_new:
        a, b = best_own[headline], best_new[headline]
        gap = 100 * (b - a) / b
        verdict = "within 2 %" if abs(gap) <= 2 else ("win" if a < b else "loss")
        p99_ok = best_own[p99] <= best_new[p99]
        name = "mean TTFT" if headline == "mean_ttft_s" else "mean E2E"
        lines.append(f"verdict ({name}): lbbench's best {best_own['router']}/{best_own['instance_scheduler']} "
                     f"{a:.3f} s vs {what} {best_new['router']}/{best_new['instance_scheduler']} "
                     f"{b:.3f} s: {gap:+.1f} % -> **{verdict}**; p99 {best_own[p99]:.2f} vs {best_new[p99]:.2f} s "
                     f"({'no worse' if p99_ok else 'worse'})")
    lines += kv_vs_rr(rows)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("setups", nargs="+",
                    choices=["all", "a100", "a100-50", "a100-90", "azure", "mooncake", "v100-7", "v100-20", "f1",
                             "agentic", "shared-prefix"])
    ap.add_argument("--profile", default="llama3.1-8b-a100",
                    help="the A100 setups' profile (llama3.1-8b-a100: vLLM V1, chunked prefill; -v0: the earlier V0)")
    ap.add_argument("--instances", default="4", help="A100 setups: instance counts, comma-separated (4,8)")
    ap.add_argument("--tune", action="store_true",
                    help="prefix-heavy setups on tuning data: seeds 1000.., the Mooncake trace's first quarter")
    ap.add_argument("--agentic-rate", type=float, default=160.0)
    ap.add_argument("--shared-prefix-rate", type=float, default=160.0)
    ap.add_argument("--prefix-routers", default=PREFIX_ROUTERS)
    ap.add_argument("--find-rate", action="store_true", help="a100: search least_requests' R on seeds 1000-1001")
    ap.add_argument("--sat-rate", type=float, default=255.0,
                    help="least_requests' saturation rate on 4 x A100 paper-mix (TTFT <= 2 s for 90 %%, 1000 requests)")
    ap.add_argument("--requests", default="1000")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--azure-rate", type=float, default=20.0)
    ap.add_argument("--mooncake-rate", type=float, default=8.0, help="per 4 instances (scaled with --instances)")
    ap.add_argument("--f1-rate", type=float, default=65.8)
    ap.add_argument("--routers", default=ROUTERS)
    ap.add_argument("--trace-dir", default=TRACE_DIR,
                    help="where the traces are, when not in the current directory (default: ../shared/traces)")
    ap.add_argument("--jobs", default="2")
    ap.add_argument("--out", default="runs/platform-routers")
    a = ap.parse_args()
    setups = ["v100-7", "v100-20", "a100-50", "a100-90", "azure", "mooncake", "f1"] if "all" in a.setups else a.setups
    common = ["--instance-scheduler", "fcfs,priority", "--predictor", "noisy:0.79", "--requests", a.requests,
              "--jobs", a.jobs, "--timeline-interval", "0"]
    if "a100" in setups and a.find_rate:
        rows, _ = lbbench_json(["--profile", a.profile, "--instances", "4", "--workload", "paper-mix", "--requests", a.requests, "--router", "least_requests",
                                "--seed", "1000", "--seeds", "2", "--predictor", "noisy:0.79", "--find-rate",
                                "--slo", "ttft=2", "--attainment", "0.9", "--find-rate-start", "20",
                                "--timeline-interval", "0", "--out", f"{a.out}/a100-find-rate"])
        print(json.dumps(rows[0], indent=1))
    seeds = ["--seeds", str(a.seeds), "--seed", "0"]
    for n in (int(x) for x in a.instances.split(",")):
        run_setups(a, setups, common, seeds, n)


def run_setups(a: argparse.Namespace, setups: list[str], common: list[str], seeds: list[str], n: int) -> None:
    A100 = ["--profile", a.profile, "--instances", str(n)]
    gpu = f"{n} x A100 ({a.profile}: {'vLLM V0' if a.profile.endswith('-v0') else 'vLLM V1, chunked prefill'}, calibrated)"
    tag = f"{a.out}/n{n}{'-tune' if a.tune else ''}"
    first = 1000 if a.tune else 0
    for s in setups:
        if s in ("v100-7", "v100-20"):
            rate = s.split("-")[1]
            rows, mape = lbbench_json([*V100, "--workload", "paper-mix", "--rate", rate, "--router", a.routers,
                                       *common, *seeds, "--out", f"{a.out}/{s}"])
            title = f"4 x V100 (physics), paper-mix, {rate} req/s, {a.requests} requests, seeds 0-{a.seeds - 1}"
            print(table(rows, mape, title))
        elif s in ("a100-50", "a100-90"):
            frac = int(s.split("-")[1]) / 100
            rate = round(frac * a.sat_rate, 1)
            rows, mape = lbbench_json([*A100, "--workload", "paper-mix", "--rate", str(rate), "--router", a.routers,
                                       *common, *seeds, "--out", f"{tag}/{s}"])
            title = (f"{gpu}, paper-mix, {frac:.0%} of R = {rate:g} req/s, {a.requests} requests, "
                     f"seeds 0-{a.seeds - 1}")
            print(table(rows, mape, title))
        elif s in ("azure", "mooncake"):
            if s == "azure":
                trace, span, rate = "AzureLLMInferenceTrace_conv.csv", 3500.0, a.azure_rate
                extra = ["--max-prompt-tokens", "7168"]
            else:
                trace, span, rate = "synthetic_trace.jsonl", 1022.0, a.mooncake_rate
                extra = ["--max-prompt-tokens", "7000", "--prompt-overflow", "truncate", "--prefix-caching", "on"]
            if not os.path.exists(trace):
                trace = os.path.normpath(os.path.join(a.trace_dir, trace))
            if s == "mooncake":
                rate = rate * n / 4
                q = span / 4
                wins = [(0.0, q)] if a.tune else [(k * q, (k + 1) * q) for k in (1, 2, 3)]
                base = [*A100, "--trace", trace, *extra, "--rate", f"{rate:g}", "--router", a.prefix_routers, *common]
                rows, mape = pooled_runs(base, [["--window", f"{w0:.0f}:{w1:.0f}", "--seed", str(first + k)]
                                                for k, (w0, w1) in enumerate(wins)], f"{tag}/mooncake")
                title = (f"{gpu}, {os.path.basename(trace)}, prefix caching on, {rate:g} req/s, up to {a.requests} "
                         f"requests from each of {len(wins)} {q:.0f}-s windows ({'tuning' if a.tune else 'evaluation'})")
                print(table(rows, mape, title, "mean_ttft_s", PREFIX_BASELINES))
                continue
            w = span / a.windows
            runs, mape = [], []
            for k in range(a.windows):
                rows, m = lbbench_json([*A100, "--trace", trace, *extra, "--window", f"{k * w:.0f}:{(k + 1) * w:.0f}",
                                        "--rate", f"{rate:g}", "--router", a.routers, *common, "--seed", str(k),
                                        "--out", f"{tag}/{s}-w{k}"])
                runs.append(rows)
                mape += m
            title = (f"{gpu}, {os.path.basename(trace)}, "
                     f"{rate:g} req/s, up to {a.requests} requests from each of {a.windows} {w:.0f}-s windows")
            print(table(pool(runs), mape, title))
        elif s in ("agentic", "shared-prefix"):
            wl, rate = (AGENTIC, a.agentic_rate) if s == "agentic" else (SHARED_PREFIX, a.shared_prefix_rate)
            rate = rate * n / 4
            base = [*A100, "--workload", wl, "--prefix-caching", "on", "--rate", f"{rate:g}",
                    "--router", a.prefix_routers, *common]
            rows, mape = pooled_runs(base, [["--seed", str(first + k)] for k in range(a.seeds)], f"{tag}/{s}")
            title = (f"{gpu}, {wl}, prefix caching on, {rate:g} req/s offered, {a.requests} requests, "
                     f"{'tuning ' if a.tune else ''}seeds {first}-{first + a.seeds - 1}")
            print(table(rows, mape, title, "mean_ttft_s", PREFIX_BASELINES))
        elif s == "f1":
            rows, mape = lbbench_json(["--fleet", F1, "--workload", "paper-mix", "--rate", f"{a.f1_rate:g}",
                                       "--router", F1_ROUTERS, *common, *seeds, "--out", f"{a.out}/f1"])
            title = (f"F1 (2 x A100 + 2 x L4, derived L4), paper-mix, R = {a.f1_rate:g} req/s, {a.requests} requests, "
                     f"seeds 0-{a.seeds - 1}")
            print(table(rows, mape, title))
        print(flush=True)


if __name__ == "__main__":
    main()
