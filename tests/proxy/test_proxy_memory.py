"""The proxy keeps nothing for a finished request: after many streamed requests its per-request structures are
empty and the state's finish heaps bounded (a long run's memory stays flat)."""

from __future__ import annotations

from harness.conftest import poisson_requests

from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig
from lbbench.harness import replay as replay_mod
from lbbench.harness.replay import ReplaySettings, run_replay
from lbbench.profiles import load_profile
from lbbench.proxy.gateway import GatewayThread, ProxyConfig
from lbbench.routers import get_router


def test_nothing_kept_for_finished_requests(tmp_path, monkeypatch):
    seen = []
    real_init = replay_mod._Replay.__init__

    def keep(self, *a, **kw):
        real_init(self, *a, **kw)
        seen.append(self)
    monkeypatch.setattr(replay_mod._Replay, "__init__", keep)
    reqs = poisson_requests(300, 60.0, output=(40, 120))
    with EmulatorFleet(FleetConfig(load_profile("llama3.1-8b-a100-v0"), 2)) as fleet:  # streams last seconds
        cfg = ProxyConfig(backends=list(fleet.endpoints), router=get_router("least_requests", num_instances=2),
                          health_interval_s=0.2)
        with GatewayThread(cfg) as gw:
            res = run_replay(reqs, get_router("round_robin", num_instances=1), [gw.url],
                             ReplaySettings(run_id="mem", seed=0, scrape_interval_s=None, out_dir=tmp_path,
                                            keep_token_times=False))
            g = gw.gateway
            assert res.complete and all(r.error is None for r in res.records)
            # the client has a stream's last bytes a moment before the proxy's handler returns: wait until the
            # proxy is idle (it refuses nothing more: no request is left to send)
            gw.call(g.drain, 10.0)
            # the proxy: no waiter, no queue, no state entry, no in-flight count, finish heaps bounded
            assert not g._waiting and len(g.dispatcher) == 0 and g._in_flight == 0
            assert not g.state._where and all(not inst.entries for inst in g.state._inst)
            assert all(len(inst.heap) <= 64 + 1 for inst in g.state._inst)
            assert sum(g.metrics.in_flight) == 0 and set(g.metrics.requests) == {"200"}
    # the client: records only (written as they completed); no token times, no per-request state left
    rp = seen[-1]
    assert not res.token_times and len(res.records) == len(reqs)
    assert sum(1 for _ in (tmp_path / "requests.partial.jsonl").open()) == len(reqs)
    assert not rp.arrived_at and not rp.remote and not rp.in_flight and not rp.no_lead
    assert not rp.state._where and all(len(inst.heap) <= 64 + 1 for inst in rp.state._inst)
