"""Text prompts of exact token lengths (endpoints that take only text): the length search against a
tokenizer, determinism and distinctness, the token-id probe, and an end-to-end run through the CLI."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.core import Request
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig, free_port
from lbbench.harness.text_prompts import accepts_token_ids, exact_text, texts_for
from lbbench.profiles import load_profile


def words_plus_bos(text: str) -> int:
    return 1 + len(text.split())


def uneven(text: str) -> int:
    """A tokenizer where every word of four letters costs two tokens."""
    return 1 + sum(2 if len(w) == 4 else 1 for w in text.split())


@pytest.mark.parametrize("counter", [words_plus_bos, uneven])
@pytest.mark.parametrize("n", [2, 17, 300])
def test_exact_lengths_by_the_tokenizer(counter, n):
    text, exact = exact_text(Request(7, 0.0, n, 4), counter)
    assert exact and counter(text) == n


def test_a_length_below_the_special_tokens_is_reported_inexact():
    # one token with a BOS leaves no room for a word
    assert exact_text(Request(7, 0.0, 1, 4), words_plus_bos)[1] is False


def test_prompts_are_deterministic_and_distinct():
    reqs = [Request(i, 0.0, 50, 4) for i in range(20)]
    a, bad_a = texts_for(reqs, words_plus_bos)
    b, _ = texts_for(reqs, words_plus_bos)
    assert a == b and bad_a == 0 and len(set(a.values())) == 20
    # requests that carry their own text keep it
    own, _ = texts_for([Request(1, 0.0, 5, 4, prompt="mine")], words_plus_bos)
    assert own == {}


def test_without_a_tokenizer_lengths_are_approximate():
    text, exact = exact_text(Request(3, 0.0, 40, 4), None)
    assert not exact and len(text.split()) == 40


class TextOnlyGateway:
    """A stand-in for a gateway that refuses token-id prompts and forwards text to one backend."""

    def __init__(self, backend: str):
        self.backend = backend
        self.port = free_port()
        self.seen_text = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        import aiohttp
        body = await request.json()
        if not isinstance(body.get("prompt"), str):
            return web.json_response({"error": "prompt: data did not match any variant"}, status=400)
        self.seen_text += 1
        async with aiohttp.ClientSession() as s, s.post(self.backend + "/v1/completions", json=body) as up:
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def passthrough(self, request: web.Request) -> web.Response:
        import aiohttp
        async with aiohttp.ClientSession() as s, s.get(self.backend + request.path) as up:
            return web.Response(body=await up.read(), status=up.status, content_type="application/json")


def test_cli_run_through_a_text_only_gateway(tmp_path):
    import asyncio
    import threading
    prof = load_profile("llama3.1-8b-a100-v0")
    with EmulatorFleet(FleetConfig(prof, 1)) as fleet:
        gw = TextOnlyGateway(fleet.endpoints[0])
        loop = asyncio.new_event_loop()
        app = web.Application()
        app.add_routes([web.post("/v1/completions", gw.handle), web.get("/v1/models", gw.passthrough),
                        web.get("/health", gw.passthrough)])
        runner = web.AppRunner(app)
        threading.Thread(target=loop.run_forever, daemon=True).start()

        async def start():
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", gw.port).start()
        asyncio.run_coroutine_threadsafe(start(), loop).result(10)
        url = f"http://127.0.0.1:{gw.port}"
        assert accepts_token_ids(fleet.endpoints[0], prof.model)
        assert not accepts_token_ids(url, prof.model)
        res = CliRunner().invoke(main, ["run", "--endpoint", url, "--profile", "llama3.1-8b-a100-v0", "--workload",
                                        "poisson", "--rate", "20", "--requests", "20", "--prompt-tokens", "64",
                                        "--output-tokens", "8", "--out", str(tmp_path / "r"), "--format", "json"])
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
    assert res.exit_code == 0, res.output
    assert "approximate lengths" in res.output
    rows = json.loads(res.output[res.output.index("["):res.output.rindex("]") + 1])
    assert rows[0]["completed"] == 20
    assert gw.seen_text == 20
