"""Corpus readers, token counting and the grouped stratified split."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from lbbench.predict import paper_scheme
from lbbench.predict.data import (
    DataError,
    Example,
    count_tokens,
    load_corpus,
    prompt_fingerprint,
    stratified_split,
    write_jsonl,
)


def test_native_jsonl_with_output_tokens_and_response(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"prompt": "Say hi", "output_tokens": 7, "task": "chat"}) + "\n\n"
                 + json.dumps({"prompt": "Say hello there", "response": "hello there friend", "model": "x"}) + "\n")
    c = load_corpus(p)
    a, b = c.examples
    assert (a.output_tokens, a.task, a.model) == (7, "chat", None)
    assert b.output_tokens == count_tokens("hello there friend") >= 3
    assert b.prompt_tokens == count_tokens("Say hello there")


@pytest.mark.parametrize("line, msg", [
    ({"output_tokens": 3}, "'prompt'"),
    ({"prompt": "x"}, "needs 'output_tokens'"),
    ({"prompt": "x", "output_tokens": -1}, "non-negative"),
])
def test_native_jsonl_errors_name_file_and_row(tmp_path, line, msg):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"prompt": "ok", "output_tokens": 1}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(DataError, match=rf"bad.jsonl:2: .*{msg}"):
        load_corpus(p)


def test_missing_path_and_unknown_format(tmp_path):
    with pytest.raises(DataError, match="^data"):
        load_corpus(tmp_path / "nope.jsonl")
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(DataError, match="no file in a known format"):
        load_corpus(tmp_path)


def test_alpaca_eval_fastchat_self_instruct_formats(tmp_path):
    ae = tmp_path / "m.model_outputs.json"
    ae.write_text(json.dumps([{"dataset": "koala", "instruction": "Write a poem", "output": "roses are red",
                               "generator": "llama"}]))
    fc = tmp_path / "fc"
    fc.mkdir()
    (fc / "question.jsonl").write_text(json.dumps({"question_id": 1, "text": "Why?", "category": "fermi"}) + "\n")
    (fc / "answer_a.jsonl").write_text(json.dumps({"question_id": 1, "model_id": "a", "text": "because"}) + "\n")
    (fc / "answer_b.jsonl").write_text(json.dumps({"question_id": 1, "model_id": "b", "text": "it is so"}) + "\n")
    si = tmp_path / "si"
    si.mkdir()
    (si / "user_oriented_instructions.jsonl").write_text(json.dumps(
        {"id": "t0", "motivation_app": "Gmail", "instruction": "Reply", "instances": [{"input": "hi", "output": "hey"}]})
        + "\n")
    (si / "davinci_predictions.jsonl").write_text(json.dumps(
        {"prompt": "Reply\n\nInput: hi\nOutput:", "instruction": "Reply", "input": "hi", "response": "hello you",
         "target": "hey"}) + "\n")
    c = load_corpus(tmp_path)
    got = Counter((e.task, e.model) for e in c.examples)
    assert got == Counter({("koala", "llama"): 1, ("fermi", "a"): 1, ("fermi", "b"): 1,
                           ("Gmail", "davinci"): 1, ("Gmail", "human"): 1})
    assert load_corpus(fc / "answer_b.jsonl").examples[0].model == "b"
    assert {e.model for e in load_corpus(tmp_path, models=["LLAMA", "b"]).examples} == {"llama", "b"}


def test_max_examples_subsample_is_seeded(tiny_corpus):
    a = load_corpus(tiny_corpus, max_examples=10, seed=1).examples
    assert len(a) == 10 and a == load_corpus(tiny_corpus, max_examples=10, seed=1).examples


def test_write_jsonl_roundtrip(tiny_corpus, tmp_path):
    ex = load_corpus(tiny_corpus).examples
    write_jsonl(ex, tmp_path / "out.jsonl")
    back = load_corpus(tmp_path / "out.jsonl").examples
    assert [(e.prompt, e.output_tokens, e.prompt_tokens, e.task) for e in back] == \
        [(e.prompt, e.output_tokens, e.prompt_tokens, e.task) for e in ex]


def test_split_is_grouped_stratified_and_disjoint():
    s = paper_scheme()
    ex = [Example(f"p{i % 50}", (i * 37) % 2000, 10, None, f"m{i // 50}") for i in range(200)]
    train, test = stratified_split(ex, s, 0.25, seed=3)
    assert len(train) + len(test) == len(ex)
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert 0.15 < len({e.prompt for e in test}) / 50 < 0.35
    assert stratified_split(ex, s, 0.25, seed=3) == (train, test)
    with pytest.raises(ValueError):
        stratified_split(ex, s, 1.0)


def test_fingerprint_is_stable():
    assert prompt_fingerprint("abc") == prompt_fingerprint("abc") != prompt_fingerprint("abd")
