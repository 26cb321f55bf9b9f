"""Length regressor: features of the prompt (frozen-encoder embedding or
hashed bag of words) + the generating model's name -> a distribution of the
output length: bucket, expected tokens, p50 and p90.

Training (``train_length_model``) holds out a share of the training prompts
(grouped by prompt, stratified by bucket) and picks, by held-out Kendall tau
(the mean over generators of the within-generator tau, so a model's overall
verbosity does not flatter the choice):

* the encoder layer whose pooled output ranks best, from 0 (the token
  embeddings, nearly free) to ``max_layers`` (inference then drops the layers
  above it), and
* the head: ``ridge`` (ridge regression on log output length) or
  ``bucket_logreg`` (multinomial logistic regression over the buckets; its
  expected length is the probability-weighted mean of the training lengths per
  bucket), each over a small grid of its regularisation strength.

The held-out rows are a share of the training prompts (``validation='prompt'``)
or, with ``validation='task'``, each task/source subset in turn (leave one
task out), which favours what transfers to prompts of another kind. The
held-out residuals of the chosen candidate (log length minus prediction)
give the p50 and p90 offsets and the mean correction, so the quantiles are
calibrated out of sample. The bucket is chosen by held-out accuracy among:
the bucket of the p50, the bucket of the mean, or a separate bucket classifier
on the same features. The chosen settings are then refitted on all training
rows.

Saved as a directory: ``config.json`` (kind ``embed`` or ``bow``) + ``heads.npz``.
Inference needs numpy, scikit-learn (bag of words) or torch + transformers
(encoder) only.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..core import Request
from .base import BucketScheme, Prediction, PredictorSpecError, TrainedModelConfig
from .data import Example, prompt_fingerprint, stratified_split
from .features import EncoderFeaturizer, ModelNameVocab, bow_features
from .metrics import LengthBaseline, accuracy, kendall_tau, majority_bucket

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "heads.npz"
FEATURES = ("encoder", "bow", "encoder+bow")
RIDGE_ALPHAS = (0.3, 1.0, 3.0, 10.0, 30.0)
LOGREG_CS = (0.3, 1.0, 3.0)
#: generators with fewer held-out rows do not get their own tau in the selection score
MIN_ROWS_PER_GENERATOR = 20
#: a task needs this many distinct prompts to be a leave-one-task-out fold
MIN_PROMPTS_PER_TASK_FOLD = 20


@dataclass
class LengthTrainConfig:
    features: str = "encoder"
    """'encoder' (frozen pretrained encoder, pooled), 'bow' (hashed bag of words) or 'encoder+bow'"""
    encoder: str = ""
    """transformers model name or path (default: bundled all-MiniLM-L6-v2)"""
    max_length: int = 128
    """encoder input tokens (longer prompts keep their first and last halves)"""
    max_layers: int = 99
    """encoder: consider only layers up to this one (0 = the pooled token embeddings; cost grows with depth)"""
    use_model_name: bool = True
    """condition on the generating model's name (``model`` of each row)"""
    heads: tuple[str, ...] = ("ridge", "bucket_logreg")
    """heads to choose from on held-out ranking"""
    val_fraction: float = 0.2
    """share of training prompts held out for the choice"""
    validation: str = "prompt"
    """'prompt' (a held-out share of the prompts) or 'task' (leave one task/source subset out at a time)"""
    seed: int = 0


@dataclass(kw_only=True)
class LengthModelConfig(TrainedModelConfig):
    features: str
    encoder: str
    max_length: int
    layer: int
    use_model_name: bool
    model_tokens: list[str]
    head: str
    head_param: float
    bucket_rule: str
    bucket_head_param: float
    log_offsets: dict[str, float]
    bucket_mean_tokens: list[float]
    selection: list[dict[str, Any]] = field(default_factory=list)
    train: dict[str, Any] = field(default_factory=dict)
    kind: str = "embed"
    format_version: int = 1


# --------------------------------------------------------------------------- heads


def _fit_ridge(x: Any, y: np.ndarray, alpha: float) -> dict[str, np.ndarray]:
    from sklearn.linear_model import Ridge  # lazy: optional extra (sklearn)

    m = Ridge(alpha=alpha).fit(x, y)
    return {"coef": np.asarray(m.coef_, dtype=np.float32).ravel(), "intercept": np.asarray([m.intercept_])}


