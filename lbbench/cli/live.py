"""Live-cluster commands: ``lbbench launch`` (local vLLM servers) and
``lbbench serve-sim`` (emulated instances timed by the simulator).

Both print one endpoint URL per line once the servers are up and run until
Ctrl-C or SIGTERM, then stop every server they started. ``--endpoints-file``
writes the URLs for ``lbbench run --endpoints FILE``.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import click

from ..engines.vllm.launcher import LaunchError
from ..engines.vllm.launcher import launch as launch_servers  # `launch` is this module's command
from ..experiment.config import profile_ref
from ..fleet import FleetError, parse_fleet
from ..kv_links import DEFAULT_LINK, KVLinkError, kv_bytes_per_token, parse_kv_link
from ..profiles import ProfileError
from .flags import (api_server_option, cpus_per_instance_option, log_dir_option, port_option, user_message,
                    vllm_python_option)


def _write_endpoints(path: str | None, urls: list[str]) -> None:
    if path:
        Path(path).write_text("".join(u + "\n" for u in urls))


def _announce(urls: list[str], what: str, endpoints_file: str | None) -> None:
    _write_endpoints(endpoints_file, urls)
    click.echo(f"{len(urls)} {what} ready (Ctrl-C to stop):", err=True)
    for u in urls:
        click.echo(u)


@click.command("launch", context_settings={"ignore_unknown_options": False})
@click.argument("model")
@click.option("--instances", type=click.IntRange(min=1), default=None,
              help="Servers to start (default: one per visible GPU, 1 without GPUs).")
@click.option("--chunked-prefill", type=click.Choice(["on", "off", "default"]), default="default",
              show_default=True, help="vLLM chunked prefill.")
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=None, help="vLLM --max-num-seqs.")
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=None,
              help="vLLM --max-num-batched-tokens.")
@vllm_python_option(help="Python of the vLLM environment (default: `vllm` on the PATH, else .venv-vllm).")
@port_option("--port-base", default=8100, help="Port of the first server; the others follow.")
@log_dir_option(default="runs/launch-logs", help="Where each server's log is kept.")
@click.option("--health-timeout", "health_timeout_s", type=click.FloatRange(min=1), default=600.0,
              show_default=True, help="Seconds to wait for every /health.")
@click.option("--endpoints-file", default=None, type=click.Path(dir_okay=False),
              help="Also write the endpoint URLs to this file.")
@cpus_per_instance_option(help="CPU instances: pin each to its own N cores (no two share compute, as GPUs do "
                               "not); the cores left are for clients. Refused when instances x N + 1 exceeds the "
                               "machine's cores. Default: the cores split between the instances, unpinned.")
@api_server_option
@click.argument("extra_args", nargs=-1, type=click.UNPROCESSED)
def launch_cmd(model: str, instances: int | None, chunked_prefill: str, max_num_seqs: int | None,
               max_num_batched_tokens: int | None, vllm_python: str | None, port_base: int, log_dir: str,
               health_timeout_s: float, endpoints_file: str | None, cpus_per_instance: int | None,
               api_server_cores: str, extra_args: tuple[str, ...]) -> None:
    """Start local vLLM servers for MODEL (``tiny``: the tiny local test model)
    and keep them running until Ctrl-C. Arguments after ``--`` go to vLLM."""
    cp = {"on": True, "off": False, "default": None}[chunked_prefill]
    # Ctrl-C stops the servers even when started from a shell that ignores SIGINT
    # for background jobs (SIGTERM is handled by the launcher).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with launch_servers(model, instances, chunked_prefill=cp, max_num_seqs=max_num_seqs,
                    max_num_batched_tokens=max_num_batched_tokens, extra_args=list(extra_args),
                    vllm_python=vllm_python, log_dir=log_dir, port_base=port_base,
                    health_timeout_s=health_timeout_s, cpus_per_instance=cpus_per_instance,
                    front_end=api_server_cores) as urls:
            _announce(urls, "vLLM server(s)", endpoints_file)
            if urls.placement is not None:
                p = urls.placement.as_dict()
                click.echo(f"cores: instances {', '.join(p['instance_cores'])}; "
                           f"{'clients ' + p['client_cores'] if p['pinned'] else 'unpinned (shared)'}"
                           + (f"; API servers on the {p['front_end']}'s cores" if p['pinned'] else ""), err=True)
            click.echo(f"logs in {log_dir}", err=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    except LaunchError as exc:
        first, rest = user_message(exc), str(exc).partition("\n")[2]
        if not rest:  # a bad layout or flag: the command group prints it in one line (exit 2)
            raise
        click.echo(rest, err=True)  # the server log's tail
        raise click.UsageError(first) from None
    click.echo("servers stopped", err=True)


@click.command("serve-sim")
@click.option("--instances", type=click.IntRange(min=1), default=None,
              help="Emulated instances to serve  [default: 2].")
@click.option("--profile", default=None,
              help="Profile name or .toml path timing each instance (`zero`: steps of 1 us, for "
                   "client benchmarks)  [default: llama3.1-8b-a100].")
@click.option("--fleet", default=None, metavar="PROFILE:N[:ROLE][,PROFILE:N[:ROLE]...]",
              help="A mixed fleet, as `lbbench run --fleet`: each instance timed by its entry's profile (replaces "
                   "--profile and --instances). Endpoints are printed as URL@PROFILE (URL@PROFILE:ROLE with "
                   "prefill/decode roles: llm-d's P/D sidecar protocol), for `lbbench run --endpoint`.")
@click.option("--kv-link", default=DEFAULT_LINK, show_default=True, metavar="NAME|BYTES_S[@LATENCY_S]",
              help="The link a P/D fleet's KV crosses (as `lbbench run --kv-link`).")
@click.option("--port", "port_base", type=click.IntRange(1, 65535), default=8200, show_default=True,
              help="Port of the first instance; the others follow.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--model-name", default=None, help="Served model name (default: the profile's model).")
@click.option("--instance-scheduler", type=click.Choice(["fcfs", "bin_packing", "least_work_left", "priority"]),
              default="fcfs", show_default=True,
              help="Scheduler inside each instance (priority: vLLM's policy, by the requests' `priority` field).")
@click.option("--chunked-prefill", type=click.Choice(["on", "off", "profile"]), default="profile",
              show_default=True, help="Chunked prefill (default: as the profile says).")
@click.option("--endpoints-file", default=None, type=click.Path(dir_okay=False),
              help="Also write the endpoint URLs to this file.")
@click.option("--allow-kill", is_flag=True,
              help="Fault injection: POST /lbbench/kill to an instance crashes it (drops its connections).")
@click.option("--prefix-caching", type=click.Choice(["on", "off", "profile"]), default="profile",
              show_default=True, help="Prefix caching of token-id prompts, by content as vLLM's (profile: as the "
                                      "profile says; on with --kv-events-port-base).")
@click.option("--kv-events-port-base", type=click.IntRange(1, 65535), default=None,
              help="Instance I publishes its KV-cache events on tcp://HOST:PORT+I in vLLM's wire format (ZMQ, "
                   "msgpack), for `lbbench run --kv-events` / `lbbench proxy --kv-events` and precise_prefix.")
def serve_sim_cmd(instances: int | None, profile: str | None, fleet: str | None, kv_link: str, port_base: int,
                  host: str, model_name: str | None, instance_scheduler: str, chunked_prefill: str,
                  endpoints_file: str | None, allow_kill: bool, prefix_caching: str,
                  kv_events_port_base: int | None) -> None:
    """Serve emulated vLLM instances (OpenAI-compatible, /metrics) timed by the simulator.

    \b
    Examples:
      lbbench serve-sim --profile llama3.1-8b-a100 --instances 2
      lbbench serve-sim --fleet llama3.1-8b-a100:1,llama3.1-8b-l4:1 --endpoints-file eps.txt
      lbbench run --endpoints eps.txt --router least_work_speed     # routers assume each URL@PROFILE
      lbbench serve-sim --fleet llama3.1-8b-a100:1:prefill,llama3.1-8b-a100:1:decode --kv-link rdma-400g
      lbbench serve-sim --instances 2 --port 8200 --kv-events-port-base 5557
      lbbench run --endpoint http://127.0.0.1:8200 --kv-events tcp://127.0.0.1:5557 \\
                  --endpoint http://127.0.0.1:8201 --kv-events tcp://127.0.0.1:5558 --router precise_prefix ...
    """
    # lazy: start-up time (the emulator's aiohttp server, ~190 ms)
    from ..engines.vllm.emulator import FleetConfig, resolve_profile, serve_forever

    profiles = roles = None
    try:
        parse_kv_link(kv_link)
    except KVLinkError as exc:
        raise click.BadParameter(str(exc).removeprefix("kv_link: "), param_hint="--kv-link") from None
    if fleet is not None:
        if profile is not None or instances is not None:
            raise click.UsageError(f"--fleet names every instance's profile; give it or "
                                   f"{'--profile' if profile is not None else '--instances'}, not both")
        try:
            parsed = parse_fleet(fleet)
            profiles = parsed.profiles()
            if parsed.is_disaggregated:
                roles = parsed.roles()
                for p in profiles:
                    kv_bytes_per_token(p)
        except (FleetError, KVLinkError) as exc:
            raise click.BadParameter(str(exc).removeprefix("fleet: ").removeprefix("kv_link: "),
                                     param_hint="--fleet") from None
    try:
        prof = profiles[0] if profiles else resolve_profile(profile or "llama3.1-8b-a100")
    except ProfileError as exc:
        raise click.BadParameter(str(exc).removeprefix("profile: "), param_hint="--profile") from None
    caching = {"on": True, "off": False, "profile": None}[prefix_caching]
    if kv_events_port_base is not None:
        if caching is False:
            raise click.BadParameter("the instances publish prefix-cache events: not with --prefix-caching off",
                                     param_hint="--kv-events-port-base")
        caching = True
    cfg = FleetConfig(prof, len(profiles) if profiles else instances or 2, profiles=profiles, host=host,
                      port_base=port_base, model=model_name,
                      scheduler=instance_scheduler,
                      chunked_prefill={"on": True, "off": False, "profile": None}[chunked_prefill],
                      allow_kill=allow_kill, kv_link=kv_link, kv_events_port_base=kv_events_port_base,
                      prefix_caching=caching)
    if kv_events_port_base is not None:
        n = cfg.num_instances
        click.echo(f"KV events: tcp://{host}:{kv_events_port_base} .. tcp://{host}:{kv_events_port_base + n - 1}",
                   err=True)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            what = f"emulated instance(s) of {prof.name}"
            if profiles:  # each URL with the profile routers may assume of it
                what = f"emulated instance(s) of fleet {parse_fleet(fleet).label}"
                await serve_forever(cfg, on_ready=lambda urls: _announce(
                    [f"{u}@{profile_ref(p)}" + (f":{r}" if roles else "")
                     for u, p, r in zip(urls, profiles, roles or profiles)], what, endpoints_file))
            else:
                await serve_forever(cfg, on_ready=lambda urls: _announce(urls, what, endpoints_file))
        except OSError as exc:
            raise click.BadParameter(str(exc).removeprefix("port: "), param_hint="--port") from None

    try:
        asyncio.run(main())
    except (asyncio.CancelledError, KeyboardInterrupt):
        pass
    click.echo("stopped", err=True)


# names the main CLI looks up
launch = launch_cmd
serve_sim = serve_sim_cmd
