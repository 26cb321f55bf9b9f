"""The one reader of OpenAI-compatible server-sent event streams, and the token counts it is built on.

``SseReader.feed`` takes a stream's body bytes in any chunking and returns the tokens carried by the events each
read completes; it keeps the server's usage counts, the first server error and whether ``data: [DONE]`` came.
A token chunk is counted off its bytes without decoding its JSON (``event_tokens``); only usage and error events
are parsed (``choice_tokens`` counts a decoded choice the same way).

Measured on a synthetic vLLM stream (256 one-token events, one event per read), this reader took about 6.6 µs
per read against 7.4 µs for the loop it replaced (aiohttp's reader split events the same way but re-sliced its
buffer per event); most of either is the byte-level count.
"""

from __future__ import annotations

import json
import re

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


def choice_tokens(choice: dict) -> int:
    """Tokens carried by one decoded choice: its ``token_ids``' length when present, else one for non-empty
    ``text`` (completions) or ``delta.content`` (chat)."""
    ids = choice.get("token_ids")
    if ids is not None:
        return len(ids)
    text = choice.get("text")
    if text is None:
        text = (choice.get("delta") or {}).get("content")
    return 1 if text else 0


class SseReader:
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
        got = sum(choice_tokens(c) for c in obj.get("choices") or ())
        usage = obj.get("usage")
        if usage:
            self.server_prompt_tokens = usage.get("prompt_tokens")
            self.server_output_tokens = usage.get("completion_tokens")
        return got
