"""Router gain against predictor quality: trained predictors (not only
``noisy:ACC``) on a text workload in the simulator, Kendall tau on the axis.

    python bench/bench_predictor_routing.py [--datasets ../shared/datasets] [--out runs/predictor-routing]
        [--profile llama2-7b-v100] [--rates 4,6,9] [--requests 800] [--seeds 2]

1. AlpacaEval (805 instructions x 9 models) is split by prompt (70 / 30,
   stratified by bucket, seed 0). The ``embed`` and ``bow`` regressors and the
   ``metadata`` model (prompt length + task) are trained on the 70 % (all
   nine generators).
2. The workload is the held-out 30 % answered by ``llama-2-7b-chat-hf`` (the
   paper's model family), replayed with Poisson arrivals through
   ``lbbench run --workload dataset:FILE``; the regressors are conditioned on
   that model's name (``text:DIR?model=llama-2-7b-chat-hf``).
3. Each predictor's tau and bucket accuracy are measured on the exact
   requests the simulator replays (first seed, first rate), then every
   predictor drives ``round_robin``, ``jsq`` and ``late_binding_srpt`` under
   the ``fcfs`` and ``least_work_left`` instance schedulers (the latter also
   uses the predictions) at every rate.

Printed: per rate and predictor, the mean and p99 E2E of round robin (fcfs),
of the strongest baseline combination the run found (``best_baseline``), and
of ``late_binding_srpt``, with its gain over each. Trained models and run
reports stay in ``--out`` (models are reused when present).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import DATASETS, log, torch_one_thread  # bench/_common.py, beside this script

SERVING_MODEL = "llama-2-7b-chat-hf"
ROUTERS = "round_robin,jsq,late_binding_srpt"
SCHEDULERS = "fcfs,least_work_left"


def _prepare(datasets: Path, out: Path, log) -> dict[str, str]:
    from lbbench.predict import get_scheme
    from lbbench.predict.data import load_corpus, stratified_split, write_jsonl
    from lbbench.predict.metadata import train_metadata_model
    from lbbench.predict.regression import LengthTrainConfig, train_length_model

    scheme = get_scheme("paper")
    corpus = load_corpus(datasets / "alpaca_eval").examples
    train, test = stratified_split(corpus, scheme, 0.3, seed=0)
    workload = out / "workload.jsonl"
    write_jsonl([e for e in test if e.model == SERVING_MODEL], workload)
    models = {"embed": LengthTrainConfig(features="encoder"),
              "bow": LengthTrainConfig(features="bow", heads=("ridge",), use_model_name=False)}
    for name, cfg in models.items():
        d = out / "models" / name
        if not (d / "config.json").is_file():
            log(f"training {name} on {len(train)} rows")
            train_length_model(train, scheme, cfg, log=log).save(d)
    meta = out / "models" / "metadata"
    if not (meta / "config.json").is_file():
        log(f"training metadata on {len(train)} rows")
        train_metadata_model(train, scheme).save(meta)
    q = f"?model={SERVING_MODEL}"
    return {"oracle": "oracle", "embed": f"text:{out / 'models' / 'embed'}{q}",
            "bow": f"text:{out / 'models' / 'bow'}{q}", "metadata": f"metadata:{meta}", "noisy:0.79": "noisy:0.79",
            "workload": str(workload)}


def _quality(spec: str, workload: str, profile_name: str, requests: int, rate: float) -> dict[str, float]:
    from lbbench.predict import annotate, load_predictor
    from lbbench.predict.dataset_workload import dataset_workload
    from lbbench.predict.metrics import accuracy, kendall_tau
    from lbbench.profiles import load_profile

    profile = load_profile(profile_name)
    reqs = dataset_workload(workload, requests, rate, seed=0, max_model_len=profile.max_model_len)
    p = load_predictor(spec, profile=profile, seed=0)
    ann = annotate(reqs, p)
    true = [r.output_tokens for r in ann]
    return {"kendall_tau": kendall_tau([r.predicted_output_tokens for r in ann], true),
            "accuracy": accuracy([p.scheme.bucket_of(t) for t in true], [r.predicted_bucket for r in ann])}


def _run(spec: str, workload: str, args, out_dir: Path) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "lbbench.cli", "run", "--profile", args.profile, "--instances", "4",
           "--workload", f"dataset:{workload}", "--rate", args.rates, "--jobs", "1", "--requests", str(args.requests),
           "--seeds", str(args.seeds), "--router", ROUTERS, "--instance-scheduler", SCHEDULERS, "--predictor", spec,
           "--out", str(out_dir), "--format", "json"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"lbbench run failed ({res.returncode}): {res.stderr.strip().splitlines()[-1:]}")
    return json.loads(res.stdout)


def render(rows: list[dict[str, Any]]) -> str:
    lines = ["| rate (req/s) | predictor | τ | accuracy | round robin mean / p99 (s) | best baseline | "
             "its mean / p99 (s) | late_binding_srpt mean / p99 (s) | vs round robin | vs best baseline | "
             "jsq vs best baseline |",
             "|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["rate"], -r["kendall_tau"])):
        lines.append(
            f"| {r['rate']:g} | {r['predictor']} | {r['kendall_tau']:.3f} | {r['accuracy']:.3f} | "
            f"{r['rr_mean']:.1f} / {r['rr_p99']:.1f} | {r['best_baseline']} | {r['best_mean']:.1f} / "
            f"{r['best_p99']:.1f} | {r['lb_mean']:.1f} / {r['lb_p99']:.1f} | {r['lb_vs_rr_pct']:+.1f} % | "
            f"{r['lb_vs_best_pct']:+.1f} % (p99 {r['lb_p99_vs_best_pct']:+.1f} %) | {r['jsq_vs_best_pct']:+.1f} % |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default=str(DATASETS))
    ap.add_argument("--out", default="runs/predictor-routing")
    ap.add_argument("--profile", default="llama2-7b-v100")
    ap.add_argument("--rates", default="4,6,9")
    ap.add_argument("--requests", type=int, default=800)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--predictors", default="oracle,embed,bow,metadata,noisy:0.79")
    args = ap.parse_args()
    torch_one_thread()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    specs = _prepare(Path(args.datasets), out, log)
    workload = specs.pop("workload")
    first_rate = float(args.rates.split(",")[0])
    rows = []
    for name in [p.strip() for p in args.predictors.split(",") if p.strip()]:
        if name not in specs:
            ap.error(f"--predictors: unknown {name!r} (known: {', '.join(specs)})")
        q = _quality(specs[name], workload, args.profile, args.requests, first_rate)
        log(f"{name}: tau {q['kendall_tau']:.3f}, accuracy {q['accuracy']:.3f}; running the simulator")
        report = _run(specs[name], workload, args, out / "runs" / name.replace(":", "_"))
        for r in report:  # a single-rate run does not name its rate
            r.setdefault("rate_per_s", first_rate)
        for rate in sorted({r["rate_per_s"] for r in report}):
            at = {(r["router"], r["instance_scheduler"]): r for r in report if r["rate_per_s"] == rate}
            rr, lb = at[("round_robin", "fcfs")], at[("late_binding_srpt", "fcfs")]
            best = next(r for r in at.values()
                        if f"{r['router']}/{r['instance_scheduler']}" == rr["best_baseline"])
            rows.append({"rate": rate, "predictor": name, **q, "rr_mean": rr["mean_e2e_s"], "rr_p99": rr["p99_e2e_s"],
                         "best_baseline": rr["best_baseline"], "best_mean": best["mean_e2e_s"],
                         "best_p99": best["p99_e2e_s"], "lb_mean": lb["mean_e2e_s"], "lb_p99": lb["p99_e2e_s"],
                         "lb_vs_rr_pct": lb["improvement_vs_round_robin_pct"],
                         "lb_vs_best_pct": lb["vs_best_baseline_pct"],
                         "lb_p99_vs_best_pct": lb["p99_vs_best_baseline_pct"],
                         "jsq_vs_best_pct": at[("jsq", "fcfs")]["vs_best_baseline_pct"]})
    (out / "summary.json").write_text(json.dumps(rows, indent=1))
    print(render(rows))


if __name__ == "__main__":
    main()
