"""A lean streaming HTTP/1.1 client for load workers: SSE events counted in ``asyncio.Protocol.data_received``.

``HttpBackend`` (aiohttp) hands every streamed read through a ``StreamReader`` and an async iterator; in a
profile of the 80 req/s replay that cost about 45 µs per chunk, most of a load worker's time. Here one
``asyncio.Protocol`` per keep-alive connection does the whole exchange in ``data_received``: the status line and
headers, chunked transfer decoding, and the SSE framing and token count (``SseCounter``: the same byte-level count
as ``HttpBackend`` — ``lbbench.live.http.event_tokens`` — with a full JSON parse only for usage and error events).
No task, future or buffer object is made per chunk.

``LeanHttpClient.send`` has ``HttpBackend.send``'s contract: the same request body
(``lbbench.live.http.request_body``), a ``StreamResult`` with the same fields and the same error texts, never an
exception for server or network faults. Connections are kept alive per endpoint; a request that finds its pooled
connection closed by the server before any answer byte is sent once more on a fresh connection.
"""

from __future__ import annotations

import asyncio
import json
from typing import Callable
from urllib.parse import urlsplit

from ..core import Request
from ..engines import VLLM, Engine
from .http import DEFAULT_TOKEN_ID_RANGE, StreamResult, TokenCallback, _count_tokens, event_tokens, request_body


class SseCounter:
    """Server-sent events of an OpenAI-compatible stream, fed as body bytes in any chunking."""

    __slots__ = ("buf", "done", "error", "server_prompt_tokens", "server_output_tokens")

    def __init__(self) -> None:
        self.buf = b""
        self.done = False
        self.error: str | None = None
        self.server_prompt_tokens: int | None = None
        self.server_output_tokens: int | None = None

    def feed(self, data: bytes) -> int:
        """Tokens carried by the events that ``data`` completes (raises ``json.JSONDecodeError`` on bad JSON)."""
        buf = self.buf + data if self.buf else data
        if b"\r" in buf:
            if buf.endswith(b"\r"):  # a CR whose LF is in the next read
                self.buf = buf
                return 0
            buf = buf.replace(b"\r\n", b"\n")
        got, start = 0, 0
        while True:
            cut = buf.find(b"\n\n", start)
            if cut < 0:
                break
            for line in buf[start:cut].split(b"\n"):
                if line[:5] != b"data:":
                    continue
                data_s = line[5:].strip()
                if data_s == b"[DONE]":
                    self.done = True
                    continue
                fast = event_tokens(data_s)
                if fast is not None:
                    got += fast
                    continue
                got += self._parse(data_s)
            start = cut + 2
        self.buf = buf[start:]
        return got

    def _parse(self, data_s: bytes) -> int:
        obj = json.loads(data_s)
        if "error" in obj and not obj.get("choices"):
            err = obj["error"]
            self.error = f"server error: {err.get('message', err) if isinstance(err, dict) else err}"
            return 0
        got = sum(_count_tokens(c) for c in obj.get("choices") or ())
        usage = obj.get("usage")
        if usage:
            self.server_prompt_tokens = usage.get("prompt_tokens")
            self.server_output_tokens = usage.get("completion_tokens")
        return got


class _Exchange:
    """One request's state while its answer arrives."""

    __slots__ = ("res", "on_tokens", "clock", "sse", "error_body", "future")

    def __init__(self, res: StreamResult, on_tokens: TokenCallback | None, clock: Callable[[], float],
                 future: asyncio.Future):
        self.res = res
        self.on_tokens = on_tokens
        self.clock = clock
        self.sse = SseCounter()
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
        if self.chunked:
            self.remaining = None
        elif self.remaining is None:
            self.until_close = True
            self.keep_alive = False
        self.ex.res.http_status = self.status

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


class LeanHttpClient:
    """Keep-alive connections per endpoint; ``send`` streams one request (``HttpBackend.send``'s contract)."""

    def __init__(self, *, model: str, clock: Callable[[], float], api: str = "completions",
                 request_timeout_s: float = 600.0, token_id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE,
                 priority_of: Callable[[Request], int | None] | None = None,
                 prompt_texts: dict[int, str] | None = None, engine: Engine = VLLM):
        if api not in ("completions", "chat"):
            raise ValueError(f"api: unknown API {api!r} (completions or chat)")
        self.model = model
        self.clock = clock
        self.api = api
        self.request_timeout_s = request_timeout_s
        self.token_id_range = token_id_range
        self.priority_of = priority_of
        self.prompt_texts = prompt_texts if prompt_texts is not None else {}
        self.engine = engine
        self.path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
        self.pools: dict[tuple[str, int], list[_Conn]] = {}

    @staticmethod
    def _addr(base_url: str) -> tuple[str, int]:
        u = urlsplit(base_url)
        return u.hostname or "127.0.0.1", u.port or 80

    async def _connect(self, addr: tuple[str, int]) -> _Conn:
        pool = self.pools.setdefault(addr, [])
        _, conn = await asyncio.get_running_loop().create_connection(lambda: _Conn(pool), *addr)
        return conn

    async def warm(self, endpoints: list[str] | tuple[str, ...], per_endpoint: int) -> None:
        """Open ``per_endpoint`` keep-alive connections to each endpoint before a run's clock starts."""
        async def one(url: str) -> None:
            addr = self._addr(url)
            try:
                conn = await self._connect(addr)
            except OSError:
                return
            self.pools[addr].append(conn)
        await asyncio.gather(*(one(u) for u in endpoints for _ in range(per_endpoint)))

    def close(self) -> None:
        for pool in self.pools.values():
            for conn in list(pool):
                if conn.transport is not None:
                    conn.transport.close()
            pool.clear()

    def prepare(self, base_url: str, request: Request) -> bytes:
        """The whole HTTP request for ``request`` (built ahead of its send time by a load worker)."""
        prio = self.priority_of(request) if self.priority_of is not None else None
        payload = json.dumps(request_body(request, self.model, self.api, self.token_id_range, prio,
                                          self.prompt_texts.get(request.request_id), self.engine)).encode()
        host, port = self._addr(base_url)
        return (f"POST {self.path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload

    async def send(self, base_url: str, request: Request, on_tokens: TokenCallback | None = None,
                   raw: bytes | None = None) -> StreamResult:
        """Stream one request to ``base_url`` (``raw``: its bytes from ``prepare``); never raises for server or
        network faults."""
        addr = self._addr(base_url)
        if raw is None:
            raw = self.prepare(base_url, request)
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
