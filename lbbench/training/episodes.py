"""Training episodes from any workload or trace, with the evaluation predictor.

``episode_source(cfg, profile)`` returns ``seed -> requests`` for the RL
environment. For a named workload (``paper-mix``, ``paper-classes``,
``poisson``, ``dataset:FILE``) an episode is the workload ``lbbench run``
builds for that seed. For a trace (``cfg.trace``) the whole trace is read once
with the trace flags of ``lbbench run`` and rescaled to ``cfg.rate`` (a rate
of 0 keeps the trace's own), and an episode is a window of ``cfg.requests``
consecutive requests starting at an offset drawn from the seed, its arrivals
shifted to start at 0 and its requests renumbered. Either way the requests are
annotated with ``cfg.predictor`` — the predictor that will be used at
evaluation — so the network learns on the prediction errors it will see. With
``cfg.rates`` (several rates) the workload of seed ``s`` uses rate ``s mod
len(rates)``: consecutive training and validation seeds cycle through them.

With ``cfg.fleet`` (a mixed fleet) the workload is built for the fleet's first
profile (what ``lbbench run --fleet`` gives its workload), every simulator of
training and validation is the fleet's (``make_sim``), and the state's shapes
are the fleet's (``feature_spec``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from lbbench.core import Request
from lbbench.experiment import RunConfig, build_requests
from lbbench.predict import annotate, load_predictor
from lbbench.routers.rl.features import FeatureSpec
from lbbench.sim.cluster import ClusterSim
from lbbench.workloads.traces import load_trace_requests


def trace_window(requests: list[Request], num_requests: int, seed: int) -> list[Request]:
    """``num_requests`` consecutive requests of a trace from a seeded offset,
    arrivals shifted to start at 0, ids renumbered from 0."""
    n = len(requests)
    if num_requests >= n:
        start, stop = 0, n
    else:
        start = int(np.random.default_rng(seed).integers(0, n - num_requests + 1))
        stop = start + num_requests
    window = requests[start:stop]
    t0 = window[0].arrival_s
    return [replace(r, request_id=i, arrival_s=r.arrival_s - t0) for i, r in enumerate(window)]


def feature_spec(cfg, profile):
    """The ``FeatureSpec`` of a ``TrainConfig``: the profile's, or with a fleet the fleet's
    (``FeatureSpec.from_profiles``)."""
    kw = {"kv_features": cfg.kv_features}
    if cfg.capacity_features:
        kw["capacity_features"] = True
    profiles = cfg.fleet_profiles()
    if profiles is None:
        return FeatureSpec.from_profile(profile, cfg.instances, **kw)
    return FeatureSpec.from_profiles(profiles, **kw)


def make_sim(cfg, profile, requests, seed: int, profiles=None):
    """The simulator a ``TrainConfig`` trains and validates on: ``cfg.instances`` x ``profile``, or with a
    fleet one profile per instance (``profiles``, default ``cfg.fleet_profiles()``)."""
    profiles = profiles if profiles is not None else cfg.fleet_profiles()
    kw = {"seed": seed, "instance_scheduler": cfg.instance_scheduler, "chunked_prefill": cfg.chunked_prefill}
    if profiles is None:
        return ClusterSim(profile, cfg.instances, requests, **kw)
    return ClusterSim(None, len(profiles), requests, profiles=profiles, **kw)


def episode_source(cfg, profile) -> Callable[[int], list[Request]]:
    """``seed -> annotated requests`` for a ``TrainConfig``."""
    predictor = load_predictor(cfg.predictor, profile=profile, seed=cfg.train_seed_base + cfg.seed)
    rates = cfg.rate_list()
    if cfg.trace:
        opts = dict(cfg.trace_options)
        wholes = [load_trace_requests(cfg.trace, rate=r or None, **opts) for r in rates]

        def from_trace(seed: int) -> list[Request]:
            return annotate(trace_window(wholes[seed % len(rates)], cfg.requests, seed), predictor)
        return from_trace

    run_cfgs = [RunConfig(profile=profile.name, instances=cfg.instances, workload=cfg.workload,
                          rate_per_s=r, requests=cfg.requests) for r in rates]

    def from_workload(seed: int) -> list[Request]:
        return annotate(build_requests(run_cfgs[seed % len(rates)], profile, seed, None), predictor)
    return from_workload
