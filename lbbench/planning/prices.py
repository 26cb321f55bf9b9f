"""GPU prices for ``lbbench plan --price-file``: the user's own numbers, and the cost columns made from them.

lbbench ships no prices: they differ by provider, region, commitment and month. A price file is TOML with one
table, US dollars per GPU-hour keyed by GPU name (the names ``lbbench profile derive --gpu`` takes)::

    [gpu_usd_per_hour]
    a100-80gb = 1.0
    h100 = 2.0

``examples/prices.example.toml`` shows the form with placeholder numbers. The cost columns of a plan row:

- ``usd_per_hour`` = instances x TP x the GPU's price per hour (every GPU of an instance is paid for);
- ``usd_per_million_tokens`` = ``usd_per_hour`` / (``tokens_per_s`` x 3600) x 10^6, where ``tokens_per_s``
  is the prompt plus generated tokens of the requests the instances completed, per second of the run
  (first arrival to last finish), at the planned instance count.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

from ..errors import InputError
from ..profiling.gpus import UnknownGPUError, get_gpu

FIELD = "price_file"
TABLE = "gpu_usd_per_hour"


def load_prices(path: str | Path) -> dict[str, float]:
    """GPU name (canonical, as ``get_gpu`` spells it) -> US dollars per GPU-hour; ``InputError`` naming the
    file and the key for anything unusable."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such file", FIELD)
    try:
        data = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: not valid TOML: {exc}", FIELD) from None
    table = data.get(TABLE)
    if not isinstance(table, dict) or not table:
        raise InputError(f"{p}: needs a [{TABLE}] table of GPU = US dollars per GPU-hour", FIELD)
    prices: dict[str, float] = {}
    for name, value in table.items():
        try:
            gpu = get_gpu(name).name
        except UnknownGPUError as exc:
            raise InputError(f"{p}: [{TABLE}] {exc}", FIELD) from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise InputError(f"{p}: [{TABLE}] {name} = {value!r}: give US dollars per GPU-hour, a number >= 0",
                             FIELD)
        prices[gpu] = float(value)
    return prices


def price_of(prices: dict[str, float], gpu: str, path: str | Path) -> float:
    """The price per GPU-hour of ``gpu``, or an ``InputError`` saying the file lacks it."""
    try:
        return prices[get_gpu(gpu).name]
    except KeyError:
        raise InputError(f"{path}: no price for {gpu} (add {gpu} = USD per GPU-hour under [{TABLE}])",
                         FIELD) from None


def cost_columns(usd_per_gpu_hour: float, instances: int, tp: int, tokens_per_s: float | None
                 ) -> dict[str, float | None]:
    """``usd_per_hour`` and ``usd_per_million_tokens`` of a row (see the module docstring)."""
    usd_per_hour = usd_per_gpu_hour * instances * tp
    per_million = (usd_per_hour / (tokens_per_s * 3600.0) * 1e6
                   if tokens_per_s is not None and tokens_per_s > 0 else None)
    return {"usd_per_hour": usd_per_hour, "usd_per_million_tokens": per_million}
