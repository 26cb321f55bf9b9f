"""``lbbench run``: flags -> ``RunConfig`` -> ``run_experiment`` -> a table.

Everything a run does is the library's (``lbbench.experiment``): this module only turns flags into the typed
config, draws progress, and renders the summary. Simulated and live runs take the same path. A scenario file
(``--config``) and a recorded run (``--from``) give the flags their defaults (``lbbench.cli.scenario``).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

import click
import polars as pl
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..distributed import UnitError, get_executor
from ..errors import InputError
from ..experiment import ConfigError, Reporter, RunConfig, default_out_dir, plan_all, run_experiment
from ..kv_links import DEFAULT_LINK
from ..live.saturation import DEFAULT_WINDOW_S
from ..admission import SHED_PREFIX
from ..metrics.admitted import admitted_load_line
from ..metrics.prefix_check import prefix_reuse_line
from ..metrics.summary import Slo, to_json
from ..profiles import load_profile
from ..reports.render import cell, to_rich
from ..reports.disagg import disagg_table, roles_table
from ..reports.tables import instances_table
from ..routers.registry import needs_simulator
from ..rundir import (DECISIONS_FILE, REQUESTS_FILE, RUN_TOML, SUMMARY_FILE, TIMELINE_FILE, has_decisions,
                      read_requests, scan_requests)
from .common import err_console
from .find_rate import find_rate_cli
from .scenario import name_the_source, scenario_options
from .flags import (admission_options, api_server_option, parse_value, ray_option, read_endpoints_file, slo_limits,
                    split_csv)
from .trace import trace_options, trace_transform_options


def _checkpoints(value: str, routers: list[str]) -> dict[str, dict[str, Any]]:
    """``DIR`` (for the one learned router in --router) or ``ROUTER=DIR,ROUTER=DIR``."""
    learned = [r for r in routers if r.endswith("_rl") or r == "wgrl"]
    if "=" not in value:
        if len(learned) != 1:
            raise ConfigError(f"--checkpoint {value}: give ROUTER=DIR for each of {', '.join(learned) or 'no'} "
                              "learned routers in --router")
        return {learned[0]: {"checkpoint": value}}
    out: dict[str, dict[str, Any]] = {}
    for part in split_csv(value):
        name, eq, path = part.partition("=")
        if not eq or name not in routers:
            raise ConfigError(f"--checkpoint {part!r}: expected ROUTER=DIR with ROUTER in --router")
        out[name] = {"checkpoint": path}
    return out


def _chunked(value: str) -> list[bool | None]:
    return {"on": [True], "off": [False], "both": [False, True], "profile": [None]}[value]


class _RichReporter(Reporter):
    """Progress bars on stderr: one for the run, one for the unit running now."""

    def __init__(self, progress: Progress, total: int):
        self.progress = progress
        self.overall = progress.add_task("runs", total=total)
        self.current = progress.add_task("", total=1, visible=False)

    def unit_started(self, label: str, total: int) -> None:
        self.progress.update(self.current, description=f"  {label}", completed=0, total=total, visible=True)

    def unit_progress(self, label: str, done: int, total: int) -> None:
        if done % 50 == 0 or done == total:
            self.progress.update(self.current, completed=done, total=total)

    def unit_finished(self, label: str) -> None:
        self.progress.advance(self.overall)

    def note(self, message: str, warning: bool = False) -> None:
        self.progress.console.print(f"[yellow]warning: {message}[/yellow]" if warning else message,
                                    highlight=False, soft_wrap=True)


def config_from_flags(kw: dict[str, Any]) -> RunConfig:
    """The ``RunConfig`` the flags ask for (flag syntax is checked here, values by ``RunConfig.check``)."""
    trace_opts = trace_options(kw)
    routers = split_csv(kw["routers"])
    rates = _rates(kw["rate"])
    endpoints = list(kw["endpoints"])
    if kw["endpoints_file"]:
        endpoints += read_endpoints_file(kw["endpoints_file"])
    router_options: dict[str, Any] = {}
    if kw["checkpoint"]:
        router_options = _checkpoints(kw["checkpoint"], routers)
    for opt in kw["router_opts"]:
        name, _, rest = opt.partition(".")
        key, eq, value = rest.partition("=")
        if not (name and key and eq):
            raise ConfigError(f"--router-opt {opt!r}: expected ROUTER.KEY=VALUE")
        router_options.setdefault(name, {})[key] = parse_value(value)
    fleet = kw.get("fleet")
    if fleet is not None:
        given = [f for f in ("profile", "instances") if kw.get(f) is not None]
        if given:
            raise ConfigError(f"--fleet names every instance's profile; give it or --{given[0]}, not both")
    return RunConfig(
        profile=kw["profile"] or "llama2-7b-v100", instances=kw["instances"] or 4, fleet=fleet,
        workload=kw["workload"], trace=kw["trace"],
        trace_options=trace_opts, rate_per_s=None if rates or kw["trace"] else 20.0, rates=rates,
        requests=kw["requests"], routers=routers, router_options=router_options,
        instance_schedulers=split_csv(kw["instance_scheduler"]), chunked_prefill=_chunked(kw["chunked_prefill"]),
        orders=[None] if kw["order"] is None else split_csv(kw["order"]),
        seeds=kw["seeds"], seed=kw["seed"], burstiness=kw["burstiness"], predictor=kw["predictor"],
        prompt_tokens=kw["prompt_tokens"], output_tokens=kw["output_tokens"],
        timeline_interval_s=kw["timeline_interval"] or None, slo=slo_limits(kw["slo"]),
        prefix_caching={"on": True, "off": False}.get(kw["prefix_caching"]),
        kv_link=kw.get("kv_link") or DEFAULT_LINK,
        jobs=kw["jobs"] or max(1, min(len(rates), os.cpu_count() or 1)),
        endpoints=endpoints, kv_events=list(kw.get("kv_events") or ()), launch_model=kw["launch_model"],
        launch_args=_launch_args(kw.get("launch_args", ())),
        model=kw["model"], api=kw["api"],
        engine=kw["engine"], prompt_mode=kw["prompt_mode"], tokenizer=kw["tokenizer"],
        vllm_python=kw["vllm_python"], request_timeout_s=kw["request_timeout"],
        stream_workers=kw["stream_workers"], load_workers=_load_workers(kw.get("load_workers", "auto")),
        send_lead_s=kw.get("send_lead", 0.02), ray_address=kw.get("ray_address"), cpus_per_instance=kw["cpus_per_instance"],
        api_server_cores=kw["api_server_cores"],
        saturation_threshold_per_s=kw.get("saturation_threshold"),
        saturation_window_s=kw.get("saturation_window", DEFAULT_WINDOW_S),
        saturation_stop=not kw.get("no_saturation_stop", False), on_saturation=kw.get("on_saturation", "drain"),
        decisions=kw["decisions"] or kw["counterfactual"] is not None,
        counterfactual=kw["counterfactual"], counterfactual_every=kw["counterfactual_every"],
        admission=kw.get("admission"), tenants=kw.get("tenants"), signal_lag_s=kw.get("signal_lag_s", 0.0),
    )


@click.command("run")
@scenario_options(lambda kw: config_from_flags(dict(kw)))
@click.option("--profile", default=None,
              help="Profile name (see `lbbench profiles`) or path to a profile TOML  [default: llama2-7b-v100].")
@click.option("--instances", type=click.IntRange(min=1), default=None,
              help="Number of instances (simulated or launched)  [default: 4].")
@click.option("--fleet", default=None, metavar="PROFILE:N[,PROFILE:N...]",
              help="A mixed fleet of one model: each entry a profile name or TOML path and its instance count, "
                   "e.g. llama3.1-8b-a100:2,llama3.1-8b-l4:2 (instances 0-1 on the first). Replaces --profile and "
                   "--instances (giving either with it is an error); --profile P --instances N is the fleet P:N. "
                   "Routers that take one profile are given the first entry's; capacity-aware ones read each "
                   "instance's spec. A third field gives a role for prefill/decode disaggregation, "
                   "e.g. llama3.1-8b-h100:2:prefill,llama3.1-8b-a100:4:decode (mixed, the default, does both; "
                   "routers: pd_llmd, pd_llmd_always, pd_dynamo, pd_vllm, pd_joint).")
@click.option("--kv-link", default=None, metavar="NAME|BYTES_S[@LATENCY_S]",
              help="Prefill/decode fleets: the link a request's KV crosses, nvlink4 | nvlink3 | rdma-400g | "
                   "rdma-200g | pcie5 | pcie4, or bytes/s with an optional latency (40e9@50e-6); transfers sharing "
                   f"an instance's link are serialized  [default: {DEFAULT_LINK}].")
@click.option("--workload", default="paper-mix", show_default=True,
              help="paper-mix | paper-classes | poisson | sessions[:K=V,...] | shared-prefix[:K=V,...] | "
                   "dataset:FILE.jsonl (ignored with --trace).")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Replay a trace file (Parquet/CSV/JSONL: canonical, Azure, BurstGPT, Mooncake).")
@click.option("--rate", default=None, metavar="RATE[,RATE...]",
              help="Mean arrival rate in requests/s (default 20; with --trace: rescale to this rate). "
                   "Several, comma-separated, run a load sweep: one run per rate, in parallel processes.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Processes the simulated units (routers x schedulers x rates x seeds) run in; records do not "
                   "depend on it (default: one per rate of a load sweep, at most the CPU count; else 1).")
@ray_option
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
@click.option("--resume", "resume", is_flag=False, flag_value="", default=None, metavar="[RUN_DIR]",
              help="Resume an interrupted run in RUN_DIR (or --out): keep its complete units, run the others. The "
                   "flags must ask for the same units (workload, requests, seeds, routers, rates, fleet, ...); a "
                   "setting that differs is named.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--wide", is_flag=True, default=False,
              help="Every summary column (TBT, router wait, throughput, goodput, the gain over the strongest "
                   "baseline, ...), not only those that fit a 120-column terminal.")
@click.option("--endpoint", "endpoints", multiple=True, metavar="URL[@PROFILE]",
              help="Attach to a running OpenAI-compatible server (repeat per instance). URL@PROFILE: routers may "
                   "assume that profile of it (its KV tokens, max_num_seqs, speed), for a mixed live fleet; "
                   "without it, --profile with the KV capacity the engine reports.")
@click.option("--endpoints", "endpoints_file", type=click.Path(dir_okay=False), default=None,
              help="File with one endpoint URL per line.")
@click.option("--kv-events", "kv_events", multiple=True, metavar="tcp://HOST:PORT",
              help="An endpoint's KV-event publisher (vLLM's --kv-events-config, serve-sim --kv-events-port-base); "
                   "repeat once per --endpoint, in order. Feeds precise_prefix's index.")
@click.option("--launch", "launch_model", default=None,
              help="Launch local vLLM instances serving MODEL first (`tiny` = a small local test model).")
@click.option("--launch-args", "launch_args", multiple=True, metavar="I:ARGS",
              help="With --launch: more vLLM arguments for launched instance I (from 0), e.g. "
                   "'1:--no-enable-chunked-prefill' runs instance 1 without chunked prefill and instance 0 as "
                   "launched (repeatable): one fleet with different engine settings, each recorded in run.toml.")
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
@click.option("--cpus-per-instance", type=click.IntRange(min=1), default=None,
              help="With --launch on CPUs: pin each instance to its own N cores and the client to the rest (no "
                   "two share compute, as GPU instances do not); recorded in run.toml. Default: shared cores.")
@api_server_option
@click.option("--request-timeout", type=float, default=600.0, show_default=True,
              help="Live runs: seconds before a request is recorded as failed.")
@click.option("--stream-workers", type=click.IntRange(min=0), default=0, show_default=True,
              help="Live runs: worker processes that send and read the streams, leaving the dispatcher's process "
                   "only the schedule and the decisions (0: one process).")
@click.option("--load-workers", default="auto", show_default=True, metavar="auto|N",
              help="Live runs: processes (Ray actors with --ray) that send each request at its planned time, on "
                   "this process's clock through a measured clock offset, and read the streams; the routers still "
                   "decide here. auto: none below 40 req/s or on one core, else one per 1,000 req/s, leaving this "
                   "process a core.")
@click.option("--send-lead", type=float, default=0.02, show_default=True,
              help="Live runs with load workers: seconds before an arrival that the router decides it and hands it "
                   "to its worker.")
@click.option("--saturation-threshold", type=float, default=None, metavar="PER_S",
              help="A step is saturated when its backlog (arrived, not yet ended) grows faster than this many "
                   "requests/s over --saturation-window, throughout it (default: a quarter of the step's mean "
                   "arrival rate). Simulated and live steps are marked (a `saturated` column and a note).")
@click.option("--saturation-window", type=float, default=DEFAULT_WINDOW_S, show_default=True, metavar="S",
              help="Seconds the backlog must keep growing for a step to be saturated.")
@click.option("--on-saturation", type=click.Choice(["drain", "cancel"]), default="drain", show_default=True,
              help="Live runs: when a step saturates it stops sending (the unsent requests are recorded as `not "
                   "sent: saturated`); drain lets the requests in flight finish, cancel aborts them (recorded as "
                   "failed, `cancelled: saturated`).")
@click.option("--no-saturation-stop", is_flag=True, default=False,
              help="Live runs: only mark a saturated step, keep sending (as the simulator does).")
@click.option("--find-rate", is_flag=True, default=False,
              help="Search, per router x instance scheduler, the highest rate at which --slo holds for "
                   "--attainment of requests (exponential probe, bisection, paired seeds); every probe is a run "
                   "in --out.")
@click.option("--find-rate-start", type=float, default=10.0, show_default=True,
              help="--find-rate: the first rate probed, requests/s.")
@click.option("--find-rate-tol", type=float, default=0.02, show_default=True,
              help="--find-rate: stop when the bracket's top is within this share of its bottom.")
@click.option("--find-rate-max", type=float, default=None, help="--find-rate: the highest rate probed.")
@click.option("--attainment", type=float, default=0.99, show_default=True,
              help="--find-rate: the share of requests that must meet every --slo limit, in (0, 1].")
@click.option("--timeline-interval", type=float, default=1.0, show_default=True,
              help="Seconds between per-instance samples (running, waiting, KV usage); 0 = off.")
@click.option("--decisions", is_flag=True, default=False,
              help="Write decisions.parquet: per routing decision the features read, the choice (or a deferral) "
                   "and the alternatives' scores where the router has them.")
@click.option("--counterfactual", type=int, default=None, metavar="K",
              help="Simulator: also roll the chosen action and the K best alternatives forward on forks (the "
                   "planner's horizon and costs) and record each decision's regret (implies --decisions).")
@click.option("--counterfactual-every", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="--counterfactual at every N-th decision only (bounds the run time).")
@admission_options
@click.option("--signal-lag-s", "signal_lag_s", type=float, default=0.0, show_default=True, metavar="S",
              help="The router sees what the instances report (load, first tokens, finishes) S seconds late, as a "
                   "scraped or published signal; its own dispatches at once (simulated and live runs).")
@trace_transform_options
def run_cmd(**kw: Any) -> None:
    """Replay a workload through routers on a simulated or live cluster.

    \b
    Examples:
      lbbench run                                              # paper setup: 4 x V100, paper-mix, 20 req/s
      lbbench run --config bench.toml --out nightly/today      # a scenario file (flags override it)
      lbbench run --from runs/demo --out runs/demo-again       # repeat what runs/demo/run.toml recorded
      lbbench run --router round_robin,jsq,least_requests --instance-scheduler fcfs,priority --seeds 5
      lbbench run --profile llama3.1-8b-a100 --trace azure.csv --rate 2,5,10 --slo ttft=1,e2e=30
      lbbench run --router round_robin,jsq,min_min --rate 10,20,30 --seeds 5 --ray   # units as Ray tasks
      lbbench run --fleet llama3.1-8b-a100:2,llama3.1-8b-l4:2 --router round_robin,least_work_speed
      lbbench run --launch tiny --instances 2 --workload poisson --rate 4 --requests 100   # real vLLM (CPU)
      lbbench run --launch tiny --instances 2 --launch-args "1:--no-enable-chunked-prefill" --requests 20
      lbbench run --endpoint http://gpu-1:8000 --endpoint http://gpu-2:8000 --trace prod.parquet --router jsq
      lbbench run --endpoint http://gateway:30000 --model MODEL --tokenizer http://gpu-1:8000 --trace prod.parquet
    """
    try:
        _run(kw)
    except InputError as exc:  # a value from a scenario file or a repeated run: say where it came from
        raise name_the_source(click.get_current_context(), exc) from None


def _run(kw: dict[str, Any]) -> None:
    if kw["find_rate"]:
        find_rate_cli(config_from_flags(kw), kw)
        return
    cfg = config_from_flags(kw).resolved()
    profile = load_profile(cfg.profile)
    cfg.check(profile)  # before any long work starts
    out_dir = Path(kw["out_dir"]) if kw["out_dir"] else default_out_dir(cfg)
    if kw.get("from_run") and out_dir.resolve() == Path(kw["from_run"]).resolve():
        raise ConfigError(f"--out {out_dir}: that is the run --from repeats; give another directory")
    resume = kw.get("resume")
    if resume is not None:
        out_dir = _resume_dir(resume, kw["out_dir"])
    total = len(plan_all(cfg))
    ray_address = kw["ray_address"]
    if ray_address is not None and cfg.live:
        if not cfg.load_workers:
            err_console.print("note: --ray runs simulated units and load workers; this live run has no load "
                              "workers (--load-workers N) and replays from this process", highlight=False,
                              soft_wrap=True)
        ray_address = None  # the load workers join the cluster from the runner (RunConfig.ray_address)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err_console, transient=True)
    executor = None if cfg.live else get_executor(cfg.jobs if total > 1 else 1, ray_address)
    try:
        with progress:
            outcome = run_experiment(cfg, out_dir, profile=profile, reporter=_RichReporter(progress, total),
                                     executor=executor, resume=resume is not None)
    except UnitError as exc:
        click.echo(f"Error: {exc}; the units that finished are in {out_dir} (run.toml: complete = false)",
                   err=True)
        sys.exit(1)
    finally:
        if executor is not None:
            executor.close()
    _print_summary(outcome.summary, cfg, kw["fmt"], out_dir, outcome.complete, kw["wide"])
    _say_rejections(out_dir, profile)
    if not outcome.complete:
        sys.exit(130)


def _resume_dir(resume: str, out: str | None) -> Path:
    """The run directory ``--resume [RUN_DIR]`` names (else ``--out``'s), which must exist."""
    if resume and out and Path(resume).resolve() != Path(out).resolve():
        raise ConfigError(f"--resume {resume} and --out {out}: give the run directory once")
    if not (resume or out):
        raise ConfigError("--resume: give the run directory, --resume RUN_DIR (or --out RUN_DIR)")
    path = Path(resume or out or "")
    if not path.is_dir():
        raise ConfigError(f"--resume: {path}: no such run directory")
    return path


def _say_rejections(out_dir: Path, profile: Any) -> None:
    """One line per kind of request that did not complete: how many, why, and what changes it."""
    df = read_requests(out_dir)
    if df is None or "error" not in df.columns or df.height == 0:
        return
    bad = df.filter(pl.col("error").is_not_null() & ~pl.col("error").str.starts_with(SHED_PREFIX))
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
                          f"in {out_dir / REQUESTS_FILE} with its error", highlight=False, soft_wrap=True)


