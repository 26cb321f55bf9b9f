"""``lbbench paper SETUP``: one of the paper's comparisons, beside the paper's numbers.

Each setup is an ``lbbench run`` with the paper's cluster, workload, rate,
predictor accuracy and routers: the command is printed first, so it can be
rerun or varied by hand, and its flags give the ``RunConfig`` that this command
hands to the library (``run_experiment``; ``lbbench report OUT`` shows every
table of the run). Then comes one line per router
with lbbench's change against round robin next to the one the paper reports
(Jain et al., arXiv 2408.13510, Tables 3-5), and the change against the
*strongest* baseline in the run: the best production router (``round_robin``,
``jsq``, ``least_requests``, ``power_of_two``) on the best instance scheduler,
vLLM's ``priority`` policy included (``lbbench.metrics.reference``), which the
paper does not compare with. Learned routers use the shipped checkpoint for the
setup (the ``-chunked`` one for runs with chunked prefill on); where none is
shipped the run stops with the message that says how to train one.

**A100 load.** The paper runs 4 x A100 at 80 req/s, where its round robin is
at 248 s mean E2E: deep overload. lbbench's re-derived A100 profile serves
paper-mix at roughly 75 req/s, so 80 req/s is barely saturated (round robin
4.7 s with the efficiency fitted to measured A100 timings, 3.6 s before). ``a100`` therefore runs at 200 req/s, the
main setup's offered load relative to capacity (4 x V100 serves ~7.2 req/s;
20 req/s is 2.8 x that; 2.8 x 75 = 210). ``a100-80`` keeps the paper's rate.

    lbbench paper main         # 4 x V100, paper-mix, 20 req/s, noisy:0.79, 5 seeds, fcfs and priority engines
    lbbench paper production   # 4 x A100, the Azure conversation trace (first half) at 20 req/s
    lbbench paper table2       # 2 x V100, 3000 class-labelled requests as one batch: makespan

Table 2 of the paper reports a "total end-to-end latency" of ~425-705 s for
3000 requests on 2 instances. lbbench reads that as the makespan of a batch
(the time until the last of the 3000 requests finishes, all of them sent at
once in the given order; a mean E2E at a low rate could not reach hundreds of
seconds), so ``table2`` sends them at 1000 req/s (3 s for all) and prints
``makespan_s`` per router, arrival order and instance scheduler.

**Two regimes.** ``main`` and ``scale8`` run twice: on the physics-derived
``llama2-7b-v100`` profile (the default for users) and on
``llama2-7b-v100-paper``, whose KV capacity is calibrated so that round robin
gives the paper's 168 s (heavy KV pressure, where the paper's gain comes from).
Each run goes to ``OUT/PROFILE`` and is printed with its label, then the two
side by side. A learned router with no shipped checkpoint for the calibrated
profile is left out of that run, with a line saying how to train one.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..distributed import get_executor
from ..experiment import RunConfig, plan_all, run_experiment
from ..predict.metadata import MODEL_FILE, train_from_trace
from ..profiles import ProfileError, load_profile
from ..rundir import read_summary
from ..workloads.errors import TraceError
from .common import err_console
from .find_rate import NoteReporter
from .run import config_from_flags, run_cmd

PAPER_ROUTERS = "round_robin,jsq,min_min,baseline_rl,wa_rl,wgrl"


@dataclass(frozen=True)
class Setup:
    """One of the paper's comparisons: ``lbbench run`` flags and the paper's gains (%)."""

    flags: tuple[str, ...]
    paper_pct: dict[str, float] = field(default_factory=dict)
    note: str = ""
    metric: str = "improvement"  #: improvement (vs round robin, %) | makespan (s)
    #: further profiles to run the same comparison on (printed beside the setup's own, each labelled)
    regimes: tuple[str, ...] = ()


#: the calibrated profile of the paper's regime (KV capacity tuned to the paper's round-robin mean E2E)
PAPER_REGIME = "llama2-7b-v100-paper"
RL_ROUTERS = ("baseline_rl", "wa_rl", "wgrl")


SETUPS: dict[str, Setup] = {
    "main": Setup(("--profile", "llama2-7b-v100", "--instances", "4", "--workload", "paper-mix", "--rate", "20",
                   "--requests", "2000", "--router", PAPER_ROUTERS + ",least_requests,power_of_two",
                   "--instance-scheduler", "fcfs,priority", "--predictor", "noisy:0.79", "--seeds", "5"),
                  {"baseline_rl": 4.35, "wa_rl": 7.79, "wgrl": 11.43},
                  "paper: round robin 168-173 s mean E2E on this setup", regimes=(PAPER_REGIME,)),
    "scale8": Setup(("--profile", "llama2-7b-v100", "--instances", "8", "--workload", "paper-mix", "--rate", "40",
                     "--requests", "4000", "--router", "round_robin,jsq,least_requests,wgrl",
                     "--instance-scheduler", "fcfs,priority", "--predictor", "noisy:0.79",
                     "--seeds", "5"), {"wgrl": 11.62}, regimes=(PAPER_REGIME,)),
    "a100": Setup(("--profile", "llama3.1-8b-a100-v0", "--instances", "4", "--workload", "paper-mix", "--rate", "200",
                   "--requests", "2000", "--router", "round_robin,jsq,least_requests,decode_balancer,wgrl",
                   "--predictor", "noisy:0.79", "--chunked-prefill", "both", "--seeds", "5"),
                  {"wgrl": 10.71, "wgrl@chunked": 11.06},
                  "paper: +10.71 % with chunked prefill off, +11.06 % with it on, at 80 req/s "
                  "(200 req/s here: the main setup's load relative to capacity)"),
    "a100-80": Setup(("--profile", "llama3.1-8b-a100-v0", "--instances", "4", "--workload", "paper-mix", "--rate", "80",
                      "--requests", "2000", "--router", "round_robin,jsq,least_requests,decode_balancer,wgrl",
                      "--predictor", "noisy:0.79", "--chunked-prefill", "both", "--seeds", "5"),
                     {"wgrl": 10.71, "wgrl@chunked": 11.06},
                     "the paper's rate; barely saturated here (checkpoints trained at 200 req/s)"),
    "production": Setup(("--profile", "llama3.1-8b-a100-v0", "--instances", "4", "--window", "0:1800", "--rate", "20",
                         "--requests", "2000", "--router", "round_robin,jsq,least_requests,wgrl",
                         "--instance-scheduler", "fcfs,priority"),
                        {"wgrl": 7.8},
                        "the paper's production trace is not public; this is the Azure conversation trace, "
                        "evaluated on the half the shipped checkpoint and the metadata predictor were not "
                        "trained on"),
    "table2": Setup(("--profile", "llama2-7b-v100", "--instances", "2", "--workload", "paper-classes",
                     "--requests", "3000", "--rate", "1000", "--router",
                     "round_robin,decode_balancer,dedicated_small_large",
                     "--instance-scheduler", "fcfs,bin_packing,least_work_left"), {},
                    "paper: total end-to-end latency ~425-705 s, read here as the makespan of the batch",
                    metric="makespan"),
}


@click.command("paper")
@click.argument("setup", type=click.Choice(sorted(SETUPS)))
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="The Azure conversation trace (AzureLLMInferenceTrace_conv.csv) for `production`.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Run directory (default runs/paper-SETUP).")
@click.option("--predictor", default=None,
              help="Override the setup's predictor (production default: the metadata predictor, trained on the "
                   "trace's second half into OUT/metadata-predictor).")
@click.pass_context
def paper(ctx: click.Context, setup: str, trace: str | None, out_dir: str | None, predictor: str | None) -> None:
    """Run one of the paper's comparisons and print it beside the paper's numbers."""
    s = SETUPS[setup]
    args = list(s.flags)
    out = Path(out_dir or f"runs/paper-{setup}")
    if setup == "production":
        if not trace:
            raise click.BadParameter("give the Azure conversation trace file", param_hint="--trace")
        args = ["--trace", trace, *args]
        if predictor is None:
            profile = args[args.index("--profile") + 1]
            predictor = f"metadata:{production_predictor(trace, profile, out / 'metadata-predictor')}"
    if predictor is not None:
        if "--predictor" in args:
            i = args.index("--predictor")
            del args[i:i + 2]
        args += ["--predictor", predictor]
    own = args[args.index("--profile") + 1]
    profiles = (own, *s.regimes)
    results = []
    for name in profiles:
        run_args, run_out = _with_profile(args, name), (out / name if s.regimes else out)
        if name != own:
            run_args = _without_missing_checkpoints(run_args, name)
        label = regime_label(name)
        if s.regimes:
            click.echo(f"\n== {name}: {label}")
        click.echo("lbbench run " + " ".join(shlex.quote(a) for a in run_args))
        if not run_setup(run_config(run_args), run_out):
            click.echo(f"interrupted: the units that finished are in {run_out} (run.toml: complete = false)",
                       err=True)
            ctx.exit(130)
        click.echo(f"wrote {run_out} (every table: lbbench report {run_out})")
        results.append((name, label, read_summary(run_out)))
    for name, label, summary in results:
        regime = f" on {name} ({label})" if s.regimes else ""
        click.echo(f"\nlbbench vs the paper ({setup}){regime}{': ' + s.note if s.note else ''}")
        _print_rows(s, summary)
    if len(results) > 1:
        _print_side_by_side(s, results)


def run_config(args: Sequence[str]) -> RunConfig:
    """The config ``lbbench run ARGS`` runs: its flags read by that command's own parser and
    ``config_from_flags`` (nothing runs)."""
    return config_from_flags(dict(run_cmd.make_context("run", list(args)).params))


class _UnitProgress(NoteReporter):
    """Notes, and one progress bar over the run's units."""

    def __init__(self, progress: Progress, total: int):
        super().__init__(progress.console)
        self.progress = progress
        self.task = progress.add_task("units", total=total)

    def unit_finished(self, label: str) -> None:
        self.progress.advance(self.task)


