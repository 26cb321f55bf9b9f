"""The metrics of a measured row, computed from simulated records with the measuring tool's definitions.

Per stage (the requests sent during it), in milliseconds like the measured-runs schema:

- ``ttft_*``: first token minus the request's scheduled send time, as the client sees it (the profile's
  front-end latency included). A multi-turn user's request that waits for the user's previous one (inference-perf's
  per-user lock) counts that wait, as inference-perf's timer starts at the scheduled time;
- ``e2e_*``: last token minus the scheduled send time;
- ``itl_mean_ms``: the mean over requests of ``(E2E - TTFT) / (output tokens - 1)``, the time per output token
  after the first (inference-perf's ``time_per_output_token`` and the trainval tables' ITL; equal to the mean gap
  between tokens when every request has the same output length);
- ``tpot_p50_ms`` / ``tpot_p99_ms``: percentiles of that per-request figure (MLPerf loadgen's "time to output
  token", which excludes the first token);
- ``throughput_rps`` and ``output_tok_s``: completions and output tokens of the stage's requests per second of the
  stage.

Percentiles interpolate linearly (numpy's default, as inference-perf and loadgen report them).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core import RequestRecord

METRICS = ("ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "itl_mean_ms", "tpot_p50_ms", "tpot_p99_ms",
           "e2e_mean_ms", "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms", "throughput_rps", "output_tok_s")


def stage_metrics(records: Sequence[RequestRecord], stage_of: np.ndarray, scheduled_s: np.ndarray,
                  spans_s: Sequence[tuple[float, float]], cut: Sequence[bool] | None = None
                  ) -> list[dict[str, float | int | None]]:
    """One dict of :data:`METRICS` per stage (plus ``num_requests``, ``num_failed``, ``num_cut``).

    ``scheduled_s[request_id]``: when the load generator meant to send it. ``cut[k]``: stage ``k`` was stopped at
    its end (the measurement completed fewer requests than it scheduled); its requests that had not finished by
    then are left out, as the measuring tool cancelled them."""
    n_stages = len(spans_s)
    ttft: list[list[float]] = [[] for _ in range(n_stages)]
    e2e: list[list[float]] = [[] for _ in range(n_stages)]
    tpot: list[list[float]] = [[] for _ in range(n_stages)]
    out_tok = [0] * n_stages
    failed = [0] * n_stages
    num_cut = [0] * n_stages
    for r in records:
        k = int(stage_of[r.request_id])
        if k < 0:
            continue
        if r.error is not None or r.finish_s is None or r.first_token_s is None:
            failed[k] += 1
            continue
        if cut is not None and cut[k] and r.finish_s > spans_s[k][1]:
            num_cut[k] += 1
            continue
        sent = float(scheduled_s[r.request_id])
        t = r.first_token_s - sent
        e = r.finish_s - sent
        ttft[k].append(t)
        e2e[k].append(e)
        out_tok[k] += r.generated_tokens
        if r.generated_tokens > 1:
            tpot[k].append((e - t) / (r.generated_tokens - 1))
    out = []
    for k, (a, b) in enumerate(spans_s):
        m: dict[str, float | int | None] = {"num_requests": len(e2e[k]) + failed[k], "num_failed": failed[k],
                                            "num_cut": num_cut[k]}
        for name, xs in (("ttft", ttft[k]), ("e2e", e2e[k])):
            arr = np.asarray(xs) * 1e3
            m[f"{name}_mean_ms"] = float(arr.mean()) if arr.size else None
            for q in (50, 90, 99):
                m[f"{name}_p{q}_ms"] = float(np.percentile(arr, q)) if arr.size else None
        tp = np.asarray(tpot[k]) * 1e3
        m["itl_mean_ms"] = float(tp.mean()) if tp.size else None
        m["tpot_p50_ms"] = float(np.percentile(tp, 50)) if tp.size else None
        m["tpot_p99_ms"] = float(np.percentile(tp, 99)) if tp.size else None
        m["throughput_rps"] = len(e2e[k]) / (b - a)
        m["output_tok_s"] = out_tok[k] / (b - a)
        out.append(m)
    return out