def _launch_args(values: Any) -> dict[int, list[str]]:
    """``("1:--no-enable-chunked-prefill --max-num-seqs 8", ...)`` -> ``{1: [...]}`` (shell words)."""
    out: dict[int, list[str]] = {}
    for v in values:
        index, sep, args = v.partition(":")
        try:
            i = int(index)
            words = shlex.split(args)
        except ValueError:
            i, words = -1, []
        if not sep or i < 0 or not words:
            raise ConfigError(f"{v!r}: expected I:ARGS, an instance index from 0 and vLLM arguments", "launch_args")
        out.setdefault(i, []).extend(words)
    return out


def _load_workers(value: str) -> int | None:
    """``auto`` -> None (chosen from the rate and the cores); else a count >= 0."""
    if str(value).strip().lower() == "auto":
        return None
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise ConfigError(f"{value!r}: give a worker count >= 0 or auto", "load_workers")
    return n


def _rates(value: str | None) -> list[float]:
    out = []
    for part in split_csv(value):
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


#: every summary column (``--wide``), in order, with its header
_COLUMNS = [
    ("mean_e2e_s", "mean E2E (s)"), ("improvement_vs_round_robin_pct", "vs RR (%)"),
    ("vs_best_baseline_pct", "vs best (%)"), ("p50_e2e_s", "p50 E2E"), ("p99_e2e_s", "p99 E2E"),
    ("mean_ttft_s", "mean TTFT"), ("p99_ttft_s", "p99 TTFT"), ("mean_tbt_s", "TBT"), ("p99_tbt_s", "p99 TBT"),
    ("mean_router_wait_s", "router wait"), ("router_wait_max_s", "max wait"), ("preemptions", "preempt."),
    ("throughput_tokens_per_s", "tok/s"), ("goodput_per_s", "goodput/s"), ("slo_attainment", "met SLO"),
    ("completed", "done"), ("failed", "failed"),
]
_LIVE_COLUMNS = [("dispatch_lag_p50_s", "lag p50 (ms)"), ("dispatch_lag_p99_s", "lag p99 (ms)"),
                 ("achieved_rate_per_s", "achieved/s"), ("requested_rate_per_s", "requested/s")]
