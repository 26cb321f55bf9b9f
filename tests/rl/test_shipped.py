"""The shipped checkpoints load through the registry, record what they were
trained on, are found by that description, and route a small run."""

from __future__ import annotations

import pytest

from lbbench.profiles import load_profile
from lbbench.routers import get_router
from lbbench.fleet import parse_fleet
from lbbench.routers.rl.policy import SHIPPED_DIR, VARIANTS, QPolicy, shipped_checkpoint, shipped_fleet_checkpoint
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
    # lbbench run finds it from the profile, the instance count, the workload and engine mode it was trained on
    chunked = bool(trained["chunked_prefill"])
    fleet = parse_fleet(meta["fleet"]) if meta.get("fleet") else None
    if fleet is not None:  # a mixed fleet's: found from the fleet
        assert meta["fleet"] == trained["fleet"] and fleet.num_instances == m
        assert shipped_fleet_checkpoint(variant, fleet, trained.get("instance_scheduler")) == where
    else:
        assert shipped_checkpoint(variant, profile.name, m, trained["workload"], chunked) == where
    router = get_router(variant, num_instances=m, seed=0, profile=profile, workload=trained["workload"],
                        chunked_prefill=chunked, fleet=fleet, instance_scheduler=trained.get("instance_scheduler"))
    # the validation gate ran, on seeds away from the evaluation seeds, and decided the routing mode
    v = meta["validation"]
    assert min(v["seeds"]) > 1000 and meta["gate"] in ("network", "heuristic")
    assert router.heuristic_only == (meta["gate"] == "heuristic")
    # what it was trained on names no machine's paths
    paths = (meta["train_config"]["trace"], trained["predictor"].split(":", 1)[-1])
    assert not any(str(x).startswith(("/", "~")) or ".." in str(x) for x in paths), paths
    reqs = paper_mix(60, 20.0, 3)
    recs = (ClusterSim.for_fleet(fleet, reqs, seed=3) if fleet is not None
            else ClusterSim(profile, m, reqs, seed=3)).run(router)
    assert len(recs) == 60
    assert all(0 <= r.instance < m and r.dispatch_s >= r.arrival_s for r in recs)
