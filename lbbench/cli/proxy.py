"""``lbbench proxy``: serve an OpenAI-compatible gateway in front of a fleet, routed by an lbbench router."""

from __future__ import annotations

import asyncio
import signal

import click

from ..admission import parse_admission, parse_tenants
from ..experiment.config import profile_ref, split_endpoint
from ..fleet import FleetError, parse_fleet, split_role
from ..live.kv_events import address_problem
from ..predict import load_predictor
from ..profiles import load_profile
from ..routers import get_router
from ..routers.registry import KV_EVENTS_REFUSAL, ORACLE_REFUSAL, is_pair_router, needs_kv_events, needs_simulator
from .flags import admission_options, parse_value, read_endpoints_file


@click.command("proxy")
@click.option("--endpoint", "endpoints", multiple=True, metavar="URL[@PROFILE[:ROLE]]",
              help="A backend (base URL); repeat for each. URL@PROFILE: the router may assume that profile of it; "
                   "URL@PROFILE:prefill|decode: a prefill/decode fleet for a pair router (llm-d's P/D protocol).")
@click.option("--endpoints", "endpoints_file", default=None, type=click.Path(dir_okay=False),
              help="A file with one backend URL per line.")
@click.option("--kv-events", "kv_events", multiple=True, metavar="tcp://HOST:PORT",
              help="A backend's KV-event publisher (vLLM's --kv-events-config, serve-sim --kv-events-port-base); "
                   "repeat once per --endpoint, in order. Feeds precise_prefix's index.")
@click.option("--router", default="round_robin", show_default=True, help="Router name (lbbench routers).")
@click.option("--router-opt", "router_opts", multiple=True, help="KEY=VALUE option for the router.")
@click.option("--predictor", default=None, help="Output-length predictor (default: the request's max_tokens).")
@click.option("--profile", default=None, help="Profile whose limits the router may assume for every backend.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--api-key", default=None, help="Require `Authorization: Bearer KEY`.")
@click.option("--max-body-mb", type=click.FloatRange(min=0.001), default=8.0, show_default=True,
              help="Refuse request bodies larger than this (413).")
@click.option("--max-retries", type=click.IntRange(min=0), default=2, show_default=True,
              help="Re-route a request whose backend failed before its first byte.")
@click.option("--drain-timeout", "drain_timeout_s", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="On SIGTERM, seconds to let in-flight requests finish.")
@click.option("--seed", type=int, default=0, show_default=True)
@admission_options
@click.option("--signal-lag-s", "signal_lag_s", type=float, default=0.0, show_default=True, metavar="S",
              help="The router sees what the backends report (first tokens, finishes, health) S seconds late, as "
                   "a scraped or published signal (its own dispatches at once).")
