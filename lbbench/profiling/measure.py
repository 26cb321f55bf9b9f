"""``lbbench profile measure``: fit a profile's step-time model to a live vLLM engine.

A designed sweep, each point run on an otherwise idle engine with distinct prompts (so no prefix-cache hit):

- **prefill**: one request of ``p`` prompt tokens and 2 output tokens for each ``p``; its time to first
  token is one prefill step plus the API server's own latency;
- **decode**: ``B`` requests of ``c`` prompt tokens sent together; once all ``B`` decode, each request's
  mean gap between tokens (span / tokens, robust to several tokens arriving in one streamed chunk), the median
  over requests, is one decode step at batch ``B`` over about ``B x (c + tokens so far)`` tokens of context.

Least squares over the points' medians (repeats and instances pooled) gives ``base_s``, ``prefill_token_s``, ``decode_seq_s`` and ``context_token_s``
(non-negative) and the API latency added to the first token (``api_overhead_s``); residuals and R² go into the
profile's ``[source]``. The KV cache (``num_gpu_blocks``, ``block_size``) is read from vLLM's
``vllm:cache_config_info`` metric, ``max_model_len`` from ``/v1/models``. A sweep that fails mid-way keeps its
points: the profile is fitted from them and marked ``complete = false``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..core import Request
from ..engines.vllm.info import EngineInfo, engine_info
from ..errors import SetupError


class MeasureError(SetupError):
    """The endpoint is not a usable vLLM, or the sweep could not run (the message says which)."""


@dataclass(frozen=True)
class Sweep:
    prefill_tokens: tuple[int, ...] = (16, 64, 256, 512, 1024, 2048)
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    decode_contexts: tuple[int, ...] = (16, 512, 1536)
    decode_tokens: int = 48
    repeats: int = 3
    decode_repeats: int = 2


@dataclass
class Observation:
    kind: str  # "ttft" (prefill step + API latency) or "step" (one decode step)
    prefill_tokens: int
    decode_seqs: int
    context_tokens: float
    time_s: float


@dataclass
class Measurement:
    engine: EngineInfo
    observations: list[Observation] = field(default_factory=list)
    complete: bool = True
    error: str | None = None


# ---------------------------------------------------------------------------- the sweep
class _Driver:
    def __init__(self, info: EngineInfo):
        self.info = info
        self.next_id = 1_000_000  # distinct prompts: token ids are derived from the request id
        self.t0 = time.perf_counter()

    def clock(self) -> float:
        return time.perf_counter() - self.t0

    def request(self, prompt: int, output: int) -> Request:
        self.next_id += 1
        return Request(request_id=self.next_id, arrival_s=0.0, prompt_tokens=prompt, output_tokens=output)

    async def one(self, backend, prompt: int, output: int):
        """One request; resent (with a new prompt) when its connection failed before any token: a pooled
        keep-alive connection that the server closed just as it was reused is not a measurement."""
        for _ in range(3):
            r = await backend.send(self.info.url, self.request(prompt, output))
            if not (r.connection_error and not r.token_times_s):
                break
        return r

    async def batch(self, backend, prompt: int, output: int, n: int):
        results = await asyncio.gather(*(self.one(backend, prompt, output) for _ in range(n)))
        for r in results:
            if r.error is not None:
                raise MeasureError(f"{self.info.url}: request failed during the sweep: {r.error}")
            if len(r.token_times_s) != output:
                raise MeasureError(f"{self.info.url}: asked for {output} tokens, got {len(r.token_times_s)} "
                                   "(the server must honour min_tokens/ignore_eos)")
        return results


def _decode_step_s(results) -> float | None:
    """The decode step time while every request of the batch decodes: per request, the span of its tokens
    inside that window over their number less one (robust to tokens coalesced into one chunk); the median."""
    start = max(r.token_times_s[1] for r in results)
    end = min(r.token_times_s[-1] for r in results)
    steps = []
    for r in results:
        t = [x for x in r.token_times_s if start <= x <= end]
        if len(t) >= 8 and t[-1] > t[0]:
            steps.append((t[-1] - t[0]) / (len(t) - 1))
    return float(np.median(steps)) if steps else None


async def _sweep(m: Measurement, infos: list[EngineInfo], sweep: Sweep, max_num_seqs: int, progress) -> None:
    """Every point runs on all engines at once (in lockstep, point by point), so that each engine is measured
    under the load the others put on a shared host, the same at every point."""
    from ..live.http import HttpBackend  # lazy: start-up time (the live HTTP client, ~5 ms)

    limits = [i.max_model_len - sweep.decode_tokens - 2 if i.max_model_len else 1 << 30 for i in infos]
    limit = min(limits)
    drivers = [_Driver(i) for i in infos]
    obs = m.observations
    async with HttpBackend(model=infos[0].model, clock=drivers[0].clock, request_timeout_s=300.0) as backend:
        async def on_all(prompt: int, output: int, n: int):
            return await asyncio.gather(*(d.batch(backend, prompt, output, n) for d in drivers))

        await on_all(32, 4, 2)  # warm-up
        for p in (p for p in sweep.prefill_tokens if p <= limit):
            for _ in range(sweep.repeats):
                for (r,) in await on_all(p, 2, 1):
                    obs.append(Observation("ttft", p, 0, 0, r.token_times_s[0] - r.actual_send_s))
            progress(f"prefill {p} tokens")
        for c in (c for c in sweep.decode_contexts if c <= limit):
            for b in (b for b in sweep.decode_batches if b <= max_num_seqs):
                for _ in range(sweep.decode_repeats):
                    for results in await on_all(c, sweep.decode_tokens, b):
                        step_s = _decode_step_s(results)
                        if step_s is not None:
                            obs.append(Observation("step", 0, b, b * (c + sweep.decode_tokens / 2), step_s))
                progress(f"decode batch {b}, context {c}")


def run_sweep(urls: list[str], *, sweep: Sweep = Sweep(), max_num_seqs: int = 256,
              progress=lambda what: None) -> Measurement:
    """Drive every engine in ``urls`` (instances of one configuration) through ``sweep`` together, as they will
    run in a benchmark (on a shared host the instances slow each other down, and the fit should see that); the
    points are pooled. Failures mid-way keep what was measured."""
    infos = [engine_info(u) for u in urls]
    m = Measurement(infos[0])
    for info in infos:
        if (info.block_size, info.num_blocks, info.model) != (m.engine.block_size, m.engine.num_blocks,
                                                              m.engine.model):
            raise MeasureError(f"{info.url}: not configured like {m.engine.url} (model, KV blocks or block size)")
    try:
        asyncio.run(_sweep(m, infos, sweep, max_num_seqs, progress))
    except (MeasureError, OSError) as exc:
        m.complete, m.error = False, str(exc)
    except KeyboardInterrupt:
        m.complete, m.error = False, "interrupted"
    return m


# ---------------------------------------------------------------------------- the fit
COEFFICIENTS = ("api_overhead_s", "base_s", "prefill_token_s", "decode_seq_s", "context_token_s")


def medians(obs: list[Observation]) -> list[Observation]:
    """One observation per sweep point (kind, prompt, batch, context): the median of its repeats and
    instances. On a shared host single points can be several times their typical value; the median is not."""
    groups: dict[tuple, list[float]] = {}
    for o in obs:
        groups.setdefault((o.kind, o.prefill_tokens, o.decode_seqs, round(o.context_tokens)), []).append(o.time_s)
    return [Observation(k[0], k[1], k[2], float(k[3]), float(np.median(v))) for k, v in groups.items()]


def fit_step_model(obs: list[Observation]) -> dict[str, float]:
    """Non-negative least squares of ``time = [ttft] api_overhead + base + a*prefill + b*seqs + c*context``
    on *relative* residuals (each point weighted by 1/time, so a 5 ms decode step counts as much as a 300 ms
    prefill: benchmarks live mostly at small batches), by an active-set loop over ``numpy.linalg.lstsq``; adds
    ``r2``, ``rmse_s``, ``mape_pct`` and per-kind R²."""
    if len(obs) < len(COEFFICIENTS):
        raise MeasureError(f"only {len(obs)} measured points: too few to fit {len(COEFFICIENTS)} coefficients")
    x = np.array([[o.kind == "ttft", 1.0, o.prefill_tokens, o.decode_seqs, o.context_tokens] for o in obs])
    y = np.array([o.time_s for o in obs])
    if (y <= 0).any():
        raise MeasureError("a measured time is not positive; the sweep is unusable")
    w = 1.0 / y
    xw, yw = x * w[:, None], y * w
    scale = np.maximum(np.abs(xw).max(axis=0), 1e-12)
    active = np.ones(x.shape[1], bool)
    coef = np.zeros(x.shape[1])
    while True:
        sol, *_ = np.linalg.lstsq(xw[:, active] / scale[active], yw, rcond=None)
        coef[:] = 0
        coef[active] = sol / scale[active]
        neg = active & (coef < 0)
        if not neg.any():
            break
        active &= ~neg
    pred = x @ coef
    out = dict(zip(COEFFICIENTS, coef.tolist()))

    def r2(mask):
        yy, pp = y[mask], pred[mask]
        ss = float(((yy - yy.mean()) ** 2).sum())
        return 1.0 - float(((yy - pp) ** 2).sum()) / ss if ss > 0 else float("nan")

    kinds = np.array([o.kind for o in obs])
    out.update(r2=r2(np.ones(len(y), bool)), rmse_s=float(np.sqrt(((y - pred) ** 2).mean())),
               mape_pct=float((np.abs(y - pred) / y).mean() * 100.0),
               r2_ttft=r2(kinds == "ttft"), r2_step=r2(kinds == "step"),
               max_abs_residual_s=float(np.abs(y - pred).max()), num_points=len(y))
    return out


def fit_profile(m: Measurement, *, name: str, max_num_seqs: int, max_num_batched_tokens: int,
                chunked_prefill: bool, hardware: str) -> dict:
    """The measured profile as a TOML-ready dict."""
    fit = fit_step_model(medians(m.observations))
    e = m.engine
    base = fit["base_s"]
    if base <= 0:
        raise MeasureError("the fit gave no per-step base time; the sweep is too noisy to use")
    step = {k: float(f"{fit[k]:.5g}") for k in COEFFICIENTS}
    ctx_kinds = sorted({o.decode_seqs for o in m.observations if o.kind == "step"})
    src = (f"lbbench profile measure against vLLM {e.version} at {e.url} ({e.model}): least squares over "
           f"{fit['num_points']} points, R2 {fit['r2']:.4f} (first token {fit['r2_ttft']:.4f}, decode steps "
           f"{fit['r2_step']:.4f}), mean relative error {fit['mape_pct']:.1f} %, RMSE {fit['rmse_s'] * 1e3:.2f} ms, "
           f"largest residual "
           f"{fit['max_abs_residual_s'] * 1e3:.2f} ms")
    return {
        "name": name,
        "description": f"{e.model} measured on a live vLLM {e.version} ({hardware})",
        "model": e.model,
        "hardware": hardware,
        "step": step,
        "kv": {"num_kv_blocks": e.num_blocks, "block_size": e.block_size},
        "engine": {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                   "max_model_len": e.max_model_len or max_num_batched_tokens, "chunked_prefill": chunked_prefill,
                   "scheduler": "v1"},
        "mixing": {"grad1": step["prefill_token_s"], "grad2": step["decode_seq_s"], "epsilon": 0.05, "alpha": 0.5,
                   "min_step_s": float(f"{base + step['decode_seq_s']:.5g}")},
        "measure": {"complete": m.complete, **({"error": m.error} if m.error else {}),
                    "r2": round(fit["r2"], 5), "mape_pct": round(fit["mape_pct"], 2),
                    "rmse_s": float(f"{fit['rmse_s']:.4g}"), "num_points": fit["num_points"],
                    "vllm_version": e.version, "prefix_caching": bool(e.prefix_caching)},
        "source": {
            "method": src + ("" if m.complete else f"; INCOMPLETE sweep ({m.error})"),
            "base_s": "fitted (" + src.split(":")[0] + ")",
            "prefill_token_s": "fitted: time to first token of lone requests of "
                               + ", ".join(str(p) for p in sorted({o.prefill_tokens for o in m.observations
                                                                   if o.kind == "ttft"})) + " prompt tokens",
            "decode_seq_s": "fitted: median token gaps at decode batches " + ", ".join(map(str, ctx_kinds)),
            "context_token_s": "fitted: the same gaps over different context lengths",
            "num_kv_blocks": f"read from the engine: vllm:cache_config_info num_gpu_blocks = {e.num_blocks}",
            "block_size": f"read from the engine: vllm:cache_config_info block_size = {e.block_size}",
            "max_model_len": "read from the engine's /v1/models",
            "engine": "max_num_seqs, max_num_batched_tokens and chunked prefill as the engine was started",
            "api_overhead_s": "fitted: latency the API server adds to the first token beyond the prefill step; "
                          "the simulator adds it to every time the client observes",
        },
    }


def observations_json(m: Measurement) -> str:
    return json.dumps({"engine": asdict(m.engine), "complete": m.complete, "error": m.error,
                       "observations": [asdict(o) for o in m.observations]}, indent=1)
