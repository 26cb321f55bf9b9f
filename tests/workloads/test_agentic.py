"""Agentic sessions: the context grows call by call, forks share it, the tool time is kept closed loop, and the
open-loop rendering is what a trace holds (written by ``lbbench trace synth`` and read back unchanged)."""

from collections import defaultdict

import polars as pl
import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.errors import InputError
from lbbench.profiles import load_profile
from lbbench.workloads.agentic import AgenticSpec, agentic, parse_agentic_spec
from lbbench.workloads.traces import read_trace, trace_to_requests


def _chains(reqs):
    by = defaultdict(list)
    for r in reqs:
        by[r.session_id].append(r)
    for turns in by.values():
        turns.sort(key=lambda r: r.turn)
    return by


def test_each_call_resends_the_whole_context():
    spec = AgenticSpec(fork=0.0, steps=3, turns=2, think=5.0, tool=1.5)
    reqs = agentic(600, 5.0, seed=2, spec=spec)
    assert [r.request_id for r in reqs] == list(range(600))
    grown = 0
    for turns in _chains(reqs).values():
        assert [r.turn for r in turns] == list(range(len(turns)))
        assert turns[0].think_s == 0.0
        for k, (prev, cur) in enumerate(zip(turns, turns[1:]), start=1):
            # the next prompt is the previous prompt, its output, and a tool result (or the user's next task)
            assert cur.prompt_tokens > prev.prompt_tokens + prev.output_tokens
            kept = (prev.prompt_tokens + prev.output_tokens) // 16
            assert cur.prefix_hashes[:kept] == prev.prefix_hashes[:kept]
            assert cur.think_s == (5.0 if k % (spec.steps + 1) == 0 else 1.5)  # tool time, or think before a turn
            grown += 1
        for r in turns:
            assert len(r.prefix_hashes) == -(-(r.prompt_tokens + r.output_tokens) // 16)
            assert r.arrival_s == turns[0].arrival_s  # closed loop: sent when the previous call finished
    assert grown > 300
    # every agent opens with the same 1,000-token system head: its 62 full blocks are named alike
    heads = {r.prefix_hashes[:62] for r in reqs}
    assert len(heads) == 1 and len({r.prefix_hashes[62] for r in reqs if r.turn == 0}) > 50


def test_forks_share_the_context_so_far():
    spec = AgenticSpec(fork=1.0, kmin=3, kmax=3, steps=1, turns=1)
    reqs = agentic(400, 5.0, seed=0, spec=spec)
    chains = _chains(reqs)
    # a forked turn: dispatch, sub-agent 1's loop (2 calls) and the merge in the agent's chain; sub-agents 2 and 3 in
    # chains of their own
    main = [c for c in chains.values() if len(c) == 4]
    extra = [c for c in chains.values() if len(c) == 2]
    assert len(main) > 20 and len(extra) >= 2 * len(main) - 4
    dispatch = {c[0].prefix_hashes[:(c[0].prompt_tokens + c[0].output_tokens) // 16]: c for c in main}
    matched = 0
    for sub in extra:
        first = sub[0]
        # a sub-agent starts from the dispatching call's context (its prompt and output) ...
        parent = [c for key, c in dispatch.items() if first.prefix_hashes[:len(key)] == key]
        assert len(parent) == 1
        d = parent[0][0]
        assert first.prompt_tokens == d.prompt_tokens + d.output_tokens
        # ... and diverges from its siblings after it
        sib = parent[0][1]
        n = (d.prompt_tokens + d.output_tokens) // 16
        assert sib.prompt_tokens == first.prompt_tokens and sib.prefix_hashes[n + 1] != first.prefix_hashes[n + 1]
        # it starts when the fork was planned (open loop), no earlier than its parent was due
        assert first.arrival_s > d.arrival_s and first.think_s == 0.0
        matched += 1
    assert matched == len(extra)
    for c in main:  # the merge waits for the planned end of the other sub-agents
        assert c[3].arrival_s > c[0].arrival_s
        # it continues the agent's own context (not the sub-agent's): the dispatch, then the reports (sub-agent 1's
        # report is its last call's output)
        d = c[0].prompt_tokens + c[0].output_tokens
        assert c[3].prompt_tokens > d + c[2].output_tokens
        assert c[3].prefix_hashes[:d // 16] == c[0].prefix_hashes[:d // 16]


def test_rate_is_the_offered_call_rate_and_contexts_fit():
    reqs = agentic(3000, 20.0, seed=1, spec=parse_agentic_spec("agentic:closed=0"), max_model_len=4096)
    assert all(r.prompt_tokens + r.output_tokens <= 4096 for r in reqs)
    span = reqs[-1].arrival_s - reqs[0].arrival_s
    assert 3000 / span == pytest.approx(20.0, rel=0.15)
    assert all(r.session_id is None for r in reqs)
    # open and closed loop plan the same calls
    closed = agentic(3000, 20.0, seed=1, spec=AgenticSpec(), max_model_len=4096)
    key = lambda r: (r.prompt_tokens, r.output_tokens, r.prefix_hashes)  # noqa: E731
    assert sorted(map(key, closed)) == sorted(map(key, reqs))


@pytest.mark.parametrize("text,word", [("agentic:fork=1.5", "fork"), ("agentic:kmin=5,kmax=2", "kmin"),
                                       ("agentic:steps=x", "steps"), ("agentic:nope=1", "nope"),
                                       ("agentic:closed=2", "closed")])
def test_bad_specs_name_the_key(text, word):
    with pytest.raises(InputError, match=word):
        parse_agentic_spec(text)


def test_written_trace_round_trips(tmp_path):
    out = tmp_path / "agentic.parquet"
    res = CliRunner().invoke(main, ["trace", "synth", "agentic:fork=0.5", str(out), "--rate", "8", "--requests",
                                    "300", "--seed", "4"])
    assert res.exit_code == 0, res.output
    assert "wrote 300 requests of agentic:fork=0.5,closed=0" in res.output
    back = trace_to_requests(read_trace(out))
    prof = load_profile("llama3.1-8b-a100")  # the command's default profile plans the calls
    want = agentic(300, 8.0, 4, parse_agentic_spec("agentic:fork=0.5,closed=0"), max_model_len=prof.max_model_len,
                   prefill_s_per_token=prof.prefill_token_s, step_s=prof.min_step_s)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.task, r.prefix_hashes, r.prefix_block_tokens)
            for r in back] == [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.task, r.prefix_hashes, 16)
                               for r in want]
    # a closed-loop session workload has no planned times for its later turns: refused in one line
    res = CliRunner().invoke(main, ["trace", "synth", "sessions", str(tmp_path / "s.parquet")])
    assert res.exit_code == 2 and "closed-loop" in res.output


def test_closed_loop_end_to_end(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["run", "--workload", "agentic:fork=0.3", "--profile", "llama3.1-8b-a100-v0",
                                    "--instances", "2", "--requests", "120", "--rate", "4", "--prefix-caching", "on",
                                    "--router", "kv_overlap", "--out", str(out), "--timeline-interval", "0"])
    assert res.exit_code == 0, res.output
    df = pl.read_parquet(out / "requests.parquet").sort("session_id", "turn")
    assert df.height == 120 and df["error"].null_count() == 120
    prev = df.with_columns(pl.col("finish_s").shift(1).over("session_id").alias("prev_finish"))
    later = prev.filter(pl.col("prev_finish").is_not_null())
    # a call is sent no earlier than the previous call of its chain finished plus its tool or think time
    assert (later["dispatch_s"] >= later["prev_finish"] + later["think_s"] - 1e-9).all()
    assert df["cached_prompt_tokens"].sum() > 0.4 * df["prompt_tokens"].sum()
