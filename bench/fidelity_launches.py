"""How steady is the live side? The same requests replayed on several fresh launches of one pinned vLLM CPU
instance, several times each: the spread within a launch against the spread across launches.

    python bench/fidelity_launches.py --profile tiny.toml --spec "trace:../shared/traces/synthetic_trace.jsonl?\
max_prompt_tokens=1000&requests=80&rate=1.5" --launches 3 --repeats 2 [--json out.json]

Each launch replays the spec's first ``--warmup`` requests once first (not counted), then the whole request set
``--repeats`` times; printed: launch, repeat, mean E2E and mean time between tokens. Needs ``make vllm-env``.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from lbbench.engines.vllm.emulator import free_port_range
from lbbench.experiment import annotated_requests
from lbbench.engines.vllm.launcher import launch
from lbbench.profiles import load_profile
from lbbench.profiling.fidelity import live_replay, stats
from lbbench.profiling.workload_spec import parse_workload_spec
from lbbench.routers import get_router


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True, help="measured profile (.toml) of the launched engine")
    ap.add_argument("--spec", required=True, help="workload spec: trace:FILE?... or workload:NAME?...")
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--log-dir", default="runs/fidelity-launches")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    prof = load_profile(a.profile)
    f = parse_workload_spec(a.spec, "spec").run_config_fields({"requests": 80, "rate_per_s": 1.5, "seed": 0,
                                                                "prompt_tokens": "128", "output_tokens": "128"})
    reqs = annotated_requests(prof, a.profile, workload=f.get("workload", "poisson"), trace=f.get("trace"),
                              max_prompt_tokens=None, rate=f["rate_per_s"], requests=f["requests"], seed=f["seed"],
                              prompt_tokens=f["prompt_tokens"], output_tokens=f["output_tokens"],
                              predictor="oracle", trace_options=f.get("trace_options") or {},
                              burstiness=f.get("burstiness", 1.0))
    extra = [] if prof.enable_prefix_caching else ["--no-enable-prefix-caching"]
    rows = []
    for n in range(a.launches):
        with launch("tiny", 1, cpus_per_instance=1, log_dir=f"{a.log_dir}/launch-{n}", port_base=free_port_range(1),
                    max_num_seqs=prof.max_num_seqs, max_num_batched_tokens=prof.max_num_batched_tokens,
                    chunked_prefill=prof.chunked_prefill, extra_args=extra) as urls:
            def replay(requests, what):
                return live_replay(requests, get_router("round_robin", num_instances=1, seed=0, profile=prof), urls,
                                   prof, run_id=f"launch-{n}", seed=0, what=what)
            if a.warmup:
                replay(reqs[:a.warmup], "warm-up")
            for k in range(a.repeats):
                s = stats(replay(reqs, f"launch {n} repeat {k}"))
                rows.append({"launch": n, "repeat": k, "mean_e2e_s": s["mean_e2e_s"], "mean_tbt_s": s["mean_tbt_s"]})
                print(f"launch {n} repeat {k}: mean E2E {s['mean_e2e_s']:.3f} s, mean TBT "
                      f"{s['mean_tbt_s'] * 1e3:.2f} ms", flush=True)
    tbt = np.array([[r["mean_tbt_s"] for r in rows if r["launch"] == n] for n in range(a.launches)])
    within = float(np.mean([(t.max() - t.min()) / t.mean() for t in tbt])) * 100
    across = float((tbt.mean(axis=1).max() - tbt.mean(axis=1).min()) / tbt.mean()) * 100
    print(f"mean TBT spread within a launch {within:.1f} % (mean over launches), across launch means {across:.1f} %")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"spec": a.spec, "rows": rows, "within_pct": within, "across_pct": across}, fh, indent=1)


if __name__ == "__main__":
    main()
