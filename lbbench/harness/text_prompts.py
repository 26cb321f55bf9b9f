"""Text prompts of exact token lengths, for endpoints that take only text (gateways in front of vLLM).

lbbench normally sends a token-id list as the prompt, which vLLM reads as exactly that many tokens. A gateway
(SGLang's model gateway, for one) may accept only text. Then each request's prompt is built from words drawn
deterministically per request (so prompts differ and a prefix cache sees no accidental sharing) and trimmed or
extended, one word at a time, until the served model's tokenizer says it is exactly ``prompt_tokens`` long.

The tokenizer is the endpoint's own (vLLM's ``POST /tokenize``), one given by path (a Hugging Face tokenizer
directory or ``tokenizer.json``), or none: then lengths are approximate (one token per word) and the caller
warns. After a run, the server's usage counts say whether the lengths held (``prompt_length_mismatches``).
"""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence

import polars as pl

from ..core import Request
from ..errors import InputError

#: short, common words: one token each (with the leading space) in the usual BPE vocabularies
WORDS = ("the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "had", "her", "was", "one",
         "our", "out", "day", "get", "has", "him", "his", "how", "man", "new", "now", "old", "see", "two",
         "way", "who", "boy", "did", "its", "let", "put", "say", "she", "too", "use", "time", "back", "good")


class TextPromptError(InputError):
    """The tokenizer could not be reached or loaded (the message says which)."""


def _words(request_id: int, n: int) -> list[str]:
    rng = random.Random(0x7E57 ^ (request_id * 2654435761))
    return [rng.choice(WORDS) for _ in range(n)]


def endpoint_counter(url: str, model: str, timeout_s: float = 10.0) -> Callable[[str], int]:
    """Token counts from a vLLM server's ``/tokenize`` (special tokens included, as a completion counts them)."""
    def count(text: str) -> int:
        body = json.dumps({"model": model, "prompt": text, "add_special_tokens": True}).encode()
        req = urllib.request.Request(url.rstrip("/") + "/tokenize", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                data = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise TextPromptError(f"{url}: /tokenize failed ({exc}); give a local tokenizer instead") from None
        return int(data.get("count", len(data.get("tokens", []))))
    return count


def local_counter(path: str | Path) -> Callable[[str], int]:
    """Token counts from a local tokenizer (a ``tokenizer.json`` or a Hugging Face tokenizer directory)."""
    p = Path(path)
    try:
        if p.is_file():
            from tokenizers import Tokenizer  # lazy: the learn extra (a local tokenizer only)
            tok = Tokenizer.from_file(str(p))
            return lambda text: len(tok.encode(text).ids)
        from transformers import AutoTokenizer  # lazy: the learn extra (a local tokenizer only)
        hf = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except (ImportError, OSError, ValueError) as exc:
        raise TextPromptError(f"{path}: cannot load a tokenizer ({exc})") from None
    return lambda text: len(hf(text)["input_ids"])


#: pieces tried to add exactly one token at the end of a prompt
_TOP_UPS = (" a", ".", ",", " x", "!", " 1", "a", "-")


def exact_text(request: Request, count: Callable[[str], int] | None) -> tuple[str, bool]:
    """(text, exact): a prompt of ``request.prompt_tokens`` tokens by ``count``; without a counter one word
    per token (``exact`` False). The longest prefix of the request's words that fits is found by bisection
    (the count only grows with more words), then single-token pieces top it up."""
    n = request.prompt_tokens
    pool = _words(request.request_id, max(n, 1))
    if count is None:
        return " ".join(pool[:n]), False
    c0 = count("")  # special tokens (a BOS) that any prompt carries
    if n <= c0:  # no room for any text (servers refuse an empty prompt): the shortest non-empty one
        return pool[0], False
    lo, hi = 0, max(0, n - c0)  # every word is at least one token
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(" ".join(pool[:mid])) <= n:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(pool[:lo])
    c = count(text)
    while c < n:
        for piece in _TOP_UPS:
            c2 = count(text + piece)
            if c2 == c + 1:
                text, c = text + piece, c2
                break
        else:
            break
    return text, c == n


def texts_for(requests: Sequence[Request], count: Callable[[str], int] | None) -> tuple[dict[int, str], int]:
    """Prompt text per request id for the requests without text of their own, and how many are not exact."""
    out: dict[int, str] = {}
    inexact = 0
    memo_empty: dict[str, int] = {}

    def cached(text: str) -> int:
        if text == "":
            if "" not in memo_empty:
                memo_empty[""] = count("")
            return memo_empty[""]
        return count(text)

    for r in requests:
        if r.prompt is not None:
            continue
        text, exact = exact_text(r, cached if count is not None else None)
        out[r.request_id] = text
        inexact += not exact
    return out, inexact


def accepts_token_ids(url: str, model: str, timeout_s: float = 30.0) -> bool:
    """Whether ``url`` takes a token-id prompt: a 1-token completion of a 2-token id prompt answers 200 (a
    gateway that wants text answers 400 or 422)."""
    body = json.dumps({"model": model, "prompt": [100, 101], "max_tokens": 1}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status == 200
    except urllib.error.HTTPError as exc:
        if exc.code in (400, 422):
            return False
        raise TextPromptError(f"{url}: probing token-id prompts failed: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise TextPromptError(f"{url}: probing token-id prompts failed: {exc}") from None


def prompt_length_mismatches(records: Any) -> int:
    """Completed requests whose server-counted prompt length differs from the intended one (``records``: a polars
    frame of them, lazy or not: a live replay's ``frame()``)."""
    served = pl.col("server_prompt_tokens")
    bad = pl.col("error").is_null() & served.is_not_null() & (served != pl.col("prompt_tokens"))
    return int(records.lazy().filter(bad).select(pl.len()).collect().item())
