"""``predicted_latency``: llm-d's predicted-latency routing, as llm-d runs it.

Source: ``llm-d/llm-d-router`` at commit ``ebab687927f5331c1b39defcb579a07951bce56c`` (formerly
``llm-d-inference-scheduler``; Apache-2.0): the ``predicted-latency-producer``
(``pkg/epp/framework/plugins/requestcontrol/dataproducer/predictedlatency/``: ``prediction.go``, ``training.go``,
``requestcontrol_hooks.go``), its in-flight load (``dataproducer/inflightload/producer.go``), its prefix score
(``dataproducer/approximateprefix``, as ``token_affinity`` reads it) and the scheduling profile after it
(``lbbench.routers.llmd_picker``); the model is ``llm-d/llm-d-latency-predictor``'s
(``training/training_server.py`` at ``04e44cd801d5d79a215d99109081b6afb870b87e``; ``lbbench.routers.latency_model``).

**Features** of a (request, instance) pair, llm-d's TTFT features in its order, then lbbench's two:

=========================  ==========================================================================================
``is_queued``              a request waits there (1/0)
``kv_cache_percentage``    KV usage (``/metrics`` live; in the simulator, the client's count of the tokens there)
``input_token_length``     the prompt's tokens
``num_request_waiting``    waiting requests (``/metrics`` live; else the requests there without a first token)
``num_request_running``    requests in flight there (llm-d overrides the engine's count with the EPP's own)
``prefill_tokens_in_flight`` uncached prompt tokens of the requests sent there without a first token yet (the
                           in-flight load producer's, released at the first token)
``prefix_cache_score``     llm-d's prefix score there (64-token blocks)
``effective_input_tokens`` (1 - prefix score) x prompt tokens
``prefill_score_bucket``   the score's quarter (0-3)
``prefill_tokens_ahead``   the same tokens ahead of the request in the engine's order: all of them first come,
                           first served; on vLLM's ``priority`` scheduler only those of requests the engine serves
                           first (priority no larger than this request's) (lbbench's)
``kv_deficit_tokens``      KV tokens the instance would lack with the request's uncached prompt added (lbbench's)
``since_last_step_s``      time since the instance's last engine step ended, as the router's streams show it
``step_period_s``          the instance's recent step time, from the same streams
``to_next_step_s``         the wait until its next step starts: period - (since mod period); 0 when idle
=========================  ==========================================================================================

The last three are lbbench's (``phase_features``, on by default): a request waits for the step in progress to end
before its prefill starts, up to a whole step, which is a large share of a short TTFT on a V1 engine with chunked
prefill. A gateway sees it in the token streams it proxies (the simulator's ``StepsAdvanced`` events, live
``TokensGenerated``); llm-d's features do not carry it. On 4 x H100 (derived V1 profile), 60 % of a run to train
and 40 % to test, they cut the TTFT MAPE from 17.4 % to 12.0 % (agentic, 60 req/s), 23.4 % to 14.5 % (agentic,
160 req/s) and 9.0 % to 7.5 % (4,000-token Poisson prompts at 20 req/s).

llm-d's ``decode_tokens_in_flight`` is always 0 at dispatch (its ``addEstimatedOutputTokens`` is off) and is left
out; the TPOT model reads the same row (llm-d's TPOT features are a subset, plus a generated-token count it zeroes).

**Targets.** ``streaming`` (lbbench's default: its clients stream): TTFT (dispatch to first token) and TPOT ((finish
- first token) / (output - 1)), as llm-d's ``streamingMode: true``. ``streaming=False`` is llm-d's default: it
records "TTFT" at the end of the response, the end-to-end latency, trains that one model, and neutralises TPOT.

**Model**: boosted trees on stratified buckets with queued / unqueued sub-models, relative loss by default
(``latency_model``); first fit after ``min_samples`` (100) samples of each target, then a refit after every
``refit_every`` (200) completions, in ``on_event``, never in ``route`` (llm-d's training server refits every 10 s;
200 completions is 10 s at 20 requests/s). A prediction walks the flattened trees (``tree_ensemble``), tens of µs.

**Choice**: the predictions go through llm-d's profile (``llmd_picker``): strict affinity (0.99), the SLO tier
filter (``epsilon``, 0.01), loose affinity (0.80), the latency scorer (TTFT 0.8 / TPOT 0.2, strategy ``least``) and
a weighted-random pick, seeded. Without SLOs (``slo_ttft_s``, ``slo_tpot_s`` unset) every headroom is negative and
the scorer favours the lowest predictions.

**Cold start**: until its first fit it routes as ``least_requests`` (llm-d's scorer falls back to a KV / queue /
prefix composite when it has no predictions) and ``run_notes()`` says for how many requests. ``run_notes()`` also
reports the mean absolute percentage error (MAPE) of the predictions it acted on, over the run and once warm
(after 500 completions).
"""

