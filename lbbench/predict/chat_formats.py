"""Readers for multi-turn chat corpora: one row per assistant turn, the
conversation before it as the prompt.

Layouts read (recognised by their keys and paths):

* FastChat ``llm_judge`` (MT-Bench style): ``question.jsonl`` rows with
  ``question_id``, ``turns`` (the user turns) and ``category``; answers in
  ``model_answer/<model>.jsonl`` beside it, rows with ``question_id``,
  ``model_id`` and ``choices[0].turns`` (the assistant turns). Turn *k* of an
  answer becomes a row whose prompt is user 1, assistant 1, ..., user *k*.
  task = ``category``, model = ``model_id`` (else the file name).
* ShareGPT JSON: an array of ``{"conversations": [{"from": "human"|"gpt"|
  "system", "value": ...}]}``.
* LMSYS-Chat-style JSONL: ``{"conversation": [{"role", "content"}], "model"}``.
* OpenAI chat-format JSONL: ``{"messages": [{"role", "content"}], "model"?}``.

A conversation whose history is a single user message keeps that message as
the prompt verbatim (so a single-turn chat row and the same instruction in an
instruction corpus share a prompt); longer histories are rendered as
``"User: ...\\n\\nAssistant: ...\\n\\nUser: ..."``. Errors name the file, the
line (JSON Lines) or array index (JSON), and the missing key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from .data_rows import DataError, Raw, opt_str, read_jsonl_numbered

#: ShareGPT speaker names -> OpenAI roles.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
                  "bard": "assistant", "assistant": "assistant", "system": "system"}
ROLE_LABELS = {"user": "User", "assistant": "Assistant", "system": "System"}


def render_history(history: Sequence[tuple[str, str]]) -> str:
    """The prompt text for a conversation so far (``(role, text)`` pairs)."""
    if len(history) == 1 and history[0][0] == "user":
        return history[0][1]
    return "\n\n".join(f"{ROLE_LABELS.get(role, role.title())}: {text}" for role, text in history)


def conversation_rows(turns: Sequence[tuple[str, str]], where: str, task: str | None,
                      model: str | None, source: str) -> list[Raw]:
    """One row per assistant turn that follows a user turn."""
    out = []
    history: list[tuple[str, str]] = []
    for role, text in turns:
        if role == "assistant" and history and any(r == "user" for r, _ in history):
            out.append(Raw(render_history(history), task, model, response=text, source=source))
        history.append((role, text))
    return out


def _require(obj: Any, key: str, where: str, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise DataError(f"{where}: missing key {key!r}")
    v = obj[key]
    if not isinstance(v, kind):
        raise DataError(f"{where}: {key!r} must be {what}")
    return v


def _messages(msgs: list, where: str, role_key: str, text_key: str,
              role_map: dict[str, str] | None = None) -> list[tuple[str, str]]:
    turns = []
    for j, m in enumerate(msgs):
        w = f"{where}: message {j}"
        role = str(_require(m, role_key, w, str, "a string")).lower()
        text = m.get(text_key) if isinstance(m, dict) else None
        if text_key not in m:
            raise DataError(f"{w}: missing key {text_key!r}")
        if isinstance(text, list):  # OpenAI content parts
            text = " ".join(str(p.get("text", "")) for p in text if isinstance(p, dict))
        turns.append(((role_map or {}).get(role, role), "" if text is None else str(text)))
    return turns


def read_messages_jsonl(path: Path, key: str) -> list[Raw]:
    """LMSYS (``key='conversation'``) or OpenAI (``key='messages'``) JSON Lines."""
    out = []
    for line, row in read_jsonl_numbered(path):
        where = f"{path}:{line}"
        msgs = _require(row, key, where, list, "a list of messages")
        turns = _messages(msgs, where, "role", "content")
        out.extend(conversation_rows(turns, where, opt_str(row.get("task") or row.get("category")),
                                     opt_str(row.get("model")), path.name))
    return out


def read_sharegpt(path: Path, data: list) -> list[Raw]:
    out = []
    for i, row in enumerate(data):
        where = f"{path}: item {i}"
        msgs = _require(row, "conversations", where, list, "a list of messages")
        turns = _messages(msgs, where, "from", "value", SHAREGPT_ROLES)
        out.extend(conversation_rows(turns, where, None, opt_str(row.get("model")), path.name))
    return out


# --------------------------------------------------------------------------- FastChat llm_judge


def is_llm_judge_question_file(path: Path) -> bool:
    if path.name != "question.jsonl":
        return False
    for _, row in read_jsonl_numbered(path):
        return "turns" in row
    return False


def llm_judge_question_of(answer_path: Path) -> Path | None:
    """``question.jsonl`` for a ``model_answer/<model>.jsonl`` file, if there is one."""
    if answer_path.parent.name != "model_answer":
        return None
    q = answer_path.parent.parent / "question.jsonl"
    return q if q.is_file() else None


def read_llm_judge(question_path: Path, answer_paths: Sequence[Path] | None = None) -> list[Raw]:
    """Rows of a FastChat ``llm_judge`` question file and its answer files
    (default: every ``model_answer/*.jsonl`` beside it)."""
    questions: dict[Any, tuple[list[str], str | None]] = {}
    for line, q in read_jsonl_numbered(question_path):
        where = f"{question_path}:{line}"
        qid = _require(q, "question_id", where, (int, str), "an integer or string")
        turns = _require(q, "turns", where, list, "a list of strings")
        questions[qid] = ([str(t) for t in turns], opt_str(q.get("category")))
    if answer_paths is None:
        answer_paths = sorted((question_path.parent / "model_answer").glob("*.jsonl"))
    if not answer_paths:
        raise DataError(f"{question_path}: no answers (expected model_answer/<model>.jsonl beside it)")
    out = []
    for ap in answer_paths:
        for line, a in read_jsonl_numbered(ap):
            where = f"{ap}:{line}"
            qid = _require(a, "question_id", where, (int, str), "an integer or string")
            if qid not in questions:
                raise DataError(f"{where}: question_id {qid!r} not in {question_path.name}")
            choices = _require(a, "choices", where, list, "a list")
            if not choices:
                raise DataError(f"{where}: 'choices' is empty")
            answers = _require(choices[0], "turns", f"{where}: choices[0]", list, "a list of strings")
            user_turns, category = questions[qid]
            turns: list[tuple[str, str]] = []
            for u, r in zip(user_turns, answers):
                turns += [("user", u), ("assistant", str(r))]
            model = opt_str(a.get("model_id")) or ap.stem
            out.extend(conversation_rows(turns, where, category, model, ap.name))
    return out
