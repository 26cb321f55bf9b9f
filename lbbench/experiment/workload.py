"""The requests of one seed: a synthetic workload, a dataset or a trace, as a ``RunConfig`` asks.

Seeds are paired: for a given seed (and arrival order) every router sees exactly the same requests.
"""

from __future__ import annotations

from .. import workloads as wl
from ..admission import AdmissionError, assign_tenants, parse_tenants
from ..core import Request
from ..predict import annotate, load_predictor
from ..predict.dataset_workload import dataset_workload
from ..profiles import Profile
from ..workloads.agentic import agentic, parse_agentic_spec
from ..workloads.inference_perf import inference_perf_requests
from ..workloads.session_traces import is_session_trace, load_session_trace
from ..workloads.sessions import parse_session_spec, sessions
from ..workloads.traces import load_trace_requests
from .config import WORKLOADS, ConfigError, RunConfig


def build_requests(cfg: RunConfig, profile: Profile, seed: int, order: str | None) -> list[Request]:
    """The requests for one seed (and arrival order), before predictions; with ``tenants``, each with its tenant
    and priority band (``lbbench.admission.assign_tenants``)."""
    reqs = _workload_requests(cfg, profile, seed, order)
    if cfg.tenants is None:
        return reqs
    try:
        return assign_tenants(reqs, parse_tenants(cfg.tenants), seed)
    except AdmissionError as exc:
        raise ConfigError(exc.problem, exc.field) from None


def _workload_requests(cfg: RunConfig, profile: Profile, seed: int, order: str | None) -> list[Request]:
    n = cfg.requests
    if cfg.trace:
        opts = dict(cfg.trace_options)
        if is_session_trace(cfg.trace):  # conversations (chat_id / parent_chat_id): replayed closed loop
            return load_session_trace(cfg.trace, rate=cfg.rate_per_s, requests=n, **opts)
        return load_trace_requests(cfg.trace, rate=cfg.rate_per_s, requests=n, **opts)
    rate = cfg.rate_per_s if cfg.rate_per_s is not None else 20.0
    n = n if n is not None else 2000
    w = cfg.workload
    if w == "paper-mix":
        return wl.paper_mix(n, rate, seed, burstiness=cfg.burstiness)
    if w == "paper-classes":
        return wl.paper_classes(order or "all_random", n, rate, seed, profile, burstiness=cfg.burstiness)
    if w == "poisson":
        return wl.poisson(n, rate, seed, prompt_tokens=wl.parse_length_spec(cfg.prompt_tokens, "prompt_tokens"),
                          output_tokens=wl.parse_length_spec(cfg.output_tokens, "output_tokens"),
                          burstiness=cfg.burstiness)
    if w.split(":", 1)[0] in ("sessions", "shared-prefix"):
        return sessions(n, rate, seed, parse_session_spec(w), max_model_len=profile.max_model_len,
                        burstiness=cfg.burstiness)
    if w.split(":", 1)[0] == "inference-perf":
        return inference_perf_requests(w, n, rate, seed)
    if w.split(":", 1)[0] == "agentic":
        return agentic(n, rate, seed, parse_agentic_spec(w), max_model_len=profile.max_model_len,
                       burstiness=cfg.burstiness, prefill_s_per_token=profile.prefill_token_s,
                       step_s=profile.min_step_s)
    if w.startswith("dataset:"):
        return dataset_workload(w.split(":", 1)[1], n, rate, seed, max_model_len=profile.max_model_len)
    raise ConfigError(f"unknown workload {w!r} (choose from {', '.join(WORKLOADS)}, "
                      "sessions[:K=V,...], shared-prefix[:K=V,...], inference-perf[:K=V,...], agentic[:K=V,...], "
                      "dataset:FILE, or give a trace file)",
                      "workload")


def annotated_requests(profile: Profile, profile_name: str, *, workload: str, trace: str | None,
                       max_prompt_tokens: int | None, rate: float, requests: int, seed: int, prompt_tokens: str,
                       output_tokens: str, predictor: str, trace_options: dict | None = None,
                       burstiness: float = 1.0) -> list[Request]:
    """The requests of a workload (or trace) for ``profile``, annotated by ``predictor``: what fidelity and
    calibration replay live and simulate."""
    opts = dict(trace_options or {})
    if max_prompt_tokens:
        opts["max_prompt_tokens"] = max_prompt_tokens
    cfg = RunConfig(profile=profile_name, workload=workload, trace=trace, rate_per_s=rate, requests=requests,
                    trace_options=opts, seed=seed, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                    predictor=predictor, burstiness=burstiness)
    return annotate(build_requests(cfg, profile, seed, None), load_predictor(predictor, profile=profile, seed=seed))
