"""What a profile's numbers imply physically: prefill MFU and decode bandwidth utilization.

A profile whose ``[physics]`` table names its model config and GPU can be checked against the hardware:

- ``prefill_mfu`` = prefill FLOPs per token / (``prefill_token_s`` x peak dense FLOP/s): the share of peak
  compute its prefill cost needs; above ~0.8 no serving engine reaches it, above 1 it is impossible;
- ``decode_bw_util`` = weight bytes streamed per step / (single-sequence step time x bandwidth): the share of
  peak bandwidth a batch-1 decode step needs; above ~0.9 it is not reached, above 1 impossible.
"""

from __future__ import annotations

from ..profiles import Profile
from .gpus import get_gpu
from .models import DTYPE_BYTES, load_model_config

#: the most a real engine reaches; shipped profiles must stay at or below these
MAX_PREFILL_MFU = 0.8
MAX_DECODE_BW_UTIL = 0.9
#: prompt length at which the attention part of a prefill token's FLOPs is evaluated (mean context: half)
REFERENCE_PROMPT_TOKENS = 1024


def implied_utilization(profile: Profile) -> dict[str, float | None]:
    """``prefill_mfu`` and ``decode_bw_util`` of ``profile``; None where its physics is not stated."""
    phys = profile.physics
    if not phys.get("model_config") or not phys.get("gpu"):
        return {"prefill_mfu": None, "decode_bw_util": None}
    model = load_model_config(phys["model_config"])
    gpu = get_gpu(phys["gpu"])
    dtype = phys.get("dtype", "bf16")
    tp = int(phys.get("tp", 1))
    flops = model.prefill_flops_per_token(REFERENCE_PROMPT_TOKENS / 2) / tp
    mfu = flops / (profile.prefill_token_s * gpu.peak(dtype)) if profile.prefill_token_s > 0 else float("inf")
    read_bytes = model.params_read_per_step * DTYPE_BYTES[dtype] / tp
    step1 = profile.base_s + profile.decode_seq_s
    bw_util = read_bytes / (step1 * gpu.memory_bw_bytes_s) if step1 > 0 else float("inf")
    return {"prefill_mfu": round(mfu, 4), "decode_bw_util": round(bw_util, 4)}


def physical_problems(profile: Profile) -> list[str]:
    """Why ``profile`` is not physically possible on its stated hardware (empty when it is)."""
    u = implied_utilization(profile)
    out = []
    if u["prefill_mfu"] is not None and u["prefill_mfu"] > MAX_PREFILL_MFU:
        out.append(f"prefill cost {profile.prefill_token_s:.3g} s/token implies MFU {u['prefill_mfu']:.2f} "
                   f"> {MAX_PREFILL_MFU}")
    if u["decode_bw_util"] is not None and u["decode_bw_util"] > MAX_DECODE_BW_UTIL:
        out.append(f"decode step {profile.base_s + profile.decode_seq_s:.3g} s implies bandwidth utilization "
                   f"{u['decode_bw_util']:.2f} > {MAX_DECODE_BW_UTIL}")
    return out