def run_setup(cfg: RunConfig, out_dir: Path) -> bool:
    """Run ``cfg`` into ``out_dir`` with a progress bar on stderr; False when it was interrupted."""
    cfg = cfg.resolved()
    profile = load_profile(cfg.profile)
    cfg.check(profile)
    total = len(plan_all(cfg))
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err_console, transient=True)
    with progress, get_executor(cfg.jobs if total > 1 else 1) as executor:
        outcome = run_experiment(cfg, out_dir, profile=profile, reporter=_UnitProgress(progress, total),
                                 executor=executor)
    return outcome.complete


def regime_label(profile: str) -> str:
    """How a profile's numbers came about, for the regime's heading: calibrated (to what) or physics-derived."""
    try:
        src = load_profile(profile).source
    except ProfileError:
        return "profile from file"
    if "calibrated" in src:
        return f"calibrated {src['calibrated']}"
    return "physics-derived" if "physics" in src.get("method", "") or "derive" in src.get("method", "") else (
        src.get("method", "source not stated"))


def _with_profile(args: list[str], profile: str) -> list[str]:
    out = list(args)
    out[out.index("--profile") + 1] = profile
    return out


def _without_missing_checkpoints(args: list[str], profile: str) -> list[str]:
    """``args`` less the learned routers that have no shipped checkpoint for ``profile`` (each noted)."""
    from ..routers.rl import CheckpointError  # lazy: start-up time (the RL policy stack, for this check only)
    from ..routers.rl.policy import shipped_checkpoint  # lazy: start-up time (as above)

    out = list(args)
    i = out.index("--router")
    instances = int(out[out.index("--instances") + 1])
    kept = []
    for r in out[i + 1].split(","):
        if r in RL_ROUTERS:
            try:
                shipped_checkpoint(r, profile, instances)
            except CheckpointError as exc:
                click.echo(f"note: {r} left out of the {profile} run: {exc}")
                continue
        kept.append(r)
    out[i + 1] = ",".join(kept)
    return out