from __future__ import annotations

import importlib.util
import math
import random
from typing import Any, Sequence

import numpy as np

from ..core import (ClusterView, Decision, Event, Failed, Finished, FirstToken, InstanceView, Request, StepsAdvanced,
                    TokensGenerated)
from ..errors import InputError
from ..priority import request_priority
from ..profiles import Profile
from . import llmd_picker as pick
from .heuristics import _Base
from .latency_model import LOSSES, LatencyModel, bucket_key, mape
from .registry import register
from .token_affinity import LLMD_BLOCK_TOKENS, llmd_prefix_score, llmd_prefix_trees

LLMD_SOURCE = ("llm-d/llm-d-router pkg/epp/framework/plugins/requestcontrol/dataproducer/predictedlatency + "
               "scorer/latency + picker/weightedrandom @ ebab687927f5331c1b39defcb579a07951bce56c; "
               "llm-d/llm-d-latency-predictor training/training_server.py @ 04e44cd8")

FEATURES = ("is_queued", "kv_cache_percentage", "input_token_length", "num_request_waiting", "num_request_running",
            "prefill_tokens_in_flight", "prefix_cache_score", "effective_input_tokens", "prefill_score_bucket",
            "prefill_tokens_ahead", "kv_deficit_tokens", "since_last_step_s", "step_period_s", "to_next_step_s")
#: llm-d's own features (the first nine), then lbbench's
NUM_LLMD_FEATURES = 9
ENGINE_ORDERS = ("fcfs", "priority")
#: the prediction error the issue's target reads: predictions made after this many completions trained the model
WARM_COMPLETIONS = 500


class InFlightPrefill:
    """Per instance, the uncached prompt tokens of the requests sent there that the engine has not finished
    prefilling (llm-d's in-flight load producer: released at the first token when streaming, at the end otherwise),
    with each request's engine priority."""

    def __init__(self, num_instances: int):
        self.pending: list[dict[int, tuple[int, int]]] = [{} for _ in range(num_instances)]

    def add(self, request_id: int, instance: int, priority: int, tokens: int) -> None:
        self.pending[instance][request_id] = (priority, tokens)

    def release(self, request_id: int, instance: int) -> None:
        self.pending[instance].pop(request_id, None)

    def ahead(self, instance: int, priority: int | None) -> int:
        """Tokens served before a request of ``priority`` (None: first come, first served: all of them)."""
        p = self.pending[instance]
        if priority is None:
            return sum(t for _, t in p.values())
        return sum(t for q, t in p.values() if q <= priority)


class StepPhase:
    """Per instance, when its engine last ended a step and how long its steps take, from the events a gateway's
    streams give it: the simulator's ``StepsAdvanced`` (k steps ended at t), live ``TokensGenerated`` (a request
    had n tokens at t), and first tokens and ends (a step ended at t)."""

    def __init__(self, num_instances: int):
        self.last_s = [-math.inf] * num_instances
        self.period_s = [0.0] * num_instances
        self._steps_at = [-math.inf] * num_instances  # the last StepsAdvanced's end, per instance
        self._tokens: dict[int, tuple[float, int]] = {}  # request -> (time, tokens generated), live

    def observe(self, ev: Event) -> None:
        i = getattr(ev, "instance", None)
        if i is None or i >= len(self.last_s):
            return
        t = ev.time_s
        if isinstance(ev, StepsAdvanced):
            if ev.num_steps > 0 and t > self._steps_at[i] > -math.inf:
                self.period_s[i] = (t - self._steps_at[i]) / ev.num_steps
            self._steps_at[i] = t
        elif isinstance(ev, TokensGenerated):
            prev = self._tokens.get(ev.request_id)
            if prev is not None and ev.generated_tokens > prev[1] and t > prev[0]:
                self.period_s[i] = (t - prev[0]) / (ev.generated_tokens - prev[1])
            self._tokens[ev.request_id] = (t, ev.generated_tokens)
        elif isinstance(ev, (Finished, Failed)):
            self._tokens.pop(ev.request_id, None)
        elif not isinstance(ev, FirstToken):
            return
        if t > self.last_s[i]:
            self.last_s[i] = t

    def features(self, instance: int, now_s: float, busy: bool) -> tuple[float, float, float]:
        """(since the last step ended, step period, wait for the next step); zeros on an idle instance (a request
        starts at once) or before anything was seen."""
        period = self.period_s[instance]
        if not busy or self.last_s[instance] == -math.inf:
            return 0.0, period, 0.0
        since = max(0.0, now_s - self.last_s[instance])
        return since, period, (period - since % period) if period > 0 else 0.0


