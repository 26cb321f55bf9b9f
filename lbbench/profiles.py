"""Profiles: one TOML file per model x hardware x engine setting.

A profile gives the simulator its step-time model (``Profile.step_model``, a ``lbbench.step_model.StepModel``:
``base + a*prefill_tokens + b*decode_seqs + c*context_tokens`` seconds, ``LinearStepModel``), the
paged KV cache (``num_kv_blocks`` of ``block_size`` tokens), the engine's limits,
the paper's mixing parameters and a ``[source]`` table saying where each number
came from. Comparing hardware is comparing profiles.

Lookup order for ``load_profile(name_or_path)``: an existing file path; then
``profiles/NAME.toml`` in the source tree; then the copy shipped in the wheel.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from .core import InstanceSpec
from .errors import InputError
from .roofline import RooflineEfficiency, RooflineError, RooflineShape, RooflineStepModel
from .step_model import LinearStepModel, StepModel, step_s


class ProfileError(InputError):
    pass


#: context per sequence (prompt + generated tokens) of the typical decode batch behind an instance's speed figure
TYPICAL_CONTEXT_TOKENS = 1024
#: prompt length behind an instance's prefill speed figure
TYPICAL_PROMPT_TOKENS = 1024


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    model: str
    hardware: str
    # step time (seconds)
    base_s: float
    prefill_token_s: float
    decode_seq_s: float
    context_token_s: float
    # paged KV cache
    num_kv_blocks: int
    block_size: int
    # engine limits
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    chunked_prefill: bool
    # the paper's workload impact estimator
    grad1: float
    grad2: float
    epsilon: float
    alpha: float
    min_step_s: float  # the paper's Δt: decision epoch / minimum decode step
    #: engine semantics: "v1" (vLLM V1: one mixed step, running first) or "v0" (vLLM V0 without chunked
    #: prefill: a step prefills waiting requests only, decodes pause; otherwise decode-only steps)
    scheduler: str = "v1"
    #: latency the serving front end adds between the engine and the client (request intake, streaming); a
    #: measured profile fits it from time to first token. The simulator adds it to every client-observed time.
    api_overhead_s: float = 0.0
    #: vLLM's ``--long-prefill-token-threshold`` (``[engine]``): with chunked prefill, the most prompt tokens one
    #: request prefills in a step (0: no cap beyond the step's token budget)
    long_prefill_token_threshold: int = 0
    #: vLLM V1's async scheduling (``[engine] async_scheduling``, the default from vLLM 0.12): step k + 1 is
    #: scheduled while step k runs, so a request arriving during step k first runs in step k + 2
    async_scheduling: bool = False
    #: automatic prefix caching (``[kv] enable_prefix_caching``; off unless set, so results made without it
    #: stay put, although vLLM V1 enables it by default)
    enable_prefix_caching: bool = False
    #: a CPU tier for KV blocks, as vLLM's offloading connector keeps one (``[kv] cpu_offload_blocks``; 0: none,
    #: the default). It needs ``kv_bytes_per_block`` (bytes of one block's KV, all layers) and
    #: ``cpu_link_bytes_s`` (the host-to-device link, e.g. PCIe), which time a load (``lbbench.sim.offload``)
    cpu_offload_blocks: int = 0
    kv_bytes_per_block: float = 0.0
    cpu_link_bytes_s: float = 0.0
    #: what the profile models physically (``model_config``, ``gpu``, ``dtype``, ``tp``, efficiency factors):
    #: lets ``lbbench profiles`` show the implied prefill MFU and decode bandwidth utilization
    physics: dict[str, Any] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)
    path: str | None = None
    #: ``[step] model = "roofline"``: the ``[roofline]`` table (what one GPU handles per step) and the
    #: ``[efficiency]`` factors; the step times then come from ``lbbench.roofline`` and ``[step]``'s linear
    #: coefficients are only a summary of it
    roofline: dict[str, float] = field(default_factory=dict)
    efficiency: dict[str, float] = field(default_factory=dict)

    @cached_property
    def step_model(self) -> StepModel:
        """What every step of an instance with this profile costs (``lbbench.step_model``)."""
        if self.roofline:
            return RooflineStepModel(RooflineShape.from_table(self.roofline, self.name),
                                     RooflineEfficiency(**self.efficiency))
        return LinearStepModel(self.base_s, self.prefill_token_s, self.decode_seq_s, self.context_token_s)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size

    @property
    def decode_tokens_per_s(self) -> float:
        """Single-stream decode rate used to convert seconds to tokens."""
        return 1.0 / self.min_step_s

    def step_time_s(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        """One step through ``step_model``: ``decode_seqs`` decoding sequences reading ``context_tokens`` of
        KV beside one fresh prefill chunk of ``prefill_tokens``."""
        return step_s(self.step_model, prefill_tokens, decode_seqs, context_tokens)

    def typical_decode_batch(self) -> int:
        """Sequences in a typical full decode batch: ``max_num_seqs``, or fewer when the KV cache holds
        fewer sequences of ``TYPICAL_CONTEXT_TOKENS`` each."""
        return max(1, min(self.max_num_seqs, self.kv_capacity_tokens // TYPICAL_CONTEXT_TOKENS))

    def instance_spec(self) -> InstanceSpec:
        """What a router may know of an instance with this profile. Speed figures, from the step-time model:

        - ``batch_decode_tokens_per_s = B / step_time_s(0, B, B * C)`` with ``C = TYPICAL_CONTEXT_TOKENS``
          and ``B = typical_decode_batch()`` (one token per sequence per decode step);
        - ``prefill_tokens_per_s = P / step_time_s(P, 0, 0)`` with
          ``P = min(TYPICAL_PROMPT_TOKENS, max_num_batched_tokens)``.
        """
        b = self.typical_decode_batch()
        p = min(TYPICAL_PROMPT_TOKENS, self.max_num_batched_tokens)
        return InstanceSpec(max_num_seqs=self.max_num_seqs, kv_capacity_tokens=self.kv_capacity_tokens,
                            min_step_s=self.min_step_s,
                            batch_decode_tokens_per_s=b / self.step_time_s(0, b, b * TYPICAL_CONTEXT_TOKENS),
                            prefill_tokens_per_s=p / self.step_time_s(p, 0, 0), profile_name=self.name)

    def with_overrides(self, **kw: Any) -> "Profile":
        return replace(self, **kw)


_SECTIONS = {
    "step": ("base_s", "prefill_token_s", "decode_seq_s", "context_token_s"),
    "kv": ("num_kv_blocks", "block_size"),
    "engine": ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "chunked_prefill"),
    "mixing": ("grad1", "grad2", "epsilon", "alpha", "min_step_s"),
}


def _source_dirs() -> list[Path]:
    here = Path(__file__).resolve().parent
    return [here.parent / "profiles", here / "_profiles"]


def available_profiles() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for d in _source_dirs():
        if d.is_dir():
            for p in sorted(d.glob("*.toml")):
                out.setdefault(p.stem, p)
    return out


def load_profile(name_or_path: str | Path) -> Profile:
    p = Path(name_or_path)
    if not (p.suffix == ".toml" and p.is_file()):
        found = available_profiles().get(str(name_or_path))
        if found is None:
            names = ", ".join(available_profiles()) or "none"
            raise ProfileError(f"profile: unknown profile {str(name_or_path)!r} (known: {names}; "
                               "or give a path to a .toml file)")
        p = found
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{p}: not valid TOML: {exc}") from None
    return profile_from_dict(data, p)


def profile_from_dict(data: dict[str, Any], origin: str | Path) -> Profile:
    """A profile from its TOML tables as a dict (a file's, or ``derive_profile``'s held in memory); errors
    name ``origin`` (the file, or what made the dict)."""
    p = Path(origin)
    kw: dict[str, Any] = {
        "name": data.get("name", p.stem),
        "description": data.get("description", ""),
        "model": data.get("model", ""),
        "hardware": data.get("hardware", ""),
        "source": {str(k): str(v) for k, v in data.get("source", {}).items()},
        "physics": dict(data.get("physics", {})),
        "path": str(p) if p.is_file() else None,
    }
    for section, keys in _SECTIONS.items():
        tbl = data.get(section)
        if not isinstance(tbl, dict):
            raise ProfileError(f"{p}: missing table [{section}]")
        for k in keys:
            if k not in tbl:
                raise ProfileError(f"{p}: missing key {section}.{k}")
            kw[k] = tbl[k]
    kw["scheduler"] = str(data["engine"].get("scheduler", "v1"))
    kw["api_overhead_s"] = float(data["step"].get("api_overhead_s", 0.0))
    kw["long_prefill_token_threshold"] = int(data["engine"].get("long_prefill_token_threshold", 0))
    asy = data["engine"].get("async_scheduling", False)
    if not isinstance(asy, bool):
        raise ProfileError(f"{p}: engine.async_scheduling must be true or false, not {asy!r}")
    kw["async_scheduling"] = asy
    model = data["step"].get("model", "linear")
    if model not in ("linear", "roofline"):
        raise ProfileError(f"{p}: step.model must be \"linear\" or \"roofline\", not {model!r}")
    if model == "roofline":
        for tbl in ("roofline", "efficiency"):
            if not isinstance(data.get(tbl), dict):
                raise ProfileError(f"{p}: step.model = \"roofline\" needs a [{tbl}] table")
        kw["roofline"] = dict(data["roofline"])
        known = set(RooflineEfficiency().as_dict())
        unknown = sorted(set(data["efficiency"]) - known)
        if unknown:
            raise ProfileError(f"{p}: unknown key efficiency.{unknown[0]} (known: {', '.join(sorted(known))})")
        kw["efficiency"] = {k: float(v) for k, v in data["efficiency"].items()}
    apc = data["kv"].get("enable_prefix_caching", False)
    if not isinstance(apc, bool):
        raise ProfileError(f"{p}: kv.enable_prefix_caching must be true or false, not {apc!r}")
    kw["enable_prefix_caching"] = apc
    _offload_fields(data["kv"], kw, p)
    prof = Profile(**kw)
    _validate(prof, p)
    if prof.roofline:
        try:
            prof.step_model  # noqa: B018 - built now, so that a bad table is an error naming the file
        except (RooflineError, TypeError) as exc:
            raise ProfileError(f"{p}: {exc}") from None
    return prof


def _offload_fields(kv: dict[str, Any], kw: dict[str, Any], p: Path) -> None:
    """``[kv] cpu_offload_blocks``, ``kv_bytes_per_block``, ``cpu_link_bytes_s`` (all optional; a CPU tier
    needs the two others)."""
    n = kv.get("cpu_offload_blocks", 0)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ProfileError(f"{p}: kv.cpu_offload_blocks must be a whole number >= 0, not {n!r}")
    kw["cpu_offload_blocks"] = n
    for key in ("kv_bytes_per_block", "cpu_link_bytes_s"):
        v = kv.get(key, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (n and v <= 0):
            need = "> 0 (a CPU tier, kv.cpu_offload_blocks > 0, needs it)" if n else ">= 0"
            raise ProfileError(f"{p}: kv.{key} must be a number {need}, not {v!r}")
        kw[key] = float(v)


def _validate(prof: Profile, p: Path) -> None:
    for k in ("base_s", "prefill_token_s", "decode_seq_s", "context_token_s", "grad1", "grad2",
              "epsilon", "alpha"):
        if getattr(prof, k) < 0:
            raise ProfileError(f"{p}: {k} must be >= 0")
    for k in ("num_kv_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        if int(getattr(prof, k)) <= 0:
            raise ProfileError(f"{p}: {k} must be a positive integer")
    if prof.long_prefill_token_threshold < 0:
        raise ProfileError(f"{p}: engine.long_prefill_token_threshold must be >= 0")
    if prof.api_overhead_s < 0:
        raise ProfileError(f"{p}: step.api_overhead_s must be >= 0")
    if prof.scheduler not in ("v1", "v0"):
        raise ProfileError(f"{p}: engine.scheduler must be \"v1\" or \"v0\", not {prof.scheduler!r}")
    if prof.min_step_s <= 0:
        raise ProfileError(f"{p}: mixing.min_step_s must be > 0")
    if prof.max_num_batched_tokens < prof.max_num_seqs:
        raise ProfileError(f"{p}: max_num_batched_tokens must be >= max_num_seqs (every running "
                           "request decodes each step)")
