"""lbbench's own live runs (a run directory: ``requests.parquet`` + ``run.toml``) -> one row per rate x router.

The run directory is read through lbbench's run-directory reader (``_read_run``, the one place this module touches
it). Only live runs are measurements: a simulated run (``backend = "sim"``) is refused.

Each (rate, router) of the run is one experiment stage: ``id`` is ``<run_id>-<router>`` and ``stage`` the rate's
index in increasing order; the seeds' requests are pooled.

**Definitions**, as lbbench's summaries (``lbbench.metrics.summary``) define them, over completed requests (no
error, a finish time), in ms: ``ttft = first_token_s - arrival_s`` and ``e2e = finish_s - arrival_s``, from the
request's *scheduled* arrival (so the router's wait and any send lag count); per request
``(finish_s - first_token_s) / (generated_tokens - 1)`` -> ``itl_mean_ms`` (mean), ``tpot_p50_ms``, ``tpot_p99_ms``;
percentiles interpolate linearly. ``throughput_rps`` and ``output_tok_s`` are completed requests and generated
tokens over the seeds' summed makespans (last finish - first arrival); ``duration_s`` is the seeds' summed arrival
spans; ``requests`` counts every request sent.

**Setup.** ``model`` is the run's ``--model`` (else ``--launch``'s, else the profile's); ``engine`` the run's;
``replicas`` its instance count. The live client asks for exact lengths (``max_tokens = min_tokens`` and
``ignore_eos``, ``lbbench.live.http``), so ``ignore_eos`` is true and ``output_tokens`` the requests' length — a
run whose requests asked for different output lengths has no single ``output_tokens`` and is refused. When lbbench
launched the engines (``--launch``), their limits are the profile's (``max_num_seqs``, ``max_num_batched_tokens``,
prefix caching), as the launcher passes them; against ``--endpoint``s the engines' settings are unknown. The GPU
and TP are never in a run directory: ``--set gpu=... tp=...``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import polars as pl

from ...rundir import REQUESTS_FILE, RunDirError, load_runs
from ..model_facts import ModelFacts
from ..schema import MeasuredError, MeasuredRowError
from .common import Imported, RawRow, rounded


def _read_run(path: Path) -> tuple[dict[str, Any], pl.DataFrame]:
    """``run.toml`` and the request rows of the one run directory at ``path`` (lbbench's run-directory reader)."""
    try:
        runs = load_runs([path])
    except RunDirError as exc:
        raise MeasuredError(str(exc)) from None
    if len(runs.infos) != 1:
        raise MeasuredError(f"{path}: {len(runs.infos)} run directories here; give one")
    return runs.infos[0].config, runs.requests.collect()


def is_run(path: Path) -> bool:
    return path.is_dir() and (path / REQUESTS_FILE).is_file()


def _ms_stats(x: np.ndarray) -> dict[str, float | None]:
    if not x.size:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {"mean": round(float(x.mean()) * 1e3, 3),
            **{f"p{q}": round(float(np.percentile(x, q)) * 1e3, 3) for q in (50, 90, 99)}}


def read(path: Path, facts: ModelFacts, context: Mapping[str, Any]) -> Imported:
    path = Path(path)
    toml, df = _read_run(path)
    cfg, profile = toml.get("config") or {}, toml.get("profile") or {}
    backend = cfg.get("backend") or (df["backend"][0] if "backend" in df.columns and df.height else None)
    if backend != "live":
        raise MeasuredError(f"{path}: a {backend or 'simulated'} run is not a measurement (only live runs are)")
    run_id = str(toml.get("run_id") or path.name)
    origin = path / "requests.parquet"
    common: dict[str, Any] = {
        "source": f"lbbench live run {run_id}", "model": cfg.get("model") or cfg.get("launch_model")
        or profile.get("model"), "engine": cfg.get("engine"), "ignore_eos": True,
        "replicas": len(cfg.get("endpoints") or []) or cfg.get("instances"),
    }
    if cfg.get("launch_model"):
        common.update(max_num_seqs=profile.get("max_num_seqs"),
                      max_num_batched_tokens=profile.get("max_num_batched_tokens"),
                      prefix_caching=profile.get("enable_prefix_caching"))
    out = Imported()
    rates = sorted(r for r in df["rate_per_s"].unique().to_list() if r is not None) \
        if "rate_per_s" in df.columns else []
    for router in sorted(df["router"].unique().to_list()):
        for stage, rate in enumerate(rates):
            g = df.filter((pl.col("router") == router) & (pl.col("rate_per_s") == rate))
            values = {**common, "id": f"{run_id}-{router}", "stage": stage, "rate_rps": float(rate)}
            problem = _load(cfg, g, values)
            if problem:
                out.problems.append(MeasuredRowError(origin, problem, id=values["id"], stage=stage,
                                                     column="arrival" if "arrival" in problem else "output_tokens"))
                continue
            values.update(_metrics(g))
            out.rows.append(RawRow(origin, values))
    return out


def _load(cfg: dict, g: pl.DataFrame, values: dict) -> str | None:
    if cfg.get("trace"):
        return f"trace replay ({cfg['trace']}): a trace's arrivals have no arrival kind in the schema"
    if float(cfg.get("burstiness", 1.0)) != 1.0:
        return f"burstiness {cfg['burstiness']}: gamma-distributed arrivals have no arrival kind in the schema"
    asked = g["output_tokens"].drop_nulls().unique().to_list()
    if len(asked) != 1:
        return (f"requests asked for {len(asked)} different output lengths "
                f"({min(asked) if asked else '?'}-{max(asked) if asked else '?'}): the schema describes one")
    values.update(arrival="poisson", output_tokens=int(asked[0]))
    return None


def _metrics(g: pl.DataFrame) -> dict[str, Any]:
    done = g.filter(pl.col("error").is_null() & pl.col("finish_s").is_not_null() & pl.col("first_token_s").is_not_null())
    ttft = (done["first_token_s"] - done["arrival_s"]).to_numpy()
    e2e = (done["finish_s"] - done["arrival_s"]).to_numpy()
    multi = done.filter(pl.col("generated_tokens") > 1)
    tpot = ((multi["finish_s"] - multi["first_token_s"]) / (multi["generated_tokens"] - 1)).to_numpy()
    per_seed = g.group_by("seed").agg(span=pl.col("arrival_s").max() - pl.col("arrival_s").min(),
                                      makespan=pl.col("finish_s").max() - pl.col("arrival_s").min())
    makespan = float(per_seed["makespan"].sum() or 0.0)
    t, e, p = _ms_stats(ttft), _ms_stats(e2e), _ms_stats(tpot)
    prompts = g["prompt_tokens"].drop_nulls()
    return {
        "duration_s": rounded(float(per_seed["span"].sum()), 3) or None, "requests": g.height,
        "prompt_tokens_mean": rounded(prompts.mean(), 2) if prompts.len() else None,
        "prompt_tokens_max": int(prompts.max()) if prompts.len() else None,
        **{f"ttft_{s}_ms": t[s] for s in t}, **{f"e2e_{s}_ms": e[s] for s in e},
        "itl_mean_ms": p["mean"], "tpot_p50_ms": p["p50"], "tpot_p99_ms": p["p99"],
        "throughput_rps": rounded(done.height / makespan) if makespan > 0 else None,
        "output_tok_s": rounded(float(done["generated_tokens"].sum()) / makespan, 2) if makespan > 0 else None,
    }
