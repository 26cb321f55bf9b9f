"""A tiny random-weight Llama for running real vLLM on machines without GPUs.

``lbbench run --launch tiny`` serves this model: 4 layers, hidden size 256,
vocabulary 2048 (about 3.7 M parameters) with a byte-level BPE tokenizer
trained here on generated text. Nothing is downloaded; the weights are random
(seeded), so its text is gibberish, but the serving engine that runs it —
continuous batching, paged KV cache, preemption, chunked prefill, metrics — is
the real one.

The model is created once and cached under ``$LBBENCH_CACHE/tiny-llama`` (or
``~/.cache/lbbench/tiny-llama``). This file imports nothing from lbbench, so any
Python with ``torch``, ``transformers`` and ``tokenizers`` can create it:
``python -m lbbench.engines.vllm.tiny_model [DIR]`` from the lbbench environment, or
``python path/to/tiny_model.py [DIR]`` from the vLLM environment.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

TINY_NAME = "tiny"
#: Bump when the recipe changes, so stale caches are rebuilt.
TINY_VERSION = 1
VOCAB_SIZE = 2048
HIDDEN_SIZE = 256
NUM_LAYERS = 4
NUM_HEADS = 4
INTERMEDIATE_SIZE = 512
MAX_POSITION_EMBEDDINGS = 4096
_SPECIAL = ("<s>", "</s>", "<unk>", "<pad>")
_CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def cache_dir() -> Path:
    """Where the tiny model lives: ``$LBBENCH_CACHE/tiny-llama`` or ``~/.cache/lbbench/tiny-llama``."""
    root = os.environ.get("LBBENCH_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "lbbench"
    return base / "tiny-llama"


def is_ready(path: Path) -> bool:
    marker = path / "lbbench-tiny.json"
    try:
        return json.loads(marker.read_text()).get("version") == TINY_VERSION
    except (OSError, ValueError):
        return False


def _corpus(num_lines: int = 20000, seed: int = 0) -> list[str]:
    """Deterministic English-like text to train the tokenizer on."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ren", "to", "sa", "vel", "qu", "or", "an", "de", "is", "th",
                 "er", "ing", "ed", "on", "at", "st", "pro", "con", "ver", "ly", "ment", "tion"]
    words = ["the", "a", "of", "to", "and", "in", "is", "for", "on", "with", "request", "token",
             "server", "model", "queue", "latency", "batch", "cache", "route", "load"]
    words += ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    letters = "abcdefghijklmnopqrstuvwxyz"
    words += ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(3000)]
    lines = []
    for _ in range(num_lines):
        n = rng.randint(4, 20)
        sent = " ".join(rng.choice(words) for _ in range(n))
        lines.append(sent.capitalize() + rng.choice([".", "?", "!", ",", ":"]) +
                     (" " + str(rng.randint(0, 9999)) if rng.random() < 0.2 else ""))
    return lines


def _build(out: Path) -> None:
    import torch  # lazy: the learn extra (or the vLLM environment's own packages)
    from tokenizers import ByteLevelBPETokenizer  # lazy: the learn extra (or the vLLM environment's own packages)
    # lazy: the learn extra (or the vLLM environment's own packages)
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(_corpus(), vocab_size=VOCAB_SIZE, min_frequency=2,
                            special_tokens=list(_SPECIAL), show_progress=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>",
                                   model_max_length=MAX_POSITION_EMBEDDINGS)
    missing = VOCAB_SIZE - len(fast)
    if missing > 0:  # every id the model can sample must decode
        fast.add_tokens([f"<extra_{i}>" for i in range(missing)])
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=HIDDEN_SIZE, intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS, num_attention_heads=NUM_HEADS, num_key_value_heads=NUM_HEADS,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS, bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "lbbench-tiny.json").write_text(json.dumps({"version": TINY_VERSION, "name": TINY_NAME}))


def ensure_tiny_model(path: str | Path | None = None) -> Path:
    """Create the tiny model at ``path`` (default: :func:`cache_dir`) unless it
    is already there; returns its directory. Safe against concurrent callers
    (built in a temporary directory, then renamed into place)."""
    out = Path(path) if path is not None else cache_dir()
    if is_ready(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=out.parent))
    tmp.chmod(0o755)
    try:
        _build(tmp)
        if out.exists() and not is_ready(out):
            shutil.rmtree(out, ignore_errors=True)
        try:
            tmp.rename(out)
        except OSError:
            if not is_ready(out):  # lost a race only if the winner finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(ensure_tiny_model(args[0] if args else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
