"""``predicted_latency``: llm-d's predicted-latency routing, as a baseline.

Source: ``llm-d/llm-d-router`` at commit ``ebab687927f5331c1b39defcb579a07951bce56c`` (formerly
``llm-d-inference-scheduler``): the ``predicted-latency-producer``
(``pkg/epp/framework/plugins/requestcontrol/dataproducer/predictedlatency/``), the ``latency-scorer``
(``pkg/epp/framework/plugins/scheduling/scorer/latency/``) and the ``slo-headroom-tier-filter``
(``pkg/epp/framework/plugins/scheduling/filter/sloheadroomtier/``); the model is trained by
``llm-d/llm-d-latency-predictor`` (``training/training_server.py`` at ``04e44cd801d5d79a215d99109081b6afb870b87e``).

A model trained online, while serving, predicts each instance's TTFT and time per output token (TPOT) for the
request from that instance's live state:

- features per (request, instance): queued (prefilling) and running (decoding) requests there, its queued
  prompt tokens, its KV usage, the request's expected prefix-cache hit there (the router's prefix view), the
  prompt length, its uncached part, the predicted output length and the instance's decoding context;
- targets: TTFT (dispatch to first token) when the first token arrives, TPOT ((finish - first token) /
  (output - 1)) when the request finishes, each with the features its instance had when it was dispatched.

The choice, as llm-d's scorer makes it:

- without SLOs (``slo_ttft_s`` and ``slo_tpot_s`` unset), the lowest predicted E2E (TTFT + TPOT x predicted
  output tokens), llm-d's default non-streaming mode, which routes on end-to-end latency alone;
- with SLOs, headroom = SLO - prediction per instance. Instances meeting both SLOs form the positive tier; when
  both tiers exist the negative one is taken with probability ``epsilon`` (0.01, ``epsilonExploreNeg``). In
  the positive tier the instance closest to its SLOs wins (strategy ``least``: the lowest blend
  ``0.8 x TTFT headroom + 0.2 x TPOT headroom``, each min-max normalised over the tier; a dimension with no
  spread gets weight 0). In the negative tier an idle instance goes first, then the least severe deficit
  bucket (only TPOT missed, only TTFT, both), then the blend closest to the SLOs.
- Without SLOs llm-d has no exploration; here ``epsilon`` also sends that share of requests to a random
  instance, so that a model that never sees an instance does not ignore it for good.

Model: ridge regression (numpy least squares on standardised features) over a sliding window of the last
``window`` samples (2,000), first fit after ``min_samples`` (10, llm-d's ``LATENCY_MIN_SAMPLES_FOR_RETRAIN_FRESH``)
completions, refit as the completions double (20, 40, 80) and then every ``refit_every`` (100, its deployment's
``LATENCY_MIN_SAMPLES_FOR_RETRAIN``). Coefficients are sign-constrained (``SIGNS``). Refits
run in ``on_event`` when a completion arrives, never in ``route``; a prediction is a dot product (a few µs).
llm-d trains XGBoost by default (a p90 quantile objective, stratified windows of 500 samples per bucket of
queue x KV x prefix) behind a sidecar, and ships Bayesian ridge for in-process predictions from cached
coefficients; XGBoost is not an lbbench dependency and a boosted-tree call costs more than the decision budget,
so this router fits the linear form llm-d predicts in process, on the mean. ``model = "bayesian_ridge"`` fits
scikit-learn's ``BayesianRidge`` instead (the ``learn`` extra); ``log_space = true`` fits log latency on
log1p features (a multiplicative model; on paper-mix it routed worse).

Cold start: until its first fit it routes as ``least_requests`` and ``run_notes()`` says for how many
requests. ``run_notes()`` also reports the mean absolute percentage error (MAPE) of the predictions it routed
on, for TTFT and TPOT, over the run.
"""

from __future__ import annotations

import importlib.util
import math
from math import exp, log1p
from collections import deque
from typing import Any, Sequence

import numpy as np

from ..core import ClusterView, Decision, Event, Failed, Finished, FirstToken, InstanceView, Request
from ..errors import InputError
from ..profiles import Profile
from .heuristics import _Base
from .prefix_tree import PrefixTrees, lru_bound
from .registry import register