def _fit_logreg(x: Any, buckets: np.ndarray, c: float, num_buckets: int) -> dict[str, np.ndarray]:
    from sklearn.linear_model import LogisticRegression  # lazy: optional extra (sklearn)

    classes = np.unique(buckets)
    if len(classes) == 1:
        coef = np.zeros((num_buckets, x.shape[1]), dtype=np.float32)
        intercept = np.full(num_buckets, -30.0)
        intercept[classes[0]] = 0.0
        return {"coef": coef, "intercept": intercept}
    m = LogisticRegression(C=c, max_iter=500).fit(x, buckets)
    coef = np.zeros((num_buckets, x.shape[1]), dtype=np.float32)
    intercept = np.full(num_buckets, -30.0)  # buckets never seen: ~zero probability
    raw_coef = m.coef_ if len(classes) > 2 else np.vstack([-m.coef_[0] / 2, m.coef_[0] / 2])
    raw_int = m.intercept_ if len(classes) > 2 else np.array([-m.intercept_[0] / 2, m.intercept_[0] / 2])
    coef[classes] = raw_coef
    intercept[classes] = raw_int
    return {"coef": coef, "intercept": intercept}


def _ridge_mu(w: dict[str, np.ndarray], x: Any) -> np.ndarray:
    return np.asarray(x @ w["coef"]).ravel() + float(w["intercept"][0])


def _probs(w: dict[str, np.ndarray], x: Any) -> np.ndarray:
    z = np.asarray(x @ w["coef"].T) + w["intercept"]
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


def _head_mu(head: str, w: dict[str, np.ndarray], x: Any, bucket_mean_tokens: np.ndarray) -> np.ndarray:
    """Predicted log1p(output tokens)."""
    if head == "ridge":
        return _ridge_mu(w, x)
    return np.log1p(_probs(w, x) @ bucket_mean_tokens)


def _fit_head(head: str, x: Any, y_log: np.ndarray, buckets: np.ndarray, param: float,
              num_buckets: int) -> dict[str, np.ndarray]:
    if head == "ridge":
        return _fit_ridge(x, y_log, param)
    if head == "bucket_logreg":
        return _fit_logreg(x, buckets, param, num_buckets)
    raise ValueError(f"unknown head {head!r} (known: ridge, bucket_logreg)")


def _grid(head: str) -> tuple[float, ...]:
    return RIDGE_ALPHAS if head == "ridge" else LOGREG_CS


# --------------------------------------------------------------------------- features


class _Features:
    """Design matrices for one feature setting: text part (encoder embedding
    and/or hashed bag of words) + log prompt length + model-name one-hot."""

    def __init__(self, features: str, encoder: str, max_length: int, num_layers: int | None = None,
                 precision: str = "fp32"):
        self.features = features
        self.featurizer = (EncoderFeaturizer(encoder, max_length, num_layers, precision)
                           if "encoder" in features.split("+") else None)
        self.bow = "bow" in features.split("+")

    def text_parts(self, prompts: Sequence[str]) -> tuple[np.ndarray | None, Any]:
        """``(layers + 1, n, dim)`` encoder outputs (or None), sparse bag of words (or None)."""
        emb = self.featurizer.embed_layers(prompts) if self.featurizer is not None else None
        return emb, (bow_features(prompts) if self.bow else None)

    @property
    def num_layers(self) -> int:
        return self.featurizer.num_layers if self.featurizer is not None else 0

    @staticmethod
    def design(emb: np.ndarray | None, bow: Any, prompt_tokens: Sequence[int], names: Sequence[str | None],
               vocab: ModelNameVocab | None) -> Any:
        """``emb``: ``(n, dim)`` embeddings of one layer (or None)."""
        parts = [] if emb is None else [emb]
        parts.append(np.log1p(np.asarray(prompt_tokens, dtype=np.float32))[:, None] / 4.0)
        if vocab is not None:
            parts.append(vocab.transform(names))
        dense = np.hstack(parts).astype(np.float32)
        if bow is None:
            return dense
        from scipy import sparse  # lazy: optional extra (scipy, with sklearn)

        return sparse.hstack([bow, sparse.csr_matrix(dense)]).tocsr()


def _generator_tau(true: np.ndarray, pred: np.ndarray, models: Sequence[str | None]) -> float:
    """Mean within-generator Kendall tau (weighted by rows); pooled tau when
    no generator has enough rows."""
    groups: dict[str | None, list[int]] = {}
    for i, m in enumerate(models):
        groups.setdefault(m, []).append(i)
    taus, weights = [], []
    for idx in groups.values():
        if len(idx) >= MIN_ROWS_PER_GENERATOR:
            t = kendall_tau(pred[idx], true[idx])
            if t == t:
                taus.append(t)
                weights.append(len(idx))
    if not taus:
        return kendall_tau(pred, true)
    return float(np.average(taus, weights=weights))


