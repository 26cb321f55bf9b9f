"""The one request sender of live runs: one streamed OpenAI-compatible request, read into a ``StreamResult``.

``HttpBackend.send`` posts one ``Request`` to ``/v1/completions`` (or ``/v1/chat/completions``) with
``stream: true`` and ``stream_options.include_usage``, and returns a ``StreamResult`` with the time the request
left the client, the arrival time of every generated token, the finish time, the server's usage counts, the HTTP
status and any error. The in-process replay, the stream workers (``lbbench.live.workers``) and the load workers
(``lbbench.live.load_workers``) all send through it; ``throttled`` turns its per-read token callback into the
first-token and tokens-so-far events every path reports.

Exact lengths: a request without text is sent as a deterministic list of token ids (``prompt_token_ids``) with
the engine's exact-length fields (vLLM's and SGLang's: ``max_tokens = min_tokens = output_tokens`` and
``ignore_eos``), so the server reads exactly ``prompt_tokens`` and writes exactly ``output_tokens``. A request
with ``prompt`` text is sent as text. The engine's token-count fields (vLLM: ``return_token_ids``) are asked for
so that a streamed chunk carrying several tokens is counted exactly; servers without them are counted one token
per non-empty chunk. The field names live in :mod:`lbbench.engines`.

The wire: one ``asyncio.Protocol`` per keep-alive HTTP/1.1 connection does the whole exchange in
``data_received`` (status line and headers, chunked transfer decoding, and the SSE framing and token count of
``lbbench.live.sse.SseReader``); no task, future or buffer object is made per chunk (aiohttp's stream reader cost
about 45 µs per chunk in a profile of the 80 req/s replay). Connections are kept alive per endpoint; a request
that finds its pooled connection closed by the server before any answer byte is sent once more on a fresh one.

Errors and timeouts never raise: they are returned on the result, and ``connection_error`` says whether the
instance itself looks unreachable (refused or dropped connection) rather than the request being bad.
"""


from __future__ import annotations

import asyncio
import json
import math
import ssl
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Sequence
from urllib.parse import urlsplit

import numpy as np

from ..core import DEFAULT_PREFIX_BLOCK_TOKENS, Request, tbt_stats
from ..engines import VLLM, Engine
from ..engines.vllm.pd import TIMING_HEADERS
from .sse import SseReader

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
    #: the prefill/decode split a ``serve-sim`` decode instance reported (``lbbench.engines.vllm.pd``'s headers)
    pd_timing: dict[str, float] | None = None

    @property
    def generated_tokens(self) -> int:
        return len(self.token_times_s)

    @property
    def first_token_s(self) -> float | None:
        return self.token_times_s[0] if self.token_times_s else None

    def tbt_stats_s(self) -> tuple[float | None, float | None, float | None]:
        """Mean, p99 and max time between tokens (:func:`lbbench.core.tbt_stats`)."""
        return tbt_stats(self.token_times_s)


#: response header -> ``StreamResult.pd_timing`` key
_PD_HEADERS = {v: k for k, v in TIMING_HEADERS.items()}
#: Called as ``on_tokens(generated_so_far, time_s)`` whenever tokens arrive.
TokenCallback = Callable[[int, float], None]
#: (host, port, TLS) of one endpoint: a connection pool's key
_Addr = tuple[str, int, bool]


