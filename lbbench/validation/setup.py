"""From measured rows to a simulated setup: the profile, the workload and the stage windows of one experiment.

Rows of ``lbbench.measured`` sharing an ``id`` are the load stages of one experiment, run one after the other
against one engine. For each experiment this module builds:

- **the profile** (``lbbench.profiling.roofline_derive``): the model config named by the row's Hugging Face id,
  the GPU, TP, weight and KV dtypes, and the engine limits as launched (``max_num_seqs``,
  ``max_num_batched_tokens``, ``max_model_len``, ``gpu_memory_utilization``, ``long_prefill_token_threshold``,
  prefix caching, the KV blocks the engine reported); an empty limit takes the engine version's default;
- **the workload**: inference-perf ``shared_prefix`` rows (``prefix_groups`` set) as
  ``lbbench.workloads.shared_prefix`` generates them, at each stage's rate and arrival kind; other rows as
  independent requests of the row's prompt length (its measured mean and max) and output length, at the stage's
  rate; MLPerf's Llama-3.1-8B rows, whose per-sample prompt lengths are not public, with the CNN/DailyMail
  assumption of :data:`MLPERF_CNNDM_PROMPTS` (its derivation is in that constant's docstring);
- **the stage windows**: which requests each stage's metrics cover (those sent during it).

A row that cannot be built (an unknown model or GPU, a model that does not fit, a workload the row does not
describe) yields a setup with ``not_covered`` set to the reason, never an exception, so that the other rows
still run. Every assumption made is listed in ``notes``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..core import Request
from ..errors import InputError
from ..profiles import Profile, profile_from_dict
from ..profiling.gpus import get_gpu
from ..profiling.models import load_model_config, shipped_models
from ..profiling.roofline_derive import V1_GPU_MEMORY_UTILIZATION, EngineLimits, derive_roofline_profile
from ..roofline import RooflineEfficiency
from ..workloads.lengths import LognormalLength
from ..workloads.shared_prefix import SharedPrefixSpec, Stage, shared_prefix_requests, stage_arrivals

@dataclass(frozen=True)
class PromptAssumption:
    """Prompt lengths a source does not publish: lognormal of this mean and CV, clipped to ``[lo, hi]``."""

    mean_tokens: float
    cv: float
    lo: int
    hi: int
    source: str

    def lengths(self, n: int, rng: np.random.Generator) -> np.ndarray:
        sigma = math.sqrt(math.log1p(self.cv ** 2))
        model = LognormalLength.for_mean(self.mean_tokens, sigma, lo=self.lo, hi=self.hi)
        return np.asarray(model.sample(rng, n), dtype=np.int64)


#: MLPerf Inference v5.1 Llama-3.1-8B (CNN/DailyMail validation, 13,368 articles, Llama-3.1 tokenizer, the chat
#: prompt "Summarize the following news article in 128 tokens..."; inputs at most 2,540 tokens). No public file
#: gives the per-sample lengths, so they are assumed: CNN/DailyMail articles average 781 words (See et al., "Get
#: To The Point", ACL 2017, section 4), the Llama-3.1 tokenizer makes 1.308 tokens of a word of CNN/DailyMail text
#: (NVIDIA TensorRT-LLM, triton_backend README, measured on its mini_cnn_eval.json with the Llama-3.1-8B
#: tokenizer), and the prompt template adds about 30 tokens: 781 x 1.308 + 30 = 1,052, less the few articles past
#: the 2,540-token cap: a mean of 1,030. The spread (CV 0.5) is that of news article lengths, right-skewed; the
#: floor is 64 tokens. ``lbbench fidelity --measured`` reports how far the results move at 800 and 1,250.
MLPERF_CNNDM_PROMPTS = PromptAssumption(
    mean_tokens=1030.0, cv=0.5, lo=64, hi=2540,
    source="assumed CNN/DailyMail lengths: 781 words (See et al. 2017) x 1.308 Llama-3.1 tokens per word "
           "(TensorRT-LLM triton_backend README) + 30 template tokens, less articles past the 2,540-token cap; "
           "lognormal, CV 0.5, clipped to [64, 2540]")


@dataclass
class Setup:
    """One experiment ready to simulate (or the reason it is not)."""

    key: str
    rows: list[Any]
    profile: Profile | None = None
    requests: list[Request] = field(default_factory=list)
    stage_of: np.ndarray | None = None  # stage index of each request, by position in ``requests``
    stage_spans_s: list[tuple[float, float]] = field(default_factory=list)
    replicas: int = 1
    notes: list[str] = field(default_factory=list)
    not_covered: str | None = None


def value(row: Any, col: str) -> Any:
    """A row's cell (a ``MeasuredRow`` attribute or a mapping's value); None when empty."""
    v = row.get(col) if isinstance(row, dict) else getattr(row, col, None)
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def number(row: Any, col: str) -> float | None:
    v = value(row, col)
    if v is None:
        return None
    if isinstance(v, bool):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        raise InputError(f"row {value(row, 'id')} stage {value(row, 'stage')}: column {col}: {v!r} is not a "
                         "number") from None


def flag(row: Any, col: str) -> bool | None:
    v = value(row, col)
    if v is None or isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("true", "1", "yes", "on")


def resolve_model(hf_id: str):
    """The shipped model config whose Hugging Face id is ``hf_id`` (case and ``-hf`` / ``-instruct`` suffixes
    aside); None when none matches."""

    def norm(s: str) -> str:
        s = s.lower().split("/")[-1]
        for suffix in ("-hf", "-instruct", "-v0.1", "-fp8-dynamic"):
            s = s.replace(suffix, "")
        return s

    want = norm(hf_id)
    for name in shipped_models():
        cfg = load_model_config(name)
        if cfg.hf_id and (cfg.hf_id.lower() == hf_id.lower() or norm(cfg.hf_id) == want):
            return cfg
    return None


def _whole(row: Any, col: str) -> int | None:
    """A whole-number cell, None when empty (or 0)."""
    v = number(row, col)
    return int(v) if v else None


def _async_by_default(engine: Any, version: Any) -> bool:
    """vLLM schedules asynchronously by default from 0.12 (vllm-project/vllm pull request #27614)."""
    if str(engine or "vllm").lower() != "vllm" or not version:
        return False
    try:
        major, minor = (int(x) for x in str(version).split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (0, 12)


def _stages(rows: Sequence[Any]) -> list[Stage]:
    out = []
    for r in rows:
        rate, dur = number(r, "rate_rps"), number(r, "duration_s")
        n = number(r, "requests")
        if rate is None:
            raise ValueError(f"stage {value(r, 'stage')}: no rate_rps")
        if dur is None:
            if n is None:
                raise ValueError(f"stage {value(r, 'stage')}: neither duration_s nor requests")
            dur = n / rate
        arrival = value(r, "arrival") or "poisson"
        if arrival == "burst":
            raise ValueError(f"stage {value(r, 'stage')}: burst arrivals are not simulated")
        out.append(Stage(rate_per_s=rate, duration_s=dur, arrival=str(arrival)))
    return out


def build_profile(row: Any, eff: RooflineEfficiency, eff_source: str, api_overhead_s: float) -> Profile:

    cfg = resolve_model(str(value(row, "model")))
    if cfg is None:
        raise ValueError(f"model {value(row, 'model')!r} has no shipped config")
    gpu = get_gpu(str(value(row, "gpu")))
    tp = int(number(row, "tp") or 1)
    weights = str(value(row, "weights_dtype") or cfg.weights_dtype or "bf16")
    kv = str(value(row, "kv_dtype") or "auto")
    engine = EngineLimits(  # an empty limit: vLLM V1's default on this GPU (EngineLimits.resolved)
        max_num_seqs=_whole(row, "max_num_seqs"),
        max_num_batched_tokens=_whole(row, "max_num_batched_tokens"),
        max_model_len=_whole(row, "max_model_len"),
        gpu_memory_utilization=number(row, "gpu_memory_utilization") or V1_GPU_MEMORY_UTILIZATION,
        long_prefill_token_threshold=int(number(row, "long_prefill_token_threshold") or 0),
        enable_prefix_caching=flag(row, "prefix_caching") is not False,  # vLLM V1 enables it by default
        async_scheduling=_async_by_default(value(row, "engine"), value(row, "engine_version")),
        num_gpu_blocks=_whole(row, "gpu_kv_blocks"),
        cpu_offload_gib=number(row, "cpu_offload_gib") or 0.0)
    data = derive_roofline_profile(cfg, gpu, tp=tp, weights_dtype=weights, kv_dtype=kv, engine=engine, eff=eff,
                                   eff_source=eff_source, api_overhead_s=api_overhead_s,
                                   name=f"{value(row, 'id')}")
    return profile_from_dict(data, f"measured row {value(row, 'id')}")


def build_setup(key: str, rows: Sequence[Any], eff: RooflineEfficiency, *, eff_source: str = "",
                api_overhead_s: float = 0.0, prompts: PromptAssumption | None = None, seed: int = 0) -> Setup:
    rows = sorted(rows, key=lambda r: int(number(r, "stage") or 0))
    setup = Setup(key=key, rows=list(rows))
    first = rows[0]
    try:
        setup.profile = build_profile(first, eff, eff_source, api_overhead_s)
        stages = _stages(rows)
    except (ValueError, InputError) as exc:
        setup.not_covered = str(exc)
        return setup
    prof = setup.profile
    if prof.cpu_offload_blocks:
        setup.notes.append(f"CPU KV offload of {number(first, 'cpu_offload_gib'):g} GiB: a CPU tier of "
                           f"{prof.cpu_offload_blocks:,} blocks loaded at {prof.cpu_link_bytes_s / 1e9:g} GB/s")
    setup.replicas = int(number(first, "replicas") or 1)
    out = int(number(first, "output_tokens") or 0)
    if out < 1:
        setup.not_covered = "no output_tokens"
        return setup
    t0 = 0.0
    for st in stages:
        setup.stage_spans_s.append((t0, t0 + st.duration_s))
        t0 += st.duration_s
    groups = number(first, "prefix_groups")
    if groups:
        nominal = (number(first, "system_prompt_tokens") or 0) + (number(first, "question_tokens") or 0)
        measured = number(first, "prompt_tokens_mean")
        scale = measured / nominal if measured and nominal else 1.0
        if measured and nominal:
            setup.notes.append(f"prompt lengths scaled by {scale:.3f} to the measured mean {measured:g} "
                               f"(nominal {nominal:g})")
        spec = SharedPrefixSpec(
            num_groups=int(groups), prompts_per_group=int(number(first, "prompts_per_group") or 1),
            system_prompt_tokens=int(number(first, "system_prompt_tokens") or 0),
            question_tokens=int(number(first, "question_tokens") or 0), output_tokens=out,
            multi_turn=bool(flag(first, "multi_turn")), prompt_scale=scale)
        setup.requests, setup.stage_of = shared_prefix_requests(spec, stages, seed=seed)
        return setup
    mean = number(first, "prompt_tokens_mean")
    rng = np.random.default_rng(seed)
    send_s, stage_of = stage_arrivals(stages, rng)
    if mean is None:
        if prompts is None:
            setup.not_covered = "prompt lengths unknown (no prompt_tokens_mean, no assumption for this source)"
            return setup
        lengths = prompts.lengths(len(send_s), rng)
        setup.notes.append(f"prompt lengths: {prompts.source}")
    else:
        hi = int(number(first, "prompt_tokens_max") or mean * 2)
        assumed = PromptAssumption(mean_tokens=mean, cv=0.5, lo=1, hi=max(hi, int(mean) + 2),
                                   source=f"lognormal of the measured mean {mean:g}, CV 0.5 (assumed)")
        lengths = assumed.lengths(len(send_s), rng)
        setup.notes.append(f"prompt lengths: {assumed.source}")
    total = number(first, "requests")
    if total is not None and len(stages) == 1 and abs(total - len(send_s)) > 0.02 * total:
        setup.notes.append(f"{len(send_s)} requests simulated for the {int(total)} measured")
    setup.requests = [Request(i, float(t), int(p), out) for i, (t, p) in enumerate(zip(send_s, lengths))]
    setup.stage_of = stage_of
    return setup


def workload_assumed(row: Any) -> bool:
    """Whether simulating the row needs an assumption about its prompts (it gives neither a shared-prefix
    description nor a measured mean prompt length)."""
    return number(row, "prefix_groups") is None and number(row, "prompt_tokens_mean") is None


def mlperf_prompts_for(row: Any) -> PromptAssumption | None:
    """The prompt assumption for a row from MLPerf's Llama-3.1-8B benchmark, else None."""
    src = str(value(row, "source") or "").lower()
    model = str(value(row, "model") or "").lower()
    return MLPERF_CNNDM_PROMPTS if "mlperf" in src and "llama-3.1-8b" in model else None