# --------------------------------------------------------------------------- predictor


class LengthPredictor:
    """A trained length regressor; ``predict`` follows the ``Predictor`` protocol.

    ``serving_model``: the model name used for every request in ``predict``
    (requests do not carry one); ``predict_rows`` takes a name per row.
    """

    def __init__(self, config: LengthModelConfig, weights: dict[str, np.ndarray], precision: str = "fp32",
                 serving_model: str | None = None):
        self.config = config
        self.scheme = BucketScheme.from_dict(config.scheme)
        self.weights = weights
        self.precision = precision
        self.serving_model = serving_model
        self.vocab = ModelNameVocab(config.model_tokens) if config.use_model_name else None
        self.baseline = LengthBaseline.from_dict(config.length_baseline)
        self.bucket_mean_tokens = np.asarray(config.bucket_mean_tokens, dtype=np.float64)
        self.name = f"{config.kind}:{precision}"
        self._features: _Features | None = None

    def _feats(self) -> _Features:
        if self._features is None:
            self._features = _Features(self.config.features, self.config.encoder, self.config.max_length,
                                       self.config.layer, self.precision)
        return self._features

    def design(self, prompts: Sequence[str], prompt_tokens: Sequence[int], models: Sequence[str | None]) -> Any:
        emb, bow = self._feats().text_parts(prompts)
        return _Features.design(None if emb is None else emb[-1], bow, prompt_tokens, models, self.vocab)

    def predict_rows(self, prompts: Sequence[str], prompt_tokens: Sequence[int],
                     models: Sequence[str | None], x: Any = None) -> list[Prediction]:
        if not prompts:
            return []
        x = self.design(prompts, prompt_tokens, models) if x is None else x
        cfg = self.config
        head = {k.split("/", 1)[1]: v for k, v in self.weights.items() if k.startswith("head/")}
        mu = _head_mu(cfg.head, head, x, self.bucket_mean_tokens)
        off = cfg.log_offsets
        mean = np.maximum(1.0, np.expm1(mu + off["mean"]))
        p50 = np.maximum(1.0, np.expm1(mu + off["p50"]))
        p90 = np.maximum(p50, np.expm1(mu + off["p90"]))
        if cfg.bucket_rule == "classifier":
            bw = {k.split("/", 1)[1]: v for k, v in self.weights.items() if k.startswith("bucket/")}
            buckets = _probs(bw, x).argmax(axis=1).tolist()
        else:
            point = p50 if cfg.bucket_rule == "p50" else mean
            buckets = [self.scheme.bucket_of(int(round(t))) for t in point]
        return [Prediction(int(b), int(round(e)), int(round(q5)), int(round(q9)))
                for b, e, q5, q9 in zip(buckets, mean, p50, p90)]

    def predict(self, requests: Sequence[Request]) -> list[Prediction]:
        with_text = [i for i, r in enumerate(requests) if r.prompt]
        exp = self.config.bucket_expected_tokens
        out = [Prediction(b, exp[b], exp[b], exp[b])
               for b in self.baseline.predict([r.prompt_tokens for r in requests])]  # fallback: no text
        got = self.predict_rows([requests[i].prompt or "" for i in with_text],
                                [requests[i].prompt_tokens for i in with_text],
                                [self.serving_model] * len(with_text))
        for i, p in zip(with_text, got):
            out[i] = p
        return out

    # -- persistence --------------------------------------------------------------------
    def save(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(out / WEIGHTS_FILE, **self.weights)
        (out / CONFIG_FILE).write_text(json.dumps(asdict(self.config), indent=1))
        return out

    @classmethod
    def load(cls, model_dir: str | Path, precision: str = "fp32",
             serving_model: str | None = None) -> "LengthPredictor":
        d = Path(model_dir)
        if not (d / CONFIG_FILE).is_file() or not (d / WEIGHTS_FILE).is_file():
            raise PredictorSpecError(f"{model_dir}: no {CONFIG_FILE} + {WEIGHTS_FILE} there "
                                     "(train one with `lbbench predictor train --kind embed`)")
        raw = json.loads((d / CONFIG_FILE).read_text())
        if raw.get("kind") not in ("embed", "bow"):
            raise PredictorSpecError(f"{model_dir}: {CONFIG_FILE} is a {raw.get('kind')!r} model, "
                                     "not a length regressor")
        with np.load(d / WEIGHTS_FILE) as z:
            weights = {k: z[k] for k in z.files}
        return cls(LengthModelConfig(**raw), weights, precision, serving_model)


# --------------------------------------------------------------------------- training


def _bucket_means(y: np.ndarray, buckets: np.ndarray, scheme: BucketScheme) -> np.ndarray:
    return np.array([y[buckets == b].mean() if (buckets == b).any() else scheme.expected(b)
                     for b in range(scheme.num_buckets)], dtype=np.float64)


def _folds(train: Sequence[Example], scheme: BucketScheme,
           cfg: LengthTrainConfig) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(fit rows, held-out rows)`` pairs; a prompt never sits on both sides.

    ``prompt``: one grouped, stratified split of ``val_fraction`` of the prompts.
    ``task``: leave one task (source subset) out at a time, for the (at most 6
    largest) tasks with at least ``MIN_PROMPTS_PER_TASK_FOLD`` prompts, so the
    choice favours what transfers to prompts of another kind; falls back to
    ``prompt`` with fewer than two such tasks.
    """
    if cfg.validation not in ("prompt", "task"):
        raise ValueError(f"validation must be 'prompt' or 'task', got {cfg.validation!r}")
    if cfg.validation == "task":
        prompts_of: dict[str, set[str]] = {}
        for e in train:
            if e.task:
                prompts_of.setdefault(e.task, set()).add(e.prompt)
        tasks = sorted((t for t, ps in prompts_of.items() if len(ps) >= MIN_PROMPTS_PER_TASK_FOLD),
                       key=lambda t: (-len(prompts_of[t]), t))[:6]
        if len(tasks) >= 2:
            out = []
            for t in tasks:
                held = prompts_of[t]
                v = np.array([i for i, e in enumerate(train) if e.task == t])
                f = np.array([i for i, e in enumerate(train) if e.task != t and e.prompt not in held])
                out.append((f, v))
            return out
    _, val_part = stratified_split(train, scheme, cfg.val_fraction, cfg.seed)
    val_prompts = {e.prompt for e in val_part}
    v = np.array([i for i, e in enumerate(train) if e.prompt in val_prompts])
    f = np.array([i for i, e in enumerate(train) if e.prompt not in val_prompts])
    if len(v) == 0 or len(f) == 0:
        raise ValueError("too few training prompts to hold some out for the choice of head")
    return [(f, v)]


def train_length_model(train: Sequence[Example], scheme: BucketScheme, cfg: LengthTrainConfig | None = None,
                       log: Callable[[str], None] | None = None) -> LengthPredictor:
    """Choose layer, head and bucket rule on held-out training prompts; refit on all of ``train``."""
    cfg = cfg or LengthTrainConfig()
    log = log or (lambda s: None)
    if cfg.features not in FEATURES:
        raise ValueError(f"features must be one of {', '.join(FEATURES)}, got {cfg.features!r}")
    for h in cfg.heads:
        if h not in ("ridge", "bucket_logreg"):
            raise ValueError(f"unknown head {h!r} (known: ridge, bucket_logreg)")
    if len({e.prompt for e in train}) < 5:
        raise ValueError(f"need at least 5 distinct training prompts, got {len({e.prompt for e in train})}")
    t0 = time.perf_counter()
    feats = _Features(cfg.features, cfg.encoder, cfg.max_length, num_layers=cfg.max_layers)
    prompts = [e.prompt for e in train]
    models = [e.model for e in train]
    pt = [e.prompt_tokens for e in train]
    y = np.array([e.output_tokens for e in train], dtype=np.float64)
    y_log = np.log1p(y)
    buckets = np.array([scheme.bucket_of(e.output_tokens) for e in train])
    vocab = ModelNameVocab.fit(models) if cfg.use_model_name else None
    emb, bow = feats.text_parts(prompts)
    log(f"features: {cfg.features} ({time.perf_counter() - t0:.0f} s)")
    layers = [0] if emb is None else list(range(0, min(feats.num_layers, cfg.max_layers) + 1))

    def design(layer: int, rows: np.ndarray) -> Any:
        return _Features.design(None if emb is None else emb[layer][rows], None if bow is None else bow[rows],
                                [pt[i] for i in rows], [models[i] for i in rows], vocab)

    folds = _folds(train, scheme, cfg)
    log(f"held out for the choice: {cfg.validation} ({len(folds)} fold{'s' if len(folds) > 1 else ''})")
    fold_bm = [_bucket_means(y[f], buckets[f], scheme) for f, _ in folds]
    selection: list[dict[str, Any]] = []
    best: tuple[float, int, str, float, list[np.ndarray]] | None = None
    for layer in layers:
        xs = [(design(layer, f), design(layer, v)) for f, v in folds]
        for head in cfg.heads:
            for param in _grid(head):
                mus, taus = [], []
                for (f, v), (x_fit, x_val), bm in zip(folds, xs, fold_bm):
                    w = _fit_head(head, x_fit, y_log[f], buckets[f], param, scheme.num_buckets)
                    mus.append(_head_mu(head, w, x_val, bm))
                    taus.append(_generator_tau(y[v], mus[-1], [models[i] for i in v]))
                tau = float(np.mean(taus))
                selection.append({"layer": layer, "head": head, "param": param, "val_tau": round(tau, 4)})
                if best is None or tau > best[0]:
                    best = (tau, layer, head, param, mus)
        log(f"layer {layer}: best so far tau {best[0]:.3f} (layer {best[1]}, {best[2]} {best[3]:g})"
            f" ({time.perf_counter() - t0:.0f} s)")
    assert best is not None
    val_tau, layer, head, param, mus = best
    val_idx = np.concatenate([v for _, v in folds])
    mu_val = np.concatenate(mus)
    resid = y_log[val_idx] - mu_val
    offsets = {"p50": float(np.quantile(resid, 0.5)), "p90": float(np.quantile(resid, 0.9)),
               "mean": float(np.log(np.mean(np.exp(resid))))}

    # bucket rule, by held-out accuracy (out-of-fold predictions pooled)
    true_val = buckets[val_idx].tolist()
    rules: dict[tuple[str, float], float] = {}
    for key, off in (("p50", offsets["p50"]), ("mean", offsets["mean"])):
        rules[(key, 0.0)] = accuracy(true_val, [scheme.bucket_of(int(round(t))) for t in
                                                np.maximum(1.0, np.expm1(mu_val + off))])
    for c in LOGREG_CS:
        guessed: list[int] = []
        for f, v in folds:
            bw = _fit_logreg(design(layer, f), buckets[f], c, scheme.num_buckets)
            guessed += _probs(bw, design(layer, v)).argmax(axis=1).tolist()
        rules[("classifier", c)] = accuracy(true_val, guessed)
    (bucket_rule, bucket_c), val_acc = max(rules.items(), key=lambda kv: kv[1])
    log(f"chosen: layer {layer}, {head} {param:g} (held-out tau {val_tau:.3f}); bucket rule {bucket_rule} "
        f"(held-out accuracy {val_acc:.3f})")

    # refit on every training row
    all_idx = np.arange(len(train))
    x_all = design(layer, all_idx)
    bm_all = _bucket_means(y, buckets, scheme)
    weights = {f"head/{k}": v for k, v in
               _fit_head(head, x_all, y_log, buckets, param, scheme.num_buckets).items()}
    if bucket_rule == "classifier":
        weights.update({f"bucket/{k}": v for k, v in
                        _fit_logreg(x_all, buckets, bucket_c, scheme.num_buckets).items()})
    expected = [max(1, round(float(bm_all[b]))) for b in range(scheme.num_buckets)]
    train_dict = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
    config = LengthModelConfig(
        scheme=scheme.to_dict(), tasks=[], bucket_expected_tokens=expected,
        length_baseline=LengthBaseline.fit(pt, buckets.tolist()).to_dict(),
        majority_bucket=majority_bucket(buckets.tolist()),
        train_fingerprints=sorted({prompt_fingerprint(p) for p in prompts}),
        train_seconds=time.perf_counter() - t0, num_train_examples=len(train),
        features=cfg.features, encoder=feats.featurizer.encoder if feats.featurizer else "",
        max_length=cfg.max_length, layer=layer, use_model_name=cfg.use_model_name,
        model_tokens=vocab.tokens if vocab else [], head=head, head_param=param, bucket_rule=bucket_rule,
        bucket_head_param=bucket_c, log_offsets=offsets, bucket_mean_tokens=bm_all.tolist(),
        selection=selection, train=train_dict, kind="bow" if cfg.features == "bow" else "embed")
    return LengthPredictor(config, weights)