#: the default table: what an engineer choosing a router reads first, so that it fits a 120-column terminal
_DEFAULT = {"mean_e2e_s", "improvement_vs_round_robin_pct", "p50_e2e_s", "p99_e2e_s", "mean_ttft_s", "p99_ttft_s",
            "preemptions", "achieved_rate_per_s"}


def summary_columns(summary: Any, cfg: RunConfig, wide: bool) -> list[tuple[str, str]]:
    """The summary table's (column, header) pairs: with ``wide`` every one; else the default set, plus "met SLO"
    when an SLO was given and "failed" when a request failed."""
    failed = "failed" in summary.columns and bool((summary["failed"].fill_null(0) > 0).any())
    shown = _DEFAULT | ({"slo_attainment"} if cfg.slo else set()) | ({"failed"} if failed else set())
    cols = [c for c in _COLUMNS + (_LIVE_COLUMNS if cfg.backend == "live" else []) if wide or c[0] in shown]
    if "shed" in summary.columns:  # flow control shed requests (lbbench.metrics.admitted)
        cols += [c for c in (("goodput_per_s", "goodput/s"),) if c not in cols]
        cols += [("shed", "shed"), ("admitted_rate_per_s", "admitted/s")]
    if "saturated" in summary.columns:  # some step's backlog kept growing (lbbench.live.saturation)
        cols.append(("saturated", "saturated"))
    return cols + _prefix_check_columns(summary, wide)