@register("predicted_latency", "llm-d's predicted-latency routing: online boosted-tree TTFT/TPOT model (stratified "
                               "buckets, queued/unqueued sub-models), affinity filters, SLO tiers, latency scorer, "
                               "weighted-random pick; least_requests until its first fit (" + LLMD_SOURCE + ")")
class PredictedLatency(_Base):
    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None,
                 slo_ttft_s: float | None = None, slo_tpot_s: float | None = None, epsilon: float = 0.01,
                 streaming: bool = True, loss: str = "relative", min_samples: int = 100, min_split: int = 200,
                 bucket_size: int = 500, refit_every: int = 200, engine_order: str | None = None,
                 instance_scheduler: str | None = None, strict_affinity: float = pick.STRICT_AFFINITY,
                 loose_affinity: float = pick.LOOSE_AFFINITY, affinity_penalty_s: float = pick.AFFINITY_PENALTY_S,
                 block_tokens: int = LLMD_BLOCK_TOKENS, lru_blocks: int | None = None, phase_features: bool = True,
                 **kw: Any):
        super().__init__(num_instances, seed, profile, **kw)
        for name, v in (("slo_ttft_s", slo_ttft_s), ("slo_tpot_s", slo_tpot_s)):
            if v is not None and not (math.isfinite(v) and v > 0):
                raise InputError(f"predicted_latency: {name} must be > 0, got {v}")
        for name, v in (("epsilon", epsilon), ("strict_affinity", strict_affinity),
                        ("loose_affinity", loose_affinity)):
            if not 0 <= v <= 1:
                raise InputError(f"predicted_latency: {name} must be in [0, 1], got {v}")
        if not (math.isfinite(affinity_penalty_s) and affinity_penalty_s >= 0):
            raise InputError(f"predicted_latency: affinity_penalty_s must be >= 0, got {affinity_penalty_s}")
        if loss not in LOSSES:
            raise InputError(f"predicted_latency: loss must be one of {', '.join(LOSSES)}, got {loss!r}")
        for name, v, low in (("min_samples", min_samples, 2), ("min_split", min_split, 2),
                             ("bucket_size", bucket_size, 1), ("refit_every", refit_every, 1),
                             ("block_tokens", block_tokens, 1)):
            if int(v) < low:
                raise InputError(f"predicted_latency: {name} must be >= {low}, got {v}")
        order = engine_order or ("priority" if instance_scheduler == "priority" else "fcfs")
        if order not in ENGINE_ORDERS:
            raise InputError(f"predicted_latency: engine_order must be one of {', '.join(ENGINE_ORDERS)}, "
                             f"got {order!r}")
        if importlib.util.find_spec("sklearn") is None:
            raise InputError("predicted_latency: its boosted-tree model needs scikit-learn; install the learn extra "
                             "(pip install 'lbbench[learn]')")
        self.slo_ttft_s = None if slo_ttft_s is None else float(slo_ttft_s)
        self.slo_tpot_s = None if slo_tpot_s is None else float(slo_tpot_s)
        self.epsilon = float(epsilon)
        self.streaming = bool(streaming)
        self.engine_order = order
        self.strict_affinity, self.loose_affinity = float(strict_affinity), float(loose_affinity)
        self.affinity_penalty_s = float(affinity_penalty_s)
        self.refit_every = int(refit_every)
        self.model = LatencyModel(("ttft", "tpot") if self.streaming else ("e2e",), loss, int(bucket_size),
                                  int(min_samples), int(min_split))
        self.trees = llmd_prefix_trees(num_instances, profile, int(block_tokens), lru_blocks)
        self.inflight = InFlightPrefill(num_instances)
        self.phase = StepPhase(num_instances) if phase_features else None
        self._now_s = 0.0
        self._rng = random.Random(seed)
        # request id -> [features at dispatch, bucket key, dispatch time, predictions, first token time,
        #                completions when predicted, instance]
        self._open: dict[int, list[Any]] = {}
        self.completions = 0
        self._fit_at = 0
        self.cold_decisions = 0
        self.decisions = 0
        self.first_fit_completions: int | None = None
        #: (predicted, actual) pairs of the predictions the router acted on, per target; and once warm
        self.pairs: dict[str, list[tuple[float, float]]] = {t: [] for t in self.model.targets}
        self.warm_pairs: dict[str, list[tuple[float, float]]] = {t: [] for t in self.model.targets}

    @property
    def fitted(self) -> bool:
        return self.model.fitted

    @property
    def num_fits(self) -> int:
        return self.model.num_fits

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self._rng = random.Random(self.seed if seed is None else seed)

    def _draw(self) -> float:
        return self._rng.random()

    # ------------------------------------------------------------------ features
    def _priority(self, request: Request) -> int | None:
        return request_priority(request, self.profile) if self.engine_order == "priority" else None

    def features(self, request: Request, iv: InstanceView) -> tuple[tuple[float, ...], int]:
        """The feature row of ``request`` on ``iv`` (``FEATURES``) and the uncached prompt tokens it would bring."""
        score, uncached = llmd_prefix_score(self.trees, iv.index, request)
        m = iv.metrics
        cap = max(1, iv.spec.kv_capacity_tokens)
        used = m.kv_usage * cap if m is not None else iv.context_tokens + iv.prompt_tokens_pending
        waiting = m.num_waiting if m is not None else iv.num_prefilling
        p = request.prompt_tokens
        uncached = min(uncached, p)
        in_flight = float(self.inflight.ahead(iv.index, None))
        ahead = in_flight if self.engine_order == "fcfs" else float(self.inflight.ahead(iv.index, self._priority(request)))
        row = (1.0 if waiting > 0 else 0.0, min(1.0, used / cap), float(p), float(waiting), float(iv.num_outstanding),
               in_flight, score, (1.0 - score) * p, float(min(int(score * 4), 3)), ahead,
               float(max(0.0, used + uncached - cap)))
        if self.phase is not None:
            row += self.phase.features(iv.index, self._now_s, iv.num_outstanding > 0)
        return row, uncached

    def predict(self, rows: Sequence[Sequence[float]]) -> np.ndarray:
        """Predicted latencies (seconds) per row: (TTFT, TPOT) when streaming, (E2E,) otherwise."""
        x = np.asarray(rows, dtype=float)
        return self.model.predict(x, x[:, 0] > 0)

    # ------------------------------------------------------------------ choice
    def _headroom(self, preds: np.ndarray) -> tuple[list[float], list[float], list[float]]:
        """Per row: the TTFT the affinity gates read, TTFT headroom, TPOT headroom (llm-d's ``validatePrediction``;
        non-streaming: E2E against the TTFT SLO, TPOT neutralised to 0)."""
        ttft = [float(v) for v in preds[:, 0]]
        slo_t = self.slo_ttft_s or 0.0
        if not self.streaming:
            return ttft, [slo_t - t for t in ttft], [0.0] * len(ttft)
        slo_p = self.slo_tpot_s or 0.0
        return ttft, [slo_t - t for t in ttft], [slo_p - float(v) for v in preds[:, 1]]

    def choose(self, healthy: list[InstanceView], prefix: list[float], preds: np.ndarray) -> int:
        """llm-d's profile on the predictions of ``healthy`` (rows in its order); returns an instance index."""
        ttft, head_t, head_p = self._headroom(preds)
        cands = list(range(len(healthy)))
        cands = pick.affinity_filter(cands, prefix, ttft, self.strict_affinity, self.affinity_penalty_s)
        cands = pick.tier_filter(cands, head_t, head_p, self.epsilon, self._draw)
        cands = pick.affinity_filter(cands, prefix, ttft, self.loose_affinity, self.affinity_penalty_s)
        scores = pick.latency_scores(cands, head_t, head_p, [iv.num_outstanding for iv in healthy])
        return healthy[pick.weighted_pick(scores, self._draw)].index

    def scores(self, request: Request, view: ClusterView) -> list[float]:
        """Per instance (inf: unhealthy): the predicted latency the scorer ranks by without SLOs (TTFT + TPOT x
        expected output when streaming, else E2E); before the first fit the outstanding requests ``route``
        minimises."""
        vals = [math.inf] * len(view.instances)
        healthy = [iv for iv in view.instances if iv.healthy]
        if not healthy:
            return vals
        if not self.fitted:
            for iv in healthy:
                vals[iv.index] = float(iv.num_outstanding)
            return vals
        self._now_s = view.now_s
        preds = self.predict([self.features(request, iv)[0] for iv in healthy])
        out = max(1, request.expected_output_tokens)
        for iv, p in zip(healthy, preds):
            vals[iv.index] = float(p[0] + p[1] * out) if self.streaming else float(p[0])
        return vals

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        r = queue[0]
        healthy = [iv for iv in view.instances if iv.healthy]
        if not healthy:
            return None
        self._now_s = now_s
        self.decisions += 1
        if not self.fitted:  # least_requests; only the chosen instance's features are kept, for training
            self.cold_decisions += 1
            inst = self._argmin(view, lambda iv: iv.num_outstanding)
            assert inst is not None
            x, uncached = self.features(r, view.instances[inst])
            pred = None
        else:
            rows = [self.features(r, iv) for iv in healthy]
            preds = self.predict([row for row, _ in rows])
            inst = self.choose(healthy, [row[6] for row, _ in rows], preds)
            k = next(n for n, iv in enumerate(healthy) if iv.index == inst)
            (x, uncached), pred = rows[k], [float(v) for v in preds[k]]
        self._open[r.request_id] = [x, bucket_key(x[3], x[1], x[6]), now_s, pred, None, self.completions, inst]
        self.inflight.add(r.request_id, inst, self._priority(r) or 0, uncached)
        self.trees.insert(inst, r)
        self._last = inst
        return Decision(0, inst)

    # ------------------------------------------------------------------ online training (off the decision path)
    def _sample(self, target: str, rec: list[Any], actual: float) -> None:
        if actual <= 0:
            return
        self.model.add(target, rec[0], rec[1], actual)
        if rec[3] is not None:
            k = self.model.targets.index(target)
            self.pairs[target].append((rec[3][k], actual))
            if rec[5] >= WARM_COMPLETIONS:
                self.warm_pairs[target].append((rec[3][k], actual))

    def on_event(self, ev: Event) -> None:
        if self.phase is not None:
            self.phase.observe(ev)
        if isinstance(ev, FirstToken):
            rec = self._open.get(ev.request_id)
            if rec is None or rec[4] is not None:
                return
            rec[4] = ev.time_s
            if self.streaming:
                self.inflight.release(ev.request_id, rec[6])
                self._sample("ttft", rec, ev.time_s - rec[2])
        elif isinstance(ev, Finished):
            rec = self._open.pop(ev.request_id, None)
            if rec is None:
                return
            self.inflight.release(ev.request_id, rec[6])
            if not self.streaming:
                self._sample("e2e", rec, ev.time_s - rec[2])
            elif rec[4] is not None and ev.output_tokens > 1:
                self._sample("tpot", rec, (ev.time_s - rec[4]) / (ev.output_tokens - 1))
            self.completions += 1
            due = (not self.fitted and self.model.ready()) or (
                self.fitted and self.completions - self._fit_at >= self.refit_every)
            if due:
                self.refit()
        elif isinstance(ev, Failed):
            rec = self._open.pop(ev.request_id, None)
            if rec is not None:
                self.inflight.release(ev.request_id, rec[6])

    def refit(self) -> None:
        """Fit the models on the samples held (called on completions; ``route`` never fits)."""
        self.model.fit()
        self._fit_at = self.completions
        if self.first_fit_completions is None:
            self.first_fit_completions = self.completions

    # ------------------------------------------------------------------ reporting
    def prediction_error(self) -> dict[str, float | int | None]:
        """MAPE (%) of the predictions the router acted on, per target, over the run and once warm."""
        out: dict[str, float | int | None] = {}
        for t in self.model.targets:
            out[f"{t}_mape_pct"] = mape(self.pairs[t])
            out[f"{t}_samples"] = len(self.pairs[t])
            out[f"warm_{t}_mape_pct"] = mape(self.warm_pairs[t])
            out[f"warm_{t}_samples"] = len(self.warm_pairs[t])
        return out

    def run_notes(self) -> list[str]:
        """What a run should say about this router: its cold start, its model and its prediction error."""
        if self.first_fit_completions is None:
            return [f"predicted_latency: never fit (fewer than {self.model.min_samples} samples of each target); "
                    f"it routed all {self.decisions} requests as least_requests"]
        notes = [f"predicted_latency: routed its first {self.cold_decisions} of {self.decisions} requests as "
                 f"least_requests (cold start, first fit after {self.first_fit_completions} completions; "
                 f"{self.num_fits} fits; {self.model.describe()})"]
        e = self.prediction_error()

        def fmt(t: str, warm: bool = False) -> str:
            v = e[f"{'warm_' if warm else ''}{t}_mape_pct"]
            n = e[f"{'warm_' if warm else ''}{t}_samples"]
            return f"{t.upper()} MAPE {'n/a' if v is None else f'{v:.1f} %'} ({n} requests)"
        line = "predicted_latency: prediction error over the run: " + ", ".join(fmt(t) for t in self.model.targets)
        if any(e[f"warm_{t}_samples"] for t in self.model.targets):
            line += (f"; after {WARM_COMPLETIONS} completions: "
                     + ", ".join(fmt(t, warm=True) for t in self.model.targets))
        return notes + [line]
