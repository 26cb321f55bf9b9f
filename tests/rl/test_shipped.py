"""The shipped checkpoints load through the registry and route a small run."""

from __future__ import annotations

import pytest

from lbbench.profiles import load_profile
from lbbench.routers import get_router
from lbbench.routers.rl.policy import SHIPPED_DIR, VARIANTS
from lbbench.sim.cluster import ClusterSim
from lbbench.workloads import paper_mix

SHIPPED = sorted((p.parent.parent.name, p.parent.name) for p in SHIPPED_DIR.glob("*/*/policy.npz"))


def test_v100_4x_is_shipped_for_every_variant():
    for v in VARIANTS:
        assert (v, "llama2-7b-v100-4x") in SHIPPED


@pytest.mark.parametrize("variant,where", SHIPPED)
def test_shipped_checkpoint_routes(variant, where):
    profile_name, n = where.rsplit("-", 1)
    num_instances = int(n.rstrip("x"))
    profile = load_profile(profile_name)
    router = get_router(variant, num_instances=num_instances, seed=0, profile=profile)
    assert router.name == variant and router.policy.meta["variant"] == variant
    assert router.policy.meta["profile"] == profile_name
    recs = ClusterSim(profile, num_instances, paper_mix(60, 20.0, 3), seed=3).run(router)
    assert len(recs) == 60
    assert all(0 <= r.instance < num_instances and r.dispatch_s >= r.arrival_s for r in recs)
