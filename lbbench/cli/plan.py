"""``lbbench plan``: flags -> ``PlanConfig`` -> ``plan_capacity`` -> a table, JSON or HTML (and the picture).

Thin: the search, the profiles and the rows are ``lbbench.planning``'s. With ``--out DIR`` every search's
evaluated points are appended to ``DIR/points.jsonl`` as it completes, and ``DIR/plan.json`` (rows, points,
``complete``), ``DIR/plan.png`` and ``DIR/plan.html`` are written at the end, also after Ctrl-C (then marked
incomplete, exit 130). ``--mix`` and ``--disagg`` hand over to ``planning.mix`` and ``planning.disagg``
(``cli/plan_disagg.py``); the flags that belong to ``--disagg`` alone are refused without it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..errors import InputError
from ..experiment import ConfigError, RunConfig
from ..metrics.summary import Slo
from ..planning import PlanConfig, plan_capacity
from ..planning.capacity import write_outcome
from .common import err_console
from .flags import ray_option, slo_limits, split_csv
from .trace import trace_options, trace_transform_options


def _tps(value: str) -> list[int]:
    out = []
    for part in split_csv(value):
        try:
            out.append(int(part))
        except ValueError:
            raise InputError(f"{part!r} is not a whole number of GPUs", "tp") from None
    if not out:
        raise InputError("give a tensor-parallel size, or several comma-separated", "tp")
    return out


def check_disagg_flags(kw: dict[str, Any]) -> None:
    """The flags that belong to ``--disagg`` only, and those it cannot take (one line naming the flag)."""
    from ..routers.registry import is_pair_router  # lazy: start-up time (the router registry)

    pair = [r for r in split_csv(kw["routers"]) if is_pair_router(r)]
    if not kw["disagg"]:
        for name, flag in (("pd_routers", "pd-router"), ("kv_link", "kv-link")):
            if kw[name] is not None:
                raise InputError("plans prefill/decode fleets: give --disagg with it", name)
        if pair:
            raise InputError(f"{pair[0]} routes prefill/decode pairs: plan them with --disagg --pd-router "
                             f"{pair[0]}", "routers")
        return
    if pair:
        raise InputError(f"{pair[0]} routes prefill/decode pairs: give it as --pd-router (--router routes the "
                         "aggregated fleets)", "routers")
    if kw["mix"]:
        raise InputError("--disagg searches the aggregated fleets --mix does, beside the prefill/decode ones: "
                         "give one of them", "mix")
    if kw["fmt"] == "html":
        raise InputError("--disagg writes a table or JSON; give --format table or json", "format")
    if kw["jobs"] != 1 or kw["ray_address"]:
        raise InputError("--disagg runs its searches one after another (each step depends on the last); "
                         "leave it at 1", "jobs" if kw["jobs"] != 1 else "ray")


def plan_config_from_flags(kw: dict[str, Any]) -> Any:
    trace_opts = trace_options(kw)
    slo = slo_limits(kw["slo"])
    if not slo:
        raise ConfigError("--slo: give at least one limit, e.g. ttft=2,tbt=0.1")
    run = RunConfig(workload=kw["workload"], trace=kw["trace"], trace_options=trace_opts, rate_per_s=kw["rate"],
                    requests=kw["requests"], routers=split_csv(kw["routers"]),
                    instance_schedulers=split_csv(kw["instance_scheduler"]), seeds=kw["seeds"], seed=kw["seed"],
                    burstiness=kw["burstiness"], predictor=kw["predictor"], prompt_tokens=kw["prompt_tokens"],
                    output_tokens=kw["output_tokens"])
    return PlanConfig(run=run, model=kw["model"], gpus=split_csv(kw["gpu"]), tps=_tps(kw["tp"]), slo=Slo(**slo),
                      attainment=kw["attainment"], max_instances=kw["max_instances"], dtype=kw["dtype"],
                      price_file=kw["price_file"], jobs=kw["jobs"], ray=kw["ray_address"],
                      calibration=kw["calibration"])


@click.command("plan")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Plan for a trace file (rescaled to --rate).")
@click.option("--workload", default="paper-mix", show_default=True,
              help="paper-mix | paper-classes | poisson | sessions[:K=V,...] | dataset:FILE (ignored with --trace).")
@click.option("--rate", type=float, required=True, help="Arrival rate to plan for, requests/s.")
@click.option("--requests", type=click.IntRange(min=1), default=None,
              help="Requests per simulation (default 2000; 3000 for paper-classes; all of a trace).")
@click.option("--slo", required=True, metavar="ttft=S,tbt=S[,e2e=S]",
              help="Latency limits (seconds): TTFT, each request's mean time between tokens, E2E.")
@click.option("--attainment", type=float, default=0.99, show_default=True,
              help="Share of requests that must meet every limit, in (0, 1].")
@click.option("--model", required=True, help="A shipped model config (llama-3.1-8b, ...) or a config.json path.")
@click.option("--gpu", required=True, metavar="GPU[,GPU...]",
              help="GPUs to compare (a100-80gb, h100, l4, ...; see `lbbench profile derive --help`).")
@click.option("--tp", default="1", show_default=True, metavar="N[,N...]", help="Tensor-parallel sizes to try.")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32", "fp8"]), default="bf16", show_default=True)
@click.option("--router", "routers", default="jsq", show_default=True,
              help="Comma-separated routers; each gets its own rows.")
@click.option("--calibration", type=click.Path(dir_okay=False), default=None,
              help="A calibration TOML (`lbbench profile fit --measured` writes one) whose efficiency factors the "
                   "derived profiles take, as `lbbench profile derive --calibration`. Default: the shipped one.")
@click.option("--instance-scheduler", default="fcfs", show_default=True,
              help="Comma-separated instance-level schedulers; each gets its own rows.")
@click.option("--predictor", default="oracle", show_default=True,
              help="Output-length predictor for length-aware routers.")
@click.option("--price-file", type=click.Path(dir_okay=False), default=None,
              help="TOML of US dollars per GPU-hour ([gpu_usd_per_hour]; see examples/prices.example.toml): "
                   "adds usd_per_hour and usd_per_million_tokens.")
@click.option("--max-instances", type=int, default=64, show_default=True,
              help="The largest count searched; a target not met there is an error.")
@click.option("--seeds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Paired seeds per count (every count sees the same requests).")
@click.option("--seed", type=int, default=0, show_default=True, help="First seed.")
@click.option("--burstiness", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True)
@click.option("--prompt-tokens", default="128", show_default=True, help="poisson workload: N or MEAN:CV.")
@click.option("--output-tokens", default="128", show_default=True, help="poisson workload: N or MEAN:CV.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes that run the searches (one search per GPU x TP x router) side by side.")
@ray_option
@click.option("--format", "fmt", type=click.Choice(["table", "json", "html"]), default="table", show_default=True,
              help="html: to DIR/plan.html with --out, else to stdout.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write points.jsonl, plan.json, plan.png and plan.html here.")
@click.option("--mix", is_flag=True, default=False,
              help="Search mixed fleets over the --gpu x --tp types too: the cheapest fleet meeting the target "
                   "(by --price-file; without one, by GPU count) beside the cheapest uniform one, per router.")
@click.option("--max-evaluations", type=int, default=60, show_default=True,
              help="--mix: the most mixed fleets simulated per router (a capped search says so).")
@click.option("--min-capacity", type=float, default=1.0, show_default=True,
              help="--mix: skip mixes whose capacity share sum(count / (uniform count - 1)) is below this "
                   "(1: a linear capacity model's bound; 0: every mix under the uniform cost).")
@click.option("--disagg", is_flag=True, default=False,
              help="Compare the cheapest aggregated fleet (as --mix finds it) with the cheapest prefill/decode "
                   "split (counts and GPU type per role) on the same search, at equal cost too; check both with "
                   "full runs on held-out seeds and n / n-1 along each role.")
@click.option("--pd-router", "pd_routers", default=None, metavar="ROUTER[,ROUTER...]",
              help="--disagg: pair routers for the prefill/decode fleets (pd_llmd, pd_llmd_always, pd_dynamo, "
                   "pd_vllm, pd_joint). Default pd_joint: lbbench's own, which falls back to whole serving on a "
                   "split that is wrong for the traffic.")
@click.option("--kv-link", default=None, metavar="NAME|BYTES_S[@LATENCY_S]",
              help="--disagg: the link a request's KV crosses from prefill to decode (nvlink4, nvlink3, rdma-400g, "
                   "rdma-200g, pcie5, pcie4). Default rdma-400g.")
@trace_transform_options
def plan_cmd(**kw: Any) -> None:
    """How many instances of which GPU does this traffic need to meet its SLO?

    For every GPU x TP the profile is derived (physics, not measured: `lbbench profile derive`'s vLLM V1 with chunked
    prefill and the shipped calibration), and the smallest instance count whose
    SLO attainment meets the target is searched on the simulator (exponential probe, bisection, paired seeds).

    \b
    Examples:
      lbbench plan --workload paper-mix --rate 20 --slo ttft=2,tbt=0.1 --attainment 0.95 \\
          --model llama-3.1-8b --gpu a100-80gb,h100,l4
      lbbench plan --trace prod.parquet --rate 50 --slo ttft=1,tbt=0.05 --model llama-3.1-70b \\
          --gpu h100,a100-80gb --tp 2,4,8 --price-file prices.toml --format json --out runs/plan
      lbbench plan --mix --workload paper-mix --rate 100 --slo ttft=2,tbt=0.1 --attainment 0.95 \\
          --model llama-3.1-8b --gpu a100-80gb,h100,l4 --router round_robin,jsq_speed \\
          --price-file examples/prices.example.toml
      lbbench plan --disagg --workload poisson --prompt-tokens 3000:0.5 --output-tokens 64:0.5 --rate 32 \\
          --slo ttft=1,tbt=0.025 --attainment 0.9 --model llama-3.1-8b --gpu a100,h100 \\
          --price-file examples/prices.example.toml
    """
    from ..planning.render import attainment_png, print_table, to_html, to_json  # lazy: start-up time

    check_disagg_flags(kw)
    cfg = plan_config_from_flags(kw)
    out_dir = Path(kw["out_dir"]) if kw["out_dir"] else None
    if kw["disagg"]:
        from .plan_disagg import plan_disagg_cmd  # lazy: start-up time

        plan_disagg_cmd(cfg, kw, out_dir)
        return
    if kw["mix"]:
        _plan_mix(cfg, kw, out_dir)
        return
    if out_dir is not None and (out_dir / "points.jsonl").exists():
        (out_dir / "points.jsonl").unlink()  # a fresh plan: points of an earlier one do not mix in

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err_console, transient=True, disable=not err_console.is_terminal)
    searches = progress.add_task("searches", total=None)

    def note(message: str) -> None:
        progress.console.print(message, highlight=False, soft_wrap=True)

    def done(outcome: Any) -> None:  # progress only (transient): the rows are the result
        k, res = outcome.key, outcome.result
        got = f"{res.instances} instance(s)" if res else "target not met"
        progress.update(searches, advance=1, description=f"last: {k['gpu']} TP {k['tp']} {k['router']}: {got} "
                                                         f"({len(outcome.points)} counts, {outcome.wall_s:.1f} s)")
        if out_dir is not None:
            write_outcome(out_dir, outcome)

    with progress:
        plan = plan_capacity(cfg, note=note, on_outcome=done)
    png = attainment_png(plan) if plan.outcomes else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "plan.json").write_text(to_json(plan) + "\n")
        if png is not None:
            (out_dir / "plan.png").write_bytes(png)
        (out_dir / "plan.html").write_text(to_html(plan, png))
    fmt = kw["fmt"]
    if fmt == "json":
        click.echo(to_json(plan))
    elif fmt == "html":
        if out_dir is None:
            click.echo(to_html(plan, png))
        else:
            note(f"wrote {out_dir / 'plan.html'}")
    else:
        print_table(plan, Console() if sys.stdout.isatty() else Console(width=200))
        if out_dir is not None:
            Console().print(f"[dim]wrote {out_dir}/plan.json, plan.png, plan.html, points.jsonl[/dim]")
    if not plan.complete:
        sys.exit(130)


def _plan_mix(cfg: Any, kw: dict[str, Any], out_dir: Path | None) -> None:
    """``--mix``: the cheapest fleet per router (``planning.mix``), as a table or JSON (and ``DIR/mix.json``)."""
    from ..planning.mix import plan_mix, print_mix  # lazy: start-up time (the fleet search, ~15 ms)

    if kw["fmt"] == "html":
        raise InputError("--mix writes a table or JSON; give --format table or json", "format")

    def note(message: str) -> None:
        err_console.print(message, highlight=False, soft_wrap=True)

    def done(s: Any) -> None:
        note(f"{s.router} {s.instance_scheduler}: {s.spec(s.best)} ({len(s.points)} fleets simulated, "
             f"{s.wall_s:.1f} s)")

    plan = plan_mix(cfg, max_evaluations=kw["max_evaluations"], min_capacity=kw["min_capacity"],
                    profile_dir=None if out_dir is None else out_dir / "profiles", note=note, on_search=done)
    doc = {"model": cfg.model, "rate_per_s": cfg.run.rate_per_s, "slo": kw["slo"], "attainment": cfg.attainment,
           "price_file": cfg.price_file, "wall_s": round(plan.wall_s, 3), "skipped": plan.skipped,
           "searches": [s.record() for s in plan.searches]}
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "mix.json").write_text(json.dumps(doc, indent=2) + "\n")
    if kw["fmt"] == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    traffic = f"trace {cfg.run.trace}" if cfg.run.trace else cfg.run.workload
    title = (f"{cfg.model}: cheapest fleet for {traffic} at {cfg.run.rate_per_s:g} req/s with "
             f"{100 * cfg.attainment:g} % of requests within {cfg.slo.describe()}")
    console = Console() if sys.stdout.isatty() else Console(width=220)
    print_mix(plan, title, console)
    console.print(f"[dim]search: {plan.wall_s:.1f} s, {sum(len(s.points) for s in plan.searches)} fleets "
                  "simulated[/dim]", highlight=False)


plan = plan_cmd
