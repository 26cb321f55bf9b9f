"""``--workload inference-perf:...``: inference-perf's shared_prefix traffic at the run's rate and request count."""

import numpy as np
import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.errors import InputError
from lbbench.workloads.inference_perf import inference_perf_requests, parse_inference_perf_spec
from lbbench.workloads.shared_prefix import SharedPrefixSpec, Stage, shared_prefix_requests

SPEC = "inference-perf:groups=10,users=10,system=100,question=466,output=247,multi_turn=1"


def test_spec_is_shared_prefix_at_the_run_rate():
    reqs = inference_perf_requests(SPEC, 1000, 10.0, seed=3)
    want, _ = shared_prefix_requests(SharedPrefixSpec(10, 10, 100, 466, 247, multi_turn=True), [Stage(10.0, 100.0)], 3)
    assert reqs == want and len(reqs) == 1000
    # constant load: evenly spaced at the rate; prompt i mod 100 comes back every 100 requests
    assert np.allclose([r.arrival_s for r in reqs], np.arange(1000) / 10.0)
    assert all(r.prompt_tokens == 566 and r.output_tokens == 247 for r in reqs)
    assert reqs[7].prefix_hashes == reqs[107].prefix_hashes != reqs[8].prefix_hashes
    # 100 system tokens: 6 full 16-token blocks are the group's, shared by its 10 users
    groups = {r.prefix_hashes[:6] for r in reqs[:100]}
    assert len(groups) == 10


def test_defaults_poisson_and_user_lock():
    spec = parse_inference_perf_spec("inference-perf")
    assert (spec.groups, spec.users, spec.system, spec.question, spec.output, spec.arrival) == (10, 10, 100, 50, 50,
                                                                                                "constant")
    reqs = inference_perf_requests("inference-perf:arrival=poisson", 500, 20.0, seed=0)
    assert len(reqs) == 500 and reqs[-1].arrival_s == pytest.approx(25.0, rel=0.15)
    gaps = np.diff([r.arrival_s for r in reqs])
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.15)  # exponential gaps
    locked = inference_perf_requests("inference-perf:groups=2,users=3,multi_turn=1,user_lock=1", 30, 5.0, seed=0)
    assert {r.session_id for r in locked} == set(range(6)) and max(r.turn for r in locked) == 4


@pytest.mark.parametrize("text,word", [("inference-perf:groups=0", "groups"), ("inference-perf:arrival=burst", "arrival"),
                                       ("inference-perf:user_lock=1", "user_lock"), ("inference-perf:x=1", "x=1"),
                                       ("inference-perf:system=a", "system")])
def test_bad_specs_name_the_key(text, word):
    with pytest.raises(InputError, match=word):
        parse_inference_perf_spec(text)


def test_run_prints_the_intended_reuse(tmp_path):
    res = CliRunner().invoke(main, ["run", "--workload", SPEC, "--profile", "llama3.1-8b-a100-v0", "--instances", "2",
                                    "--requests", "300", "--rate", "5", "--prefix-caching", "on", "--router",
                                    "round_robin", "--out", str(tmp_path / "r"), "--timeline-interval", "0"])
    assert res.exit_code == 0, res.output
    # 100 prompts of 566 tokens (35 full 16-token blocks, 560 tokens), each sent 3 times. The first round: the
    # group's 6 system blocks (96 tokens) hit for its 9 prompts after the first, 10 x 9 x 96 = 8,640 tokens; the two
    # later rounds hit all 35 blocks, 200 x 560 = 112,000. (8,640 + 112,000) / (300 x 566) = 71.0 %
    line = next(ln for ln in res.output.splitlines() if ln.startswith("prefix reuse:"))
    assert "intended 71.0 % of prompt tokens" in line and "achieved" in line
