"""The `lbbench` command line: parse flags, build a config, call the library.

Bad input ends with one line naming the flag or file and what is wrong, and
exit code 2. Everything measured is written as it completes; Ctrl-C keeps what
was measured and marks the run incomplete.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..experiment import (ConfigError, RunConfig, default_out_dir, group_keys, iter_sim_runs, iter_sweep,
                         slo_of, to_json, variants, write_outputs, write_run_toml)

err_console = Console(stderr=True)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean bad user input (exit 2, one line)."""
    from ..dispatch import RouterError
    from ..profiles import ProfileError
    from ..routers.registry import UnknownRouterError
    errs: list[type[BaseException]] = [ConfigError, ProfileError, UnknownRouterError, RouterError]
    for mod, name in (("lbbench.workloads.errors", "WorkloadError"), ("lbbench.predict.base", "PredictorSpecError"),
                      ("lbbench.harness.replay", "EndpointError"), ("lbbench.reports.summary", "SummaryError"),
                      ("lbbench.routers.rl.policy", "CheckpointError"), ("lbbench.engines.vllm.launcher", "LaunchError"),
                      ("lbbench.profiling.derive", "DeriveError"), ("lbbench.profiling.gpus", "UnknownGPUError"),
                      ("lbbench.profiling.models", "ModelConfigError"),
                      ("lbbench.profiling.measure", "MeasureError"),
                      ("lbbench.profiling.calibrate", "CalibrationError"),
                      ("lbbench.harness.text_prompts", "TextPromptError")):
        try:
            errs.append(getattr(importlib.import_module(mod), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errs)


class LbbenchGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except _user_errors() as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            click.echo(f"Error: {msg}", err=True)
            ctx.exit(2)


@click.group(cls=LbbenchGroup)
@click.version_option(package_name="lbbench")
def main() -> None:
    """lbbench: benchmark LLM request routers on simulated or live clusters."""


def _split_csv(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _checkpoints(value: str, routers: list[str]) -> dict[str, dict[str, Any]]:
    """``DIR`` (for the one learned router in --router) or ``ROUTER=DIR,ROUTER=DIR``."""
    learned = [r for r in routers if r.endswith("_rl") or r == "wgrl"]
    if "=" not in value:
        if len(learned) != 1:
            raise ConfigError(f"--checkpoint {value}: give ROUTER=DIR for each of {', '.join(learned) or 'no'} "
                              "learned routers in --router")
        return {learned[0]: {"checkpoint": value}}
    out: dict[str, dict[str, Any]] = {}
    for part in _split_csv(value):
        name, eq, path = part.partition("=")
        if not eq or name not in routers:
            raise ConfigError(f"--checkpoint {part!r}: expected ROUTER=DIR with ROUTER in --router")
        out[name] = {"checkpoint": path}
    return out


def _parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "on", "yes"):
        return True
    if low in ("false", "off", "no"):
        return False
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _chunked(value: str) -> list[bool | None]:
    return {"on": [True], "off": [False], "both": [False, True], "profile": [None]}[value]


@main.command("routers")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def routers_cmd(fmt: str) -> None:
    """List the registered routers."""
    from ..routers import available_routers
    items = available_routers()
    if fmt == "json":
        click.echo(json.dumps([{"name": k, "description": v} for k, v in items.items()], indent=2))
    else:
        width = max(len(k) for k in items)
        for k, v in items.items():
            click.echo(f"{k:<{width}}  {v}")


@main.command("profiles")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def profiles_cmd(fmt: str) -> None:
    """List the shipped profiles (model x hardware x engine setting)."""
    from ..profiles import available_profiles, load_profile
    from ..profiling.physics import implied_utilization
    rows = []
    for name in available_profiles():
        p = load_profile(name)
        rows.append({"name": name, "description": p.description, "model": p.model, "hardware": p.hardware,
                     "scheduler": p.scheduler, "chunked_prefill": p.chunked_prefill,
                     "kv_capacity_tokens": p.kv_capacity_tokens, **implied_utilization(p)})
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
    else:
        width = max((len(r["name"]) for r in rows), default=4)
        for r in rows:
            phys = ("" if r["prefill_mfu"] is None else
                    f"  [prefill MFU {r['prefill_mfu']:.2f}, decode bandwidth {r['decode_bw_util']:.2f}]")
            click.echo(f"{r['name']:<{width}}  {r['description']}{phys}")


def _read_endpoints_file(path: str) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--endpoints {path}: no such file")
    urls = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if not line.startswith(("http://", "https://")):
            raise ConfigError(f"--endpoints {path}: line {n}: not an http(s) URL: {line!r}")
        urls.append(line)
    if not urls:
        raise ConfigError(f"--endpoints {path}: no endpoints in the file")
    return urls


def _trace_options_decorator(f: Any) -> Any:
    try:
        from .trace import trace_transform_options
    except ImportError:  # pragma: no cover - trace readers are part of the package
        return f
    return trace_transform_options(f)


@main.command("run")
@click.option("--profile", default="llama2-7b-v100", show_default=True,
              help="Profile name (see `lbbench profiles`) or path to a profile TOML.")
@click.option("--instances", type=click.IntRange(min=1), default=4, show_default=True,
              help="Number of instances (simulated or launched).")
@click.option("--workload", default="paper-mix", show_default=True,
              help="paper-mix | paper-classes | poisson | sessions[:K=V,...] | shared-prefix[:K=V,...] | "
                   "dataset:FILE.jsonl (ignored with --trace).")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Replay a trace file (Parquet/CSV/JSONL: canonical, Azure, BurstGPT, Mooncake).")
@click.option("--rate", default=None, metavar="RATE[,RATE...]",
              help="Mean arrival rate in requests/s (default 20; with --trace: rescale to this rate). "
                   "Several, comma-separated, run a load sweep: one run per rate, in parallel processes.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Processes for a load sweep (default: one per rate, at most the CPU count).")
@click.option("--slo", default=None, metavar="ttft=S,tbt=S,e2e=S",
              help="Latency limits (seconds) for goodput: requests/s that met every limit, and their share.")
@click.option("--requests", type=click.IntRange(min=1), default=None,
              help="Requests per run (default 2000; 3000 for paper-classes; all of a trace).")
@click.option("--router", "routers", default="round_robin", show_default=True,
              help="Comma-separated routers run side by side (see `lbbench routers`).")
@click.option("--instance-scheduler", default="fcfs", show_default=True,
              help="Comma-separated instance-level schedulers: fcfs, bin_packing, least_work_left.")
@click.option("--chunked-prefill", type=click.Choice(["profile", "on", "off", "both"]), default="profile",
              show_default=True, help="Chunked prefill; `both` runs each variant.")
@click.option("--prefix-caching", type=click.Choice(["profile", "on", "off"]), default="profile",
              show_default=True, help="Automatic prefix caching in the simulated instances "
                                      "(profile: its kv.enable_prefix_caching, off unless set).")
@click.option("--order", default=None,
              help="paper-classes arrival order (default: all four): lh_hl_random, all_random, "
                   "lh_then_hl, hl_then_lh.")
@click.option("--seeds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Number of paired seeds (every router sees the same arrivals per seed).")
@click.option("--seed", type=int, default=0, show_default=True, help="First seed.")
@click.option("--burstiness", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Coefficient of variation of inter-arrival times (1 = Poisson; gamma otherwise).")
@click.option("--prompt-tokens", default="128", show_default=True,
              help="poisson workload: prompt length, N or MEAN:CV (lognormal).")
@click.option("--output-tokens", default="128", show_default=True,
              help="poisson workload: output length, N or MEAN:CV (lognormal).")
@click.option("--predictor", default="oracle", show_default=True,
              help="Output-length predictor for length-aware routers: oracle | bucket_oracle | "
                   "noisy:ACC | text:DIR | metadata:DIR.")
@click.option("--checkpoint", default=None,
              help="Checkpoint directory for a learned router (wgrl, ...), or ROUTER=DIR[,ROUTER=DIR] for several.")
@click.option("--router-opt", "router_opts", multiple=True, metavar="ROUTER.KEY=VALUE",
              help="A router parameter, e.g. late_binding_srpt.max_wait_s=600 (repeatable).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Run directory (default runs/<timestamp>-<workload>).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--endpoint", "endpoints", multiple=True,
              help="Attach to a running OpenAI-compatible server (repeat per instance).")
@click.option("--endpoints", "endpoints_file", type=click.Path(dir_okay=False), default=None,
              help="File with one endpoint URL per line.")
@click.option("--launch", "launch_model", default=None,
              help="Launch local vLLM instances serving MODEL first (`tiny` = a small local test model).")
@click.option("--model", default=None, help="Model name to request from endpoints (default: the first served).")
@click.option("--api", type=click.Choice(["completions", "chat"]), default="completions", show_default=True)
@click.option("--engine", type=click.Choice(["vllm", "sglang"]), default="vllm", show_default=True,
              help="Live runs: the endpoints' engine, for its request fields (exact lengths, token counts) and the "
                   "metric names the timeline and the routers read (lbbench/engines/).")
@click.option("--prompt-mode", type=click.Choice(["auto", "ids", "text"]), default="auto", show_default=True,
              help="Live runs: send prompts as token ids (exact; vLLM) or as text built to the exact length "
                   "(gateways that take only text); auto: ids unless the endpoint refuses them.")
@click.option("--tokenizer", default=None,
              help="Text prompts: a local tokenizer (tokenizer.json or a Hugging Face directory), or a backend's URL "
                   "whose /tokenize to use, to make lengths exact; default: the endpoint's /tokenize, else "
                   "approximate lengths with a warning.")
@click.option("--vllm-python", default=None, help="Python of the vLLM environment used by --launch.")
@click.option("--request-timeout", type=float, default=600.0, show_default=True,
              help="Live runs: seconds before a request is recorded as failed.")
@click.option("--timeline-interval", type=float, default=1.0, show_default=True,
              help="Seconds between per-instance samples (running, waiting, KV usage); 0 = off.")
@_trace_options_decorator
def run_cmd(**kw: Any) -> None:
    """Replay a workload through routers on a simulated or live cluster.

    \b
    Examples:
      lbbench run                                              # paper setup: 4 x V100, paper-mix, 20 req/s
      lbbench run --router round_robin,jsq,least_requests --instance-scheduler fcfs,priority --seeds 5
      lbbench run --profile llama3.1-8b-a100 --trace azure.csv --rate 2,5,10 --slo ttft=1,e2e=30
      lbbench run --launch tiny --instances 2 --workload poisson --rate 4 --requests 100   # real vLLM (CPU)
      lbbench run --endpoint http://gpu-1:8000 --endpoint http://gpu-2:8000 --trace prod.parquet --router jsq
      lbbench run --endpoint http://gateway:30000 --model MODEL --tokenizer http://gpu-1:8000 --trace prod.parquet
    """
    from ..profiles import load_profile

    trace_opts: dict[str, Any] = {}
    try:
        from .trace import split_trace_options
        read, transform = split_trace_options(kw)
        trace_opts = {**read, **transform}
    except ImportError:  # pragma: no cover
        pass
    profile = load_profile(kw["profile"])
    routers = _split_csv(kw["routers"])
    if not routers:
        raise ConfigError("--router: give at least one router name")
    scheds = _split_csv(kw["instance_scheduler"])
    from ..sim.instance import INSTANCE_SCHEDULERS
    for s in scheds:
        if s not in INSTANCE_SCHEDULERS:
            raise ConfigError(f"--instance-scheduler: unknown {s!r} (choose from {', '.join(INSTANCE_SCHEDULERS)})")
    workload = kw["workload"]
    orders: list[str | None] = [None]
    if workload == "paper-classes" and not kw["trace"]:
        from ..workloads import PAPER_CLASS_ORDERS
        orders = list(PAPER_CLASS_ORDERS) if kw["order"] is None else _split_csv(kw["order"])
        for o in orders:
            if o not in PAPER_CLASS_ORDERS:
                raise ConfigError(f"--order: unknown order {o!r} (choose from {', '.join(PAPER_CLASS_ORDERS)})")
    elif kw["order"] is not None:
        raise ConfigError("--order: only applies to --workload paper-classes")
    if kw["trace"] and not Path(kw["trace"]).is_file():
        raise ConfigError(f"--trace {kw['trace']}: no such file")
    requests = kw["requests"]
    if requests is None and not kw["trace"]:
        requests = 3000 if workload == "paper-classes" else 2000
    rates = _rates(kw["rate"])
    rate = rates[0] if len(rates) == 1 else None
    if not rates and not kw["trace"]:
        rate = 20.0
    endpoints = list(kw["endpoints"])
    if kw["endpoints_file"]:
        endpoints += _read_endpoints_file(kw["endpoints_file"])
    live = bool(endpoints or kw["launch_model"])
    if endpoints and kw["launch_model"]:
        raise ConfigError("--launch and --endpoint are exclusive: launch new servers or attach to running ones")
    if kw.get("engine", "vllm") != "vllm" and not endpoints:
        raise ConfigError(f"--engine {kw['engine']}: only with --endpoint (--launch starts vLLM; the simulator has "
                          "no engine dialect)")
    if live and len(rates) > 1:
        raise ConfigError("--rate: a load sweep (several rates) runs in the simulator only")
    slo = _slo(kw["slo"])
    router_options: dict[str, Any] = {}
    if kw["checkpoint"]:
        router_options = _checkpoints(kw["checkpoint"], routers)
    for opt in kw["router_opts"]:
        name, _, rest = opt.partition(".")
        key, eq, value = rest.partition("=")
        if not (name and key and eq):
            raise ConfigError(f"--router-opt {opt!r}: expected ROUTER.KEY=VALUE")
        if name not in routers:
            raise ConfigError(f"--router-opt {opt!r}: router {name!r} is not in --router")
        router_options.setdefault(name, {})[key] = _parse_value(value)
    for name in routers:  # a learned router picks the shipped checkpoint trained on this workload, if any
        if name in ("baseline_rl", "wa_rl", "wgrl") and "checkpoint" not in router_options.get(name, {}):
            label = f"trace:{Path(kw['trace']).name}" if kw["trace"] else workload
            router_options.setdefault(name, {}).setdefault("workload", label)
    cfg = RunConfig(
        profile=kw["profile"], instances=len(endpoints) if endpoints else kw["instances"],
        workload=workload, trace=kw["trace"], trace_options=trace_opts, rate_per_s=rate,
        requests=requests, routers=routers, router_options=router_options,
        instance_schedulers=scheds, chunked_prefill=_chunked(kw["chunked_prefill"]), orders=orders,
        seeds=kw["seeds"], seed=kw["seed"], burstiness=kw["burstiness"], predictor=kw["predictor"],
        prompt_tokens=kw["prompt_tokens"], output_tokens=kw["output_tokens"],
        timeline_interval_s=kw["timeline_interval"] or None, backend="live" if live else "sim",
        rates=rates if len(rates) > 1 else [], slo=slo,
        prefix_caching={"on": True, "off": False}.get(kw["prefix_caching"]),
        jobs=kw["jobs"] or max(1, min(len(rates), os.cpu_count() or 1)),
    )
    # validate the predictor and routers before any long work starts
    from ..predict import load_predictor
    from ..routers import get_router
    load_predictor(cfg.predictor, profile=profile, seed=cfg.seed)
    for r in routers:
        try:
            get_router(r, num_instances=cfg.instances, seed=cfg.seed, profile=profile, **router_options.get(r, {}))
        except (TypeError, ValueError) as exc:
            if not router_options.get(r) or isinstance(exc, _user_errors()):
                raise
            raise ConfigError(f"--router-opt: router {r!r}: {exc}") from None
    out_dir = Path(kw["out_dir"]) if kw["out_dir"] else default_out_dir(cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:12]
    if live:
        from .live_run import run_live
        summary, complete = run_live(cfg, profile, kw, endpoints, out_dir, run_id, err_console)
    else:
        summary, complete = _run_sim(cfg, profile, out_dir, run_id)
    _print_summary(summary, cfg, kw["fmt"], out_dir, complete)
    _say_rejections(out_dir / "requests.parquet", profile)
    if not complete:
        sys.exit(130)


def _say_rejections(path: Path, profile: Any) -> None:
    """One line per kind of request that did not complete: how many, why, and what changes it."""
    import polars as pl
    if not path.is_file():
        return
    df = pl.read_parquet(path)
    if "error" not in df.columns or df.height == 0:
        return
    bad = df.filter(pl.col("error").is_not_null())
    if bad.height == 0:
        return
    too_long = bad.filter(pl.col("error").str.contains("max_model_len"))
    if too_long.height:
        err_console.print(f"note: {too_long.height} of {df.height} requests were rejected: prompt + output longer "
                          f"than the profile's max_model_len ({profile.max_model_len} tokens), as vLLM would; "
                          "--max-prompt-tokens drops long trace prompts, a profile with a larger max_model_len "
                          "(lbbench profile derive --max-model-len) serves them", highlight=False, soft_wrap=True)
    other = bad.filter(~pl.col("error").str.contains("max_model_len"))
    if other.height:
        first = other["error"][0].splitlines()[0][:160]
        err_console.print(f"note: {other.height} of {df.height} requests failed (first: {first}); every one is "
                          f"in {path} with its error", highlight=False, soft_wrap=True)


def _rates(value: str | None) -> list[float]:
    out = []
    for part in _split_csv(value):
        try:
            rate = float(part)
        except ValueError:
            raise ConfigError(f"--rate: {part!r} is not a number of requests/s") from None
        if not rate > 0:
            raise ConfigError(f"--rate: {part!r} must be > 0 requests/s")
        out.append(rate)
    if value is not None and not out:
        raise ConfigError("--rate: give a rate in requests/s, or several comma-separated")
    return out


def _slo(value: str | None) -> dict[str, float]:
    if value is None:
        return {}
    from .report import parse_slo
    try:
        slo = parse_slo(value)
    except click.BadParameter as exc:
        raise ConfigError(f"--slo: {exc.message}") from None
    return {k: v for k, v in vars(slo).items() if v is not None}


def _run_sim(cfg: RunConfig, profile: Any, out_dir: Path, run_id: str) -> tuple[Any, bool]:
    """Every simulated run (a load sweep's rates in ``cfg.jobs`` processes), one run directory."""
    frames, timelines = [], []
    complete = True
    t0 = time.perf_counter()
    write_run_toml(out_dir / "run.toml", cfg, profile, run_id, complete=False)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=err_console, transient=True)
    with progress:
        if cfg.rates:
            overall = progress.add_task(f"rates ({cfg.jobs} processes)", total=len(cfg.rates))
            batches: Any = iter_sweep(cfg, run_id)
        else:
            overall = progress.add_task("runs", total=len(variants(cfg)) * cfg.seeds * len(cfg.routers))
            current = progress.add_task("", total=1)

            def cb(label: str, done: int, total: int) -> None:
                if done % 200 == 0 or done == total:
                    progress.update(current, description=f"  {label}", completed=done, total=total)

            batches = (([df], [] if tl is None else [tl])
                       for df, tl in iter_sim_runs(cfg, profile, run_id, progress=cb))
        try:
            for fs, tls in batches:
                frames += fs
                timelines += tls
                progress.advance(overall)
        except KeyboardInterrupt:
            complete = False
    summary = write_outputs(out_dir, frames, timelines, group_keys(cfg), slo_of(cfg))
    write_run_toml(out_dir / "run.toml", cfg, profile, run_id, complete=complete,
                   extra={"wall_s": round(time.perf_counter() - t0, 3), "runs_completed": len(frames)})
    return summary, complete


_COLUMNS = [
    ("mean_e2e_s", "mean E2E (s)"), ("improvement_vs_round_robin_pct", "vs RR (%)"),
    ("vs_best_baseline_pct", "vs best (%)"), ("p50_e2e_s", "p50 E2E"), ("p99_e2e_s", "p99 E2E"),
    ("mean_ttft_s", "TTFT"), ("mean_tbt_s", "TBT"), ("p99_tbt_s", "p99 TBT"),
    ("mean_router_wait_s", "router wait"), ("router_wait_max_s", "max wait"), ("preemptions", "preempt."),
    ("throughput_tokens_per_s", "tok/s"), ("goodput_per_s", "goodput/s"), ("slo_attainment", "met SLO"),
    ("completed", "done"), ("failed", "failed"),
]
_LIVE_COLUMNS = [("dispatch_lag_p50_s", "lag p50 (ms)"), ("dispatch_lag_p99_s", "lag p99 (ms)"),
                 ("achieved_rate_per_s", "achieved/s"), ("requested_rate_per_s", "requested/s")]


def _fmt(col: str, v: Any) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if col.startswith("dispatch_lag"):
        return f"{v * 1000:.2f}"
    if col in ("improvement_vs_round_robin_pct", "vs_best_baseline_pct"):
        return f"{v:+.2f}"
    if col == "slo_attainment":
        return f"{100 * v:.1f} %"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def _print_summary(summary: Any, cfg: RunConfig, fmt: str, out_dir: Path, complete: bool) -> None:
    if fmt == "json":
        click.echo(to_json(summary))
        return
    console = Console() if sys.stdout.isatty() else Console(width=200)
    keys = [k for k in group_keys(cfg) if k != "router"]
    cols = _COLUMNS + (_LIVE_COLUMNS if cfg.backend == "live" else [])
    where = f"live x{cfg.instances}" if cfg.backend == "live" else f"{cfg.profile} x{cfg.instances}"
    rate = ",".join(f"{r:g}" for r in cfg.rates) if cfg.rates else (cfg.rate_per_s or "trace")
    title = (f"{where}, {cfg.trace or cfg.workload}, "
             f"{rate} req/s, {cfg.requests or 'all'} requests, {cfg.seeds} seed(s)")
    table = Table(title=title + ("" if complete else "  [INCOMPLETE]"))
    for k in keys:
        table.add_column(k)
    table.add_column("router")
    for _, label in cols:
        table.add_column(label, justify="right")
    for row in summary.to_dicts():
        e2e = _fmt("mean_e2e_s", row["mean_e2e_s"])
        if row.get("seeds", 1) > 1 and row.get("mean_e2e_std_s") is not None:
            e2e += f" ± {row['mean_e2e_std_s']:.1f}"
        cells = [e2e] + [_fmt(c, row.get(c)) for c, _ in cols[1:]]
        table.add_row(*[str(row[k]) for k in keys], row["router"], *cells)
    console.print(table)
    refs = summary["best_baseline"].drop_nulls().unique(maintain_order=True).to_list() \
        if "best_baseline" in summary.columns else []
    if refs:
        console.print(f"vs best = against the strongest baseline combination ({', '.join(refs)}), paired by seed; "
                      + (f"SLO {slo_of(cfg).describe()}" if cfg.slo else "no --slo: goodput = completed requests/s"))
    if keys:
        _print_pivot(console, summary, keys)
    console.print(f"[dim]wrote {out_dir}/requests.parquet, summary.parquet, run.toml[/dim]")


def _print_pivot(console: Console, summary: Any, keys: list[str]) -> None:
    """The paper's Table 2 form: one row per variant, one mean-E2E column per router."""
    routers = list(dict.fromkeys(summary["router"].to_list()))
    table = Table(title="mean E2E (s) by variant; * marks the worst router of each row")
    for k in keys:
        table.add_column(k)
    for r in routers:
        table.add_column(r, justify="right")
    rows: dict[tuple, dict[str, float]] = {}
    for row in summary.to_dicts():
        rows.setdefault(tuple(row[k] for k in keys), {})[row["router"]] = row["mean_e2e_s"]
    for variant, vals in rows.items():
        worst = max(vals, key=lambda r: vals[r] if vals[r] is not None else float("-inf"))
        cells = [(_fmt("mean_e2e_s", vals.get(r)) + ("*" if r == worst and len(vals) > 1 else ""))
                 for r in routers]
        table.add_row(*[str(v) for v in variant], *cells)
    console.print(table)


def _add_optional_commands() -> None:
    for mod, names in (("lbbench.cli.trace", ("trace",)), ("lbbench.cli.predict", ("predictor",)),
                       ("lbbench.cli.report", ("report", "compare")), ("lbbench.cli.live", ("launch", "serve_sim")),
                       ("lbbench.cli.train", ("train",)), ("lbbench.cli.profile", ("profile", "fidelity")), ("lbbench.cli.proxy", ("proxy",)),
                       ("lbbench.cli.paper", ("paper",))):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name == mod:
                continue
            raise
        for name in names:
            cmd = getattr(m, name, None) or getattr(m, f"{name}_cmd", None)
            if isinstance(cmd, click.Command):
                main.add_command(cmd)


_add_optional_commands()

if __name__ == "__main__":  # pragma: no cover
    main()