LLMD_SOURCE = ("llm-d/llm-d-router pkg/epp/framework/plugins/requestcontrol/dataproducer/predictedlatency + "
               "scorer/latency @ ebab687927f5331c1b39defcb579a07951bce56c")

FEATURES = ("queued_requests", "running_requests", "queued_prompt_tokens", "kv_usage", "prefix_hit",
            "prompt_tokens", "uncached_prompt_tokens", "predicted_output_tokens", "decode_context_tokens")
#: the sign a coefficient may take: load and size only slow a request down (+1), a cache hit only speeds it up
#: (-1). A linear model fit on what the router itself chose otherwise learns spurious negative load terms and
#: herds requests onto the busiest instance, and the short-output tail pulls long outputs' TPOT below zero.
SIGNS = np.array([1, 1, 1, 1, -1, 1, 1, 1, 1])
#: llm-d's latency-scorer blend of normalised TTFT and TPOT headroom
TTFT_WEIGHT, TPOT_WEIGHT = 0.8, 0.2
MODELS = ("ridge", "bayesian_ridge")


class OnlineLinear:
    """A linear model over a sliding window, refit on demand; predictions are one dot product."""

    def __init__(self, window: int, alpha: float, model: str, log_space: bool = False):
        self.x: deque[tuple[float, ...]] = deque(maxlen=window)
        self.y: deque[float] = deque(maxlen=window)
        self.alpha = alpha
        self.model = model
        self.log_space = log_space
        self.coef: list[float] | None = None
        self.intercept = 0.0

    def add(self, x: tuple[float, ...], y: float) -> None:
        self.x.append(x)
        self.y.append(y)

    def fit(self) -> None:
        if len(self.y) < 2:
            return
        x = np.asarray(self.x, dtype=float)
        y = np.asarray(self.y, dtype=float)
        if self.log_space:
            x, y = np.log1p(x), np.log(y)
        mu, sd = x.mean(axis=0), x.std(axis=0)
        sd[sd == 0] = 1.0
        z = (x - mu) / sd
        ym = y.mean()
        if self.model == "bayesian_ridge":
            # lazy: scikit-learn is the optional learn extra (checked at construction)
            from sklearn.linear_model import BayesianRidge
            w = BayesianRidge().fit(z, y - ym).coef_
        else:
            w = np.zeros(z.shape[1])
            keep = np.ones(z.shape[1], dtype=bool)
            while keep.any():  # ridge on the features kept; drop those whose sign contradicts SIGNS, refit
                zk = z[:, keep]
                w[:] = 0.0
                w[keep] = np.linalg.solve(zk.T @ zk + self.alpha * np.eye(zk.shape[1]), zk.T @ (y - ym))
                wrong = SIGNS * w < 0
                if not wrong.any():
                    break
                keep &= ~wrong
        raw = w / sd
        self.coef = [float(c) for c in raw]
        self.intercept = float(ym - raw @ mu)

    def predict(self, x: Sequence[float]) -> float:
        c = self.coef
        assert c is not None
        s = self.intercept
        if self.log_space:
            for a, b in zip(c, x):
                s += a * log1p(b)
            return exp(s)
        for a, b in zip(c, x):
            s += a * b
        return s


#: the prediction error the issue's target reads: predictions made after this many completions trained the model
WARM_COMPLETIONS = 500


def _mape(errors: list[float]) -> float | None:
    return 100.0 * sum(errors) / len(errors) if errors else None


@register("predicted_latency", "llm-d's predicted-latency routing: online-trained TTFT/TPOT model per instance, "
                               "lowest predicted E2E or best fit within SLO headroom, epsilon exploration; "
                               "least_requests until its first fit (" + LLMD_SOURCE + ")")
