"""GPU check of the derived profiles: time a real model's prefill and decode steps, compare with the roofline.

On a CUDA machine with torch and transformers (no vLLM, no network needed), builds Llama-2-7B and Llama-3.1-8B
from the shipped configs with random weights, then times, with CUDA events after warm-up (medians):

- a dense GEMM and a device-to-device copy: the GPU's achieved FLOP/s and bandwidth, against the table's peaks;
- prefill of one sequence of several lengths (logits for the last token only, as vLLM computes them);
- one decode step at several batch sizes over a KV cache of several context lengths (random K/V).

Each measured time is printed beside what ``lbbench profile derive``'s profile (its roofline step model, with the
shipped calibration) predicts for that GPU, and their ratio.
Hugging Face eager PyTorch is not vLLM (no fused kernels, no CUDA graphs, more launches per layer), so ratios
above 1 at small sizes are expected; the implied prefill MFU and decode bandwidth utilization are the numbers to
carry into a calibration (``profile derive --calibration``, or ``--prefill-mfu/--weight-bw-util``). Writes a Markdown table and a JSON file.

    python bench/gpu_profile.py --out docs/gpu_profile            # on the GPU machine (< 8 min on one H200)
    python bench/gpu_profile.py --device cpu --models tiny --out /tmp/gp   # a smoke run of the script itself
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lbbench.profiles import profile_from_dict  # noqa: E402
from lbbench.profiling.derive import EngineLimits, derive_profile  # noqa: E402
from lbbench.profiling.gpus import GPUS, get_gpu  # noqa: E402
from lbbench.profiling.models import MODELS_DIR, ModelConfig, load_model_config  # noqa: E402

TINY = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 2048}


def guess_gpu(name: str, total_gib: float) -> str | None:
    n = name.lower()
    for key, gpu in (("h200", "h200"), ("h100", "h100"), ("mi300", "mi300x"), ("l4", "l4"), ("a10g", "a10g")):
        if key in n:
            return gpu
    if "a100" in n:
        return "a100-80gb" if total_gib > 50 else "a100-40gb"
    if "v100" in n:
        return "v100-32gb" if total_gib > 20 else "v100-16gb"
    return None


class Timer:
    """Median wall time of ``fn`` over ``repeats`` runs after ``warmup`` runs (CUDA events on a GPU)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn, repeats: int = 5, warmup: int = 2) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


