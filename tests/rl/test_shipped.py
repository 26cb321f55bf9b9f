"""The shipped checkpoints load through the registry, record what they were
trained on, are found by that description, and route a small run."""

from __future__ import annotations

import pytest

from lbbench.profiles import load_profile
from lbbench.routers import get_router
from lbbench.routers.rl.policy import SHIPPED_DIR, VARIANTS, QPolicy, shipped_checkpoint
from lbbench.sim.cluster import ClusterSim
from lbbench.workloads import paper_mix

SHIPPED = sorted(p.parent for p in SHIPPED_DIR.glob("*/*/policy.npz"))


def test_v100_4x_is_shipped_for_every_variant():
    for v in VARIANTS:
        assert (SHIPPED_DIR / v / "llama2-7b-v100-4x") in SHIPPED


@pytest.mark.parametrize("where", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_checkpoint_routes(where):
    variant = where.parent.name
    meta = QPolicy.load(where).meta
    trained = meta["trained_on"]
    profile = load_profile(trained["profile"])
    m = int(trained["num_instances"])
    assert meta["variant"] == variant and meta["profile"] == trained["profile"]
    assert len(meta["obs_low"]) == len(meta["obs_high"]) and "mixing" in meta
    # lbbench run finds it from the profile, the instance count and the workload it was trained on
    assert shipped_checkpoint(variant, profile.name, m, trained["workload"]) == where
    router = get_router(variant, num_instances=m, seed=0, profile=profile, workload=trained["workload"])
    recs = ClusterSim(profile, m, paper_mix(60, 20.0, 3), seed=3).run(router)
    assert len(recs) == 60
    assert all(0 <= r.instance < m and r.dispatch_s >= r.arrival_s for r in recs)
