"""Emulated instances speak the OpenAI/vLLM protocol and count like vLLM."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from lbbench.live.metrics import parse_metrics


def _post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_models_health_metrics(a100_fleet):
    base = a100_fleet.endpoints[0]
    assert urllib.request.urlopen(base + "/health").status == 200
    models = json.loads(urllib.request.urlopen(base + "/v1/models").read())
    assert models["data"][0]["id"] == "meta-llama/Llama-3.1-8B-Instruct"
    m = parse_metrics(urllib.request.urlopen(base + "/metrics").read().decode())
    assert m is not None and m.num_running >= 0 and 0.0 <= m.kv_usage <= 1.0


@pytest.mark.parametrize("chat", [False, True])
def test_non_streaming_completion_with_usage(a100_fleet, chat):
    base = a100_fleet.endpoints[1]
    body = {"max_tokens": 6, "return_token_ids": True}
    if chat:
        body["messages"] = [{"role": "user", "content": "x" * 40}]
    else:
        body["prompt"] = list(range(100, 150))
    status, raw = _post(base + ("/v1/chat/completions" if chat else "/v1/completions"), body)
    assert status == 200
    out = json.loads(raw)
    choice = out["choices"][0]
    assert len(choice["token_ids"]) == 6 and choice["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 6
    if not chat:
        assert out["usage"]["prompt_tokens"] == 50
        assert choice["text"].count(" t") == 6


def test_streaming_counts_every_token_once(a100_fleet):
    base = a100_fleet.endpoints[0]
    body = {"prompt": [5] * 20, "max_tokens": 9, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}}
    status, raw = _post(base + "/v1/completions", body)
    assert status == 200
    events = [e.removeprefix("data: ") for e in raw.decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    ids = [i for c in chunks for ch in c["choices"] for i in ch["token_ids"]]
    assert len(ids) == 9
    assert chunks[-1]["usage"] == {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29}
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"]][-1] == "length"


def test_bad_requests_get_http_errors(a100_fleet):
    base = a100_fleet.endpoints[0]
    assert _post(base + "/v1/completions", {"max_tokens": 3})[0] == 400
    assert _post(base + "/v1/completions", {"prompt": "hi", "max_tokens": 0})[0] == 400
    assert _post(base + "/v1/completions", {"prompt": "hi", "model": "nope"})[0] == 404
    # longer than the profile's max_model_len (8192)
    status, raw = _post(base + "/v1/completions", {"prompt": [1] * 9000, "max_tokens": 4})
    assert status == 400 and b"max_model_len" in raw


def test_kill_endpoint_only_when_allowed(a100_fleet):
    from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig
    from lbbench.profiles import load_profile

    assert _post(a100_fleet.endpoints[0] + "/lbbench/kill", {})[0] == 404
    with EmulatorFleet(FleetConfig(load_profile("llama3.1-8b-a100-v0"), 2, allow_kill=True)) as fleet:
        status, raw = _post(fleet.endpoints[1] + "/lbbench/kill", {})
        assert status == 200 and json.loads(raw) == {"killed": 1}
        deadline = time.monotonic() + 5
        while fleet.instances[1].alive and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(OSError):
            urllib.request.urlopen(fleet.endpoints[1] + "/health", timeout=2)
        assert urllib.request.urlopen(fleet.endpoints[0] + "/health", timeout=2).status == 200


def test_a_client_that_disconnects_aborts_its_request():
    """As vLLM does: requests whose client went away leave the engine (running and waiting counts drop to 0)."""
    import socket

    from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig
    from lbbench.profiles import load_profile

    def load(url: str) -> int:
        m = parse_metrics(urllib.request.urlopen(url + "/metrics", timeout=5).read().decode())
        return m.num_running + m.num_waiting

    with EmulatorFleet(FleetConfig(load_profile("llama3.1-8b-l4-v0"), 1)) as fleet:  # ~1 s per 6,000-token prefill
        url = fleet.endpoints[0]
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps({"prompt": [1] * 6000, "max_tokens": 4, "stream": True}).encode()
        socks = []
        for _ in range(6):
            s = socket.create_connection((host, int(port)))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            socks.append(s)
        deadline = time.monotonic() + 5
        while load(url) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert load(url) == 6
        for s in socks:
            s.close()
        deadline = time.monotonic() + 5
        while load(url) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert load(url) == 0
