"""The per-run prefix-hit check: the hit rate a run achieved against the one its workload intends.

Every request row of a run carries ``intended_prefix_hit_rate`` (the share of prompt tokens an infinite cache
would serve, ``lbbench.workloads.prefix_reuse``; null when no request names prefix hashes) and ``reuse_intended``
(the workload is built to share prefixes, or continues conversations). ``prefix_hit_check`` then labels each
summary row:

- ``no hashes``: the workload intends reuse but names no prefix hashes, so no cache can serve any of it (vLLM's
  benchmark once replayed only the first turn of ShareGPT conversations and measured 0 % reuse);
- ``low``: the intended rate is high (>= ``HIGH_INTENT``) and the achieved one (``prefix_cache_hit_rate``) is under
  ``FAR_BELOW`` of it: most of the reuse the traffic offers was lost (routing that ignores prefixes, a cache too
  small, or a broken replay);
- ``ok``: otherwise, when both rates are known; null when caching was off (nothing achieved to compare).

``prefix_reuse_line`` is the one line a run prints about it.
"""

from __future__ import annotations

import polars as pl

#: an intended hit rate at least this high is worth checking
HIGH_INTENT = 0.2
#: achieved below this share of the intended rate is "far below"
FAR_BELOW = 0.5
COLUMNS = ("intended_prefix_hit_rate", "reuse_intended")


def per_seed_exprs(schema: pl.Schema) -> list[pl.Expr]:
    """The per-seed aggregates of the intent columns present in a requests frame."""
    out = []
    if "intended_prefix_hit_rate" in schema:
        out.append(pl.col("intended_prefix_hit_rate").cast(pl.Float64).max().alias("intended_prefix_hit_rate"))
    if "reuse_intended" in schema:
        out.append(pl.col("reuse_intended").fill_null(False).any().alias("reuse_intended"))
    return out


def summary_exprs(seeds_schema: pl.Schema) -> list[pl.Expr]:
    """The per-group aggregates (over seeds) of what ``per_seed_exprs`` made."""
    out = []
    if "intended_prefix_hit_rate" in seeds_schema:
        out.append(pl.col("intended_prefix_hit_rate").mean())
    if "reuse_intended" in seeds_schema:
        out.append(pl.col("reuse_intended").any())
    return out


def add_check(summary: pl.DataFrame) -> pl.DataFrame:
    """``summary`` with ``prefix_hit_check`` (see the module docstring), ``reuse_intended`` folded into it; the
    table is left as it was when no row intends reuse or states an intended rate."""
    if not set(COLUMNS) <= set(summary.columns):
        return summary
    intended = pl.col("intended_prefix_hit_rate")
    achieved = pl.col("prefix_cache_hit_rate") if "prefix_cache_hit_rate" in summary.columns else pl.lit(None, pl.Float64)
    check = (pl.when(pl.col("reuse_intended") & intended.is_null()).then(pl.lit("no hashes"))
             .when(intended.is_null() | achieved.is_null()).then(pl.lit(None, pl.String))
             .when((intended >= HIGH_INTENT) & (achieved < FAR_BELOW * intended)).then(pl.lit("low"))
             .otherwise(pl.lit("ok")))
    out = summary.with_columns(check.alias("prefix_hit_check")).drop("reuse_intended")
    if (out.get_column("prefix_hit_check").null_count() == out.height
            and out.get_column("intended_prefix_hit_rate").null_count() == out.height):
        return out.drop("intended_prefix_hit_rate", "prefix_hit_check")
    return out


def prefix_reuse_line(summary: pl.DataFrame) -> str | None:
    """One line: the intended hit rate, the achieved range (by router) and what was flagged; None when the run
    has nothing to say (no intent, no rate)."""
    if "prefix_hit_check" not in summary.columns:
        return None
    rows = summary.to_dicts()
    if any(r["prefix_hit_check"] == "no hashes" for r in rows):
        return ("prefix reuse: the workload intends prefix reuse but its requests name no prefix hashes, so no "
                "cache can serve any of it (check the trace's hash column, or replay later turns with their context)")
    intended = [r["intended_prefix_hit_rate"] for r in rows if r.get("intended_prefix_hit_rate") is not None]
    if not intended:
        return None
    text = f"prefix reuse: intended {100 * sum(intended) / len(intended):.1f} % of prompt tokens (an infinite cache)"
    got = [(r["prefix_cache_hit_rate"], r["router"]) for r in rows if r.get("prefix_cache_hit_rate") is not None]
    if not got:
        return text + "; caching off, nothing achieved to compare"
    lo, hi = min(got), max(got)
    text += (f"; achieved {100 * lo[0]:.1f} % ({lo[1]}) to {100 * hi[0]:.1f} % ({hi[1]})" if lo != hi
             else f"; achieved {100 * hi[0]:.1f} % ({hi[1]})")
    low = sorted({r["router"] for r in rows if r["prefix_hit_check"] == "low"})
    if low and len(low) == len({r["router"] for r in rows}):
        text += (f" -- FLAG: every router achieved under {FAR_BELOW:.0%} of the intended rate (cache too small "
                 "for the reuse, or the replay loses it)")
    elif low:
        text += f"; under {FAR_BELOW:.0%} of it (flagged low): {', '.join(low)}"
    return text
