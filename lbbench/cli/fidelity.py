"""``lbbench fidelity``: the same requests, the same routers, live and in the simulator, compared.

Two questions, one command:

- **Transfer** (``--calibrate-on SPEC --check-on SPEC [--check-on SPEC ...]``): calibrate the profile on one
  workload's live replays and report the simulator's errors on the others, which it was not fitted on; every row
  says which workload it came from (``lbbench.profiling.transfer``). A SPEC is ``trace:FILE[?K=V&...]`` or
  ``workload:NAME[?K=V&...]`` (``lbbench.profiling.workload_spec``).
- **Same workload** (``--workload`` / ``--trace``, no ``--calibrate-on``): the profile as given against live
  replays of one workload (``lbbench.profiling.fidelity``).
- **Measured GPU runs** (``--measured FILE.csv``): every row of a measured-runs table (public or your own GPU
  benchmarks, imported by ``lbbench measured import``) simulated and compared, metric by metric
  (``lbbench.validation``; ``cli/fidelity_measured.py``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table

from ..engines.vllm.launcher import placement_of
from ..experiment import annotated_requests
from ..profiles import load_profile
from .common import launch_as_profile
from .flags import (backend_and_workload_options, load_options, predictor_option, repeats_option, seed_option,
                    ttft_fit_option)


@click.command("fidelity")
@click.option("--profile", "profile_name", default=None,
              help="Profile (name or .toml) the simulator runs (required unless --measured).")
@click.option("--measured", default=None, type=click.Path(dir_okay=False),
              help="Measured runs: simulate every row of this table (the columns of the measured-runs schema) with "
                   "a profile derived for its model, GPU, TP, dtypes and engine limits, and report the error of "
                   "every metric it has. No live servers are needed.")
@click.option("--calibration", default=None, type=click.Path(dir_okay=False),
              help="With --measured: the efficiency factors to simulate with (lbbench profile fit --measured "
                   "writes them; default: the calibration shipped with lbbench).")
@click.option("--prompt-assumption", default=None,
              help="With --measured: MEAN:CV of the lognormal prompt lengths for rows that give none (default: "
                   "the documented CNN/DailyMail assumption for MLPerf's Llama-3.1-8B rows).")
@click.option("--sensitivity", is_flag=True,
              help="With --measured: also rerun the rows with assumed prompt lengths at means 800 and 1,250.")
@click.option("--max-mape", default=None,
              help="With --measured: exit 1 when a metric's MAPE exceeds its bound, e.g. e2e_mean_ms=10,ttft_mean_ms=20.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --measured: experiments simulated in parallel processes.")
@backend_and_workload_options
@click.option("--calibrate-on", "calibrate_on", default=None,
              help="Transfer: calibrate the profile on this workload's live replays first: trace:FILE[?K=V&...] or "
                   "workload:NAME[?K=V&...] (keys: requests, rate, seed; a trace's max_prompt_tokens, "
                   "prompt_overflow, time_scale, window=START:END, trace_format; a workload's prompt_tokens, "
                   "output_tokens, burstiness). Needs --check-on.")
@click.option("--check-on", "check_on", multiple=True,
              help="Transfer: a workload to check the calibrated profile on (same syntax); repeat for several.")
@click.option("--calibration-router", default="round_robin", show_default=True,
              help="With --calibrate-on: the router of the calibration replays.")
@click.option("--calibration-seed", type=int, default=1, show_default=True,
              help="With --calibrate-on: seed of the calibration requests (a spec's seed= wins).")
@ttft_fit_option(default="split")
@click.option("--warmup-requests", type=click.IntRange(min=0), default=20, show_default=True,
              help="With --calibrate-on: replay the first N requests of every workload once before the repeats "
                   "and leave them out of every figure (a fresh engine's first replays run slow); 0: none.")
@click.option("--router", "routers", default="round_robin,jsq,least_requests", show_default=True,
              help="Comma-separated routers to compare.")
@load_options
@repeats_option(default=3,
                help="Live replays per router, interleaved by router (and by workload with --calibrate-on).")
@seed_option(default=0, help="Seed of the evaluated requests (calibrate a profile on another).")
@predictor_option
@click.option("--prefix-caching/--no-prefix-caching", default=None,
              help="Automatic prefix caching, live and simulated (default: as the profile says); on, the hit rates "
                   "are compared too.")
@click.option("--max-error-pct", type=click.FloatRange(min=0), default=None,
              help="Exit 1 when any router's mean E2E error (on a check workload) exceeds this (a regression gate).")
@click.option("--vllm-python", default=None, type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write every simulated and live record (records.parquet), the report (fidelity.json) and, with "
                   "--calibrate-on and a .toml profile, the calibrated profile (calibrated.toml) here.")
@click.option("--log-dir", type=click.Path(file_okay=False), default="runs/fidelity-logs", show_default=True)
@click.option("--port-base", type=click.IntRange(1, 65535), default=8160, show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_context
def fidelity_cmd(ctx: click.Context, profile_name: str | None, measured: str | None, calibration: str | None,
                 prompt_assumption: str | None, sensitivity: bool, max_mape: str | None, jobs: int,
                 endpoint: tuple[str, ...], launch_model: str | None,
                 instances: int, cpus_per_instance: int | None, api_server_cores: str, workload: str,
                 trace: str | None,
                 max_prompt_tokens: int | None, prompt_tokens: str, output_tokens: str, calibrate_on: str | None,
                 check_on: tuple[str, ...], calibration_router: str, calibration_seed: int, ttft_fit: str,
                 warmup_requests: int, routers: str,
                 requests: int, rate: float, repeats: int, seed: int, predictor: str, prefix_caching: bool | None,
                 max_error_pct: float | None, vllm_python: str | None, out_dir: str | None, log_dir: str,
                 port_base: int, fmt: str) -> None:
    """Replay the same requests live and in the simulator with the same routers; report per router the error
    of each simulated mean, per-request E2E MAPE, the live run-to-run spread, and whether the routers rank the
    same way (Kendall tau). With --calibrate-on/--check-on: calibrate on one workload, report the errors on
    others (transfer). With --measured: simulate measured GPU runs and report the simulator's error."""
    from ..profiling.fidelity import run_fidelity  # lazy: start-up time (fidelity's own modules, ~40 ms)
    from ..profiling.transfer_check import FIDELITY_FILE, TransferCheck  # lazy: start-up time (as above)

    if measured is not None:
        from .fidelity_measured import run_measured  # lazy: start-up time (the measured tables and validation)
        run_measured(measured, calibration, prompt_assumption, jobs, out_dir, fmt, sensitivity, max_mape)
        return
    if profile_name is None:
        raise click.UsageError("--profile is required (or give --measured FILE)")

    names = [r.strip() for r in routers.split(",") if r.strip()]
    prof = load_profile(profile_name)
    if prefix_caching is not None:
        prof = prof.with_overrides(enable_prefix_caching=prefix_caching)
    if calibrate_on is None and check_on:
        raise click.UsageError("--check-on needs --calibrate-on (the workload to calibrate on)")
    launch = {"launch_model": launch_model, "endpoint": endpoint, "instances": instances, "vllm_python": vllm_python,
              "log_dir": log_dir, "port_base": port_base, "cpus_per_instance": cpus_per_instance,
              "api_server_cores": api_server_cores}
    if calibrate_on is not None:
        check = TransferCheck(prof, profile_name, names, calibrate_on, check_on, requests=requests, rate_per_s=rate,
                              prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                              calibration_router=calibration_router, calibration_seed=calibration_seed,
                              repeats=repeats, seed=seed, predictor=predictor, ttft_fit=ttft_fit,
                              warmup_requests=warmup_requests, out_dir=None if out_dir is None else Path(out_dir))
        _transfer(ctx, check, launch, fmt, max_error_pct)
        return
    reqs = annotated_requests(prof, profile_name, workload=workload, trace=trace,
                              max_prompt_tokens=max_prompt_tokens, rate=rate, requests=requests, seed=seed,
                              prompt_tokens=prompt_tokens, output_tokens=output_tokens, predictor=predictor)
    with launch_as_profile(prof, **launch) as urls:
        tau, rows = run_fidelity(prof, reqs, names, urls, repeats=repeats, seed=seed, out_dir=out_dir,
                                 progress=lambda what: click.echo(f"  {what}", err=True))
        placement = placement_of(urls)
    worst = max(abs(r.mean_e2e_error_pct) for r in rows)
    report = {"profile": prof.name, "requests": len(reqs), "repeats": repeats, "rank_tau": tau,
              "placement": placement, "routers": [r.as_dict() for r in rows]}
    if out_dir is not None:
        (Path(out_dir) / FIDELITY_FILE).write_text(json.dumps(report, indent=2))
    if fmt == "json":
        click.echo(json.dumps(report, indent=2))
    else:
        t = Table(title=f"fidelity: {prof.name}, {len(reqs)} requests, {repeats} live repeats, rank tau {tau:+.2f}")
        for col in ("router", "live E2E s", "sim E2E s", "E2E err %", "live spread %", "E2E MAPE %", "live-live MAPE %",
                    "live TTFT s", "sim TTFT s", "TTFT err %", "TBT err %", "live/sim p99 E2E s"):
            t.add_column(col, justify="left" if col == "router" else "right")
        for r in rows:
            t.add_row(r.router, f"{r.live['mean_e2e_s']:.3f}", f"{r.sim['mean_e2e_s']:.3f}",
                      f"{r.mean_e2e_error_pct:+.1f}", f"{r.live_spread_pct:.1f}", f"{r.e2e_mape_pct:.1f}",
                      "-" if r.live_repeat_mape_pct is None else f"{r.live_repeat_mape_pct:.1f}",
                      f"{r.live['mean_ttft_s']:.3f}", f"{r.sim['mean_ttft_s']:.3f}", f"{r.ttft_mean_error_pct:+.1f}",
                      f"{r.tbt_mean_error_pct:+.1f}", f"{r.live['p99_e2e_s']:.2f} / {r.sim['p99_e2e_s']:.2f}")
            if r.live_prefix_hit_rate is not None or r.sim_prefix_hit_rate is not None:
                click.echo(f"{r.router}: prefix-cache hit rate live {r.live_prefix_hit_rate}, "
                           f"sim {r.sim_prefix_hit_rate}", err=True)
        Console().print(t)
    if max_error_pct is not None and worst > max_error_pct:
        click.echo(f"Error: mean E2E error {worst:.1f} % exceeds --max-error-pct {max_error_pct:g}", err=True)
        raise SystemExit(1)


