"""`lbbench run` against live servers: attach (``--endpoint``) or launch (``--launch``).

The workload, predictor, routers and output files are the simulator's; only the
backend differs (``lbbench.harness.replay.run_replay`` drives the same
dispatcher over HTTP). Each (chunked-prefill variant, seed, router) replay
appends its finished requests to ``partial/`` as they complete, so an
interrupted run keeps every measured request and is marked incomplete.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import polars as pl
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..experiment import (RunConfig, Variant, build_requests, records_frame, group_keys, run_columns, slo_of,
                         write_outputs, write_run_toml)
from ..profiles import Profile


def _replays(cfg: RunConfig, profile: Profile, endpoints: list[str], variant: Variant, kw: dict[str, Any],
             out_dir: Path, run_id: str, progress: Progress, frames: list[pl.DataFrame],
             timelines: list[pl.DataFrame]) -> bool:
    from ..harness.replay import EndpointError, run_replay
    from ..predict import annotate, load_predictor
    from ..routers import get_router

    predictor = load_predictor(cfg.predictor, profile=profile, seed=cfg.seed)
    specs = [_live_spec(profile, url) for url in endpoints]
    priority_of = None
    if variant.instance_scheduler == "priority":  # servers run --scheduling-policy priority
        from ..routers.priority import request_priority
        priority_of = lambda r: request_priority(r, profile)  # noqa: E731
    texts_for_seed = _prompt_texts(endpoints, kw, progress.console)
    for seed in cfg.seed_list():
        reqs = annotate(build_requests(cfg, profile, seed, variant.order), predictor)
        prompt_texts = texts_for_seed(reqs)
        for name in cfg.routers:
            router = get_router(name, num_instances=len(endpoints), seed=seed, profile=profile,
                                **cfg.router_options.get(name, {}))
            chunk = "" if variant.chunked_prefill is None else f"-chunked-{'on' if variant.chunked_prefill else 'off'}"
            label = f"{name}-seed{seed}{chunk}"
            task = progress.add_task(f"  {label}", total=len(reqs))
            try:
                res = run_replay(reqs, router, endpoints, model=kw.get("model"), specs=specs, run_id=run_id,
                                 seed=seed, out_dir=out_dir / "partial" / label,
                                 request_timeout_s=kw.get("request_timeout", 600.0),
                                 api=kw.get("api", "completions"), min_step_s=profile.min_step_s,
                                 priority_of=priority_of, prompt_texts=prompt_texts,
                                 engine=kw.get("engine", "vllm"),
                                 progress=lambda done, total, _t=task: progress.update(_t, completed=done))
            except EndpointError as exc:
                # an instance died between replays: keep what was measured, mark the run incomplete
                progress.console.print(f"[red]stopping: {exc}[/red]")
                return False
            progress.remove_task(task)
            if prompt_texts:
                from ..harness.text_prompts import prompt_length_mismatches
                bad = prompt_length_mismatches(res.records)
                if bad:
                    progress.console.print(f"[yellow]warning: {bad} of {len(res.records)} requests of {label} "
                                           "reached the server with another prompt length than asked "
                                           "(text prompts; give --tokenizer for exact lengths)[/yellow]")
            extra = run_columns(cfg, profile, variant)
            for r in res.records:
                r.router = name
            frames.append(records_frame(res.records, extra))
            if res.metrics is not None and res.metrics.height:
                timelines.append(res.metrics.with_columns(
                    pl.lit(name).alias("router"), pl.lit(seed).alias("seed"), pl.lit(variant.order).alias("order"),
                    pl.lit(extra["chunked_prefill"]).alias("chunked_prefill")))
            if not res.complete:
                return False
    return True


def _live_spec(profile: Profile, url: str):
    """What the router may assume of a live instance: the profile's spec (the same one the simulator gives
    routers), with the KV capacity the engine itself reports (vLLM's cache_config_info) where it does."""
    from dataclasses import replace

    from ..profiling.measure import MeasureError, engine_info
    spec = profile.instance_spec()
    try:
        info = engine_info(url)
    except MeasureError:
        return spec
    return replace(spec, kv_capacity_tokens=info.num_blocks * info.block_size)


def _prompt_texts(endpoints: list[str], kw: dict[str, Any], console: Console):
    """A function from a seed's requests to their text prompts ({} when token ids are sent)."""
    from ..harness.replay import served_models
    from ..harness.text_prompts import (TextPromptError, accepts_token_ids, endpoint_counter, local_counter,
                                       texts_for)

    mode = kw.get("prompt_mode") or "auto"
    if mode == "ids":
        return lambda reqs: {}
    model = kw.get("model") or served_models(endpoints[0])[0]
    if mode == "auto" and accepts_token_ids(endpoints[0], model):
        return lambda reqs: {}
    count = None
    tok = kw.get("tokenizer")
    if tok and tok.startswith(("http://", "https://")):  # a backend's /tokenize (behind a gateway that lacks it)
        count = endpoint_counter(tok, model)
    elif tok:
        count = local_counter(tok)
    else:
        probe = endpoint_counter(endpoints[0], model)
        try:
            probe("probe")
            count = probe
        except TextPromptError:  # no /tokenize there: approximate lengths, said once
            console.print("[yellow]warning: text prompts with approximate lengths (the endpoint has no "
                          "/tokenize; give --tokenizer PATH for exact ones)[/yellow]")
    console.print(f"sending text prompts ({'exact lengths' if count else 'approximate lengths'})")

    def texts(reqs):
        out, inexact = texts_for(reqs, count)
        if count is not None and inexact:
            console.print(f"[yellow]warning: {inexact} prompts could not be built to their exact length[/yellow]")
        return out
    return texts


def run_live(cfg: RunConfig, profile: Profile, kw: dict[str, Any], endpoints: list[str], out_dir: Path,
             run_id: str, console: Console) -> tuple[pl.DataFrame, bool]:
    from ..harness.replay import check_endpoints

    frames: list[pl.DataFrame] = []
    timelines: list[pl.DataFrame] = []
    t0 = time.perf_counter()
    write_run_toml(out_dir / "run.toml", cfg, profile, run_id, complete=False)
    complete = True
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, transient=True)
    try:
        with progress:
            if endpoints:
                check_endpoints(endpoints)
                for v in [Variant(cfg.instance_schedulers[0], None, o) for o in cfg.orders]:
                    if not _replays(cfg, profile, endpoints, v, kw, out_dir, run_id, progress, frames, timelines):
                        complete = False
                        break
            else:
                from ..engines.vllm.launcher import launch
                for chunked in cfg.chunked_prefill:
                    tag = "default" if chunked is None else ("on" if chunked else "off")
                    console.print(f"launching {cfg.instances} x {kw['launch_model']} (chunked prefill {tag}) ...")
                    policy = "priority" if cfg.instance_schedulers[0] == "priority" else None
                    with launch(kw["launch_model"], cfg.instances, chunked_prefill=chunked,
                                vllm_python=kw.get("vllm_python"), scheduling_policy=policy,
                                log_dir=out_dir / "logs" / f"chunked-{tag}") as eps:
                        v = Variant(cfg.instance_schedulers[0], chunked, cfg.orders[0])
                        if not _replays(cfg, profile, list(eps), v, kw, out_dir, run_id, progress, frames,
                                        timelines):
                            complete = False
                            break
    except KeyboardInterrupt:
        complete = False
    summary = write_outputs(out_dir, frames, timelines, group_keys(cfg), slo_of(cfg))
    if timelines:
        pl.concat(timelines, how="diagonal_relaxed").write_parquet(out_dir / "metrics.parquet")
    write_run_toml(out_dir / "run.toml", cfg, profile, run_id, complete=complete,
                   extra={"wall_s": round(time.perf_counter() - t0, 3), "endpoints": endpoints or [],
                          "launched_model": kw.get("launch_model") or ""})
    return summary, complete