def device_peaks(timer: Timer, device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    n = 8192 if device.type == "cuda" else 512
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t = timer(lambda: a @ b)
    flops = 2 * n ** 3 / t
    m = (1 << 30) if device.type == "cuda" else (1 << 24)
    x = torch.empty(m // 2, device=device, dtype=torch.float16)
    y = torch.empty_like(x)
    tc = timer(lambda: y.copy_(x))
    return {"gemm_flops": flops, "copy_bytes_s": 2 * x.numel() * 2 / tc}


def build_model(cfg_dict: dict, device: torch.device, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "tie_word_embeddings")
    config = LlamaConfig(**{k: cfg_dict[k] for k in keys if k in cfg_dict})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(prev)
    return model.eval(), config


def random_cache(config, batch: int, context: int, device, dtype):
    from transformers import DynamicCache
    cache = DynamicCache()
    hd = config.hidden_size // config.num_attention_heads
    for layer in range(config.num_hidden_layers):
        k = torch.randn(batch, config.num_key_value_heads, context, hd, device=device, dtype=dtype)
        cache.update(k, torch.randn_like(k), layer)
    return cache


def profile_model(name: str, cfg_dict: dict, mc: ModelConfig, gpu_name: str | None, device, dtype, dtype_name,
                  timer: Timer, prompts, batches, contexts, mem_budget_bytes: float) -> list[dict]:
    model, config = build_model(cfg_dict, device, dtype)
    pred = None
    if gpu_name is not None:
        doc = derive_profile(mc, get_gpu(gpu_name), dtype=dtype_name,
                             engine=EngineLimits(max_num_seqs=max(batches), max_num_batched_tokens=max(8192, *prompts),
                                                 max_model_len=min(8192, mc.max_position_embeddings)))
        pred = profile_from_dict(doc, f"derived:{doc['name']}")
    rows = []
    vocab = config.vocab_size
    with torch.inference_mode():
        for p in prompts:
            ids = torch.randint(0, vocab, (1, p), device=device)
            t = timer(lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1))
            row = {"model": name, "phase": "prefill", "batch": 1, "tokens": p, "context": 0, "measured_s": t}
            if pred:
                row["derived_s"] = pred.step_time_s(p, 0, 0)
            row["achieved_tflops"] = mc.prefill_flops_per_token(p / 2) * p / t / 1e12
            rows.append(row)
        kv_tok = mc.kv_bytes_per_token(dtype_name)
        for c in contexts:
            for b in batches:
                if b * c * kv_tok > mem_budget_bytes:
                    continue
                cache = random_cache(config, b, c, device, dtype)
                ids = torch.randint(0, vocab, (b, 1), device=device)
                pos = torch.full((b, 1), c, device=device, dtype=torch.long)

                def step():
                    model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
                    cache.crop(-1)  # drop the appended token: the context stays fixed across repeats

                t = timer(step)
                row = {"model": name, "phase": "decode", "batch": b, "tokens": b, "context": c, "measured_s": t}
                if pred:
                    row["derived_s"] = pred.step_time_s(0, b, b * c)
                read = mc.params_read_per_step * (2 if dtype_name != "fp32" else 4) + b * c * kv_tok
                row["achieved_bw_gbs"] = read / t / 1e9
                rows.append(row)
                del cache
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    for r in rows:
        if "derived_s" in r:
            r["ratio_measured_to_derived"] = r["measured_s"] / r["derived_s"]
    return rows


def markdown(header: dict, rows: list[dict]) -> str:
    lines = [f"# GPU check: {header['device']}", "",
             f"Command: `{header['command']}`; torch {header['torch']}, transformers {header['transformers']}, "
             f"dtype {header['dtype']}, table GPU `{header['gpu']}`, {header['wall_s']:.0f} s.", "",
             f"Dense GEMM {header['gemm_tflops']:.0f} TFLOP/s (table peak {header['peak_tflops']}); "
             f"device copy {header['copy_gbs']:.0f} GB/s (table {header['peak_gbs']}).", "",
             "| model | phase | batch | prompt / context | measured ms | derived ms | measured / derived | achieved |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        ach = (f"{r['achieved_tflops']:.0f} TFLOP/s" if r["phase"] == "prefill" else f"{r['achieved_bw_gbs']:.0f} GB/s")
        size = r["tokens"] if r["phase"] == "prefill" else r["context"]
        der = f"{r['derived_s'] * 1e3:.2f}" if "derived_s" in r else "-"
        ratio = f"{r['ratio_measured_to_derived']:.2f}" if "ratio_measured_to_derived" in r else "-"
        lines.append(f"| {r['model']} | {r['phase']} | {r['batch']} | {size} | {r['measured_s'] * 1e3:.2f} | {der} | "
                     f"{ratio} | {ach} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gpu", default=None, help=f"table entry to compare with ({', '.join(GPUS)}); default: guessed")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--models", default="llama-2-7b,llama-3.1-8b", help="shipped configs, or 'tiny'")
    ap.add_argument("--prompts", default="128,512,1024,2048,4096")
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--contexts", default="512,2048")
    ap.add_argument("--out", required=True, help="path prefix: writes PREFIX.md and PREFIX.json")
    args = ap.parse_args(argv)
    t0 = time.time()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_profile: no CUDA device (use --device cpu for a smoke run)", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    timer = Timer(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        dev_name, total = props.name, props.total_memory
        gpu_name = args.gpu or guess_gpu(dev_name, total / 2 ** 30)
    else:
        dev_name, total, gpu_name = "cpu", 0.0, args.gpu
    peaks = device_peaks(timer, device, dtype)
    rows: list[dict] = []
    for name in args.models.split(","):
        if name == "tiny":
            cfg, mc = TINY, None
            from lbbench.profiling import models as _m
            tmp = Path(args.out).with_suffix(".tiny-config.json")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(TINY))
            mc = _m.load_model_config(tmp)
        else:
            cfg = json.loads((MODELS_DIR / f"{name}.json").read_text())
            mc = load_model_config(name)
        budget = 0.4 * (torch.cuda.mem_get_info()[0] if device.type == "cuda" else 2 ** 30)
        rows += profile_model(name, cfg, mc, gpu_name if name != "tiny" else None, device, dtype, args.dtype, timer,
                              [int(x) for x in args.prompts.split(",")], [int(x) for x in args.batches.split(",")],
                              [int(x) for x in args.contexts.split(",")], budget)
        print(f"gpu_profile: {name} done at {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    g = get_gpu(gpu_name) if gpu_name else None
    import transformers
    header = {"device": dev_name, "gpu": gpu_name, "dtype": args.dtype, "torch": torch.__version__,
              "transformers": transformers.__version__, "command": "python bench/gpu_profile.py " + " ".join(
                  argv if argv is not None else sys.argv[1:]),
              "gemm_tflops": peaks["gemm_flops"] / 1e12, "copy_gbs": peaks["copy_bytes_s"] / 1e9,
              "peak_tflops": g.peak(args.dtype) / 1e12 if g else None,
              "peak_gbs": g.memory_bw_bytes_s / 1e9 if g else None, "wall_s": time.time() - t0}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    md = markdown(header, rows)
    out.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