def _transfer(ctx: click.Context, check: TransferCheck, launch: dict[str, Any], fmt: str,
              max_error_pct: float | None) -> None:
    """``--calibrate-on``: the flags checked, then ``run_transfer_check`` on the launched or attached instances."""
    from ..profiling.transfer_check import run_transfer_check  # lazy: start-up time (fidelity's own modules)

    for flag, param in (("--trace", "trace"), ("--workload", "workload"), ("--max-prompt-tokens", "max_prompt_tokens")):
        if ctx.get_parameter_source(param) == ParameterSource.COMMANDLINE:
            raise click.UsageError(f"{flag} does not go with --calibrate-on: name each workload in --calibrate-on "
                                   "and --check-on (trace:FILE?max_prompt_tokens=N, workload:NAME?...)")
    if not check.check_on:
        raise click.UsageError("--calibrate-on needs at least one --check-on (the workload to check on)")
    workloads = check.workloads()
    t0 = time.perf_counter()
    with launch_as_profile(check.profile, **launch) as urls:
        rep = run_transfer_check(check, workloads, urls, placement=placement_of(urls),
                                 setup_s=time.perf_counter() - t0,
                                 progress=lambda what: click.echo(f"  {what}", err=True))
    res = rep.result
    if fmt == "json":
        click.echo(json.dumps(rep.report, indent=2))
    else:
        _print_transfer(check.profile, res, rep.residuals, check.repeats, rep.report["placement"])
    if max_error_pct is not None and res.worst_mean_e2e_error_pct() > max_error_pct:
        click.echo(f"Error: mean E2E error {res.worst_mean_e2e_error_pct():.1f} % on a check workload exceeds "
                   f"--max-error-pct {max_error_pct:g}", err=True)
        raise SystemExit(1)


