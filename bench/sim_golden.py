"""Golden check for simulator optimisations: a hash of every record of fixed episodes.

Runs the paper episode (4 x llama2-7b-v100, paper-mix, 2000 requests at 20 req/s),
the paper's A100 episode (4 x llama3.1-8b-a100-v0: vLLM V0 semantics, chunked prefill
off, linear steps; 200 req/s) and the same on today's default A100 profile
(4 x llama3.1-8b-a100: vLLM V1, chunked prefill, roofline steps) with several
routers, prefix caching off and on, hashes each run's records (every field, floats
by ``repr``) and either writes the hashes (``--write``) or compares them with the
stored ones (the default). A speed-up of the simulator must keep every record
identical; a change that means to alter the records rewrites the file on purpose.

    python bench/sim_golden.py            # check (exit 1 on any difference)
    python bench/sim_golden.py --write    # store the current hashes
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from lbbench.core import PD_RECORD_FIELDS, RECORD_FIELDS
from lbbench.predict import annotate, load_predictor
from lbbench.profiles import load_profile
from lbbench.routers import get_router
from lbbench.sim.cluster import ClusterSim
from lbbench.workloads import paper_mix

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "sim" / "golden_records.json"

#: (profile, instances, requests, rate, predictor, routers)
EPISODES = {
    "v100-paper": ("llama2-7b-v100", 4, 2000, 20.0, "oracle",
                   ("round_robin", "jsq", "wgrl", "late_binding_srpt")),
    "v100-noisy": ("llama2-7b-v100", 4, 2000, 20.0, "noisy:0.79", ("late_binding_srpt", "min_min")),
    "a100-v0": ("llama3.1-8b-a100-v0", 4, 2000, 200.0, "oracle", ("round_robin", "jsq")),
    "a100-default": ("llama3.1-8b-a100", 4, 2000, 200.0, "oracle", ("round_robin", "jsq")),
}


#: the fields the stored hashes cover: every field but the prefill/decode ones, which these role-less episodes
#: must leave None (checked per record, so a role-less run that fills them fails too)
HASHED_FIELDS = tuple(f for f in RECORD_FIELDS if f not in PD_RECORD_FIELDS)


def records_hash(recs) -> str:
    h = hashlib.sha256()
    for r in sorted(recs, key=lambda r: r.request_id):
        if any(getattr(r, f) is not None for f in PD_RECORD_FIELDS):
            raise AssertionError(f"request {r.request_id}: a role-less run filled a prefill/decode field")
        h.update(repr(tuple(getattr(r, f) for f in HASHED_FIELDS)).encode())
    return h.hexdigest()


def cases():
    """Yield ``(key, thunk)`` for every golden run; the thunk returns the run's records."""
    for ep, (prof_name, n, num, rate, pred, routers) in EPISODES.items():
        prof = load_profile(prof_name)
        reqs = annotate(paper_mix(num, rate, 0), load_predictor(pred, profile=prof, seed=0))
        for router in routers:
            for caching in (False, True):
                def run(prof=prof, n=n, reqs=reqs, router=router, caching=caching):
                    sim = ClusterSim(prof, n, reqs, prefix_caching=caching, seed=0)
                    return sim.run(get_router(router, num_instances=n, seed=0, profile=prof))
                yield f"{ep}/{router}/prefix-caching-{'on' if caching else 'off'}", run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="store the hashes instead of checking them")
    args = ap.parse_args()
    got = {key: records_hash(run()) for key, run in cases()}
    if args.write:
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(got)} hashes to {GOLDEN.name}")
        return 0
    want = json.loads(GOLDEN.read_text())
    bad = [k for k in got if want.get(k) != got[k]]
    for k in got:
        print(f"{'ok  ' if k not in bad else 'DIFF'} {k}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
