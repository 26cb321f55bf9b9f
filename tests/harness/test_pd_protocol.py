"""llm-d's P/D sidecar protocol on ``serve-sim`` (``lbbench.engines.vllm.pd``): the header, the two request bodies,
``kv_transfer_params`` there and back, a hand-computed transfer wait, the records' TTFT split, and how endpoints
with roles are given."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from lbbench.engines.vllm import pd
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig
from lbbench.experiment.config import ConfigError, RunConfig
from lbbench.harness.replay import pd_record_fields
from lbbench.core import Request, RequestRecord
from lbbench.kv_links import KVFabric, parse_kv_link
from lbbench.live.http import StreamResult
from lbbench.profiles import load_profile

KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # Llama-3.1-8B in bf16: 131,072


@pytest.mark.parametrize("value, url", [("10.0.0.7:8000", "http://10.0.0.7:8000"),
                                        ("http://pod-p:8200/", "http://pod-p:8200")])
def test_the_prefiller_header(value, url):
    assert pd.prefiller_url(value) == url
    assert pd.host_port(url) == url.removeprefix("http://")


@pytest.mark.parametrize("bad", ["pod-p", ":8000", "pod-p:http", "pod-p:0", "pod-p:70000"])
def test_a_bad_prefiller_header_is_refused(bad):
    with pytest.raises(ValueError, match="x-prefiller-host-port"):
        pd.prefiller_url(bad)


def test_the_two_bodies_round_trip_kv_transfer_params():
    body = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 40, "stream": True,
            "stream_options": {"include_usage": True}}
    leg = pd.prefill_body(body)
    assert leg["max_tokens"] == 1 and leg["stream"] is False and "stream_options" not in leg
    assert leg["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False,
                                         "remote_engine_id": None, "remote_block_ids": None, "remote_host": None,
                                         "remote_port": None}
    assert pd.is_remote_decode(leg) and pd.remote_prefill(leg) is None
    assert body["max_tokens"] == 40 and "kv_transfer_params" not in body  # the original is untouched
    back = {"do_remote_decode": False, "do_remote_prefill": True, "remote_engine_id": "p:1",
            "remote_block_ids": [0, 1], "remote_host": "p", "remote_port": 1, "lbbench_kv_bytes": 5.0}
    dec = pd.decode_body(body, back)
    assert {k: v for k, v in dec.items() if k != "kv_transfer_params"} == body
    assert pd.remote_prefill(dec) == back and not pd.is_remote_decode(dec)
    assert "kv_transfer_params" not in pd.decode_body(leg, None)  # none came back: the decode prefills itself


@pytest.mark.parametrize("params", [{"do_remote_prefill": True}, {"do_remote_prefill": True, "remote_engine_id": "p",
                                    "remote_block_ids": [0], "lbbench_kv_bytes": -1}, "yes"])
def test_malformed_kv_transfer_params_are_refused(params):
    with pytest.raises(ValueError, match="kv_transfer_params"):
        pd.remote_prefill({"kv_transfer_params": params})


def test_the_fabric_serializes_transfers_sharing_an_endpoint():
    """rdma-400g: 50 GB/s, 20 us. 3,000-token prompt: 2,999 x 131,072 B = 393,084,928 B -> 7.86169856 ms + 20 us."""
    fab = KVFabric(parse_kv_link("rdma-400g"))
    nb = 2999 * KV_BYTES_PER_TOKEN
    assert fab.reserve("p0", "d0", 1.0, nb) == pytest.approx((1.0, 1.00788169856), abs=1e-12)
    # the same prefill egress: waits for the first; another pair's endpoints are free
    assert fab.reserve("p0", "d1", 1.001, nb) == pytest.approx((1.00788169856, 1.01576339712), abs=1e-12)
    assert fab.reserve("p1", "d2", 1.001, nb) == pytest.approx((1.001, 1.00888169856), abs=1e-12)


def _post(url: str, body: dict, headers: dict | None = None) -> tuple[dict, dict]:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read()), {k.lower(): v for k, v in resp.headers.items()}


def test_prefill_then_decode_on_emulated_instances_waits_the_hand_computed_transfer():
    """A 1 GB/s link with 0.5 s latency; a 101-token prompt moves 100 x 131,072 = 13,107,200 B: 0.5131072 s."""
    prof = load_profile("llama3.1-8b-a100")
    with EmulatorFleet(FleetConfig(prof, 2, kv_link="1e9@0.5")) as fleet:
        pre, dec = fleet.endpoints
        body = {"prompt": list(range(101)), "max_tokens": 4}
        answer, _ = _post(pre, pd.prefill_body(body))  # step 2, as an outside sidecar would send it
        kv = answer["kv_transfer_params"]
        host, _, port = pd.host_port(pre).rpartition(":")
        assert kv == {"do_remote_decode": False, "do_remote_prefill": True, "remote_engine_id": pd.host_port(pre),
                      "remote_block_ids": list(range(7)), "remote_host": host, "remote_port": int(port),
                      "tp_size": 1, "lbbench_kv_bytes": 100 * KV_BYTES_PER_TOKEN}
        assert len(answer["choices"][0]["text"].split()) == 1
        t0 = time.monotonic()
        out, headers = _post(dec, pd.decode_body(body, kv))  # step 4
        assert time.monotonic() - t0 >= 0.5131072
        assert float(headers["x-lbbench-transfer-s"]) == pytest.approx(0.5131072, abs=1e-6)
        assert float(headers["x-lbbench-transfer-bytes"]) == 13_107_200
        assert out["usage"]["completion_tokens"] == 4
        # the sidecar inside the decode instance: one header, the rest as above
        out, headers = _post(dec, body, {"x-prefiller-host-port": pd.host_port(pre)})
        assert out["usage"]["completion_tokens"] == 4 and float(headers["x-lbbench-prefill-s"]) > 0
        assert float(headers["x-lbbench-transfer-s"]) == pytest.approx(0.5131072, abs=1e-6)
        p, d = fleet.instances
        assert (p.num_prefill_legs, p.num_kv_received, d.num_prefill_legs, d.num_kv_received) == (2, 0, 0, 2)


def test_a_record_takes_the_split_its_decode_instance_reported():
    rec = RequestRecord.for_request(Request(7, 0.0, 101, 4), run_id="r", router="pd_llmd", seed=0, instance=1,
                                    dispatch_s=0.25, first_token_s=2.0, finish_s=2.1, generated_tokens=4)
    res = StreamResult(actual_send_s=0.5, pd_timing={"prefill_s": 0.25, "transfer_s": 0.5, "kv_wait_s": 0.125,
                                                     "transfer_bytes": 13_107_200.0})
    pd_record_fields(rec, 0, res)
    assert (rec.prefill_instance, rec.prefill_done_s, rec.kv_ready_s, rec.decode_admit_s, rec.transfer_bytes) == (
        0, 0.75, 1.25, 1.375, 13_107_200.0)


def test_endpoints_carry_roles_as_fleet_entries():
    cfg = RunConfig(endpoints=["http://a:1@llama3.1-8b-a100:prefill", "http://b:2@llama3.1-8b-a100:decode",
                               "http://c:3@llama3.1-8b-a100:decode"], routers=["pd_llmd"])
    fleet = cfg.fleet_of()
    assert fleet.roles() == ["prefill", "decode", "decode"] and fleet.spec() == \
        "llama3.1-8b-a100:1:prefill,llama3.1-8b-a100:2:decode"
    cfg = RunConfig(endpoints=cfg.endpoints, routers=["pd_llmd"], stream_workers=2, instances=3)
    with pytest.raises(ConfigError, match="streams from the dispatcher"):
        cfg.check(load_profile("llama3.1-8b-a100"))


@pytest.mark.parametrize("args, flag, says", [
    (("serve-sim", "--fleet", "llama3.1-8b-a100:1:prefill,llama3.1-8b-a100:1:decode", "--kv-link", "0"),
     "--kv-link", "bandwidth > 0"),
    (("serve-sim", "--fleet", "llama3.1-8b-a100:1:prefill"), "--fleet", "none that decodes"),
    (("proxy", "--endpoint", "http://a:1", "--router", "pd_llmd"), "--router", "backends with roles"),
    (("proxy", "--endpoint", "http://a:1@llama3.1-8b-a100:prefill", "--endpoint", "http://b:2@llama3.1-8b-a100:decode",
      "--router", "jsq"), "--router", "need a pair router"),
    (("run", "--endpoint", "http://a:1@llama3.1-8b-a100:prefill", "--endpoint", "http://b:2@llama3.1-8b-a100:decode",
      "--router", "jsq", "--requests", "5"), "--router", "needs a pair router"),
])
def test_bad_live_pd_input_is_refused_naming_the_flag(args, flag, says):
    from click.testing import CliRunner

    from lbbench.cli import main

    res = CliRunner().invoke(main, list(args))
    assert res.exit_code == 2, res.output
    assert flag in res.output and says in res.output, res.output
