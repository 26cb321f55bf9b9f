"""Flags shared by several commands: from the library's field names to the flags, options, value parsers.

Library errors name what is wrong in the library's terms (``lbbench.errors``): a ``RunConfig`` field, a trace
option, a predictor spec. ``FLAGS`` says which flag sets each, so that the one line a user reads names the
flag (``--rate: -1 must be > 0 requests/s``). A field with no flag keeps its own name.

The option decorators and value parsers below are used by more than one command module; a command module
imports them from here, never from another command module.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import click

from ..experiment import ConfigError
from ..metrics.summary import Slo

FLAGS: dict[str, str] = {
    # RunConfig
    "profile": "--profile", "instances": "--instances", "fleet": "--fleet", "kv_link": "--kv-link",
    "instance_schedulers": "--instance-scheduler",
    "chunked_prefill": "--chunked-prefill", "prefix_caching": "--prefix-caching", "workload": "--workload",
    "trace": "--trace", "rate_per_s": "--rate", "rates": "--rate", "requests": "--requests", "orders": "--order",
    "seeds": "--seeds", "seed": "--seed", "burstiness": "--burstiness", "prompt_tokens": "--prompt-tokens",
    "output_tokens": "--output-tokens", "routers": "--router", "router_options": "--router-opt",
    "predictor": "--predictor", "admission": "--admission", "tenants": "--tenants",
    "signal_lag_s": "--signal-lag-s", "timeline_interval_s": "--timeline-interval", "slo": "--slo", "jobs": "--jobs",
    "endpoints": "--endpoint", "endpoint": "--endpoint", "kv_events": "--kv-events",
    "launch_model": "--launch", "launch_args": "--launch-args", "model": "--model",
    "api": "--api", "engine": "--engine", "prompt_mode": "--prompt-mode", "tokenizer": "--tokenizer",
    "vllm_python": "--vllm-python", "request_timeout_s": "--request-timeout", "checkpoint": "--checkpoint",
    "stream_workers": "--stream-workers", "load_workers": "--load-workers", "send_lead_s": "--send-lead",
    "ray_address": "--ray", "ray": "--ray", "decisions": "--decisions", "counterfactual": "--counterfactual",
    "counterfactual_every": "--counterfactual-every",
    "saturation_threshold_per_s": "--saturation-threshold", "saturation_window_s": "--saturation-window",
    "on_saturation": "--on-saturation", "saturation_stop": "--no-saturation-stop",
    # trace options (lbbench run --trace, lbbench trace ...)
    "trace_format": "--trace-format", "mapping": "--mapping", "skip_bad_rows": "--skip-bad-rows",
    "time_scale": "--time-scale", "window": "--window", "max_prompt_tokens": "--max-prompt-tokens",
    "prompt_overflow": "--prompt-overflow",
    # lbbench plan
    "gpu": "--gpu", "tp": "--tp", "attainment": "--attainment", "max_instances": "--max-instances",
    "price_file": "--price-file", "max_evaluations": "--max-evaluations", "min_capacity": "--min-capacity",
    "pd_routers": "--pd-router", "mix": "--mix", "disagg": "--disagg",
    # lbbench run --find-rate
    "find_rate_start": "--find-rate-start", "find_rate_tol": "--find-rate-tol",
    # other commands
    "router": "--router", "data": "--data", "pair": "--pair", "max_regression": "--max-regression",
    "label": "--label",
    "metric": "--metric", "test_fraction": "--test-fraction", "port_base": "--port-base", "port": "--port",
    "kind": "--kind", "guidance_schedule": "--guidance-schedule", "format": "--format",
    "estimator": "--estimator", "discount": "--discount", "max_model_len": "--max-model-len",
    "num_requests": "--requests", "scheme": "--scheme", "encoder": "--encoder",
    "cpus_per_instance": "--cpus-per-instance", "api_server_cores": "--api-server-cores",
    "calibrate_on": "--calibrate-on", "check_on": "--check-on",
}

_LEADING_FIELD = re.compile(r"^([a-z][a-z_]*)(?=[: ])")


def user_message(exc: BaseException) -> str:
    """The first line of a user error, with a leading field name replaced by its flag."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    m = _LEADING_FIELD.match(text)
    if m and m.group(1) in FLAGS:
        return FLAGS[m.group(1)] + text[len(m.group(1)):]
    return text


