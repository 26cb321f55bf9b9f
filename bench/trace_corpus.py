"""Write a trace's token counts as a predictor corpus, for the metadata predictor.

A trace without prompt text (the Azure LLM inference traces give arrival,
prompt tokens and generated tokens) can still train and test the ``metadata``
output-length predictor, which reads only the prompt length and the task. This
reads any trace ``lbbench run --trace`` reads, keeps an arrival window, and
writes native JSONL rows ``{"prompt": "", "prompt_tokens": P, "output_tokens":
O, "task": T}`` (``--task`` when the trace has none). ``lbbench predictor train
--kind metadata`` and ``lbbench predictor eval`` on a metadata model accept
rows without text that give ``prompt_tokens``.

    python bench/trace_corpus.py TRACE --window 1800:3502 --out runs/azure-train.jsonl
    lbbench predictor train --kind metadata --data runs/azure-train.jsonl --profile llama3.1-8b-a100-v0 --out DIR
    python bench/trace_corpus.py TRACE --window 0:1800 --out runs/azure-eval.jsonl
    lbbench predictor eval --model DIR --data runs/azure-eval.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lbbench.workloads.trace_transform import parse_window, transform_trace
from lbbench.workloads.traces import read_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--window", default=None, help="START:END seconds of the trace's own clock")
    ap.add_argument("--task", default="conversation", help="task label for rows without one")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tf = read_trace(args.trace)
    tf = transform_trace(tf, window=parse_window(args.window) if args.window else None)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as fh:
        for p, o, t in tf.frame.select("prompt_tokens", "output_tokens", "task").iter_rows():
            fh.write(json.dumps({"prompt": "", "prompt_tokens": int(p), "output_tokens": int(o),
                                 "task": t or args.task}) + "\n")
    print(f"{out}: {tf.frame.height} rows from {args.trace} (window {args.window or 'all'})")


if __name__ == "__main__":
    main()