def _row_key(row: dict) -> tuple[str, str]:
    extra = "".join(f" {k}={row[k]}" for k in ("order", "instance_scheduler", "chunked_prefill") if k in row)
    return row["router"], extra


def _print_rows(s: Setup, summary) -> None:
    for row in summary.iter_rows(named=True):
        name, extra = _row_key(row)
        if s.metric == "makespan":
            click.echo(f"  {name:<22}{extra}  makespan {row['makespan_s']:.1f} s  mean E2E {row['mean_e2e_s']:.1f} s")
            continue
        key = f"{name}@chunked" if row.get("chunked_prefill") and f"{name}@chunked" in s.paper_pct else name
        paper_txt = f"{s.paper_pct[key]:+.2f} %" if key in s.paper_pct else "-"
        best = row.get("vs_best_baseline_pct")
        best_txt = (f"   vs strongest ({row['best_baseline']}) {best:+6.1f} %"
                    if best is not None and row.get("best_baseline") else "")
        click.echo(f"  {name:<15}{extra}  lbbench {row['improvement_vs_round_robin_pct']:+6.1f} %  "
                   f"(mean E2E {row['mean_e2e_s']:.1f} s, p99 {row['p99_e2e_s']:.1f} s)   paper {paper_txt}"
                   f"{best_txt}")