def admission_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--admission SPEC`` and ``--tenants SPEC`` -> keywords ``admission``, ``tenants`` (``lbbench.admission``)."""
    f = click.option("--tenants", default=None, metavar="NAME[:PRIORITY][@SHARE],...",
                     help="Tenants (flow control's fairness ids) and their priority bands, higher first; a run draws "
                          "them for its requests by share (a session keeps one), the proxy reads them from the "
                          "x-llm-d-inference-fairness-id header and refuses another tenant with 400.")(f)
    return click.option("--admission", default=None,
                        metavar="max_queue=N[,max_outstanding=N][,fairness=round_robin|fcfs]",
                        help="Flow control at the gateway (as llm-d's): requests wait there while every instance "
                             "has max_outstanding in flight (default: its max_num_seqs), are released by priority "
                             "band and tenant, and are shed over max_queue (429; 503 when displaced); a shed "
                             "request is a record.")(f)


def api_server_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--api-server-cores client|instance`` -> keyword ``api_server_cores`` (with ``--cpus-per-instance``)."""
    return click.option("--api-server-cores", "api_server_cores", type=click.Choice(["client", "instance"]),
                        default="client", show_default=True,
                        help="Where each CPU instance's API server (HTTP, tokenizer, detokenizer, streaming) "
                             "runs when --cpus-per-instance pins it: client, on the client's cores, leaving the "
                             "instance's cores to its engine core alone, as a GPU host leaves the GPU to the model; "
                             "instance, beside its engine core.")(f)


_PIN_WITH_LAUNCH = ("With --launch on CPUs: pin each instance to its own N cores and this client to the rest, "
                    "so that instances do not share compute (as GPU instances do not); refused when "
                    "instances x N + 1 exceeds the cores. Default: the cores split between instances, unpinned.")


def cpus_per_instance_option(help: str = _PIN_WITH_LAUNCH) -> Callable[[Any], Any]:
    """``--cpus-per-instance N`` (None without the flag) -> keyword ``cpus_per_instance``; ``help`` as the
    command says it (the default: the pinning of ``--launch``'s instances)."""
    return click.option("--cpus-per-instance", type=click.IntRange(min=1), default=None, help=help)


def vllm_python_option(help: str | None = None) -> Callable[[Any], Any]:
    """``--vllm-python FILE`` (None without the flag) -> keyword ``vllm_python``."""
    return click.option("--vllm-python", default=None, type=click.Path(dir_okay=False), help=help)


def log_dir_option(default: str, help: str | None = None) -> Callable[[Any], Any]:
    """``--log-dir DIRECTORY`` of the launched servers' logs -> keyword ``log_dir``."""
    return click.option("--log-dir", type=click.Path(file_okay=False), default=default, show_default=True,
                        help=help)


def port_option(flag: str, default: int, help: str | None = None) -> Callable[[Any], Any]:
    """A TCP port, ``flag`` (``--port``, ``--port-base``) -> its keyword (``port``, ``port_base``)."""
    return click.option(flag, type=click.IntRange(1, 65535), default=default, show_default=True, help=help)


def repeats_option(default: int, help: str) -> Callable[[Any], Any]:
    """``--repeats N`` (N >= 1) of the live replays -> keyword ``repeats``."""
    return click.option("--repeats", type=click.IntRange(min=1), default=default, show_default=True, help=help)


def seed_option(default: int, help: str) -> Callable[[Any], Any]:
    """``--seed N`` of the replayed requests -> keyword ``seed``."""
    return click.option("--seed", type=int, default=default, show_default=True, help=help)


def ttft_fit_option(default: str) -> Callable[[Any], Any]:
    """``--ttft-fit`` of the calibration (``profile calibrate`` and ``fidelity --calibrate-on``)."""
    return click.option(
        "--ttft-fit", type=click.Choice(["mean", "split"]), default=default, show_default=True,
        help="How the calibration fits the time to first token: split fits the per-token prefill cost to how TTFT "
             "grows with the prompt (longer half against shorter half) and the API overhead to the shorter half "
             "(transfers to other prompt lengths); mean fits the prefill cost alone to the mean.")


#: ``--predictor`` of the replays that calibrate and check a profile (``profile calibrate``, ``fidelity``)
predictor_option = click.option("--predictor", default="oracle", show_default=True,
                                help="Output-length predictor (as run).")


