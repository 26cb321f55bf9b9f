"""``lbbench run --find-rate``: the highest arrival rate at which an SLO holds, per router x instance scheduler.

For every router x instance scheduler of a ``RunConfig``, ``search.max_rate`` probes rates (exponentially from
a start rate, then geometric bisection to a relative tolerance, rates rounded to three significant digits).
Each probe is the attainment ``lbbench run --slo`` reports (``metrics.summary``'s ``slo_attainment``, averaged
over variants and seeds) on the same seeds at every rate (paired seeds in the simulator; repeats live), and
runs its seeds one at a time through ``search.sequential_attainment``: once the seeds left cannot change
whether the probe meets the target, they are not run (a probe far past the threshold usually stops after its
first seed). The decisions, hence the bracket, are those of running every seed.

Every seed of every probe is an ordinary run directory (``run_experiment``, the one runner, simulated or live):
``OUT/<router>-<scheduler>/rate<RATE>/seed<SEED>/``; ``OUT/find_rate.json`` holds the rows and every probe.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.table import Table

from ..experiment import ConfigError, Reporter, RunConfig, run_experiment
from ..profiles import Profile
from .search import Probe, RateResult, max_rate, sequential_attainment

#: significant digits of the probed rates (run directory names stay readable)
RATE_DIGITS = 3


@dataclass
class FindRateConfig:
    run: RunConfig
    """Everything but the rate: workload, routers, schedulers, seeds, ``slo``; ``rate_per_s`` unused."""
    attainment: float = 0.99
    start_per_s: float = 10.0
    rel_tol: float = 0.02
    max_rate_per_s: float | None = None

    def check(self) -> None:
        if not self.run.slo:
            raise ConfigError("--find-rate needs --slo (the latency limits the rate must keep)", "slo")
        if self.run.rates:
            raise ConfigError("--find-rate searches the rate itself; drop --rate (--find-rate-start sets where "
                              "the search begins)", "rates")
        if not 0 < self.attainment <= 1:
            raise ConfigError(f"{self.attainment:g} must be in (0, 1] (a share of requests)", "attainment")
        if not self.start_per_s > 0:
            raise ConfigError(f"{self.start_per_s:g} must be > 0 requests/s", "find_rate_start")
        if not self.rel_tol > 0:
            raise ConfigError(f"{self.rel_tol:g} must be > 0", "find_rate_tol")


@dataclass
class FindRateRow:
    router: str
    instance_scheduler: str
    result: RateResult
    probes: dict[float, Probe] = field(default_factory=dict)
    wall_s: float = 0.0

    def record(self) -> dict[str, Any]:
        r = self.result
        return {"router": self.router, "instance_scheduler": self.instance_scheduler, "rate_per_s": r.rate,
                "bracket": list(r.bracket), "attainment": r.attainment, "attainment_above": r.attainment_above,
                "monotone": r.monotone, "converged": r.converged, "wall_s": round(self.wall_s, 3),
                "probes": [{"rate_per_s": rate, "attainment": p.attainment, "met": p.met,
                            "seeds_run": p.seeds_run, "seeds": p.seeds, "low": p.low, "high": p.high}
                           for rate, p in sorted(self.probes.items())]}


def rate_dir(out_dir: Path, router: str, sched: str, rate: float) -> Path:
    return out_dir / f"{router}-{sched}" / f"rate{rate:g}"


def find_rates(fc: FindRateConfig, out_dir: Path | str, profile: Profile, *,
               reporter: Reporter | None = None) -> list[FindRateRow]:
    """One row per router x instance scheduler (see the module docstring); ``find_rate.json`` is rewritten
    after each row."""
    fc.check()
    out = Path(out_dir)
    reporter = reporter or Reporter()
    base = fc.run.resolved()
    base.check(profile)
    rows: list[FindRateRow] = []
    for sched in base.instance_schedulers:
        for router in base.routers:
            t0 = time.perf_counter()
            probes: dict[float, Probe] = {}

            def attainment_at(rate: float, router: str = router, sched: str = sched,
                              probes: dict[float, Probe] = probes) -> float:
                def one_seed(k: int) -> float:
                    cfg = replace(base, rate_per_s=rate, routers=[router], instance_schedulers=[sched], seeds=1,
                                  seed=base.seed + k)
                    got = run_experiment(cfg, rate_dir(out, router, sched, rate) / f"seed{base.seed + k}",
                                         profile=profile, reporter=reporter)
                    if not got.complete:
                        raise KeyboardInterrupt  # an interrupted probe decides nothing
                    values = got.summary["slo_attainment"].drop_nulls()
                    return float(values.mean()) if values.len() else 0.0

                probe = sequential_attainment(one_seed, base.seeds, fc.attainment)
                probes[rate] = probe
                reporter.note(f"{router} {sched}: {rate:g} req/s -> {100 * probe.attainment:.1f} % "
                              f"({'meets' if probe.met else 'misses'}; {probe.seeds_run}/{probe.seeds} seeds)")
                return probe.decided()

            result = max_rate(attainment_at, fc.attainment, fc.start_per_s, rel_tol=fc.rel_tol,
                              hi=fc.max_rate_per_s, digits=RATE_DIGITS)
            rows.append(FindRateRow(router, sched, result, probes, time.perf_counter() - t0))
            write_json(out, fc, rows)
    return rows


def write_json(out: Path, fc: FindRateConfig, rows: list[FindRateRow]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {"attainment": fc.attainment, "slo": fc.run.slo, "start_per_s": fc.start_per_s, "rel_tol": fc.rel_tol,
           "seeds": fc.run.seeds, "seed": fc.run.seed, "rows": [r.record() for r in rows]}
    (out / "find_rate.json").write_text(json.dumps(doc, indent=2) + "\n")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def print_rates(rows: list[FindRateRow], fc: FindRateConfig, title: str, console: Any) -> None:
    """The table: router, scheduler, rate found, bracket, attainment at the rate and at the bracket's top."""
    table = Table(title=title)
    for name in ("router", "scheduler", "rate (req/s)", "bracket (req/s)", "at rate", "above", "probes",
                 "seeds run", "wall (s)"):
        table.add_column(name, justify="left" if name in ("router", "scheduler") else "right")
    for r in rows:
        res = r.result
        lo, hi = res.bracket
        bracket = f"[{_rate(lo)}, {_rate(hi) if hi is not None else '>'}]"
        flag = "" if res.monotone else "*"
        table.add_row(r.router, r.instance_scheduler, _rate(res.rate) + flag, bracket, _pct(res.attainment),
                      _pct(res.attainment_above), str(len(res.points)),
                      str(sum(p.seeds_run for p in r.probes.values())), f"{r.wall_s:.1f}")
    console.print(table)
    if any(not r.result.monotone for r in rows):
        console.print("* attainment rose with the rate somewhere among the probes; the bracket holds for the "
                      "probed rates")
    console.print(f"[dim]rate: the highest probed rate with >= {100 * fc.attainment:g} % of requests within "
                  f"the SLO; bracket: \\[last rate meeting, first missing]; above: attainment at the bracket's top "
                  "(a probe stopped early shows the bound that decided it)[/dim]", highlight=False)
