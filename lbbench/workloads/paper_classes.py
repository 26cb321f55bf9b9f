"""The paper's Table 2 workload: request classes LL / LH / HL / HH in four orders.

The first letter is the prompt, the second the decode: ``H`` (heavy) means at
least 0.5 s of prefill or at least 5 s of decoding on the given profile,
converted to tokens as

- heavy prompt threshold ``P = ceil(0.5 / profile.prefill_token_s)``,
- heavy decode threshold ``D = ceil(5 / profile.min_step_s)`` (250 at 0.02 s).

Lengths are drawn uniformly on either side of a threshold ``T``: light in
``[ceil(T / 10), T / 2]``, heavy in ``[T, 1.5 T]``. The gap between the classes
keeps them distinct, and the narrow heavy range keeps each class homogeneous
(which is what makes the ordered arrivals of the paper's Table 2 insensitive to
the instance scheduler). A heavy prompt is capped so that it still fits the
profile's context beside the longest heavy decode (``max_model_len - 1.5 D``).
When the context cannot hold a 0.5 s prompt at all (the V100 profile: 0.5 s is
1563 prompt tokens, but its KV cache holds 1536 tokens in all), the heavy-prompt
threshold becomes half of what fits beside a heavy decode,
``(max_model_len - 1.5 D) // 2`` (580 tokens on the V100 profile), so heavy
prompts are still the longest the instance can take; ``class_thresholds``
reports the value used.

Orders (``PAPER_CLASS_ORDERS``): ``lh_hl_random`` — half LH, half HL, shuffled;
``all_random`` — the four classes in equal numbers, shuffled; ``lh_then_hl`` —
all LH, then all HL; ``hl_then_lh`` — the reverse. Arrival times are Poisson
at ``rate_per_s`` from their own stream of the seed, so for one seed every
order has exactly the same arrival times.
"""

from __future__ import annotations

import math

import numpy as np

from ..core import Request
from ..profiles import Profile
from .arrivals import arrival_times, check_rate
from .errors import WorkloadError

PAPER_CLASS_ORDERS: tuple[str, ...] = ("lh_hl_random", "all_random", "lh_then_hl", "hl_then_lh")
PAPER_CLASSES: tuple[str, ...] = ("LL", "LH", "HL", "HH")
HEAVY_PREFILL_S = 0.5
HEAVY_DECODE_S = 5.0


def class_thresholds(profile: Profile) -> tuple[int, int]:
    """(heavy prompt tokens, heavy decode tokens) on ``profile``."""
    if profile.prefill_token_s <= 0:
        raise WorkloadError(f"profile {profile.name}: prefill_token_s must be > 0 to define a heavy prompt")
    p_thr = math.ceil(HEAVY_PREFILL_S / profile.prefill_token_s - 1e-9)
    d_thr = math.ceil(HEAVY_DECODE_S / profile.min_step_s - 1e-9)
    room = profile.max_model_len - 3 * d_thr // 2
    if p_thr > room:
        p_thr = room // 2
    return p_thr, d_thr


def class_ranges(profile: Profile) -> dict[str, tuple[tuple[int, int], tuple[int, int]]]:
    """Per class, the inclusive (prompt range, decode range) sampled from."""
    p_thr, d_thr = class_thresholds(profile)
    p_heavy_hi = min(3 * p_thr // 2, profile.max_model_len - 3 * d_thr // 2)
    if p_thr < 2 or p_heavy_hi < p_thr:
        raise WorkloadError(
            f"profile {profile.name}: a heavy prompt needs >= {p_thr} tokens but max_model_len "
            f"{profile.max_model_len} leaves only {profile.max_model_len - 2 * d_thr} beside a heavy decode")
    light_p = (max(1, math.ceil(p_thr / 10)), max(1, p_thr // 2))
    heavy_p = (p_thr, p_heavy_hi)
    light_d = (max(1, math.ceil(d_thr / 10)), max(1, d_thr // 2))
    heavy_d = (d_thr, 3 * d_thr // 2)
    sides = {"L": (light_p, light_d), "H": (heavy_p, heavy_d)}
    return {c: (sides[c[0]][0], sides[c[1]][1]) for c in PAPER_CLASSES}


def class_sequence(order: str, num_requests: int, rng: np.random.Generator) -> list[str]:
    """The class of each request, in arrival order."""
    half = (num_requests + 1) // 2
    if order == "lh_hl_random":
        seq = np.array(["LH"] * half + ["HL"] * (num_requests - half))
        rng.shuffle(seq)
        return seq.tolist()
    if order == "all_random":
        seq = np.array([PAPER_CLASSES[i % 4] for i in range(num_requests)])
        rng.shuffle(seq)
        return seq.tolist()
    if order == "lh_then_hl":
        return ["LH"] * half + ["HL"] * (num_requests - half)
    if order == "hl_then_lh":
        return ["HL"] * half + ["LH"] * (num_requests - half)
    raise WorkloadError(f"order: unknown {order!r} (choose from {', '.join(PAPER_CLASS_ORDERS)})")


def paper_classes(order: str, num_requests: int, rate_per_s: float, seed: int, profile: Profile,
                  burstiness: float = 1.0) -> list[Request]:
    """``num_requests`` class-labelled requests (``task`` = class name) in ``order``."""
    check_rate(num_requests, rate_per_s, burstiness)
    ranges = class_ranges(profile)
    arrival_rng, order_rng, length_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    times = arrival_times(num_requests, rate_per_s, arrival_rng, burstiness)
    classes = class_sequence(order, num_requests, order_rng)
    lo_hi = np.array([ranges[c][0] + ranges[c][1] for c in classes], dtype=np.int64).reshape(-1, 4)
    u = length_rng.random((num_requests, 2))
    prompts = lo_hi[:, 0] + np.floor(u[:, 0] * (lo_hi[:, 1] - lo_hi[:, 0] + 1)).astype(np.int64)
    outputs = lo_hi[:, 2] + np.floor(u[:, 1] * (lo_hi[:, 3] - lo_hi[:, 2] + 1)).astype(np.int64)
    return [Request(request_id=i, arrival_s=float(times[i]), prompt_tokens=int(prompts[i]),
                    output_tokens=int(outputs[i]), task=cls) for i, cls in enumerate(classes)]
