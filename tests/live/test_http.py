"""The one request sender (``lbbench.live.http.HttpBackend``) and the one SSE reader (``lbbench.live.sse``): the
same counts, usage and errors as a plain reference parser for any chunking of the wire bytes, and exact lengths
against an emulated instance over real sockets."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.core import Request
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig, free_port, zero_latency_profile
from lbbench.live.http import HttpBackend, StreamResult, _Conn, _Exchange, throttled
from lbbench.live.sse import SseReader

# -- a stream and its wire form -------------------------------------------------------------------------------

token_event = st.one_of(
    st.builds(lambda ids: {"choices": [{"index": 0, "text": "x", "token_ids": ids}]},
              st.lists(st.integers(0, 5000), max_size=5)),
    st.builds(lambda t: {"choices": [{"index": 0, "text": t}]}, st.text(max_size=4)),
    st.builds(lambda t: {"choices": [{"index": 0, "delta": {"content": t}}]}, st.text(max_size=4)),
)


@st.composite
def sse_stream(draw) -> bytes:
    events = draw(st.lists(token_event, max_size=12))
    if draw(st.booleans()):
        events.append({"choices": [], "usage": {"prompt_tokens": draw(st.integers(1, 99)),
                                                "completion_tokens": draw(st.integers(0, 99))}})
    if draw(st.integers(0, 7)) == 0:
        events.insert(draw(st.integers(0, len(events))), {"error": {"message": "boom"}})
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    body += b"data: [DONE]\n\n" if draw(st.booleans()) else b""
    return body.replace(b"\n", b"\r\n") if draw(st.booleans()) else body


def reference_parse(body: bytes) -> dict:
    """What a stream says, read the plain way: the whole body decoded, split into events, every event parsed."""
    tokens, usage, error, done = 0, (None, None), None, False
    for event in body.decode().replace("\r\n", "\n").split("\n\n")[:-1]:  # the last piece is no whole event
        for line in event.split("\n"):
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                continue
            obj = json.loads(data)
            if "error" in obj and not obj.get("choices"):
                error = f"server error: {obj['error']['message']}"
                continue
            for c in obj.get("choices") or []:
                if c.get("token_ids") is not None:
                    tokens += len(c["token_ids"])
                else:
                    text = c["text"] if "text" in c else c.get("delta", {}).get("content")
                    tokens += 1 if text else 0
            if obj.get("usage"):
                usage = (obj["usage"]["prompt_tokens"], obj["usage"]["completion_tokens"])
    return {"tokens": tokens, "usage": usage, "error": error, "done": done}


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


def wire_read(wire: list[bytes]) -> StreamResult:
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


@settings(max_examples=200, deadline=None)
@given(body=sse_stream(), sizes=st.lists(st.integers(1, 64), max_size=4),
       wire_cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_wire_reading_equals_the_reference_parser_for_any_chunking(body, sizes, wire_cuts):
    got = wire_read(split(chunked(body, sizes), wire_cuts))
    ref = reference_parse(body)
    error = ref["error"] or (None if ref["done"] else "connection error: stream ended before [DONE]")
    assert got.http_status == 200 and got.generated_tokens == ref["tokens"]
    assert (got.server_prompt_tokens, got.server_output_tokens) == ref["usage"]
    assert got.error == error
    assert got.connection_error == (ref["error"] is None and not ref["done"])
    assert (got.finish_s is None) == (error is not None)


@settings(max_examples=200, deadline=None)
@given(body=sse_stream(), cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_sse_reader_equals_the_reference_parser_for_any_chunking(body, cuts):
    reader = SseReader()
    tokens = sum(reader.feed(piece) for piece in split(body, cuts))
    ref = reference_parse(body)
    assert tokens == ref["tokens"]
    assert (reader.server_prompt_tokens, reader.server_output_tokens) == ref["usage"]
    assert (reader.error, reader.done) == (ref["error"], ref["done"])


def test_throttled_reports_the_first_tokens_then_at_most_one_step_per_interval():
    seen = []
    on_tokens = throttled(0.02, lambda t: seen.append(("first", t)), lambda t, n: seen.append(("step", t, n)))
    for count, t in [(1, 1.0), (2, 1.005), (3, 1.02), (5, 1.03), (6, 1.041), (9, 1.05)]:
        on_tokens(count, t)
    assert seen == [("first", 1.0), ("step", 1.02, 3), ("step", 1.041, 6)]


def test_hand_built_stream_and_a_content_length_error():
    events = (b'data: {"choices":[{"text":" a","token_ids":[1,2]}]}\n\n'
              b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\ndata: [DONE]\n\n')
    res = wire_read([chunked(events, [5])])
    assert res.generated_tokens == 2 and res.server_prompt_tokens == 7 and res.error is None
    body = b'{"error":{"message":"no such model"}}'
    res = wire_read([b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n" % len(body) + body])
    assert res.http_status == 404 and res.error == 'HTTP 404: ' + body.decode()
    reader = SseReader()
    assert reader.feed(b'data: {"choices":[{"text":"a"}]}\r') == 0  # the LF comes in the next read
    assert reader.feed(b'\n\r\n') == 1


# -- over real sockets ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fleet():
    with EmulatorFleet(FleetConfig(zero_latency_profile(), 1)) as f:
        yield f


def test_sender_streams_exact_lengths_from_an_emulated_instance(fleet):
    reqs = [Request(i, 0.0, 16 + i, 1 + 7 * i) for i in range(6)]
    url = fleet.endpoints[0]

    async def run():
        async with HttpBackend(model="sim", clock=time.monotonic) as backend:
            await backend.warm([url], 2)
            got = [await backend.send(url, r) for r in reqs]  # sequential: connections are reused
            got += await asyncio.gather(*(backend.send(url, r) for r in reqs))  # concurrent: more connections
            events = []
            on_tokens = throttled(0.0, lambda t: events.append(("first", t)), lambda t, n: events.append((t, n)))
            watched = await backend.send(url, reqs[-1], on_tokens)
            refused = await backend.send(f"http://127.0.0.1:{free_port()}", reqs[0])
        async with HttpBackend(model="nope", clock=time.monotonic) as other:
            bad = await other.send(url, reqs[0])
        return got, watched, events, bad, refused

    model = json.loads(__import__("urllib.request").request.urlopen(url + "/v1/models").read())["data"][0]["id"]
    if model != "sim":
        pytest.fail(f"the emulator serves {model!r}")
    got, watched, events, bad, refused = asyncio.run(run())
    for r, x in zip(reqs * 2, got):
        assert x.error is None and x.http_status == 200
        assert x.generated_tokens == x.server_output_tokens == r.output_tokens
        assert x.server_prompt_tokens == r.prompt_tokens
        assert x.actual_send_s <= x.first_token_s <= x.finish_s
    assert events[0] == ("first", watched.first_token_s) and watched.generated_tokens == reqs[-1].output_tokens
    assert all(t in watched.token_times_s and n <= watched.generated_tokens for t, n in events[1:])
    assert bad.http_status == 404 and bad.error.startswith("HTTP 404:") and not bad.connection_error
    assert refused.connection_error and refused.error.startswith("connection error:")
    assert refused.http_status is None and refused.finish_s is None


def test_prepared_request_carries_the_priority_and_text_it_is_given():
    backend = HttpBackend(model="m", clock=time.monotonic)
    r = Request(7, 0.0, 12, 5)

    def body(raw: bytes) -> dict:
        head, _, payload = raw.partition(b"\r\n\r\n")
        assert f"Content-Length: {len(payload)}".encode() in head
        return json.loads(payload)

    plain = body(backend.prepare("http://127.0.0.1:8000", r))
    assert "priority" not in plain and len(plain["prompt"]) == 12  # token ids
    given = body(backend.prepare("http://127.0.0.1:8000", r, 3, "a prompt as text"))
    assert given["priority"] == 3 and given["prompt"] == "a prompt as text"
    assert {k: v for k, v in given.items() if k not in ("priority", "prompt")} == \
        {k: v for k, v in plain.items() if k != "prompt"}
