"""Cost of the text predictors: milliseconds per request at batch 64 on one
CPU core, fp32, bfloat16 and dynamic-int8.

    python bench/bench_predictor.py [--kind embed|text] [--model DIR] [--data CORPUS] [--repeats 5] [--threads 1]

``--kind embed`` (default) times the length regressor: one pass of the frozen
encoder (cut to the layer the model chose) and a linear head. ``--kind text``
times the fine-tuned classifier, for requests with a task (one encoder pass)
and without (task head first, then the bucket head: two passes). Without
``--model`` the bundled all-MiniLM-L6-v2 encoder with untrained heads is timed
(same architecture, same cost; ``--layers`` sets the depth of an untrained
regressor). Without ``--data`` synthetic prompts of 15-60 words are used.
``--threads 1`` (default) is the one-core figure the target is stated for.
Wall-clock and process-CPU milliseconds are both printed: on a machine shared
with other jobs the CPU figure is the steadier one. ``--json`` prints JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from lbbench.core import Request
from lbbench.predict import get_scheme


def _requests(data: str | None, n: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    if data:
        from lbbench.predict.data import load_corpus

        ex = load_corpus(data).examples
        uniq = list({e.prompt: e for e in ex}.values())  # distinct prompts: no repeat is encoded for free
        picks = rng.sample(uniq, min(n, len(uniq)))
        return [Request(i, 0.0, e.prompt_tokens, e.output_tokens, e.task or "generic", e.prompt)
                for i, e in enumerate(picks)]
    words = ("the of and to in is for on with as by this that model data time user write explain list "
             "summarize translate code question answer story email").split()
    return [Request(i, 0.0, 40, 100, "generic", " ".join(rng.choice(words) for _ in range(rng.randint(15, 60))))
            for i in range(n)]


def _time_ms_per_request(predictor, reqs: list[Request], repeats: int) -> tuple[float, float]:
    """Median wall-clock and process-CPU milliseconds per request."""
    predictor.predict(reqs)  # warm-up
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        predictor.predict(reqs)
        wall.append((time.perf_counter() - t0) * 1000 / len(reqs))
        cpu.append((time.process_time() - c0) * 1000 / len(reqs))
    return statistics.median(wall), statistics.median(cpu)


def _untrained_regressor(precision: str, layers: int, max_length: int):
    """A length regressor with the bundled encoder cut to ``layers`` and zero heads."""
    import numpy as np

    from lbbench.predict.metrics import LengthBaseline
    from lbbench.predict.regression import LengthModelConfig, LengthPredictor

    scheme = get_scheme("paper")
    n = scheme.num_buckets
    cfg = LengthModelConfig(
        scheme=scheme.to_dict(), tasks=[], bucket_expected_tokens=[scheme.expected(b) for b in range(n)],
        length_baseline=LengthBaseline((), (0,)).to_dict(), majority_bucket=0, features="encoder", encoder="",
        max_length=max_length, layer=layers, use_model_name=False, model_tokens=[], head="ridge", head_param=1.0,
        bucket_rule="p50", bucket_head_param=1.0, log_offsets={"p50": 0.0, "p90": 0.5, "mean": 0.1},
        bucket_mean_tokens=[float(scheme.expected(b)) for b in range(n)])
    weights = {"head/coef": np.zeros(384 + 1, dtype=np.float32), "head/intercept": np.array([5.0])}
    return LengthPredictor(cfg, weights, precision=precision)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=("embed", "text"), default="embed")
    ap.add_argument("--model", help="saved predictor directory (embed or text)")
    ap.add_argument("--layers", default="5", help="embed without --model: encoder layers kept (comma-separated "
                    "list: one table row per depth and precision; 0 = pooled token embeddings only)")
    ap.add_argument("--max-length", type=int, default=128, help="embed without --model: input tokens")
    ap.add_argument("--data", help="corpus to take prompts from")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch default)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from lbbench.predict.text import TextPredictor, untrained_predictor

    reqs = _requests(args.data, args.batch, 0)
    no_task = [Request(r.request_id, 0.0, r.prompt_tokens, r.output_tokens, None, r.prompt) for r in reqs]
    rows = []
    depths = [None] if args.model or args.kind == "text" else [int(x) for x in args.layers.split(",")]
    for depth, precision in ((d, p) for d in depths for p in ("fp32", "bf16", "int8")):
        if args.kind == "embed":
            from lbbench.predict.regression import LengthPredictor

            p = (LengthPredictor.load(args.model, precision=precision) if args.model
                 else _untrained_regressor(precision, depth, args.max_length))
        elif args.model:
            p = TextPredictor.load(args.model, precision=precision)
        else:
            p = untrained_predictor(get_scheme("paper"), tasks=["generic", "other"], precision=precision)
        with_task, with_task_cpu = _time_ms_per_request(p, reqs, args.repeats)
        without_task, without_task_cpu = ((with_task, with_task_cpu) if args.kind == "embed"
                                          else _time_ms_per_request(p, no_task, args.repeats))
        rows.append({"kind": args.kind, "model": precision, "batch": args.batch,
                     "layers": getattr(getattr(p, "config", None), "layer", None),
                     "ms_per_request_with_task": with_task, "cpu_ms_per_request_with_task": with_task_cpu,
                     "ms_per_request_without_task": without_task,
                     "cpu_ms_per_request_without_task": without_task_cpu,
                     "threads": torch.get_num_threads(),
                     "mean_prompt_tokens": statistics.mean(r.prompt_tokens for r in reqs)})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    if args.kind == "embed":
        print(f"{'model':<6}{'layers':>7}{'batch':>6}{'ms/req':>9}{'cpu ms/req':>12}{'threads':>9}{'prompt tokens':>15}")
        for r in rows:
            print(f"{r['model']:<6}{r['layers']:>7}{r['batch']:>6}{r['ms_per_request_with_task']:>9.2f}"
                  f"{r['cpu_ms_per_request_with_task']:>12.2f}{r['threads']:>9}{r['mean_prompt_tokens']:>15.1f}")
        return
    print(f"{'model':<6}{'batch':>6}{'ms/req (task)':>15}{'cpu ms':>8}{'ms/req (no task)':>18}{'cpu ms':>8}"
          f"{'threads':>9}{'prompt tokens':>15}")
    for r in rows:
        print(f"{r['model']:<6}{r['batch']:>6}{r['ms_per_request_with_task']:>15.2f}"
              f"{r['cpu_ms_per_request_with_task']:>8.2f}{r['ms_per_request_without_task']:>18.2f}"
              f"{r['cpu_ms_per_request_without_task']:>8.2f}{r['threads']:>9}{r['mean_prompt_tokens']:>15.1f}")


if __name__ == "__main__":
    main()
