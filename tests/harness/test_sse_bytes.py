"""Bytes-level reading of streamed events: the token count of a chunk without decoding its JSON, and the events
that still need a full parse (usage counts, errors)."""

import json

from hypothesis import given
from hypothesis import strategies as st

from lbbench.live.sse import choice_tokens, event_tokens


def test_token_ids_and_text_chunks():
    assert event_tokens(b'{"choices":[{"index":0,"text":"ab","token_ids":[5,6,7]}]}') == 3
    assert event_tokens(b'{"choices":[{"index":0,"text":" t1"}]}') == 1
    assert event_tokens(b'{"choices": [{"index": 0, "text": ""}]}') == 0
    assert event_tokens(b'{"choices":[{"delta":{"content":"hi"}}]}') == 1
    assert event_tokens(b'{"choices":[{"delta":{"role":"assistant","content":""}}]}') == 0
    assert event_tokens(b'{"choices":[{"text":"x","token_ids":[]}]}') == 0


def test_usage_and_errors_need_a_parse():
    assert event_tokens(b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}') is None
    assert event_tokens(b'{"error":{"message":"boom"}}') is None
    assert event_tokens(b'{"choices":[{"text":"a"}],"usage":null}') == 1


@given(ids=st.lists(st.integers(0, 100000), max_size=8), text=st.text(max_size=6), spaced=st.booleans())
def test_bytes_count_equals_the_decoded_count(ids, text, spaced):
    choice = {"index": 0, "text": text, "token_ids": ids}
    sep = (", ", ": ") if spaced else (",", ":")
    raw = json.dumps({"choices": [choice]}, separators=sep).encode()
    assert event_tokens(raw) == choice_tokens(choice)
