"""``lbbench profile derive``: a profile from first principles (model config x GPU table x engine settings).

The profile's steps are priced by the roofline of :mod:`lbbench.roofline` (``[step] model = "roofline"``, with its
``[roofline]`` and ``[efficiency]`` tables), built by :func:`lbbench.profiling.roofline_derive.derive_roofline_profile`
from the model config, the GPU table, tensor parallelism and dtypes; its efficiency factors and front-end latency
are a calibration's (:mod:`lbbench.profiling.calibration`; by default the one shipped, fitted to public vLLM
measurements). ``[step]``'s linear coefficients only summarize that roofline, for the paper's mixing estimator
(``grad1``, ``grad2``) and for tables.

The engine is vLLM as it runs today unless told otherwise: the V1 scheduler with chunked prefill and vLLM V1's
default limits on the GPU. ``EngineLimits(scheduler="v0", chunked_prefill=False)`` gives the vLLM V0 variant the
paper ran. ``lbbench plan``, ``plan --mix`` and their fleets derive through :func:`derive_profile`, so a plan and
a profile written by ``derive`` describe the same engine.

KV blocks follow vLLM's memory profiler: ``memory x gpu_memory_utilization`` less the weights and the activation
peak of a profiling forward pass over ``max_num_batched_tokens`` tokens (plus the sampler's logits for
``max_num_seqs`` sequences); the CUDA context is not charged.
"""

from __future__ import annotations

from pathlib import Path

from .calibration import SHIPPED, Calibration, load_calibration
from .gpus import GPU
from .models import ModelConfig
from .roofline_derive import DeriveError, EngineLimits, derive_roofline_profile


def derive_profile(model: ModelConfig, gpu: GPU, *, dtype: str = "bf16", tp: int = 1, kv_dtype: str = "auto",
                   engine: EngineLimits = EngineLimits(), calibration: Calibration | None = None,
                   name: str | None = None) -> dict:
    """The profile as a TOML-ready dict, every number with its ``[source]`` line; ``calibration`` None: the
    shipped one (``load_calibration(None)``)."""
    cal = calibration if calibration is not None else load_calibration(None)
    if dtype != "fp8":  # FP8 weights run weight-only on a GPU without FP8 tensor cores
        gpu.peak(dtype)  # an UnknownGPUError when the GPU has no such tensor cores (bf16 on a V100)
    if model.num_heads % tp or (model.num_kv_heads % tp and tp % model.num_kv_heads):
        raise DeriveError(f"{model.name}: {model.num_heads} attention heads ({model.num_kv_heads} KV heads) do "
                          f"not split over TP {tp}")
    method = cal.info.get("method")
    which = ("the shipped calibration (lbbench/profiling/data/calibration.toml)" if Path(cal.path) == SHIPPED
             else f"calibration {Path(cal.path).name}")
    eff_source = f"{which}, fitted on: {cal.info.get('fitted_on', 'not stated')}" + (
        f"; method: {method}" if method else "")
    doc = derive_roofline_profile(model, gpu, tp=tp, weights_dtype=dtype, kv_dtype=kv_dtype, engine=engine,
                                  eff=cal.eff, eff_source=eff_source, api_overhead_s=cal.api_overhead_s, name=name)
    doc["source"]["method"] = "lbbench profile derive, through " + doc["source"]["method"]
    doc["source"]["api_overhead_s"] = f"front-end latency of {which}"
    doc["source"]["mixing"] = ("grad1 and grad2: [step]'s prefill and decode costs; min_step_s: the single-sequence "
                               "decode step; alpha 0.5 as the paper; epsilon 50 ms (not given in the paper)")
    return doc
