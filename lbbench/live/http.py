"""The HTTP backend of live runs: one streamed OpenAI-compatible request at a time.

``HttpBackend`` owns one ``aiohttp.ClientSession`` (one connection pool) for a
whole run. ``send`` posts one ``Request`` to ``/v1/completions`` (or
``/v1/chat/completions``) with ``stream: true`` and
``stream_options.include_usage``, and returns a ``StreamResult`` with the time
the request left the client, the arrival time of every generated token, the
finish time, the server's usage counts, the HTTP status and any error.

Exact lengths: a request without text is sent as a deterministic list of token
ids (``prompt_token_ids``) with the engine's exact-length fields (vLLM's and
SGLang's: ``max_tokens = min_tokens = output_tokens`` and ``ignore_eos``), so
the server reads exactly ``prompt_tokens`` and writes exactly
``output_tokens``. A request with ``prompt`` text is sent as text. The engine's
token-count fields (vLLM: ``return_token_ids``) are asked for so that a
streamed chunk carrying several tokens is counted exactly; servers without
them are counted one token per non-empty chunk. The field names live in
:mod:`lbbench.engines`.

Errors and timeouts never raise: they are returned on the result, and
``connection_error`` says whether the instance itself looks unreachable (refused
or dropped connection) rather than the request being bad.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import aiohttp
import numpy as np

from ..core import DEFAULT_PREFIX_BLOCK_TOKENS, Request, tbt_stats
from ..engines import VLLM, Engine

#: Token ids of synthetic prompts are drawn from [low, high): small ids exist in
#: every vocabulary, including the tiny model's 2048.
DEFAULT_TOKEN_ID_RANGE: tuple[int, int] = (100, 1000)
#: Mooncake-style prefix hashes name blocks of this many tokens (unless a request says otherwise).
PREFIX_BLOCK_TOKENS = DEFAULT_PREFIX_BLOCK_TOKENS

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xBF58476D1CE4E5B9)


def _mix_ids(seed: int, n: int, low: int, high: int) -> np.ndarray:
    """``n`` deterministic pseudo-random ids in [low, high) from ``seed``."""
    x = np.arange(1, n + 1, dtype=np.uint64) * _GOLDEN + np.uint64(seed & 0xFFFFFFFFFFFFFFFF)
    x ^= x >> np.uint64(31)
    x *= _MIX
    x ^= x >> np.uint64(29)
    return (x % np.uint64(high - low)).astype(np.int64) + low


@lru_cache(maxsize=4096)
def _block_ids(block_hash: int, low: int, high: int, block_tokens: int = PREFIX_BLOCK_TOKENS) -> tuple[int, ...]:
    return tuple(_mix_ids(0x51ED270B ^ (block_hash * 1000003), block_tokens, low, high).tolist())


def prompt_token_ids(request: Request, token_id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE) -> list[int]:
    """A deterministic prompt of exactly ``request.prompt_tokens`` ids.

    Requests with ``prefix_hashes`` share token blocks wherever they share
    hashes (so a server's prefix cache sees the trace's real sharing); the rest
    is unique to the request id.
    """
    low, high = token_id_range
    n = request.prompt_tokens
    ids: list[int] = []
    if request.prefix_hashes:
        for h in request.prefix_hashes:
            if len(ids) >= n:
                break
            ids.extend(_block_ids(int(h), low, high, request.prefix_block_tokens or PREFIX_BLOCK_TOKENS))
        del ids[n:]
    if len(ids) < n:
        seed = (request.request_id + 1) * 0x2545F4914F6CDD1D
        ids.extend(_mix_ids(seed, n - len(ids), low, high).tolist())
    return ids


def synthetic_text(request: Request) -> str:
    """Filler text of about ``prompt_tokens`` words for chat requests without text."""
    words = ("load", "balance", "route", "token", "queue", "cache", "batch", "model")
    rid = request.request_id
    return " ".join(words[(rid + j * 3) % len(words)] for j in range(max(1, request.prompt_tokens)))


def request_body(request: Request, model: str, api: str = "completions",
                 token_id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE, priority: int | None = None,
                 text: str | None = None, engine: Engine = VLLM) -> dict:
    """The JSON body for one request (streaming, exact output length in ``engine``'s fields); ``priority`` for
    servers run with vLLM's ``--scheduling-policy priority`` (smaller is served first);
    ``text`` replaces the token-id prompt (endpoints that take only text)."""
    n = int(request.output_tokens)
    body: dict = {
        "model": model,
        **engine.length_fields(n),
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **engine.token_count_fields,
    }
    if api == "chat":
        body["messages"] = [{"role": "user", "content": request.prompt or text or synthetic_text(request)}]
    elif api == "completions":
        if request.prompt is not None:
            body["prompt"] = request.prompt
        else:
            body["prompt"] = text if text is not None else prompt_token_ids(request, token_id_range)
    else:
        raise ValueError(f"api: unknown API {api!r} (completions or chat)")
    if priority is not None:
        if engine.priority_field is None:
            raise ValueError(f"engine {engine.name} has no per-request priority")
        body[engine.priority_field] = int(priority)
    return body


@dataclass(slots=True)
class StreamResult:
    """What happened to one request on the wire (times on the run's clock)."""

    actual_send_s: float
    http_status: int | None = None
    error: str | None = None
    connection_error: bool = False
    token_times_s: list[float] = field(default_factory=list)
    finish_s: float | None = None
    server_prompt_tokens: int | None = None
    server_output_tokens: int | None = None

    @property
    def generated_tokens(self) -> int:
        return len(self.token_times_s)

    @property
    def first_token_s(self) -> float | None:
        return self.token_times_s[0] if self.token_times_s else None

    def tbt_stats_s(self) -> tuple[float | None, float | None, float | None]:
        """Mean, p99 and max time between tokens (:func:`lbbench.core.tbt_stats`)."""
        return tbt_stats(self.token_times_s)


#: Called as ``on_tokens(generated_so_far, time_s)`` whenever tokens arrive.
TokenCallback = Callable[[int, float], None]


_TOKEN_IDS = re.compile(rb'"token_ids":\s*\[([^\]]*)\]')
_TEXT = re.compile(rb'"(?:text|content)":\s*"(.)')
_NEEDS_PARSE = re.compile(rb'"usage":\s*\{|"error"')


def event_tokens(data: bytes) -> int | None:
    """Tokens carried by one streamed event, read off the bytes without decoding the JSON: the length of each
    choice's ``token_ids`` when present, else one per choice with non-empty ``text``/``content``. None when the
    event must be parsed (it carries usage counts or an error)."""
    if _NEEDS_PARSE.search(data):
        return None
    ids = _TOKEN_IDS.findall(data)
    if ids:
        return sum(g.count(b",") + 1 for g in ids if g.strip())
    return sum(1 for m in _TEXT.finditer(data) if m.group(1) != b'"')


def _count_tokens(choice: dict) -> int:
    ids = choice.get("token_ids")
    if ids is not None:
        return len(ids)
    text = choice.get("text")
    if text is None:
        text = (choice.get("delta") or {}).get("content")
    return 1 if text else 0


class HttpBackend:
    """One connection pool for a run; ``send`` streams one request."""

    def __init__(self, *, model: str, clock: Callable[[], float], api: str = "completions",
                 request_timeout_s: float = 600.0,
                 token_id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE,
                 priority_of: Callable[[Request], int] | None = None,
                 prompt_texts: dict[int, str] | None = None, engine: Engine = VLLM):
        if api not in ("completions", "chat"):
            raise ValueError(f"api: unknown API {api!r} (completions or chat)")
        self.model = model
        self.clock = clock
        self.api = api
        self.request_timeout_s = request_timeout_s
        self.token_id_range = token_id_range
        self.priority_of = priority_of  # None: no priority field (vLLM rejects one under fcfs)
        self.prompt_texts = prompt_texts or {}  # text prompts by request id (text-only endpoints)
        self.engine = engine
        self._path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "HttpBackend":
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.request_timeout_s),
            headers={"Content-Type": "application/json"})
        return self

    async def __aexit__(self, *exc) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def send(self, base_url: str, request: Request,
                   on_tokens: TokenCallback | None = None) -> StreamResult:
        """Stream one request to ``base_url``; never raises for server or network faults."""
        assert self.session is not None, "use HttpBackend as an async context manager"
        prio = self.priority_of(request) if self.priority_of is not None else None
        payload = json.dumps(request_body(request, self.model, self.api, self.token_id_range, prio,
                                          self.prompt_texts.get(request.request_id), self.engine)).encode()
        url = base_url + self._path
        res = StreamResult(actual_send_s=self.clock())
        try:
            async with self.session.post(url, data=payload) as resp:
                res.http_status = resp.status
                if resp.status != 200:
                    body = (await resp.text())[:300].replace("\n", " ")
                    res.error = f"HTTP {resp.status}: {body}"
                    return res
                await self._read_stream(resp, res, on_tokens)
        except asyncio.TimeoutError:
            res.error = f"timeout after {self.request_timeout_s:g}s"
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            res.error = f"connection error: {type(exc).__name__}: {exc}"
            res.connection_error = True
        except aiohttp.ClientError as exc:
            res.error = f"client error: {type(exc).__name__}: {exc}"
        except json.JSONDecodeError as exc:  # malformed JSON in the stream
            res.error = f"bad stream: {exc}"
        if res.error is not None:
            res.finish_s = None  # failed requests have no finish time
        return res

    async def _read_stream(self, resp: aiohttp.ClientResponse, res: StreamResult,
                           on_tokens: TokenCallback | None) -> None:
        buf = b""
        done = False
        times = res.token_times_s
        async for data in resp.content.iter_any():
            now = self.clock()
            buf += data.replace(b"\r\n", b"\n") if b"\r" in data else data
            got = 0
            while True:
                cut = buf.find(b"\n\n")
                if cut < 0:
                    break
                event, buf = buf[:cut], buf[cut + 2:]
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    data_s = line[5:].strip()
                    if data_s == b"[DONE]":
                        done = True
                        continue
                    fast = event_tokens(data_s)
                    if fast is not None:  # the common case: a token chunk, no JSON decoding
                        got += fast
                        continue
                    obj = json.loads(data_s)
                    if "error" in obj and not obj.get("choices"):
                        err = obj["error"]
                        res.error = f"server error: {err.get('message', err) if isinstance(err, dict) else err}"
                        continue
                    for choice in obj.get("choices") or ():
                        got += _count_tokens(choice)
                    usage = obj.get("usage")
                    if usage:
                        res.server_prompt_tokens = usage.get("prompt_tokens")
                        res.server_output_tokens = usage.get("completion_tokens")
            if got:
                times.extend([now] * got)
                if on_tokens is not None:
                    on_tokens(len(times), now)
        if res.error is None and not done:
            res.error = "connection error: stream ended before [DONE]"
            res.connection_error = True
        res.finish_s = self.clock()
