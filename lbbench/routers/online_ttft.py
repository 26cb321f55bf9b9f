"""``online_ttft``: lbbench's learned router for prefix-heavy traffic, an online TTFT model trained from the run.

It is ``cache_length_aware`` (the same expected cache hit from its own prefix trees, the same uncached prefill
queued per instance, KV-headroom and free-slot filters, decode terms) with one part learned: the time to first
token of the request on each instance. ``cache_length_aware`` reads it off the profile's step model
(``prefill_token_s x (queued + own uncached tokens) + base_s``), which is a vLLM V0 picture: on a V1 engine with
chunked prefill the prefill shares each step's token budget with the decodes there, so its speed depends on the
decode batch. ``online_ttft`` predicts it with a linear model over the features below, and refits the model after
every first token it sees (recursive least squares with a forgetting factor), as Lodestar (arXiv 2606.00946) learns
over cluster snapshots during serving. A model, not a network: seven weights, no checkpoint. It is not gated: the
model decides every request from the first one; before any first token it is the analytic estimate (the prior).

**Features** of a (request, instance) pair, all from what a client sees (no true lengths; output lengths only
through ``cache_length_aware``'s decode terms, from the run's predictor):

=========  =====================================================================================================
``bias``   1
``own``    the request's uncached prompt tokens there / 1000
``queued`` uncached prompt tokens sent there without a first token yet / 1000
``own_x``  ``own`` x ``decoding``
``que_x``  ``queued`` x ``decoding``
``dec``    ``decoding``: requests decoding there / 32
``slot``   the analytic wait for a free sequence slot (seconds; 0 when one is free)
=========  =====================================================================================================

**Target**: dispatch to first token (seconds), squared error (mean TTFT is what it serves). **Prior**: the analytic
estimate's weights (``base_s``; ``1000 x prefill_token_s`` on ``own`` and ``queued``; 1 on ``slot``; 0 elsewhere)
with covariance ``prior_var`` x I. **Update**: RLS, ``forget`` (0.999 by default: about the last 1,000 first tokens
weigh). A prediction is floored at 0.

Options chosen on tuning data only (seeds 1000-1001 of the agentic and shared-prefix workloads and the first quarter
of the Mooncake trace, 4 x ``llama3.1-8b-a100``, 600 requests; ``docs/routers.md``): ``prior_var`` 0.01 of 0.01, 1,
100 (the sum of the five mean TTFTs 0.941 s against 0.983 and 0.981 s); at prior_var 1: ``forget`` 0.999 of 0.99, 0.999, 1 (0.977,
0.983, 0.982 s: a tie, kept); ``decode_weight`` 0.1 as ``cache_length_aware`` (0 gave 0.963 s, 0.3 1.088 s); then at prior_var 0.01, ``hit_weight``
1.5 of 1, 1.5, 2, 3 (0.884, against 0.941, 0.922 and 0.939 s): a cache hit weighs half again its own prefill saving,
because a prefix computed once more elsewhere costs the requests after it too (on the shared-prefix workload the
loss to ``token_affinity`` was all in the first second, while ``cache_length_aware`` spread each group's first
requests over the instances).

``learning_curve()`` gives the model's mean absolute error, per block of ``curve_every`` first tokens, of the
predictions it acted on (made before the update), beside the analytic prior's error on the same requests;
``run_notes()`` prints it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import Event, Failed, Finished, FirstToken, InstanceView, Request
from ..profiles import Profile
from .cache_length import CacheLengthAware
from .registry import register

FEATURES = ("bias", "own", "queued", "own_x", "que_x", "dec", "slot")
DEC_SCALE = 32.0


class OnlineLinear:
    """Recursive least squares with exponential forgetting: ``w`` minimises sum forget^(n-k) (y_k - w.x_k)^2 plus
    the prior's pull ``(w - w0)^T (prior_var I)^-1 (w - w0)`` (decaying with the same factor)."""

    def __init__(self, w0: np.ndarray, prior_var: float, forget: float):
        if not 0 < forget <= 1:
            raise ValueError(f"online_ttft: forget must be in (0, 1], got {forget}")
        if not prior_var > 0:
            raise ValueError(f"online_ttft: prior_var must be > 0, got {prior_var}")
        self.w = np.array(w0, dtype=float)
        self.P = np.eye(len(w0)) * prior_var
        self.forget = forget
        self.num_updates = 0

    def predict(self, x: np.ndarray) -> float:
        return float(self.w @ x)

    def update(self, x: np.ndarray, y: float) -> None:
        px = self.P @ x
        k = px / (self.forget + x @ px)
        self.w = self.w + k * (y - self.w @ x)
        self.P = (self.P - np.outer(k, px)) / self.forget
        self.num_updates += 1


