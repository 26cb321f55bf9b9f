"""A whole transfer check (``lbbench fidelity --calibrate-on SPEC --check-on SPEC ...``) as one library call.

``TransferCheck`` holds every setting (the command's flags, in the library's names). ``check.workloads()``
parses the workload specs and builds their requests (an ``InputError`` naming ``calibrate_on`` or ``check_on``
when one cannot be used); ``run_transfer_check(check, workloads, urls)`` replays and fits them
(``lbbench.profiling.transfer.run_transfer``), bins the residuals (``lbbench.profiling.residuals``) and, with
``out_dir``, writes ``fidelity.json`` and, for a profile given as a ``.toml`` file, ``calibrated.toml`` (the
profile with the calibration applied, its ``[source]`` saying what it was fitted on).
"""

from __future__ import annotations

import json
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import polars as pl
import tomli_w

from ..core import Request
from ..errors import InputError
from ..experiment import annotated_requests
from ..profiles import Profile
from .calibrate import calibrated_toml
from .residuals import residual_tables
from .transfer import TransferResult, run_transfer
from .workload_spec import WorkloadSpec, parse_workload_spec

FIDELITY_FILE = "fidelity.json"
CALIBRATED_FILE = "calibrated.toml"


@dataclass(frozen=True)
class Workloads:
    """The calibration workload and the check workloads, each a spec and its requests."""

    calibration: tuple[WorkloadSpec, list[Request]]
    checks: list[tuple[WorkloadSpec, list[Request]]]


@dataclass
class TransferCheck:
    """Every setting of a transfer check (module docstring)."""

    profile: Profile
    profile_source: str
    """The profile as given: a name, or a ``.toml`` file (then the calibrated copy is written too)."""
    routers: Sequence[str]
    calibrate_on: str
    check_on: Sequence[str]
    requests: int
    rate_per_s: float
    prompt_tokens: str = "128"
    output_tokens: str = "128"
    calibration_router: str = "round_robin"
    calibration_seed: int = 1
    repeats: int = 3
    seed: int = 0
    predictor: str = "oracle"
    ttft_fit: str = "split"
    warmup_requests: int = 20
    out_dir: Path | None = None

    def workloads(self) -> Workloads:
        """The specs parsed and their requests built; an ``InputError`` naming the spec's field otherwise."""
        cal_spec = parse_workload_spec(self.calibrate_on, "calibrate_on")
        check_specs = [parse_workload_spec(text, "check_on") for text in self.check_on]
        labels = [s.label for s in check_specs]
        if cal_spec.label in labels or len(set(labels)) != len(labels):
            raise InputError("each workload must differ from the others and from --calibrate-on's "
                             "(add seed=N to check on other requests of the same workload)", "check_on")
        return Workloads((cal_spec, self._requests(cal_spec, self.calibration_seed, "calibrate_on")),
                         [(s, self._requests(s, self.seed, "check_on")) for s in check_specs])

    def _requests(self, spec: WorkloadSpec, default_seed: int, field_name: str) -> list[Request]:
        f = spec.run_config_fields({"requests": self.requests, "rate_per_s": self.rate_per_s,
                                    "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                                    "seed": default_seed})
        try:
            return annotated_requests(self.profile, self.profile_source, workload=f.get("workload", "poisson"),
                                      trace=f.get("trace"), max_prompt_tokens=None, rate=f["rate_per_s"],
                                      requests=f["requests"], seed=f["seed"], prompt_tokens=f["prompt_tokens"],
                                      output_tokens=f["output_tokens"], predictor=self.predictor,
                                      trace_options=f.get("trace_options") or {},
                                      burstiness=f.get("burstiness", 1.0))
        except ValueError as exc:  # the workload's own errors, said as the spec's
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InputError(f"{spec.text!r}: {text}", field_name) from None


@dataclass
class TransferReport:
    """What a transfer check found: the result, the residual tables, and the report ``fidelity.json`` holds."""

    result: TransferResult
    residuals: dict[str, pl.DataFrame]
    report: dict[str, Any] = field(default_factory=dict)


def run_transfer_check(check: TransferCheck, workloads: Workloads, urls: Sequence[str], *,
                       placement: dict | None = None, setup_s: float = 0.0,
                       progress: Callable[[str], None] = lambda what: None) -> TransferReport:
    """Replay, fit and compare (module docstring) on the live instances ``urls``; ``placement``: where they run
    (in the report), ``setup_s``: seconds spent starting them (counted in the report's total wall time)."""
    t0 = time.perf_counter()
    cal_spec, cal_reqs = workloads.calibration
    res = run_transfer(check.profile, (cal_spec.label, cal_reqs), [(s.label, r) for s, r in workloads.checks],
                       check.routers, urls, repeats=check.repeats, seed=check.seed,
                       calibration_seed=check.calibration_seed, calibration_router=check.calibration_router,
                       out_dir=check.out_dir, ttft_fit=check.ttft_fit, warmup_requests=check.warmup_requests,
                       progress=progress)
    tables = residual_tables(res.records)
    wall_s = time.perf_counter() - t0
    report = {"profile": check.profile.name, "repeats": check.repeats, "placement": placement, **res.as_dict(),
              "residuals": {k: v.to_dicts() for k, v in tables.items()},
              "wall_s": {"total": round(setup_s + wall_s, 1), "replays_and_fit": round(wall_s, 1)}}
    if check.out_dir is not None:
        out = Path(check.out_dir)
        (out / FIDELITY_FILE).write_text(json.dumps(report, indent=2))
        source = Path(check.profile_source)
        if source.suffix == ".toml" and source.is_file():
            doc = calibrated_toml(tomllib.loads(source.read_text()), res.calibration,
                                  what=f"{len(cal_reqs)} requests of {cal_spec.label} (seed {check.calibration_seed}), "
                                       f"router {check.calibration_router}, {len(urls)} instance(s), "
                                       f"{check.repeats} replay(s)")
            doc["name"] = f"{check.profile.name}-calibrated"
            (out / CALIBRATED_FILE).write_text(tomli_w.dumps(doc))
    return TransferReport(res, tables, report)