class _Exchange:
    """One request's state while its answer arrives."""

    __slots__ = ("res", "on_tokens", "clock", "sse", "error_body", "future")

    def __init__(self, res: StreamResult, on_tokens: TokenCallback | None, clock: Callable[[], float],
                 future: asyncio.Future):
        self.res = res
        self.on_tokens = on_tokens
        self.clock = clock
        self.sse = SseReader()
        self.error_body = b""
        self.future = future


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; at most one exchange at a time."""

    def __init__(self, pool: list["_Conn"]):
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.ex: _Exchange | None = None
        self.got_bytes = False
        self.head: bytes | None = None
        self.until_close = False

    # -- asyncio.Protocol ----------------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self in self.pool:
            self.pool.remove(self)
        ex = self.ex
        if ex is not None and not ex.future.done():
            if self.head is None and not self.got_bytes:
                ex.future.set_result("retry")  # a pooled connection the server had closed
            elif self.until_close and self.head is not None:
                self._complete()
            else:
                self._fail("connection error: stream ended before [DONE]" if self.head is not None
                           else f"connection error: {type(exc).__name__ if exc else 'ServerDisconnectedError'}: "
                                "connection closed before the response")

    def start(self, ex: _Exchange, raw: bytes) -> None:
        self.ex = ex
        self.head: bytes | None = None
        self.hbuf = b""
        self.status = 0
        self.chunked = False
        self.remaining: int | None = None
        self.until_close = False
        self.keep_alive = True
        self.cbuf = b""
        self.chunk_left = 0
        self.need_crlf = False
        self.trailers = False
        self.got_bytes = False
        ex.res.actual_send_s = ex.clock()
        self.transport.write(raw)

    def data_received(self, data: bytes) -> None:
        ex = self.ex
        if ex is None or ex.future.done():
            return
        self.got_bytes = True
        if self.head is None:
            self.hbuf += data
            end = self.hbuf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.head, data = self.hbuf[:end], self.hbuf[end + 4:]
            self.hbuf = b""
            self._parse_head()
            if self.remaining == 0:
                self._complete()
                return
        if self.chunked:
            payload = self._dechunk(data)
        elif self.remaining is not None:
            payload = data[:self.remaining]
            self.remaining -= len(payload)
        else:
            payload = data
        if payload:
            self._sink(payload)
        if not ex.future.done() and (self.trailers is None or self.remaining == 0):
            self._complete()

    # -- HTTP ---------------------------------------------------------------------------------------------
    def _parse_head(self) -> None:
        lines = self.head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        self.status = int(parts[1])
        if parts[0] == b"HTTP/1.0":
            self.keep_alive = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value:
                self.chunked = True
            elif name == b"content-length":
                self.remaining = int(value)
            elif name == b"connection":
                self.keep_alive = value == b"keep-alive" or (value != b"close" and self.keep_alive)
            elif name.startswith(b"x-lbbench-"):
                self._pd_header(name.decode("latin-1"), value)
        if self.chunked:
            self.remaining = None
        elif self.remaining is None:
            self.until_close = True
            self.keep_alive = False
        self.ex.res.http_status = self.status

    def _pd_header(self, name: str, value: bytes) -> None:
        """One of a P/D decode instance's timing headers -> ``StreamResult.pd_timing``."""
        key = _PD_HEADERS.get(name)
        if key is None:
            return
        try:
            v = float(value)
        except ValueError:
            return
        res = self.ex.res
        if res.pd_timing is None:
            res.pd_timing = {}
        res.pd_timing[key] = v

    def _dechunk(self, data: bytes) -> bytes:
        buf = self.cbuf + data if self.cbuf else data
        pos, n, out = 0, len(buf), []
        while pos < n:
            if self.chunk_left:
                take = buf[pos:pos + self.chunk_left]
                out.append(take)
                self.chunk_left -= len(take)
                pos += len(take)
                if not self.chunk_left:
                    self.need_crlf = True
            elif self.need_crlf:
                if n - pos < 2:
                    break
                pos += 2
                self.need_crlf = False
            else:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                if self.trailers:
                    if eol == pos:  # the empty line that ends the trailers (and the body)
                        pos += 2
                        self.trailers = None
                        break
                    pos = eol + 2
                    continue
                size = int(buf[pos:eol].split(b";", 1)[0], 16)
                pos = eol + 2
                if size:
                    self.chunk_left = size
                else:
                    self.trailers = True
        self.cbuf = buf[pos:]
        return out[0] if len(out) == 1 else b"".join(out)

    def _sink(self, payload: bytes) -> None:
        ex = self.ex
        if self.status != 200:
            if len(ex.error_body) < 300:
                ex.error_body += payload[:300]
            return
        try:
            got = ex.sse.feed(payload)
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
            self.keep_alive = False
            self._fail(f"bad stream: {exc}", connection=False)
            return
        if got:
            now = ex.clock()
            times = ex.res.token_times_s
            times.extend([now] * got)
            if ex.on_tokens is not None:
                ex.on_tokens(len(times), now)

    def _complete(self) -> None:
        ex, res = self.ex, self.ex.res
        if self.status != 200:
            body = ex.error_body[:300].decode("utf-8", "replace").replace("\n", " ")
            res.error = f"HTTP {self.status}: {body}"
        else:
            sse = ex.sse
            res.server_prompt_tokens, res.server_output_tokens = sse.server_prompt_tokens, sse.server_output_tokens
            if sse.error is not None:
                res.error = sse.error
            elif not sse.done:
                res.error = "connection error: stream ended before [DONE]"
                res.connection_error = True
        res.finish_s = ex.clock() if res.error is None else None
        self._release()
        ex.future.set_result(res)

    def _fail(self, error: str, connection: bool = True) -> None:
        ex = self.ex
        ex.res.error = error
        ex.res.connection_error = connection
        ex.res.finish_s = None
        self.keep_alive = False
        self._release()
        ex.future.set_result(ex.res)

    def _release(self) -> None:
        self.ex = None
        if self.keep_alive and not self.closed and self.transport is not None and not self.transport.is_closing():
            self.pool.append(self)
        elif self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.keep_alive = False
        if self.transport is not None:
            self.transport.abort()