class PredictedLatency(_Base):
    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None,
                 slo_ttft_s: float | None = None, slo_tpot_s: float | None = None, epsilon: float = 0.01,
                 window: int = 2000, min_samples: int = 10, refit_every: int = 100, ridge_alpha: float = 1.0,
                 model: str = "ridge", log_space: bool = False, lru_tokens: int | None = None, **kw: Any):
        super().__init__(num_instances, seed, profile, **kw)
        for name, v in (("slo_ttft_s", slo_ttft_s), ("slo_tpot_s", slo_tpot_s)):
            if v is not None and not (math.isfinite(v) and v > 0):
                raise InputError(f"predicted_latency: {name} must be > 0, got {v}")
        if not 0 <= epsilon <= 1:
            raise InputError(f"predicted_latency: epsilon must be in [0, 1], got {epsilon}")
        if int(min_samples) < 2:
            raise InputError(f"predicted_latency: min_samples must be >= 2, got {min_samples}")
        if int(window) < int(min_samples):
            raise InputError(f"predicted_latency: window must be >= min_samples ({min_samples}), got {window}")
        if int(refit_every) < 1:
            raise InputError(f"predicted_latency: refit_every must be >= 1, got {refit_every}")
        if not (math.isfinite(ridge_alpha) and ridge_alpha >= 0):
            raise InputError(f"predicted_latency: ridge_alpha must be >= 0, got {ridge_alpha}")
        if model not in MODELS:
            raise InputError(f"predicted_latency: model must be one of {', '.join(MODELS)}, got {model!r}")
        if model == "bayesian_ridge" and importlib.util.find_spec("sklearn") is None:
            raise InputError("predicted_latency: model bayesian_ridge needs scikit-learn; install the learn extra "
                             "(pip install 'lbbench[learn]')")
        self.slo_ttft_s = None if slo_ttft_s is None else float(slo_ttft_s)
        self.slo_tpot_s = None if slo_tpot_s is None else float(slo_tpot_s)
        self.epsilon = float(epsilon)
        self.min_samples = int(min_samples)
        self.refit_every = int(refit_every)
        self.ttft_model = OnlineLinear(int(window), float(ridge_alpha), model, bool(log_space))
        self.tpot_model = OnlineLinear(int(window), float(ridge_alpha), model, bool(log_space))
        self.trees = PrefixTrees(num_instances, lru_bound(lru_tokens, profile))
        self._rng = np.random.default_rng(seed)
        # request id -> (features at dispatch, dispatch time, predicted TTFT, predicted TPOT, first token time)
        self._open: dict[int, list[Any]] = {}
        self.completions = 0
        self._since_fit = 0
        self.num_fits = 0
        self.cold_decisions = 0
        self.decisions = 0
        self.first_fit_completions: int | None = None
        self.ttft_ape: list[float] = []
        self.tpot_ape: list[float] = []
        # the same, for predictions made once the model had learned from WARM_COMPLETIONS completions
        self.ttft_ape_warm: list[float] = []
        self.tpot_ape_warm: list[float] = []

    @property
    def fitted(self) -> bool:
        return self.ttft_model.coef is not None and self.tpot_model.coef is not None

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self._rng = np.random.default_rng(self.seed if seed is None else seed)

    # ------------------------------------------------------------------ features and predictions
    def features(self, request: Request, iv: InstanceView) -> tuple[float, ...]:
        hit = min(self.trees.match_tokens(iv.index, request), request.prompt_tokens)
        m = iv.metrics
        kv = m.kv_usage if m is not None else (
            (iv.context_tokens + iv.prompt_tokens_pending) / max(1, iv.spec.kv_capacity_tokens))
        p = request.prompt_tokens
        return (float(iv.num_prefilling), float(iv.num_decoding), float(iv.prompt_tokens_pending), float(kv),
                hit / max(1, p), float(p), float(p - hit), float(request.expected_output_tokens),
                float(iv.context_tokens))

    def predict(self, x: Sequence[float]) -> tuple[float, float]:
        """Predicted (TTFT s, TPOT s) for one feature row (the model must be fitted)."""
        return max(1e-4, self.ttft_model.predict(x)), max(1e-5, self.tpot_model.predict(x))

    # ------------------------------------------------------------------ choice
    def _choose(self, request: Request, healthy: list[InstanceView],
                preds: dict[int, tuple[float, float]]) -> int:
        out = max(1, request.expected_output_tokens)
        if self.slo_ttft_s is None and self.slo_tpot_s is None:
            if self.epsilon > 0 and self._rng.random() < self.epsilon:
                return healthy[int(self._rng.integers(len(healthy)))].index
            e2e = {i: t + p * out for i, (t, p) in preds.items()}
            best = min(e2e.values())
            return self._rotate([i for i, v in e2e.items() if v == best])
        ttft_slo = self.slo_ttft_s if self.slo_ttft_s is not None else math.inf
        tpot_slo = self.slo_tpot_s if self.slo_tpot_s is not None else math.inf
        head = {i: (ttft_slo - t, tpot_slo - p) for i, (t, p) in preds.items()}
        pos = [i for i, (a, b) in head.items() if a >= 0 and b >= 0]
        neg = [i for i in head if i not in pos]
        use_pos = bool(pos) and not (neg and self.epsilon > 0 and self._rng.random() < self.epsilon)
        if use_pos:
            return self._blend_pick(pos, head)
        idle = [iv.index for iv in healthy if iv.index in neg and iv.num_outstanding == 0]
        if idle:
            return self._blend_pick(idle, head)
        for bucket in ([i for i in neg if head[i][0] >= 0], [i for i in neg if head[i][1] >= 0], neg):
            if bucket:
                return self._blend_pick(bucket, head)
        raise AssertionError("no candidate")  # neg is non-empty here

    def _blend_pick(self, cands: list[int], head: dict[int, tuple[float, float]]) -> int:
        """The candidate whose blended, min-max normalised headroom is closest to the SLOs (smallest when all
        are positive, least negative when all are negative)."""
        if len(cands) == 1:
            return cands[0]
        wt, wp = TTFT_WEIGHT, TPOT_WEIGHT
        cols = []
        for d in (0, 1):
            vals = [head[i][d] for i in cands if math.isfinite(head[i][d])]
            lo, hi = (min(vals), max(vals)) if len(vals) == len(cands) else (0.0, 0.0)
            cols.append((lo, hi))
        if cols[0][1] == cols[0][0]:
            wt, wp = 0.0, 1.0
        if cols[1][1] == cols[1][0]:
            wt, wp = (1.0, 0.0) if wt > 0 else (0.0, 0.0)

        def norm(i: int, d: int) -> float:
            lo, hi = cols[d]
            return 0.0 if hi == lo else (head[i][d] - lo) / (hi - lo)

        score = {i: wt * norm(i, 0) + wp * norm(i, 1) for i in cands}
        neg = all(head[i][0] < 0 or head[i][1] < 0 for i in cands)
        best = max(score.values()) if neg else min(score.values())  # closest to the SLO boundary
        return self._rotate([i for i in cands if score[i] == best])

    def _rotate(self, tied: list[int]) -> int:
        n = self.num_instances
        pick = min(tied, key=lambda i: (i - self._last - 1) % n)
        self._last = pick
        return pick

    def scores(self, request: Request, view: ClusterView) -> list[float]:
        """Per instance (inf: unhealthy): the predicted E2E, TTFT + TPOT x expected output (before the models are
        fitted: the outstanding requests ``route`` then minimises). With SLOs ``route`` picks by headroom
        instead, which these predictions feed."""
        out = max(1, request.expected_output_tokens)
        vals = []
        for iv in view.instances:
            if not iv.healthy:
                vals.append(math.inf)
            elif not self.fitted:
                vals.append(float(iv.num_outstanding))
            else:
                t, p = self.predict(self.features(request, iv))
                vals.append(t + p * out)
        return vals

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        r = queue[0]
        healthy = [iv for iv in view.instances if iv.healthy]
        if not healthy:
            return None
        self.decisions += 1
        if not self.fitted:  # least_requests; only the chosen instance's features are kept, for training
            self.cold_decisions += 1
            inst = self._argmin(view, lambda iv: iv.num_outstanding)
            assert inst is not None
            x = self.features(r, view.instances[inst])
            pred: tuple[float, float] | tuple[None, None] = (None, None)
        else:
            feats = {iv.index: self.features(r, iv) for iv in healthy}
            preds = {i: self.predict(x) for i, x in feats.items()}
            inst = self._choose(r, healthy, preds)
            x, pred = feats[inst], preds[inst]
        self._open[r.request_id] = [x, now_s, pred[0], pred[1], None, self.completions]
        self.trees.insert(inst, r)
        return Decision(0, inst)

    # ------------------------------------------------------------------ online training (off the decision path)
    @staticmethod
    def _error(predicted: float | None, actual: float, completions_then: int, run: list[float],
               warm: list[float]) -> None:
        """Log the absolute percentage error of a prediction (and among the warm ones, when it was made after
        ``WARM_COMPLETIONS`` completions); a cold-start decision had no prediction."""
        if predicted is not None:
            run.append(abs(predicted - actual) / actual)
            if completions_then >= WARM_COMPLETIONS:
                warm.append(run[-1])

    def on_event(self, ev: Event) -> None:
        if isinstance(ev, FirstToken):
            rec = self._open.get(ev.request_id)
            if rec is None or rec[4] is not None:
                return
            rec[4] = ev.time_s
            ttft = ev.time_s - rec[1]
            if ttft > 0:
                self.ttft_model.add(rec[0], ttft)
                self._error(rec[2], ttft, rec[5], self.ttft_ape, self.ttft_ape_warm)
        elif isinstance(ev, Finished):
            rec = self._open.pop(ev.request_id, None)
            if rec is None:
                return
            if rec[4] is not None and ev.output_tokens > 1:
                tpot = (ev.time_s - rec[4]) / (ev.output_tokens - 1)
                if tpot > 0:
                    self.tpot_model.add(rec[0], tpot)
                    self._error(rec[3], tpot, rec[5], self.tpot_ape, self.tpot_ape_warm)
            self.completions += 1
            self._since_fit += 1
            # the first fit after min_samples completions, then as the window doubles, then every refit_every
            need = self.min_samples if not self.fitted else min(self.refit_every, self.completions - self._since_fit)
            if self._since_fit >= need and len(self.tpot_model.y) >= 2 and len(self.ttft_model.y) >= 2:
                self.refit()
        elif isinstance(ev, Failed):
            self._open.pop(ev.request_id, None)

    def refit(self) -> None:
        """Fit both models on their windows (called on completions; ``route`` never fits)."""
        self.ttft_model.fit()
        self.tpot_model.fit()
        self._since_fit = 0
        self.num_fits += 1
        if self.first_fit_completions is None:
            self.first_fit_completions = self.completions

    # ------------------------------------------------------------------ reporting
    def prediction_error(self) -> dict[str, float | int | None]:
        """MAPE (%) of the TTFT and TPOT predictions the router chose on, over the run so far."""
        return {"ttft_mape_pct": _mape(self.ttft_ape), "tpot_mape_pct": _mape(self.tpot_ape),
                "ttft_samples": len(self.ttft_ape), "tpot_samples": len(self.tpot_ape),
                "warm_ttft_mape_pct": _mape(self.ttft_ape_warm), "warm_tpot_mape_pct": _mape(self.tpot_ape_warm),
                "warm_samples": len(self.ttft_ape_warm)}

    def run_notes(self) -> list[str]:
        """What a run should say about this router: its cold start and its prediction error."""
        if self.first_fit_completions is None:
            cold = (f"predicted_latency: never fit (fewer than {self.min_samples} completions); it routed all "
                    f"{self.decisions} requests as least_requests")
        else:
            cold = (f"predicted_latency: routed its first {self.cold_decisions} of {self.decisions} requests as "
                    f"least_requests (cold start, first fit after {self.first_fit_completions} completions; "
                    f"{self.num_fits} fits)")
        e = self.prediction_error()
        if not e["ttft_samples"] and not e["tpot_samples"]:
            return [cold]

        def fmt(v: Any) -> str:
            return "n/a" if v is None else f"{v:.1f} %"
        warm = (f"; after {WARM_COMPLETIONS} completions: TTFT MAPE {fmt(e['warm_ttft_mape_pct'])}, TPOT MAPE "
                f"{fmt(e['warm_tpot_mape_pct'])} ({e['warm_samples']} requests)" if e["warm_samples"] else "")
        return [cold, f"predicted_latency: prediction error over the run: TTFT MAPE {fmt(e['ttft_mape_pct'])} "
                      f"({e['ttft_samples']} requests), TPOT MAPE {fmt(e['tpot_mape_pct'])} "
                      f"({e['tpot_samples']} requests){warm}"]
