"""The roofline step model against measured kernel timings, GPU by GPU (no serving engine in these numbers).

Three measured sources, none of them used to fit the shipped calibration's overheads:

- Vidur's ``mlp.csv`` block timings on A100 and H100 (github.com/microsoft/vidur @ 7d47513, MIT; the batch-1 rows
  kept in ``lbbench/profiling/efficiency.toml``): one transformer block's linear part at one token, times the layer
  count; compared with the roofline's GEMM groups plus its per-layer overhead;
- whole decode steps of a Llama-3.1-8B-shaped stack on an H200 timed with torch (``bench/gpu_kernels.py``, kept in
  ``lbbench/profiling/data/h200_torch_kernels.json``): unfused torch elementwise kernels, so they are slower than an
  engine's fused ones by the extra passes;
- the same file's prefill forwards (one prompt of T tokens);
- and its mixed steps (``mixed_steps``: B decodes at a 1,024-token context sharing one forward with a P-token
  prefill chunk, as a chunked-prefill engine runs them): what a chunk costs the decodes beside it.

Usage: python bench/step_model_check.py [--calibration FILE]
"""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path

from lbbench.profiling.gpus import get_gpu
from lbbench.profiling.models import load_model_config
from lbbench.profiling.roofline_derive import roofline_shape
from lbbench.roofline import RooflineStepModel
from lbbench.profiling.calibration import load_calibration

ROOT = Path(__file__).resolve().parents[1]
#: Vidur's model directories -> shipped configs
VIDUR_MODELS = {"Llama-2-7b-hf": "llama-2-7b", "Meta-Llama-3-8B": "llama-3.1-8b", "Llama-2-70b-hf": "llama-2-70b",
                "Meta-Llama-3-70B": "llama-3.1-70b"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calibration", default=None)
    args = ap.parse_args()
    cal = load_calibration(args.calibration)
    print(f"calibration: {cal.describe()}")
    eff = cal.eff
    table = tomllib.loads((ROOT / "lbbench/profiling/efficiency.toml").read_text())
    print("\nBatch-1 block-linear time x layers (Vidur, measured) against the roofline's GEMMs + layer overhead:")
    print(f"{'gpu':10} {'model':18} {'tp':>3} {'measured ms':>12} {'roofline ms':>12} {'error':>8}")
    seen = set()
    items = [(r["gpu"], e) for r in table["fit"] for e in r["errors"]] + [(v["gpu"], v) for v in table["validation"]]
    tps = {id(e): r["tp"] for r in table["fit"] for e in r["errors"]}
    for gpu_name, e in items:
        tp = e.get("tp") or tps.get(id(e))
        model_dir = e["file"].split("/")[-2]
        key = (gpu_name, model_dir, tp)
        if model_dir not in VIDUR_MODELS or key in seen:
            continue
        seen.add(key)
        model = load_model_config(VIDUR_MODELS[model_dir])
        shape = roofline_shape(model, get_gpu(gpu_name), tp=tp, weights_dtype="fp16")
        m = RooflineStepModel(shape, eff)
        pred = (model.num_layers * (m._smax(shape.attn_bytes * m._mem, 2 * shape.attn_params * m._flop)
                                    + m._smax(shape.mlp_bytes * m._mem, 2 * shape.mlp_params * m._flop)
                                    + eff.layer_overhead_s) + shape.elementwise_bytes_per_token * m._mem)
        meas = e["batch1_block_s"] * model.num_layers
        print(f"{gpu_name:10} {model_dir:18} {tp:>3} {meas * 1e3:12.2f} {pred * 1e3:12.2f} {(pred / meas - 1) * 100:+7.1f}%")
    data = json.loads((ROOT / "lbbench/profiling/data/h200_torch_kernels.json").read_text())
    steps = data["decode_and_prefill_steps"]
    m = RooflineStepModel(roofline_shape(load_model_config("llama-3.1-8b"), get_gpu("h200")), eff)
    print("\nWhole Llama-3.1-8B-shaped steps on an H200 (torch kernels, measured) against the roofline:")
    print(f"{'step':24} {'measured ms':>12} {'roofline ms':>12} {'error':>8}")
    for r in steps["decode"]:
        pred = m.decode_s(r["batch"]) + m.context_token_s * r["batch"] * r["context_tokens"] - eff.step_overhead_s
        print(f"{'decode B=%d ctx=%d' % (r['batch'], r['context_tokens']):24} {r['step_s'] * 1e3:12.2f} "
              f"{pred * 1e3:12.2f} {(pred / r['step_s'] - 1) * 100:+7.1f}%")
    for r in steps["prefill"]:
        pred = m.decode_s(0) + m.prefill_s([(0, r["prompt_tokens"])], 0) - eff.step_overhead_s
        print(f"{'prefill %d' % r['prompt_tokens']:24} {r['step_s'] * 1e3:12.2f} {pred * 1e3:12.2f} "
              f"{(pred / r['step_s'] - 1) * 100:+7.1f}%")

    print("\nMixed steps on the H200: B decodes (context 1,024) + a P-token chunk in one forward, against the roofline:")
    print(f"{'step':24} {'measured ms':>12} {'roofline ms':>12} {'error':>8} {'x decode alone':>15} {'roofline x':>11}")
    mixed = data.get("mixed_steps", [])
    alone = {r["batch"]: r["step_s"] for r in mixed if r.get("prefill_chunk_tokens") == 0}
    for r in mixed:
        if "step_s" not in r or r["batch"] == 0:
            continue
        b, n, ctx = r["batch"], r["prefill_chunk_tokens"], r["context_tokens"]
        pred = m.step_time_s(n, b, b * ctx) - eff.step_overhead_s
        pred0 = m.step_time_s(0, b, b * ctx) - eff.step_overhead_s
        print(f"{'B=%d + P=%d' % (b, n):24} {r['step_s'] * 1e3:12.2f} {pred * 1e3:12.2f} "
              f"{(pred / r['step_s'] - 1) * 100:+7.1f}% {r['step_s'] / alone[b]:15.2f} {pred / pred0:11.2f}")


if __name__ == "__main__":
    main()
