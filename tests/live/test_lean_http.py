"""The lean HTTP/1.1 stream reader: the same counts as the reference reader (``HttpBackend``) for any chunking of
the wire bytes, and the same results against emulated instances over real sockets."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.core import Request
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig, free_port, zero_latency_profile
from lbbench.live.http import HttpBackend, StreamResult
from lbbench.live.lean_http import LeanHttpClient, SseCounter, _Conn, _Exchange

# -- a stream and its wire form -------------------------------------------------------------------------------

token_event = st.one_of(
    st.builds(lambda ids: {"choices": [{"index": 0, "text": "x", "token_ids": ids}]},
              st.lists(st.integers(0, 5000), max_size=5)),
    st.builds(lambda t: {"choices": [{"index": 0, "text": t}]}, st.text(max_size=4)),
)


@st.composite
def sse_stream(draw) -> bytes:
    events = draw(st.lists(token_event, max_size=12))
    if draw(st.booleans()):
        events.append({"choices": [], "usage": {"prompt_tokens": draw(st.integers(1, 99)),
                                                "completion_tokens": draw(st.integers(0, 99))}})
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return body + (b"data: [DONE]\n\n" if draw(st.booleans()) else b"")


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:]) if b > a]


def chunked(body: bytes, sizes: list[int]) -> bytes:
    out, pos, i = [], 0, 0
    while pos < len(body):
        n = sizes[i % len(sizes)] if sizes else len(body)
        part = body[pos:pos + n]
        out.append(b"%x\r\n" % len(part) + part + b"\r\n")
        pos += len(part)
        i += 1
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + \
        b"".join(out) + b"0\r\n\r\n"


class _FakeTransport:
    def write(self, data): pass
    def close(self): pass
    def abort(self): pass
    def is_closing(self): return False


def lean_read(wire: list[bytes]) -> StreamResult:
    loop = asyncio.new_event_loop()
    try:
        res = StreamResult(actual_send_s=0.0)
        conn = _Conn([])
        conn.connection_made(_FakeTransport())
        ex = _Exchange(res, None, time.monotonic, loop.create_future())
        conn.start(ex, b"")
        for piece in wire:
            conn.data_received(piece)
        if not ex.future.done():
            conn.connection_lost(None)
        return ex.future.result()
    finally:
        loop.close()


class _FakeContent:
    def __init__(self, pieces):
        self.pieces = pieces

    async def iter_any(self):
        for p in self.pieces:
            yield p


class _FakeResp:
    def __init__(self, pieces):
        self.content = _FakeContent(pieces)


def reference_read(pieces: list[bytes]) -> StreamResult:
    backend = HttpBackend(model="m", clock=time.monotonic)
    res = StreamResult(actual_send_s=0.0)
    asyncio.run(backend._read_stream(_FakeResp(pieces), res, None))
    return res


@settings(max_examples=200, deadline=None)
@given(body=sse_stream(), sizes=st.lists(st.integers(1, 64), max_size=4),
       wire_cuts=st.lists(st.integers(0, 10_000), max_size=12), ref_cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_lean_counts_equal_the_reference_for_any_chunking(body, sizes, wire_cuts, ref_cuts):
    lean = lean_read(split(chunked(body, sizes), wire_cuts))
    ref = reference_read(split(body, ref_cuts))
    assert lean.generated_tokens == ref.generated_tokens
    assert (lean.server_prompt_tokens, lean.server_output_tokens) == (ref.server_prompt_tokens,
                                                                      ref.server_output_tokens)
    assert lean.error == ref.error and lean.connection_error == ref.connection_error
    assert (lean.finish_s is None) == (ref.error is not None)


def test_hand_built_stream_and_a_content_length_error():
    events = (b'data: {"choices":[{"text":" a","token_ids":[1,2]}]}\n\n'
              b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\ndata: [DONE]\n\n')
    res = lean_read([chunked(events, [5])])
    assert res.generated_tokens == 2 and res.server_prompt_tokens == 7 and res.error is None
    body = b'{"error":{"message":"no such model"}}'
    res = lean_read([b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n" % len(body) + body])
    assert res.http_status == 404 and res.error == 'HTTP 404: ' + body.decode()
    counter = SseCounter()
    assert counter.feed(b'data: {"choices":[{"text":"a"}]}\r') == 0  # the LF comes in the next read
    assert counter.feed(b'\n\r\n') == 1


# -- over real sockets ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fleet():
    with EmulatorFleet(FleetConfig(zero_latency_profile(), 1)) as f:
        yield f


def test_lean_client_matches_aiohttp_against_an_emulated_instance(fleet):
    reqs = [Request(i, 0.0, 16 + i, 1 + 7 * i) for i in range(6)]
    url = fleet.endpoints[0]

    async def both():
        lean = LeanHttpClient(model="sim", clock=time.monotonic)
        await lean.warm([url], 2)
        a = [await lean.send(url, r) for r in reqs]  # sequential: connections are reused
        a += await asyncio.gather(*(lean.send(url, r) for r in reqs))  # concurrent: more connections
        bad = await LeanHttpClient(model="nope", clock=time.monotonic).send(url, reqs[0])
        refused = await lean.send(f"http://127.0.0.1:{free_port()}", reqs[0])
        lean.close()
        async with HttpBackend(model="sim", clock=time.monotonic) as backend:
            b = [await backend.send(url, r) for r in reqs]
        return a, b, bad, refused

    model = json.loads(__import__("urllib.request").request.urlopen(url + "/v1/models").read())["data"][0]["id"]
    if model != "sim":
        pytest.fail(f"the emulator serves {model!r}")
    lean, ref, bad, refused = asyncio.run(both())
    for r, x, y in zip(reqs * 2, lean, ref * 2):
        assert x.error is None and x.http_status == 200
        assert x.generated_tokens == y.generated_tokens == r.output_tokens
        assert x.server_output_tokens == y.server_output_tokens == r.output_tokens
        assert x.actual_send_s <= x.first_token_s <= x.finish_s
    assert bad.http_status == 404 and bad.error.startswith("HTTP 404:") and not bad.connection_error
    assert refused.connection_error and refused.error.startswith("connection error:")
