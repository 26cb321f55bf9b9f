"""``lbbench profile derive|measure`` and ``lbbench fidelity``: where profiles come from, and how true they are."""

from __future__ import annotations

import json
from pathlib import Path

import click
import tomli_w


def write_profile_toml(profile: dict, out: str | Path) -> Path:
    """Write a profile dict (as ``derive_profile`` / ``fit_profile`` return) to ``out``."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(tomli_w.dumps(profile))
    return out


@click.group("profile")
def profile() -> None:
    """Make profiles: from first principles (derive) or from a live engine (measure)."""


@profile.command("derive")
@click.option("--model", "model_name", required=True,
              help="A shipped model config (llama-2-7b, llama-3.1-8b, llama-3.1-70b, mistral-7b, qwen2.5-7b) "
                   "or a Hugging Face config.json path.")
@click.option("--gpu", required=True, help="GPU name (v100-16gb, v100-32gb, a10g, l4, a100-40gb, a100-80gb, "
                                           "h100, h200, mi300x).")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor-parallel GPUs.")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32", "fp8"]), default="bf16", show_default=True)
@click.option("--gpu-memory-utilization", type=click.FloatRange(0.05, 1.0), default=0.9, show_default=True)
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=None,
              help="Default: 8192 with chunked prefill, else max_model_len.")
@click.option("--max-model-len", type=click.IntRange(min=16), default=None,
              help="Default: the model's max_position_embeddings, at most 8192.")
@click.option("--chunked-prefill/--no-chunked-prefill", default=True, show_default=True)
@click.option("--scheduler", type=click.Choice(["v1", "v0"]), default="v1", show_default=True,
              help="Engine semantics the simulator applies.")
@click.option("--prefill-mfu", type=click.FloatRange(0.01, 0.8), default=0.5, show_default=True,
              help="Share of peak dense FLOP/s prefill reaches (assumption unless measured).")
@click.option("--weight-bw-util", type=click.FloatRange(0.05, 0.9), default=0.8, show_default=True)
@click.option("--kv-bw-util", type=click.FloatRange(0.05, 0.9), default=0.5, show_default=True)
@click.option("--step-overhead-s", type=click.FloatRange(0.0, 1.0), default=0.0015, show_default=True,
              help="Fixed per-step cost outside GPU kernels (scheduler, sampler, launches).")
@click.option("--grad1", type=float, default=None, help="Mixing estimator grad1 (default: the prefill cost).")
@click.option("--grad2", type=float, default=None, help="Mixing estimator grad2 (default: the decode cost).")
@click.option("--min-step-s", type=float, default=None,
              help="Decision interval (default: the single-sequence step time).")
@click.option("--name", default=None, help="Profile name (default: MODEL-GPU[-tpN]).")
@click.option("--calibration", default=None,
              help="Say here if an efficiency factor was chosen to match a published number (goes to [source]).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Profile TOML to write.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def derive_cmd(model_name: str, gpu: str, tp: int, dtype: str, gpu_memory_utilization: float, max_num_seqs: int,
               max_num_batched_tokens: int | None, max_model_len: int | None, chunked_prefill: bool,
               scheduler: str, prefill_mfu: float, weight_bw_util: float, kv_bw_util: float,
               step_overhead_s: float, grad1: float | None, grad2: float | None, min_step_s: float | None,
               name: str | None, calibration: str | None, out: str, fmt: str) -> None:
    """Derive a profile from a model config and a GPU: parameter count, KV bytes per token, KV blocks as vLLM's
    memory profiler sizes them, and step-time coefficients from a roofline with stated efficiency factors."""
    from .profiling.derive import Efficiency, EngineSettings, derive_profile
    from .profiling.gpus import get_gpu
    from .profiling.models import load_model_config

    model = load_model_config(model_name)
    prof = derive_profile(
        model, get_gpu(gpu), dtype=dtype, tp=tp, name=name,
        eff=Efficiency(prefill_mfu=prefill_mfu, weight_bw_util=weight_bw_util, kv_bw_util=kv_bw_util,
                       step_overhead_s=step_overhead_s),
        engine=EngineSettings(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                              max_model_len=max_model_len, chunked_prefill=chunked_prefill,
                              scheduler=scheduler, gpu_memory_utilization=gpu_memory_utilization))
    if calibration:
        prof["source"]["calibration"] = calibration
    for key, value in (("grad1", grad1), ("grad2", grad2), ("min_step_s", min_step_s)):
        if value is not None:
            prof["mixing"][key] = value
            prof["source"][f"mixing.{key}"] = "given to derive (--" + key.replace("_", "-") + ")"
    path = write_profile_toml(prof, out)
    if fmt == "json":
        click.echo(json.dumps({"path": str(path), **{k: prof[k] for k in ("step", "kv", "engine", "physics")},
                               "num_params": model.num_params,
                               "kv_bytes_per_token": model.kv_bytes_per_token(dtype)}, indent=2))
        return
    s, kv = prof["step"], prof["kv"]
    click.echo(f"{prof['name']}: {model.num_params / 1e9:.2f} B parameters, "
               f"{model.kv_bytes_per_token(dtype) / 1024:.0f} KiB KV per token")
    click.echo(f"  step = {s['base_s'] * 1e3:.2f} ms + {s['prefill_token_s'] * 1e6:.1f} us/prefill token + "
               f"{s['decode_seq_s'] * 1e6:.2f} us/decode seq + {s['context_token_s'] * 1e9:.1f} ns/context token")
    click.echo(f"  KV: {kv['num_kv_blocks']} blocks of {kv['block_size']} "
               f"({kv['num_kv_blocks'] * kv['block_size']} tokens)")
    click.echo(f"wrote {path}")
