"""Decision traces: what a router read, what it chose, and (simulated) what each alternative would have cost.

``DecisionRecorder`` wraps a unit's router (``lbbench run --decisions``). At every ``route`` call it records the
time, the queue length, the head request (id, prompt, predicted output), per instance the features the view
offers (outstanding, prefilling, pending prompt tokens, KV in use and its share of capacity, predicted tokens
left), the choice (instance and request, or a deferral) and the alternatives' scores where the router has them:
``scores(request, view)`` or ``queue_scores(queue, view, now_s)``, one value per instance, lower preferred
(inf: not a candidate), read before ``route`` so that a stateful router is not disturbed.

**Counterfactuals** (``counterfactual=K``, simulator only): at every ``every``-th decision the simulator is
forked (``ClusterSim.clone``) once per candidate: the chosen action and the K best other instances by score
(instance order after the chosen one when the router has no scores; every instance when K >= their number;
after a deferral, the chosen action is the deferral). On each fork the chosen request (the head after a
deferral) goes to the candidate instance, then a fresh router of the same kind and options routes from that
epoch on, and the fork is costed as the planner costs its rollouts (``lookahead.fork_cost``: E2E from the
decision, ``horizon_s`` ahead, the fluid estimate past it, the planner's per-instance costs). The decision's
regret is the chosen action's cost minus the cheapest candidate's (>= 0: the chosen one is a candidate), in
seconds of summed E2E. This is the planner's own evaluation (``lookahead.fork_cost``) with the unit's router as
the base policy (tested equal on an exact horizon).

``frame()`` gives the ``decisions.parquet`` rows of the unit (``lbbench.rundir.DECISION_SCHEMA``);
``lbbench.rundir`` writes them.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import polars as pl

from ..core import ClusterView, Decision, Request
from ..routers.lookahead import LookaheadParams, fork_cost, instance_costs
from ..rundir import DECISION_SCHEMA

#: the planner's default horizon: counterfactuals are costed as its rollouts are
DEFAULT_HORIZON_S = LookaheadParams().horizon_s

#: the per-instance feature columns, in the order the recorder reads them
FEATURES = ("outstanding", "prefilling", "pending_prompt_tokens", "context_tokens", "kv_usage",
            "predicted_tokens_remaining")
FEATURE_TYPES = {k: DECISION_SCHEMA[k].inner for k in FEATURES}
DTYPES = {k: (np.float64 if FEATURE_TYPES[k] == pl.Float64 else np.int64) for k in FEATURES}

#: the columns recorded as one tuple per decision
RECORD_COLUMNS = ("decision", "time_s", "queue_len", "head_request_id", "head_prompt_tokens",
                  "head_predicted_output_tokens", "chosen_instance", "chosen_request_id", "scores")

#: types of the unit's columns that a literal would not give (a null order, a small seed)
UNIT_TYPES: dict[str, Any] = {"seed": pl.Int64, "order": pl.Utf8, "rate_per_s": pl.Float64}


class DecisionRecorder:
    """A router that records every decision of the router it wraps (everything else is the wrapped router's)."""

    def __init__(self, router: Any, counterfactual: int = 0, every: int = 1, horizon_s: float = DEFAULT_HORIZON_S,
                 factory: Callable[[], Any] | None = None):
        self.router = router
        self.counterfactual = counterfactual
        self.every = max(1, every)
        self.horizon_s = horizon_s
        if counterfactual and factory is None:
            raise ValueError("counterfactuals need a factory of fresh routers like the wrapped one")
        self.factory = factory  # a fresh router like the wrapped one, for the forks
        self.sim: Any = None
        self.num_counterfactuals = 0
        self._recs: list[tuple] = []  # one per decision, the columns of RECORD_COLUMNS
        self._cf: dict[int, tuple[list[int], list[float]]] = {}  # decision -> (candidates, their costs)
        self._flat: list[float] = []
        self._widths: list[int] = []
        self._scores = getattr(router, "scores", None)
        self._queue_scores = getattr(router, "queue_scores", None)

    def __getattr__(self, name: str) -> Any:  # needs_detail, on_event, run_notes, ...: the wrapped router's
        if name == "router":
            raise AttributeError(name)
        return getattr(self.router, name)

    @property
    def name(self) -> str:
        return self.router.name

    def bind_simulator(self, sim: Any) -> None:
        self.sim = sim
        bind = getattr(self.router, "bind_simulator", None)
        if bind is not None:
            bind(sim)

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        head = queue[0]
        scores = self._queue_scores(queue, view, now_s) if self._queue_scores is not None else (
            self._scores(head, view) if self._scores is not None else None)
        decision = self.router.route(queue, view, now_s)
        n = len(self._recs)
        ivs = view.instances
        if decision is None:
            self._recs.append((n, now_s, len(queue), head.request_id, head.prompt_tokens,
                               head.expected_output_tokens, None, None, scores))
        else:
            self._recs.append((n, now_s, len(queue), head.request_id, head.prompt_tokens,
                               head.expected_output_tokens, decision.instance,
                               queue[decision.queue_index].request_id, scores))
        flat = self._flat  # per-instance features, flat (the frame is built once, at the end)
        for iv in ivs:
            flat.extend((iv.num_outstanding, iv.num_prefilling, iv.prompt_tokens_pending, iv.context_tokens,
                         iv.context_tokens / max(1, iv.spec.kv_capacity_tokens), iv.predicted_tokens_remaining))
        self._widths.append(len(ivs))
        if self.counterfactual and self.sim is not None and n % self.every == 0:
            self._cf[n] = self._counterfactual(decision, scores, len(ivs))
        return decision

    # ------------------------------------------------------------------ counterfactuals
    def candidates(self, decision: Decision | None, scores: Sequence[float] | None, n: int) -> list[int | None]:
        """The chosen instance (None: the deferral) first, then up to K others, best scores first."""
        chosen = None if decision is None else decision.instance
        others = [i for i in range(n) if i != chosen]
        if scores is not None:
            others = [i for i in sorted(others, key=lambda i: (scores[i], i)) if math.isfinite(scores[i])]
        elif chosen is not None:
            others.sort(key=lambda i: (i - chosen) % n)
        return [chosen] + others[:self.counterfactual]

    def _counterfactual(self, decision: Decision | None, scores: Sequence[float] | None, n: int
                        ) -> tuple[list[int], list[float]]:
        sim = self.sim
        qi = 0 if decision is None else decision.queue_index
        pending = list(sim.dispatcher.decided)
        costs = instance_costs(sim)
        insts, out = [], []
        for inst in self.candidates(decision, scores, n):
            action = None if inst is None else Decision(qi, inst)
            out.append(counterfactual_cost(sim, action, self.factory, pending,
                                           self.horizon_s, costs))
            insts.append(-1 if inst is None else inst)
        self.num_counterfactuals += 1
        return insts, out

    def frame(self, extra: dict[str, Any]) -> pl.DataFrame:
        """The unit's ``decisions.parquet`` rows, with the unit's columns ``extra``."""
        n, width = len(self._widths), (self._widths[0] if self._widths else 0)
        if any(w != width for w in self._widths):  # instances come and go: one row at a time
            feats = self._ragged()
        else:
            arr = np.asarray(self._flat, np.float64).reshape(n, width, len(FEATURES))
            feats = {k: pl.Series(k, arr[:, :, j].astype(DTYPES[k]) if n else np.empty((0, width)),
                                  dtype=pl.Array(FEATURE_TYPES[k], width)).cast(DECISION_SCHEMA[k])
                     for j, k in enumerate(FEATURES)}
        cols = dict(zip(RECORD_COLUMNS, map(list, zip(*self._recs)))) if self._recs else \
            {k: [] for k in RECORD_COLUMNS}
        cols["scores"] = [None if v is None else [float(x) for x in v] for v in cols["scores"]]
        cf = [self._cf.get(k) for k in range(n)]
        cols["cf_instances"] = [None if c is None else c[0] for c in cf]
        cols["cf_costs"] = [None if c is None else c[1] for c in cf]
        cols["chosen_cost_s"] = [None if c is None else c[1][0] for c in cf]
        cols["regret_s"] = [None if c is None else c[1][0] - min(c[1]) for c in cf]
        df = pl.DataFrame(cols, schema={k: v for k, v in DECISION_SCHEMA.items() if k not in FEATURES})
        df = df.with_columns(**feats).select(list(DECISION_SCHEMA))
        return df.with_columns([pl.lit(v, UNIT_TYPES.get(k)).alias(k) for k, v in extra.items()])


    def _ragged(self) -> dict[str, pl.Series]:
        cols: dict[str, list] = {k: [] for k in FEATURES}
        pos = 0
        for w in self._widths:
            block = self._flat[pos:pos + w * len(FEATURES)]
            pos += w * len(FEATURES)
            for j, k in enumerate(FEATURES):
                cols[k].append(block[j::len(FEATURES)])
        return {k: pl.Series(k, v, dtype=pl.List(pl.Float64)).cast(DECISION_SCHEMA[k]) for k, v in cols.items()}


def counterfactual_cost(sim: Any, action: Decision | None, make_router: Callable[[], Any],
                        pending: Sequence[tuple[Request, int]], horizon_s: float, costs: Any = None) -> float:
    """Cost of taking ``action`` (None: deferring) at ``sim``'s current epoch after the ``pending`` dispatches,
    then routing with a fresh ``make_router()``: the planner's rollout (``lookahead.fork_cost``) with that
    router as the base."""
    return fork_cost(sim, action, make_router(), pending, horizon_s, costs)[0]