class HttpBackend:
    """Keep-alive connections per endpoint for a run (``http://`` or ``https://``); ``send`` streams one request.

    Use it as an async context manager, or call ``close`` when done."""

    def __init__(self, *, model: str, clock: Callable[[], float], api: str = "completions",
                 request_timeout_s: float = 600.0, token_id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE,
                 engine: Engine = VLLM):
        if api not in ("completions", "chat"):
            raise ValueError(f"api: unknown API {api!r} (completions or chat)")
        self.model = model
        self.clock = clock
        self.api = api
        self.request_timeout_s = request_timeout_s
        self.token_id_range = token_id_range
        self.engine = engine
        self.path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
        self.pools: dict[_Addr, list[_Conn]] = {}
        self._tls: ssl.SSLContext | None = None

    async def __aenter__(self) -> "HttpBackend":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def _addr(base_url: str) -> _Addr:
        u = urlsplit(base_url)
        tls = u.scheme == "https"
        return u.hostname or "127.0.0.1", u.port or (443 if tls else 80), tls

    async def _connect(self, addr: _Addr) -> _Conn:
        host, port, tls = addr
        if tls and self._tls is None:
            self._tls = ssl.create_default_context()
        pool = self.pools.setdefault(addr, [])
        _, conn = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
            lambda: _Conn(pool), host, port, ssl=self._tls if tls else None), self.request_timeout_s)
        return conn

    async def warm(self, endpoints: Sequence[str], per_endpoint: int) -> None:
        """Open ``per_endpoint`` keep-alive connections to each endpoint before a run's clock starts, so its
        first burst does not pay for TCP connects."""
        async def one(url: str) -> None:
            addr = self._addr(url)
            try:
                conn = await self._connect(addr)
            except (OSError, asyncio.TimeoutError):
                return
            self.pools[addr].append(conn)
        await asyncio.gather(*(one(u) for u in endpoints for _ in range(per_endpoint)))

    def close(self) -> None:
        for pool in self.pools.values():
            for conn in list(pool):
                if conn.transport is not None:
                    conn.transport.close()
            pool.clear()

    def prepare(self, base_url: str, request: Request, priority: int | None = None, text: str | None = None,
                headers: dict[str, str] | None = None) -> bytes:
        """The whole HTTP request for ``request`` (a load worker builds it ahead of its send time): ``priority``
        is its ``priority`` field (None: none, as vLLM rejects one under fcfs), ``text`` its prompt as text (None:
        token ids), ``headers`` extra request headers."""
        payload = json.dumps(request_body(request, self.model, self.api, self.token_id_range, priority, text,
                                          self.engine)).encode()
        host, port, _ = self._addr(base_url)
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        if ":" in host:  # an IPv6 address
            host = f"[{host}]"
        return (f"POST {self.path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\n{extra}Content-Length: {len(payload)}\r\n\r\n").encode() + payload

    async def send(self, base_url: str, request: Request, on_tokens: TokenCallback | None = None,
                   raw: bytes | None = None, priority: int | None = None, text: str | None = None,
                   headers: dict[str, str] | None = None) -> StreamResult:
        """Stream one request to ``base_url`` (``raw``: its bytes from ``prepare``, else built here with
        ``priority`` and ``text``); never raises for server or network faults."""
        addr = self._addr(base_url)
        if raw is None:
            raw = self.prepare(base_url, request, priority, text, headers)
        loop = asyncio.get_running_loop()
        res = StreamResult(actual_send_s=self.clock())
        for attempt in (0, 1):
            pool = self.pools.setdefault(addr, [])
            conn = None
            while pool:
                c = pool.pop()
                if not c.closed and not c.transport.is_closing():
                    conn = c
                    break
            if conn is None:
                try:
                    conn = await self._connect(addr)
                except asyncio.TimeoutError:
                    res.error = f"timeout after {self.request_timeout_s:g}s"
                    return res
                except OSError as exc:
                    res.error = f"connection error: {type(exc).__name__}: {exc}"
                    res.connection_error = True
                    return res
                fresh = True
            else:
                fresh = False
            fut = loop.create_future()
            ex = _Exchange(res, on_tokens, self.clock, fut)
            conn.start(ex, raw)
            timer = loop.call_later(self.request_timeout_s, self._time_out, conn, ex)
            try:
                out = await fut
            except asyncio.CancelledError:  # the run stopped: this connection is mid-answer, never reused
                conn.abort()
                raise
            finally:
                timer.cancel()
            if out == "retry":
                if fresh or attempt:
                    res.error = "connection error: ServerDisconnectedError: connection closed before the response"
                    res.connection_error = True
                    return res
                res = StreamResult(actual_send_s=self.clock())
                continue
            return out
        return res

    def _time_out(self, conn: _Conn, ex: _Exchange) -> None:
        if ex.future.done():
            return
        ex.res.error = f"timeout after {self.request_timeout_s:g}s"
        ex.res.finish_s = None
        conn.ex = None
        conn.abort()
        ex.future.set_result(ex.res)


def throttled(min_step_s: float, first: Callable[[float], None],
              step: Callable[[float, int], None]) -> TokenCallback:
    """A stream's token callback that calls ``first(t)`` on the first tokens, then ``step(t, tokens_so_far)`` at
    most once per ``min_step_s``: what every send path reports (what the simulator's state sees per engine
    step)."""
    last = -math.inf

    def on_tokens(count: int, t: float) -> None:
        nonlocal last
        if last == -math.inf:
            first(t)
            last = t
        elif t - last >= min_step_s:
            step(t, count)
            last = t

    return on_tokens