TRANSFER_COLUMNS = ("workload", "router", "live E2E s", "sim E2E s", "E2E err %", "live spread %", "p50 E2E err %",
                    "p99 E2E err %", "TTFT err %", "TBT err %", "uncalibrated E2E err %")


def transfer_rows(res) -> list[tuple[str, ...]]:
    """The transfer table's rows: the calibration workload's own fit first, then each check workload."""
    def row(label: str, r, uncal: float | None) -> tuple[str, ...]:
        d = r.as_dict()
        return (label, r.router, f"{r.live['mean_e2e_s']:.3f}", f"{r.sim['mean_e2e_s']:.3f}",
                f"{r.mean_e2e_error_pct:+.1f}", f"{r.live_spread_pct:.1f}", f"{d['p50_e2e_error_pct']:+.1f}",
                f"{d['p99_e2e_error_pct']:+.1f}", f"{r.ttft_mean_error_pct:+.1f}", f"{r.tbt_mean_error_pct:+.1f}",
                "-" if uncal is None else f"{uncal:+.1f}")
    out = [row(f"calibrated on: {res.calibrated_on} (fitted)", res.calibration_fit, None)]
    for c in res.checks:
        out += [row(f"checked on: {c.workload}", r, c.uncalibrated_mean_e2e_error_pct.get(r.router))
                for r in c.routers]
    return out