def _prefix_check_columns(summary: Any, wide: bool) -> list[tuple[str, str]]:
    """The hit rate and the prefix-hit check's flag, when the run has them (``lbbench.metrics.prefix_check``):
    with ``wide``, or when the check flagged a row (the run also prints ``prefix_reuse_line``)."""
    if "prefix_hit_check" not in summary.columns:
        return []
    if not wide and not summary["prefix_hit_check"].is_in(["low", "no hashes"]).any():
        return []
    return [("prefix_cache_hit_rate", "hit rate"), ("prefix_hit_check", "reuse")] \
        if "prefix_cache_hit_rate" in summary.columns else [("prefix_hit_check", "reuse")]


def _fmt(col: str, v: Any) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if col == "saturated":
        return "yes" if v else "no"
    if col.startswith("dispatch_lag"):
        return f"{v * 1000:.2f}"
    if col in ("improvement_vs_round_robin_pct", "vs_best_baseline_pct"):
        return f"{v:+.2f}"
    if col in ("slo_attainment", "prefix_cache_hit_rate"):
        return f"{100 * v:.1f} %"
    if isinstance(v, str):
        return v
    return cell(v)


def summary_table(summary: Any, cfg: RunConfig, complete: bool = True, wide: bool = False) -> Table:
    """The run's summary as a rich table: one row per router (and variant), the columns of ``summary_columns``."""
    oracles = [r for r in cfg.routers if needs_simulator(r)]
    keys = [k for k in cfg.group_keys() if k != "router"]
    cols = summary_columns(summary, cfg, wide)
    fleet = cfg.fleet_of()
    uniform = fleet.is_uniform and not fleet.is_disaggregated
    where = (f"live x{cfg.instances}" if cfg.backend == "live" and uniform
             else f"{cfg.profile} x{cfg.instances}" if uniform else f"fleet {fleet.label}")
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
        table.add_row(*[str(row[k]) for k in keys], row["router"] + (" (oracle)" if row["router"] in oracles else ""),
                      *cells)
    return table