def _print_side_by_side(s: Setup, results: list) -> None:
    """One line per router: its mean E2E and change against round robin in each regime, and the paper's."""
    names = [name for name, _, _ in results]
    click.echo("\nside by side (mean E2E, change vs round robin): " + "  |  ".join(
        f"{name} = {label}" for name, label, _ in results))
    rows: dict[tuple[str, str], dict[str, dict]] = {}
    for name, _, summary in results:
        for row in summary.iter_rows(named=True):
            rows.setdefault(_row_key(row), {})[name] = row
    width = max(len(n) for n in names) + 2
    click.echo(f"  {'router':<40}" + "".join(f"{n:>{width + 11}}" for n in names) + "     paper")
    for (router, extra), by in rows.items():
        cells = "".join(
            f"{by[n]['mean_e2e_s']:>{width}.1f} s {by[n]['improvement_vs_round_robin_pct']:+6.1f} %" if n in by
            else f"{'-':>{width + 11}}" for n in names)
        paper_txt = f"{s.paper_pct[router]:+.2f} %" if router in s.paper_pct else "-"
        click.echo(f"  {router + extra:<40}{cells}     {paper_txt}")


#: the production setup trains its checkpoint and predictor on this window of the trace (seconds)
PRODUCTION_TRAIN_WINDOW = (1800.0, float("inf"))


def production_predictor(trace: str, profile: str, out_dir: Path) -> Path:
    """The paper's production-trace predictor: the metadata model (prompt length + task),
    fitted on the trace's second half (the half the evaluation does not replay), as the
    shipped Azure checkpoint was trained with (``lbbench.predict.metadata.train_from_trace``)."""
    if not (out_dir / MODEL_FILE).is_file():
        try:
            train_from_trace(trace, out_dir, window=PRODUCTION_TRAIN_WINDOW,
                             profile=load_profile(profile))
        except (TraceError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint="--trace") from None
        click.echo(f"metadata predictor trained on {Path(trace).name} from {PRODUCTION_TRAIN_WINDOW[0]:.0f} s "
                   f"on: {out_dir}")
    return out_dir
