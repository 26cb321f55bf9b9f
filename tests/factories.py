"""Small builders shared by the tests."""

from __future__ import annotations

from dataclasses import replace

from lbbench.core import Request
from lbbench.profiles import Profile, load_profile


def tiny_profile(**overrides) -> Profile:
    """A small, fast profile: few KV blocks so preemption happens, round numbers."""
    base = load_profile("llama2-7b-v100")
    kw = dict(name="tiny-test", base_s=0.01, prefill_token_s=1e-4, decode_seq_s=1e-4, context_token_s=1e-6,
              num_kv_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256,
              chunked_prefill=False, min_step_s=0.01, scheduler="v1", physics={})
    kw.update(overrides)
    return replace(base, **kw)


def req(i: int, arrival_s: float, prompt: int, output: int, task: str | None = None) -> Request:
    return Request(request_id=i, arrival_s=arrival_s, prompt_tokens=prompt, output_tokens=output, task=task)


def run_sessions(router_name: str):
    """Three tiny instances with prefix caching serve 120 multi-turn session requests (shared system prompts)
    routed by ``router_name``; returns ``(router, requests, records)``."""
    from lbbench.routers import get_router
    from lbbench.sim.cluster import ClusterSim
    from lbbench.workloads.sessions import SessionSpec, sessions

    prof = tiny_profile(num_kv_blocks=400, block_size=4, max_model_len=1200, max_num_batched_tokens=1200,
                        max_num_seqs=16)
    reqs = sessions(120, 20.0, 0, SessionSpec(system=64, prompts=2, turns=3, user=16, output=16, think=0.5,
                                                block=4), max_model_len=1200)
    router = get_router(router_name, num_instances=3, seed=0, profile=prof)
    recs = ClusterSim(prof, 3, reqs, check_invariants=True, prefix_caching=True).run(router)
    return router, reqs, recs
