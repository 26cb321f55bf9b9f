"""Multi-turn corpus layouts: FastChat llm_judge, ShareGPT, LMSYS-Chat, OpenAI
messages; one row per assistant turn, errors naming file, line and key."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from lbbench.predict.chat_formats import render_history
from lbbench.predict.data import DataError, count_tokens, load_corpus

FIXTURES = Path(__file__).parent / "fixtures"
JUDGE = FIXTURES / "llm_judge"


def test_llm_judge_directory_one_row_per_turn_with_history():
    c = load_corpus(JUDGE)
    # 2 questions x 2 turns for vicuna, 1 x 2 for llama-13b; reference answers are not read
    assert Counter(e.model for e in c.examples) == Counter({"vicuna-7b-v1.3": 4, "llama-13b": 2})
    assert not any("reference_answer" in f for f in c.files_read)
    by = {(e.model, e.prompt.count("User:")): e for e in c.examples if e.task == "writing"}
    first = next(e for e in c.examples if e.prompt == "Compose a travel blog post about Hawaii.")
    assert first.task == "writing" and first.output_tokens == count_tokens(
        "Aloha from Hawaii, where the beaches are warm and the people are kind.")
    second = by[("vicuna-7b-v1.3", 2)]
    assert second.prompt == ("User: Compose a travel blog post about Hawaii.\n\n"
                             "Assistant: Aloha from Hawaii, where the beaches are warm and the people are kind.\n\n"
                             "User: Rewrite your previous response, starting every sentence with the letter A.")
    assert second.output_tokens == count_tokens("A warm welcome awaits.")


def test_llm_judge_question_file_and_single_answer_file():
    q = JUDGE / "mt_bench" / "question.jsonl"
    assert len(load_corpus(q).examples) == 6
    one = load_corpus(JUDGE / "mt_bench" / "model_answer" / "llama-13b.jsonl").examples
    assert [e.model for e in one] == ["llama-13b"] * 2


def test_sharegpt_lmsys_openai():
    sg = load_corpus(FIXTURES / "sharegpt.json").examples
    assert [e.prompt for e in sg] == [
        "Tell me a joke.",
        "User: Tell me a joke.\n\nAssistant: Why did the chicken cross the road? To get to the other side."
        "\n\nUser: Another one.",
        "System: Be brief.\n\nUser: Capital of France?"]
    assert sg[2].output_tokens == count_tokens("Paris.")
    lm = load_corpus(FIXTURES / "lmsys.jsonl").examples
    assert [(e.model, e.output_tokens) for e in lm] == [
        ("vicuna-13b", count_tokens("2+2 equals 4.")), ("koala-13b", count_tokens("Blue.")),
        ("koala-13b", count_tokens("Green, the color of grass."))]
    oa = load_corpus(FIXTURES / "openai_messages.jsonl").examples
    assert [(e.prompt, e.model) for e in oa] == [
        ("System: You are helpful.\n\nUser: Summarize: the cat sat on the mat.", "gpt-3.5-turbo"),
        ("Say hello", None)]


def test_render_history_single_user_turn_is_verbatim():
    assert render_history([("user", "hi")]) == "hi"
    assert render_history([("user", "hi"), ("assistant", "yo"), ("user", "ok")]) == \
        "User: hi\n\nAssistant: yo\n\nUser: ok"


def _judge_copy(tmp_path: Path) -> Path:
    d = tmp_path / "judge"
    shutil.copytree(JUDGE / "mt_bench", d)
    return d


@pytest.mark.parametrize("which, line, needle", [
    ("question", '{"question_id": 7, "category": "x"}', r"question.jsonl:3: missing key 'turns'"),
    ("answer", '{"question_id": 81, "model_id": "m"}', r"vicuna-7b-v1.3.jsonl:3: missing key 'choices'"),
    ("answer", '{"question_id": 81, "choices": [{"index": 0}]}',
     r"vicuna-7b-v1.3.jsonl:3: choices\[0\]: missing key 'turns'"),
    ("answer", '{"question_id": 999, "choices": [{"turns": ["x"]}]}', r"vicuna-7b-v1.3.jsonl:3: question_id 999"),
])
def test_llm_judge_errors_name_file_line_and_key(tmp_path, which, line, needle):
    d = _judge_copy(tmp_path)
    f = d / "question.jsonl" if which == "question" else d / "model_answer" / "vicuna-7b-v1.3.jsonl"
    f.write_text(f.read_text() + line + "\n")
    with pytest.raises(DataError, match=needle):
        load_corpus(d)


def test_llm_judge_without_answers_is_an_error(tmp_path):
    d = _judge_copy(tmp_path)
    shutil.rmtree(d / "model_answer")
    with pytest.raises(DataError, match=r"question.jsonl: no answers"):
        load_corpus(d / "question.jsonl")


@pytest.mark.parametrize("name, rows, needle", [
    ("c.jsonl", [{"conversation": [{"role": "user", "content": "a"}]},
                 {"conversation": [{"role": "user"}]}], r"c.jsonl:2: message 0: missing key 'content'"),
    ("m.jsonl", [{"messages": "hello"}], r"m.jsonl:1: 'messages' must be a list"),
    ("m2.jsonl", [{"messages": [{"content": "x"}]}], r"m2.jsonl:1: message 0: missing key 'role'"),
])
def test_jsonl_chat_errors(tmp_path, name, rows, needle):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=needle):
        load_corpus(p)


def test_sharegpt_error_names_item(tmp_path):
    p = tmp_path / "sg.json"
    p.write_text(json.dumps([{"conversations": []}, {"conversations": [{"from": "human"}]}]))
    with pytest.raises(DataError, match=r"sg.json: item 1: message 0: missing key 'value'"):
        load_corpus(p)
