"""Calibration files: the fitted efficiency factors and front-end latency, with where they were fitted.

A calibration is a small TOML file::

    [calibration]
    fitted_on = "..."        # the rows, their GPUs and engines
    method = "..."           # how (lbbench.validation.fit)
    loss = 0.12              # mean |log(predicted / measured)| on the rows fitted
    [efficiency]             # lbbench.roofline.RooflineEfficiency
    weight_bw_util = 0.8
    ...
    [front_end]
    api_overhead_s = 0.012

``lbbench profile fit --measured`` writes one; ``lbbench fidelity --measured`` reads one (``--calibration``, else
the one shipped in ``lbbench/profiling/data/calibration.toml``, fitted on the public H100 development table), and
so does ``lbbench profile derive`` (and ``plan``, which derives through it): every derived profile's efficiency
factors and front-end latency are a calibration's.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from ..roofline import RooflineEfficiency, RooflineError

SHIPPED = Path(__file__).resolve().parent / "data" / "calibration.toml"


class CalibrationFileError(InputError):
    """A calibration file that cannot be read (the message names the file and the key)."""


@dataclass(frozen=True)
class Calibration:
    eff: RooflineEfficiency
    api_overhead_s: float
    info: dict[str, object] = field(default_factory=dict)
    path: str = ""

    def describe(self) -> str:
        where = self.info.get("fitted_on", "not fitted")
        return f"{Path(self.path).name if self.path else 'defaults'}: fitted on {where}"


def load_calibration(path: str | Path | None = None) -> Calibration:
    """The calibration at ``path`` (None: the shipped one)."""
    p = Path(path) if path is not None else SHIPPED
    if not p.is_file():
        raise CalibrationFileError(f"{p}: no such calibration file")
    try:
        doc = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise CalibrationFileError(f"{p}: not valid TOML: {exc}") from None
    eff_tbl = doc.get("efficiency")
    if not isinstance(eff_tbl, dict):
        raise CalibrationFileError(f"{p}: missing table [efficiency]")
    known = set(RooflineEfficiency().as_dict())
    for k, v in eff_tbl.items():
        if k not in known:
            raise CalibrationFileError(f"{p}: unknown key efficiency.{k} (known: {', '.join(sorted(known))})")
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise CalibrationFileError(f"{p}: efficiency.{k} must be a number, not {v!r}")
    eff = RooflineEfficiency(**{k: float(v) for k, v in eff_tbl.items()})
    try:
        eff.check(str(p))
    except RooflineError as exc:
        raise CalibrationFileError(str(exc)) from None
    api = doc.get("front_end", {}).get("api_overhead_s", 0.0)
    if not isinstance(api, (int, float)) or api < 0:
        raise CalibrationFileError(f"{p}: front_end.api_overhead_s must be a number >= 0, not {api!r}")
    return Calibration(eff=eff, api_overhead_s=float(api), info=dict(doc.get("calibration", {})), path=str(p))


def write_calibration(cal: Calibration, path: str | Path) -> Path:
    p = Path(path)
    lines = ["[calibration]"]
    for k, v in cal.info.items():
        lines.append(f"{k} = {_toml(v)}")
    lines += ["", "[efficiency]"] + [f"{k} = {_toml(v)}" for k, v in cal.eff.as_dict().items()]
    lines += ["", "[front_end]", f"api_overhead_s = {_toml(cal.api_overhead_s)}", ""]
    p.write_text("\n".join(lines))
    return p


def _toml(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(float(v)) if isinstance(v, float) else str(v)
    s = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'