def _print_summary(summary: Any, cfg: RunConfig, fmt: str, out_dir: Path, complete: bool,
                   wide: bool = False) -> None:
    if fmt == "json":
        click.echo(to_json(summary))
        return
    console = Console() if sys.stdout.isatty() else Console(width=200)
    oracles = [r for r in cfg.routers if needs_simulator(r)]
    keys = [k for k in cfg.group_keys() if k != "router"]
    console.print(summary_table(summary, cfg, complete, wide))
    for name in oracles:
        console.print(f"{name} is an oracle planner, not deployable: it sees true lengths and future arrivals")
    refs = summary["best_baseline"].drop_nulls().unique(maintain_order=True).to_list() \
        if "best_baseline" in summary.columns else []
    if wide and refs:
        console.print(f"vs best = against the strongest baseline combination ({', '.join(refs)}), paired by seed; "
                      + (f"SLO {_slo_text(cfg)}" if cfg.slo else "no --slo: goodput = completed requests/s"))
    elif cfg.slo:
        console.print(f"met SLO = share of requests within {_slo_text(cfg)}")
    reuse = prefix_reuse_line(summary)
    if reuse:
        console.print(reuse)
    admitted = admitted_load_line(summary)
    if admitted:
        console.print(admitted, highlight=False, soft_wrap=True)
    if keys:
        _print_pivot(console, summary, keys)
    fleet = cfg.fleet_of()
    requests = scan_requests(out_dir)
    if not fleet.is_uniform and requests is not None:  # how each kind of instance fared
        to_rich([instances_table(requests, cfg.group_keys())], console)
    if fleet.is_disaggregated and requests is not None:  # prefill/decode: TTFT split, transfers, roles' load
        tl = Path(out_dir) / TIMELINE_FILE
        timeline = pl.scan_parquet(tl) if tl.is_file() else None
        pd = [disagg_table(requests, cfg.group_keys())]
        pd += [roles_table(timeline, cfg.group_keys(), fleet.roles())] if timeline is not None else []
        to_rich([t for t in pd if t is not None], console)
    more = f", {DECISIONS_FILE}" if has_decisions(out_dir) else ""
    hint = "" if wide else f"; more columns: --wide, or lbbench report {out_dir}"
    console.print(f"[dim]wrote {out_dir}/{REQUESTS_FILE}, {SUMMARY_FILE}{more}, {RUN_TOML}{hint}[/dim]",
                  highlight=False)


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




def _slo_text(cfg: RunConfig) -> str:
    return Slo(**cfg.slo).describe()
run = run_cmd