def proxy(endpoints: tuple[str, ...], endpoints_file: str | None, router: str, router_opts: tuple[str, ...],
          predictor: str | None, profile: str | None, host: str, port: int, api_key: str | None,
          max_body_mb: float, max_retries: int, drain_timeout_s: float, seed: int, admission: str | None,
          tenants: str | None, signal_lag_s: float, kv_events: tuple[str, ...]) -> None:
    """An OpenAI-compatible gateway (/v1/completions, /v1/chat/completions, streaming or not; /v1/models,
    /health, /metrics) routing with lbbench's dispatcher and ROUTER; drains on SIGTERM."""
    from aiohttp import web  # lazy: start-up time (aiohttp and the gateway, ~190 ms)

    from ..harness.replay import normalize_endpoint  # lazy: start-up time (aiohttp and the gateway, ~190 ms)
    from ..proxy.gateway import Gateway, ProxyConfig  # lazy: start-up time (aiohttp and the gateway, ~190 ms)

    given = list(endpoints) + (read_endpoints_file(endpoints_file) if endpoints_file else [])
    urls = [normalize_endpoint(split_endpoint(u)[0]) for u in given]
    if not urls:
        raise click.UsageError("give at least one --endpoint URL (or --endpoints FILE)")
    opts = {}
    for o in router_opts:
        k, eq, v = o.partition("=")
        if not eq:
            raise click.BadParameter(f"{o!r}: expected KEY=VALUE", param_hint="--router-opt")
        opts[k] = parse_value(v)
    adm = parse_admission(admission) if admission is not None else None
    known = parse_tenants(tenants) if tenants is not None else None
    prof = load_profile(profile) if profile else None
    specs = backend_specs(given, prof)
    fleet_prof = prof
    if specs is not None and prof is None:
        fleet_prof = load_profile(split_role(split_endpoint(given[0])[1] or "")[0])
    pair, roles = is_pair_router(router), specs is not None and any(s.role != "mixed" for s in specs)
    if pair and not roles:
        raise click.BadParameter(f"{router} routes prefill/decode pairs: give backends with roles "
                                 "(--endpoint URL@PROFILE:prefill, --endpoint URL@PROFILE:decode)", param_hint="--router")
    if roles and not pair:
        raise click.BadParameter(f"{router} routes whole requests; backends with prefill/decode roles need a pair "
                                 "router", param_hint="--router")
    if needs_simulator(router):
        raise click.BadParameter(ORACLE_REFUSAL.format(name=router), param_hint="--router")
    if needs_kv_events(router) and not kv_events:
        raise click.BadParameter(KV_EVENTS_REFUSAL.format(name=router), param_hint="--router")
    problem = address_problem(kv_events, len(urls))
    if problem:
        raise click.BadParameter(problem, param_hint="--kv-events")
    r = get_router(router, num_instances=len(urls), seed=seed, profile=fleet_prof, **opts)
    pred = None
    if predictor:
        pred = load_predictor(predictor, profile=prof, seed=seed)
    if specs is None and prof is not None:
        specs = [prof.instance_spec()] * len(urls)
    cfg = ProxyConfig(backends=urls, router=r, specs=specs,
                      predictor=pred, api_key=api_key, max_body_bytes=int(max_body_mb * (1 << 20)),
                      max_retries=max_retries, min_step_s=fleet_prof.min_step_s if fleet_prof else 0.02,
                      admission=adm, tenants=known, signal_lag_s=signal_lag_s, kv_events=list(kv_events))
    gw = Gateway(cfg)

    async def main() -> None:
        runner = web.AppRunner(gw.app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        click.echo(f"lbbench proxy on http://{host}:{port} routing {len(urls)} backend(s) with {router} "
                   "(SIGTERM or Ctrl-C drains and stops)", err=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        click.echo("draining...", err=True)
        await gw.drain(drain_timeout_s)
        await runner.cleanup()

    from ..live.drive import new_event_loop  # lazy: start-up time (aiohttp and the gateway, ~190 ms)
    try:
        with asyncio.Runner(loop_factory=new_event_loop) as runner_:
            runner_.run(main())
    except OSError as exc:
        raise click.UsageError(f"--port {port}: {exc.strerror or exc}") from None
    click.echo("stopped", err=True)


def backend_specs(endpoints: list[str], profile) -> list | None:
    """What the router may assume of each backend given as ``URL@PROFILE[:ROLE]`` (``--fleet``'s parser on the
    profiles and roles; a bare URL takes ``--profile``); None when no backend names a profile."""
    refs = [split_endpoint(e)[1] for e in endpoints]
    if not any(refs):
        return None
    entries = []
    for text, ref in zip(endpoints, refs):
        if ref is None and profile is None:
            raise click.BadParameter(f"{text}: give every backend a profile (URL@PROFILE) or --profile",
                                     param_hint="--endpoint")
        name, role = split_role(ref) if ref else (profile_ref(profile), "mixed")
        entries.append(f"{name}:1" + ("" if role == "mixed" else f":{role}"))
    try:
        return parse_fleet(",".join(entries)).instance_specs()
    except FleetError as exc:
        raise click.BadParameter(str(exc).removeprefix("fleet: "), param_hint="--endpoint") from None
