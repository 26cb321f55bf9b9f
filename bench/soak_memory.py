"""Long-run memory: RSS of the proxy and of the client after warm-up against RSS at the end, no kills.

Four emulated A100 instances (``lbbench serve-sim``) behind ``lbbench proxy --router least_requests``, as in
``bench/soak_proxy.py``, and a streaming Poisson replay through the proxy at ``--rate`` for ``--minutes``, with
the load workers ``lbbench run`` picks. RSS of the proxy and of the client (this process plus its load workers)
is sampled every ``--sample-every`` s; reported: growth from the first sample after ``--warmup`` s to the last
one while the replay ran, and the slope (MB/min, least squares over the samples after warm-up).
Target (issue 32): growth <= 50 MB over 30 minutes for each process, i.e. a slope under ~1.7 MB/min.

``--trace FILE`` also sets ``LBBENCH_TRACEMALLOC=FILE`` (``lbbench.live.memtrace``): the proxy, the client and
each load worker write their top tracemalloc growth sites (baseline after ``--warmup`` s) to ``FILE.<role>``.
Tracing costs CPU: keep the rate modest with it.

    python bench/soak_memory.py [--minutes 5] [--rate 30] [--warmup 60] [--sample-every 10] [--trace FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_proxy import run_soak, slope_per_min

from lbbench.live.memtrace import ENV, ENV_WARMUP


def slope_mb_per_min(samples: list[dict], key: str, warmup_s: float) -> float | None:
    pts = [s for s in samples if s["t_s"] >= warmup_s]
    if len(pts) < 2:
        return None
    return slope_per_min([s["t_s"] for s in pts], [s[key] for s in pts])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=60.0)
    ap.add_argument("--sample-every", type=float, default=10.0)
    ap.add_argument("--load-workers", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace", default=None, help="tracemalloc growth sites to FILE.<role>")
    ap.add_argument("--out", default=None, help="summary JSON")
    args = ap.parse_args()
    if args.trace:
        os.environ[ENV] = str(Path(args.trace).resolve())
        os.environ[ENV_WARMUP] = str(args.warmup)
    soak_args = argparse.Namespace(kill_every=1e9, down=0.0, sample_every=args.sample_every, admission=None)
    soak, res, reqs, workers = run_soak(args, soak_args, "soak-memory")
    samples = soak.samples[:-1] if len(soak.samples) > 2 else soak.samples
    warm = [s for s in samples if s["t_s"] >= args.warmup] or samples
    first, last = warm[0], warm[-1]
    failed = sum(r.error is not None for r in res.records)
    summary = {"minutes": args.minutes, "rate_per_s": args.rate, "load_workers": workers, "sent": len(reqs),
               "recorded": len(res.records), "failed": failed, "rss": soak.samples,
               "warm_from_s": first["t_s"], "to_s": last["t_s"]}
    for who in ("proxy", "client"):
        key = f"{who}_rss_mb"
        summary[f"{who}_growth_mb"] = round(last[key] - first[key], 1)
        s = slope_mb_per_min(samples, key, args.warmup)
        summary[f"{who}_slope_mb_per_min"] = round(s, 2) if s is not None else None
    summary["load_worker_lag"] = res.load_workers
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp()) / "soak_memory.json"
    out.write_text(json.dumps(summary, indent=1))
    print(f"soak_memory: {args.minutes:g} min at {args.rate:g} req/s through lbbench proxy (4 x serve-sim), "
          f"{workers} load worker(s); {len(res.records)}/{len(reqs)} recorded, {failed} failed")
    for err, n in Counter(re.sub(r"\d+", "N", r.error)[:100] for r in res.records if r.error).most_common(5):
        print(f"  {n} x {err}")
    print("RSS (MB): t_s proxy client, and requests in flight at the proxy")
    for s in soak.samples:
        print(f"  {s['t_s']:8.1f} {s['proxy_rss_mb']:8.1f} {s['client_rss_mb']:8.1f} {s['proxy_in_flight']:6d}")
    for who in ("proxy", "client"):
        print(f"{who}: {summary[f'{who}_growth_mb']:+.1f} MB from {first['t_s']:.0f} s to {last['t_s']:.0f} s, "
              f"slope {summary[f'{who}_slope_mb_per_min']} MB/min")
    for w in res.load_workers:
        print(f"  load worker {w['worker']}: dispatch lag p50 {w['lag_p50_ms']:.2f} / p99 {w['lag_p99_ms']:.2f} ms; "
              f"clock offset re-measured {w.get('clock_resyncs', 0)} times, drift {w.get('clock_drift_ms', 0.0):+.3f} ms "
              f"(error bound {w['clock_error_ms']:.3f} ms)")
    print(f"summary: {out}")


if __name__ == "__main__":
    main()
