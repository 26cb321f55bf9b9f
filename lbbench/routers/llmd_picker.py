"""llm-d's predicted-latency scheduling profile after the predictions: affinity filters, the SLO tier filter, the
latency scorer and the weighted-random picker.

Source: ``llm-d/llm-d-router`` at commit ``ebab687927f5331c1b39defcb579a07951bce56c`` (Apache-2.0). The profile
(``config/charts/routerlib/templates/_config.yaml``, ``latencyPredictor.enabled``) runs, in order:

1. ``strict-affinity-filter``: ``prefix-cache-affinity-filter`` with ``affinityThreshold`` 0.99,
   ``ttftSource: latencyPredictor``, ``maxTTFTPenaltyMs`` 5000 (``filter/prefixcacheaffinity/plugin.go``): keep
   the endpoints whose prefix score reaches the threshold, unless the best of them is predicted more than the
   penalty slower to first token than the best of the others (then keep all); none sticky: keep all;
   ``explorationProbability`` 0 (the default) never skips it.
2. ``slo-headroom-tier-filter`` (``filter/sloheadroomtier``): headroom = SLO - prediction; positive tier (TTFT
   and TPOT headroom >= 0) and negative tier; when both exist the positive one is kept, the negative one with
   probability ``epsilonExploreNeg`` (0.01). Without SLOs every headroom is negative and it keeps all.
3. ``loose-affinity-filter``: the same filter at 0.80.
4. ``latency-scorer`` (``scorer/latency/plugin.go``, strategy ``least``, weights TTFT 0.8 / TPOT 0.2): when some
   candidate has positive headroom only those are scored; else idle candidates (no request dispatched) only; else
   the least severe deficit group only (only TPOT missed, then only TTFT, then both). Within the scored group each
   dimension's absolute headroom is min-max normalised (a dimension with no spread gets 0.5 and hands its weight to
   the other), blended, and turned into ``(int((1 - blend) x 100) + 1) / 100``: the candidate closest to its SLO
   (or, without SLOs, with the lowest prediction) scores 1.01, the farthest 0.01. Others score 0.
5. ``weighted-random-picker`` (``picker/weightedrandom/picker.go``): each candidate with a positive score draws
   ``u ** (1 / score)`` and the largest key wins: a draw in proportion to the scores (all zero: uniform).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

#: the profile's two affinity gates (threshold) and their TTFT penalty (seconds)
STRICT_AFFINITY, LOOSE_AFFINITY, AFFINITY_PENALTY_S = 0.99, 0.80, 5.0
TTFT_WEIGHT, TPOT_WEIGHT = 0.8, 0.2
EPSILON_EXPLORE_NEG = 0.01


def affinity_filter(cands: list[int], prefix: Sequence[float], ttft_s: Sequence[float], threshold: float,
                    penalty_s: float) -> list[int]:
    """``prefix-cache-affinity-filter`` with the predicted TTFT as its load gate."""
    if len(cands) <= 1 or threshold <= 0:
        return cands
    sticky = [i for i in cands if prefix[i] >= threshold]
    if not sticky:
        return cands
    other = [i for i in cands if prefix[i] < threshold]
    if penalty_s > 0 and other and min(ttft_s[i] for i in sticky) - min(ttft_s[i] for i in other) > penalty_s:
        return cands
    return sticky


def tier_filter(cands: list[int], ttft_head: Sequence[float], tpot_head: Sequence[float], epsilon: float,
                draw: Callable[[], float]) -> list[int]:
    """``slo-headroom-tier-filter``: the positive tier, or with probability ``epsilon`` the negative one."""
    pos = [i for i in cands if ttft_head[i] >= 0 and tpot_head[i] >= 0]
    neg = [i for i in cands if not (ttft_head[i] >= 0 and tpot_head[i] >= 0)]
    if pos and neg:
        return neg if draw() < epsilon else pos
    return cands


def _score_group(group: list[int], ttft_head: Sequence[float], tpot_head: Sequence[float],
                 scores: dict[int, float]) -> None:
    alpha, beta = TTFT_WEIGHT / (TTFT_WEIGHT + TPOT_WEIGHT), TPOT_WEIGHT / (TTFT_WEIGHT + TPOT_WEIGHT)
    ht = [abs(ttft_head[i]) for i in group]
    hp = [abs(tpot_head[i]) for i in group]
    rt, rp = max(ht) - min(ht), max(hp) - min(hp)
    eps = 1e-9
    if rt <= eps < rp:
        alpha, beta = 0.0, 1.0
    elif rp <= eps < rt:
        alpha, beta = 1.0, 0.0
    for i, a, b in zip(group, ht, hp):
        n_t = (a - min(ht)) / rt if rt > eps else 0.5
        n_p = (b - min(hp)) / rp if rp > eps else 0.5
        scores[i] = (int((1.0 - (alpha * n_t + beta * n_p)) * 100) + 1) / 100  # strategy "least"


def latency_scores(cands: list[int], ttft_head: Sequence[float], tpot_head: Sequence[float],
                   dispatched: Sequence[int]) -> dict[int, float]:
    """``latency-scorer`` (strategy ``least``): a score per candidate, 0 for those outside the scored group."""
    scores = {i: 0.0 for i in cands}
    neg = [i for i in cands if ttft_head[i] < 0 or tpot_head[i] < 0]
    pos = [i for i in cands if i not in neg]
    if pos:
        _score_group(pos, ttft_head, tpot_head, scores)
        return scores
    idle = [i for i in neg if dispatched[i] == 0]
    if idle:
        _score_group(idle, ttft_head, tpot_head, scores)
        return scores
    for group in ([i for i in neg if tpot_head[i] < 0 <= ttft_head[i]],
                  [i for i in neg if ttft_head[i] < 0 <= tpot_head[i]],
                  [i for i in neg if ttft_head[i] < 0 and tpot_head[i] < 0]):
        if group:
            _score_group(group, ttft_head, tpot_head, scores)
            return scores
    return scores


def weighted_pick(scores: dict[int, float], draw: Callable[[], float]) -> int:
    """``weighted-random-picker`` for one endpoint: the largest ``u ** (1 / score)`` (uniform when all are 0)."""
    cands = list(scores)
    if not any(s > 0 for s in scores.values()):
        return cands[min(int(draw() * len(cands)), len(cands) - 1)]
    best, best_key = cands[0], -1.0
    for i in cands:
        s = scores[i]
        if s <= 0:
            continue
        u = draw()
        key = math.pow(u if u > 0 else 1e-10, 1.0 / s)
        if key > best_key:
            best, best_key = i, key
    return best
