"""Live tier: ``precise_prefix`` fed by KV events over ZMQ, against serve-sim and against real vLLM (CPU build).

serve-sim: instance 1 is warmed with a shared prefix behind the router's back, so only its published events can
tell the router where the prefix is; every later request with that prefix must go there (the load scorers tie and
would pick instance 0), through ``run_replay`` and through ``lbbench proxy``'s gateway. vLLM: two tiny-model CPU
instances started with ``--kv-events-config``; the same check, and the index holds the blocks vLLM reported.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest

from lbbench.core import Request
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig, free_port_range, resolve_profile
from lbbench.harness.replay import ReplaySettings, run_replay
from lbbench.live.http import prompt_token_ids
from lbbench.proxy.gateway import GatewayThread, ProxyConfig
from lbbench.routers import get_router

pytestmark = pytest.mark.live

BLOCK = 256  # tokens named by each prefix hash


def _requests(hashes: tuple[int, ...], n: int, gap_s: float, first_id: int = 0) -> list[Request]:
    """``n`` requests sharing ``hashes`` as their prompt's first blocks, then 64 tokens of their own."""
    return [Request(first_id + i, gap_s * i, BLOCK * len(hashes) + 64, 4, prefix_hashes=hashes,
                    prefix_block_tokens=BLOCK) for i in range(n)]


def _post(url: str, model: str, ids: list[int], max_tokens: int = 2) -> None:
    body = json.dumps({"model": model, "prompt": ids, "max_tokens": max_tokens, "min_tokens": max_tokens,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200


def _wait(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def sim_fleet():
    base = free_port_range(2)
    with EmulatorFleet(FleetConfig(resolve_profile("llama3.1-8b-a100"), 2, kv_events_port_base=base,
                                   prefix_caching=True)) as fleet:
        fleet.kv_events = [f"tcp://127.0.0.1:{base + i}" for i in range(2)]
        yield fleet


def _warm_later(url: str, model: str, request: Request, delay_s: float) -> threading.Thread:
    """Send ``request`` straight to ``url`` after ``delay_s`` (behind the router's back)."""
    t = threading.Thread(target=lambda: (time.sleep(delay_s), _post(url, model, prompt_token_ids(request))))
    t.start()
    return t


def _check_followed(router, records, warm_instance: int) -> None:
    assert router.index.num_events > 0
    assert len(router.index.blocks[warm_instance]) >= 3 * BLOCK // 16  # the prefix's 16-token blocks, at least
    # the load scorers tie between requests (each finishes before the next arrives), so without the events every
    # request would go to instance 0; with them every one goes where the prefix is cached
    assert [r.instance for r in sorted(records, key=lambda r: r.request_id)] == [warm_instance] * len(records)


def test_precise_prefix_follows_serve_sims_events_in_a_replay(sim_fleet):
    fleet = sim_fleet
    shared = _requests((71, 72, 73), 6, 0.3)
    reqs = [Request(r.request_id, 3.0 + r.arrival_s, r.prompt_tokens, r.output_tokens,
                    prefix_hashes=r.prefix_hashes, prefix_block_tokens=BLOCK) for r in shared[1:]]
    router = get_router("precise_prefix", num_instances=2, seed=0, profile=fleet.cfg.profile)
    settings = ReplaySettings(run_id="kv", seed=0, scrape_interval_s=None, kv_events=fleet.kv_events)
    # the replay subscribes before its clock starts; instance 1 caches the prefix ~1 s later, 2 s before the first
    # arrival
    warm = _warm_later(fleet.endpoints[1], fleet.instances[1].model, shared[0], 1.0)
    res = run_replay(reqs, router, fleet.endpoints, settings)
    warm.join()
    assert res.complete and all(r.error is None for r in res.records)
    _check_followed(router, res.records, 1)


def test_precise_prefix_through_the_proxy_follows_serve_sims_events(sim_fleet):
    fleet = sim_fleet
    shared = _requests((81, 82, 83), 6, 0.3)
    router = get_router("precise_prefix", num_instances=2, seed=0, profile=fleet.cfg.profile)
    cfg = ProxyConfig(backends=list(fleet.endpoints), router=router, health_interval_s=0.2,
                      kv_events=fleet.kv_events)
    with GatewayThread(cfg) as gw:
        time.sleep(0.5)  # the SUB sockets join before anything is published (ZMQ's slow joiner)
        _post(fleet.endpoints[1], fleet.instances[1].model, prompt_token_ids(shared[0]))
        assert _wait(lambda: router.index.num_events > 0, 10.0)
        res = run_replay(shared[1:], get_router("round_robin", num_instances=1, seed=0), [gw.url],
                         ReplaySettings(run_id="kv-proxy", seed=0, scrape_interval_s=None))
    assert res.complete and all(r.error is None for r in res.records)
    assert fleet.instances[1].num_finished_total == 1 + 5 and fleet.instances[0].num_finished_total == 0
    router.index.catch_up(1e9)
    assert len(router.index.blocks[1]) >= 3 * BLOCK // 16


def test_precise_prefix_follows_vllm_cpus_events(tmp_path):
    from harness.test_live_vllm import _vllm_python_or_skip
    from lbbench.engines.vllm.launcher import launch

    py = _vllm_python_or_skip()
    base = free_port_range(4)
    kv = [f"tcp://127.0.0.1:{base + 2 + i}" for i in range(2)]
    config = [json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{base + 2 + i}",
                          "topic": "kv-events"}) for i in range(2)]
    shared = _requests((91, 92, 93), 5, 0.3)  # 832-token prompts: 6 full blocks of vLLM CPU's 128 tokens
    reqs = [Request(r.request_id, 4.0 + r.arrival_s, r.prompt_tokens, r.output_tokens,
                    prefix_hashes=r.prefix_hashes, prefix_block_tokens=BLOCK) for r in shared[1:]]
    with launch("tiny", 2, vllm_python=py, log_dir=tmp_path / "logs", port_base=base, health_timeout_s=600,
                max_num_seqs=8, extra_args=["--enable-prefix-caching"],
                instance_args={i: ["--kv-events-config", config[i]] for i in range(2)}) as endpoints:
        urls = list(endpoints)
        router = get_router("precise_prefix", num_instances=2, seed=0)
        warm = _warm_later(urls[1], "tiny", shared[0], 1.5)
        res = run_replay(reqs, router, urls, ReplaySettings(run_id="kv-vllm", seed=0, scrape_interval_s=None,
                                                             kv_events=kv))
        warm.join()
    assert res.complete and all(r.error is None for r in res.records)
    # vLLM CPU's blocks are 128 tokens: the 768-token prefix is 6 of them, each request's own tail adds none
    assert len(router.index.blocks[1]) >= 6
    assert [r.instance for r in sorted(res.records, key=lambda r: r.request_id)] == [1] * len(reqs)


def test_lbbench_run_with_kv_events_from_the_command_line(sim_fleet, tmp_path):
    from click.testing import CliRunner

    from lbbench.cli import main

    fleet = sim_fleet
    args = ["run", "--workload", "inference-perf:groups=2,users=2,system=512,question=64,output=8", "--rate", "8",
            "--requests", "16", "--router", "precise_prefix", "--out", str(tmp_path / "run")]
    for url, kv in zip(fleet.endpoints, fleet.kv_events):
        args += ["--endpoint", url, "--kv-events", kv]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if "KV events:" in x)
    assert int(line.split("KV events: ")[1].split(" batches")[0]) > 0 and "0 batches missed" in line
