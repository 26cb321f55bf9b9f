"""The simulator's records stay bit-identical on fixed episodes (guards speed-ups of the step loop).

The hashes live in ``golden_records.json``, written by ``bench/sim_golden.py --write``;
a change meant to alter simulated behaviour rewrites them on purpose.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sim_golden", ROOT / "bench" / "sim_golden.py")
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)  # type: ignore[union-attr]

WANT = json.loads((Path(__file__).parent / "golden_records.json").read_text())
CASES = dict(golden.cases())
#: a cross-section (the full set runs in bench/sim_golden.py): V0 and V1 (linear and roofline steps), caching off
#: and on, oracle and noisy
CHECKED = ("v100-paper/round_robin/prefix-caching-off", "v100-paper/late_binding_srpt/prefix-caching-on",
           "v100-noisy/min_min/prefix-caching-off", "a100-v0/jsq/prefix-caching-on",
           "a100-default/jsq/prefix-caching-on")


def test_every_golden_case_has_a_stored_hash():
    assert set(CASES) == set(WANT)


@pytest.mark.parametrize("key", CHECKED)
def test_records_match_the_golden_hash(key):
    recs = CASES[key]()
    assert len(recs) == 2000 and all(r.error is None for r in recs)
    assert golden.records_hash(recs) == WANT[key]


def test_hash_sees_a_changed_field():
    recs = CASES["v100-paper/round_robin/prefix-caching-off"]()
    before = golden.records_hash(recs)
    recs[7].finish_s = recs[7].finish_s + 1e-9
    assert golden.records_hash(recs) != before