def _print_transfer(prof, res, tables, repeats: int, placement: dict | None) -> None:
    cal = res.calibration
    where = ""
    if placement:
        where = (f"; instances on cores {', '.join(placement['instance_cores'])}, client on "
                 f"{placement['client_cores'] if placement['pinned'] else 'shared cores'}"
                 + (f", API servers on the {placement.get('front_end', 'instance')}'s cores" if placement['pinned']
                    else ""))
    t = Table(title=f"fidelity transfer: {prof.name} calibrated x{cal.decode_scale:.3f} decode / "
                    f"x{cal.prefill_scale:.3f} prefill, API overhead {cal.api_overhead_s * 1e3:.1f} ms "
                    f"({cal.ttft_fit} TTFT fit), {repeats} live repeats"
                    + (f" after a {res.warmup_requests}-request warm-up a workload" if res.warmup_requests else "")
                    + where)
    for col in TRANSFER_COLUMNS:
        t.add_column(col, justify="left" if col in ("workload", "router") else "right")
    for row in transfer_rows(res):
        t.add_row(*row)
    console = Console()
    console.print(t)
    for by, df in tables.items():
        if df.is_empty():
            continue
        rt = Table(title=f"residuals by {by.replace('_', ' ')} (calibrated profile; error of the bin's mean)")
        for col in ("workload", "router", by, "requests", "live E2E s", "sim E2E s", "E2E err %", "live TTFT s",
                    "sim TTFT s", "TTFT err %"):
            rt.add_column(col, justify="left" if col in ("workload", "router") else "right")
        for r in df.iter_rows(named=True):
            rt.add_row(r["workload"], r["router"], str(r[by]), str(r["requests"]), f"{r['live_e2e_s']:.3f}",
                       f"{r['sim_e2e_s']:.3f}", f"{r['e2e_error_pct']:+.1f}", f"{r['live_ttft_s']:.3f}",
                       f"{r['sim_ttft_s']:.3f}", f"{r['ttft_error_pct']:+.1f}")
        console.print(rt)


fidelity = fidelity_cmd