@register("online_ttft", "lbbench (learned online): cache_length_aware with its TTFT estimate replaced by a linear "
                         "model refit (RLS) after every first token of the run; no oracle, no checkpoint")
class OnlineTTFT(CacheLengthAware):
    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None,
                 forget: float = 0.999, prior_var: float = 0.01, curve_every: int = 100, hit_weight: float = 1.5,
                 **kw: Any):
        super().__init__(num_instances, seed, profile, hit_weight=hit_weight, **kw)
        p = self.prof
        self.w0 = np.array([p.base_s, 1000 * p.prefill_token_s, 1000 * p.prefill_token_s, 0.0, 0.0, 0.0, 1.0])
        self.model = OnlineLinear(self.w0, float(prior_var), float(forget))
        self.curve_every = int(curve_every)
        self._cand: dict[int, np.ndarray] = {}                      # instance -> features, this decision
        self._sent: dict[int, tuple[np.ndarray, float, float]] = {}  # request id -> (x, predicted, dispatched at)
        self._err: list[tuple[float, float]] = []                   # (|model error|, |prior error|) per first token

    @staticmethod
    def features(iv: InstanceView, uncached_tokens: int, pending_tokens: int, slot_wait_s: float) -> np.ndarray:
        own, queued, dec = uncached_tokens / 1000.0, pending_tokens / 1000.0, iv.num_decoding / DEC_SCALE
        return np.array([1.0, own, queued, own * dec, queued * dec, dec, slot_wait_s])

    def ttft_estimate(self, iv: InstanceView, uncached_tokens: int, pending_tokens: int, slot_wait_s: float) -> float:
        x = self.features(iv, uncached_tokens, pending_tokens, slot_wait_s)
        self._cand[iv.index] = x
        return max(0.0, self.model.predict(x))

    def dispatched(self, request: Request, instance: int, now_s: float) -> None:
        x = self._cand.get(instance)  # None: placed by another's decision (a planner's copy), nothing predicted
        if x is not None:
            self._sent[request.request_id] = (x, max(0.0, self.model.predict(x)), now_s)
        self._cand = {}

    def on_event(self, ev: Event) -> None:
        super().on_event(ev)
        if isinstance(ev, FirstToken):
            sent = self._sent.pop(ev.request_id, None)
            if sent is not None:
                x, predicted, at_s = sent
                y = ev.time_s - at_s
                self._err.append((abs(predicted - y), abs(max(0.0, float(self.w0 @ x)) - y)))
                self.model.update(x, y)
        elif isinstance(ev, (Finished, Failed)):
            self._sent.pop(ev.request_id, None)

    def learning_curve(self) -> list[dict[str, float]]:
        """Per block of ``curve_every`` first tokens: the model's and the prior's mean absolute TTFT error (s)."""
        out = []
        for k in range(0, len(self._err), self.curve_every):
            block = self._err[k:k + self.curve_every]
            out.append({"first_tokens": k + len(block),
                         "model_mae_s": float(np.mean([e[0] for e in block])),
                         "prior_mae_s": float(np.mean([e[1] for e in block]))})
        return out

    def run_notes(self) -> list[str]:
        curve = self.learning_curve()
        if not curve:
            return ["online_ttft: no first token seen; it routed with its prior (cache_length_aware's estimate)"]
        pts = ", ".join(f"{c['first_tokens']}: {1000 * c['model_mae_s']:.0f}/{1000 * c['prior_mae_s']:.0f}"
                        for c in curve)
        w = ", ".join(f"{n} {v:.4g}" for n, v in zip(FEATURES, self.model.w))
        return [f"online_ttft: {self.model.num_updates} updates; TTFT MAE model/prior (ms) per "
                f"{self.curve_every} first tokens: {pts}", f"online_ttft: final weights: {w}"]
