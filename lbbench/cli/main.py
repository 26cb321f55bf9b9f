"""The `lbbench` command group, its error handling, and the small listing commands.

Each command module parses flags, builds the library's typed config, calls the library and renders
(``run.py`` for ``lbbench run``).

Bad input (``lbbench.errors.InputError``) or a setup that does not work (``SetupError``, its sibling under
``UserError``) ends with one line naming the flag or file and what is wrong, and exit code 2. Everything measured
is written as it completes; Ctrl-C keeps what was measured and marks the run incomplete.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

import click

from ..errors import UserError
from ..profiles import available_profiles, load_profile
from ..routers import available_routers
from .flags import user_message


class LbbenchGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            click.echo(f"Error: {user_message(exc)}", err=True)
            ctx.exit(2)


@click.group(cls=LbbenchGroup)
@click.version_option(package_name="lbbench")
def main() -> None:
    """lbbench: benchmark LLM request routers on simulated or live clusters."""


@main.command("routers")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def routers_cmd(fmt: str) -> None:
    """List the registered routers."""
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
    # lazy: start-up time (the roofline's GPU and model tables, ~12 ms)
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


def _add_optional_commands() -> None:
    for mod, names in (("lbbench.cli.run", ("run",)), ("lbbench.cli.trace", ("trace",)), ("lbbench.cli.predict", ("predictor",)),
                       ("lbbench.cli.report", ("report", "compare")),
                       ("lbbench.cli.history", ("history",)), ("lbbench.cli.live", ("launch", "serve_sim")),
                       ("lbbench.cli.train", ("train",)), ("lbbench.cli.profile", ("profile",)),
                       ("lbbench.cli.fidelity", ("fidelity",)), ("lbbench.cli.proxy", ("proxy",)),
                       ("lbbench.cli.paper", ("paper",)), ("lbbench.cli.plan", ("plan",)),
                       ("lbbench.cli.headroom", ("headroom",)), ("lbbench.cli.measured", ("measured",))):
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