def ray_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--ray [auto|ADDRESS]`` -> keyword ``ray_address``: None without the flag, ``"auto"`` for ``--ray`` alone.

    ``auto`` joins the cluster named by ``RAY_ADDRESS`` when it is set, else a cluster running on this machine
    (``ray start --head``), else starts a local one. ``RAY_ADDRESS`` alone does not turn Ray on.
    Give the value to ``lbbench.distributed.get_executor(jobs, ray_address)``.
    """
    return click.option(
        "--ray", "ray_address", is_flag=False, flag_value="auto", default=None, metavar="[auto|ADDRESS]",
        help="Run the simulated units as Ray tasks (needs the ray extra). `--ray` alone = auto: the cluster in "
             "RAY_ADDRESS, else one started on this machine with `ray start --head`, else a local one; or "
             "HEAD:6379 / ray://HEAD:10001.")(f)


def options(*decorators: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Several click options as one decorator."""
    def apply(f: Any) -> Any:
        for d in reversed(decorators):
            f = d(f)
        return f
    return apply


backend_and_workload_options = options(
    click.option("--endpoint", multiple=True, help="Live instances (base URLs); repeat the flag for each."),
    click.option("--launch", "launch_model", default=None,
                 help="Start --instances vLLM servers for this model (`tiny`: the tiny local model), configured "
                      "as the profile says (max_num_seqs, token budget, chunked prefill, prefix caching)."),
    click.option("--instances", type=click.IntRange(min=1), default=2, show_default=True, help="With --launch."),
    cpus_per_instance_option(),
    api_server_option,
    click.option("--workload", default="poisson", show_default=True,
                 help="paper-mix, paper-classes, poisson, dataset:FILE (ignored with --trace)."),
    click.option("--trace", default=None, type=click.Path(dir_okay=False), help="Replay this trace instead."),
    click.option("--max-prompt-tokens", type=click.IntRange(min=1), default=None,
                 help="With --trace: drop requests with longer prompts (e.g. to fit a small test model)."),
    click.option("--prompt-tokens", default="128", show_default=True,
                 help="Poisson workload prompt lengths: N or MEAN:CV (lognormal)."),
    click.option("--output-tokens", default="128", show_default=True,
                 help="Poisson workload output lengths: N or MEAN:CV."),
)
"""The live backend (``--endpoint`` or ``--launch``) and the workload of ``fidelity`` and ``profile calibrate``."""

load_options = options(
    click.option("--requests", type=click.IntRange(min=1), default=150, show_default=True),
    click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
                 help="Arrival rate (req/s); with --trace, the trace is rescaled to it."),
)
"""``--requests`` and ``--rate`` of ``fidelity`` and ``profile calibrate``."""


def split_csv(value: str | None) -> list[str]:
    """``a, b,,c`` -> ``["a", "b", "c"]``; None -> ``[]``."""
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def parse_value(text: str) -> Any:
    """A ``KEY=VALUE`` value as typed: true/false words -> bool, then int, then float, else the string."""
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


def read_endpoints_file(path: str) -> list[str]:
    """The http(s) URLs of an ``--endpoints`` file, one a line, ``#`` comments allowed."""
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


def parse_slo(text: str | None) -> Slo | None:
    """``ttft=0.5,tbt=0.1,e2e=30`` (seconds) -> Slo; raises BadParameter naming --slo."""
    if text is None:
        return None
    limits: dict[str, float] = {}
    for part in text.split(","):
        name, sep, val = part.partition("=")
        name = name.strip().lower()
        if not sep or name not in ("ttft", "tbt", "e2e"):
            raise click.BadParameter(f"{part.strip()!r}: expected ttft=S, tbt=S or e2e=S "
                                     "(seconds), comma-separated", param_hint="'--slo'")
        try:
            v = float(val)
        except ValueError:
            raise click.BadParameter(f"{name}={val!r} is not a number of seconds",
                                     param_hint="'--slo'") from None
        if not v > 0:
            raise click.BadParameter(f"{name} must be > 0 seconds", param_hint="'--slo'")
        limits[f"{name}_s"] = v
    return Slo(**limits)


def slo_limits(value: str | None) -> dict[str, float]:
    """``--slo`` as the keyword limits of ``Slo`` that were given (``{}`` without the flag); ConfigError if bad."""
    if value is None:
        return {}
    try:
        slo = parse_slo(value)
    except click.BadParameter as exc:
        raise ConfigError(f"--slo: {exc.message}") from None
    return {k: v for k, v in vars(slo).items() if v is not None}
