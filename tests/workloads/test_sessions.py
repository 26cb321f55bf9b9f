"""Multi-turn session workloads: what the generator builds, and the closed loop end to end
(each turn sent no earlier than the previous finish plus its think time)."""

import json
from collections import Counter

import polars as pl
import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.workloads.errors import WorkloadError
from lbbench.workloads.sessions import SessionSpec, parse_session_spec, sessions


def test_turns_carry_the_conversation_so_far():
    reqs = sessions(400, 10.0, seed=3, spec=SessionSpec(turns=4, system=256, block=16))
    assert [r.request_id for r in reqs] == list(range(len(reqs))) and len(reqs) == 400
    by_session: dict[int, list] = {}
    for r in reqs:
        by_session.setdefault(r.session_id, []).append(r)
    multi = 0
    for turns in by_session.values():
        turns.sort(key=lambda r: r.turn)
        assert [r.turn for r in turns] == list(range(len(turns)))
        assert turns[0].think_s == 0.0
        for prev, cur in zip(turns, turns[1:]):
            multi += 1
            # the prompt repeats the previous prompt and answer, then a new user message
            assert cur.prompt_tokens > prev.prompt_tokens + prev.output_tokens
            shared = (prev.prompt_tokens + prev.output_tokens) // 16
            assert cur.prefix_hashes[:shared] == prev.prefix_hashes[:shared]
            assert cur.think_s >= 0
        for r in turns:
            assert len(r.prefix_hashes) == -(-(r.prompt_tokens + r.output_tokens) // 16)
    assert multi > 100


def test_system_prompts_are_shared_by_the_stated_share():
    reqs = sessions(3000, 10.0, seed=1, spec=parse_session_spec("shared-prefix:system=512,prompts=2,share=0.5"))
    assert all(r.turn == 0 for r in reqs)
    counts = Counter(r.prefix_hashes[0] for r in reqs)
    common = [h for h, n in counts.items() if n > 1]
    assert len(common) == 2
    assert sum(counts[h] for h in common) / len(reqs) == pytest.approx(0.5, abs=0.04)
    # the 32 blocks inside the system prompt are common to its sessions, the next one is not
    a, b = [r for r in reqs if r.prefix_hashes[0] == common[0]][:2]
    assert a.prefix_hashes[:32] == b.prefix_hashes[:32] and a.prefix_hashes[32] != b.prefix_hashes[32]


def test_bad_session_specs_name_the_key():
    for spec, word in (("sessions:turns=0", "turns"), ("sessions:foo=1", "foo"), ("sessions:think=x", "think"),
                       ("sessions:share=2", "share")):
        with pytest.raises(WorkloadError, match=word):
            parse_session_spec(spec)


def test_closed_loop_in_requests_parquet(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(main, [
        "run", "--profile", "llama3.1-8b-a100-v0", "--instances", "2", "--workload",
        "sessions:turns=4,think=2,system=512", "--rate", "8", "--requests", "300", "--router",
        "round_robin", "--prefix-caching", "on", "--out", str(out), "--format", "json"],
        catch_exceptions=False)
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)[0]
    assert 0 < row["prefix_cache_hit_rate"] < 1 and row["completed"] == 300
    df = pl.read_parquet(out / "requests.parquet").sort("session_id", "turn")
    assert {"session_id", "turn", "think_s", "cached_prompt_tokens"} <= set(df.columns)
    pairs = df.with_columns(prev_finish=pl.col("finish_s").shift(1).over("session_id")).drop_nulls("prev_finish")
    assert pairs.height > 50
    gap = pairs["arrival_s"] - (pairs["prev_finish"] + pairs["think_s"])
    assert gap.min() >= -1e-9  # never sent before the previous answer finished + think time
    assert (gap.abs() < 1e-9).mean() == 1.0  # synthetic turns have no fixed send time: exactly then
    assert (pairs["dispatch_s"] >= pairs["arrival_s"]).all()
    tl = pl.read_parquet(out / "timeline.parquet")
    assert tl["prefix_cache_hit_rate"].drop_nulls().max() > 0


def test_unknown_workload_lists_sessions():
    res = CliRunner().invoke(main, ["run", "--workload", "sesions", "--requests", "5"])
    assert res.exit_code == 2 and "sessions[:K=V,...]" in res.output


def test_live_prompts_repeat_the_earlier_turn_token_for_token():
    from lbbench.live.http import prompt_token_ids
    reqs = sessions(200, 10.0, seed=2, spec=SessionSpec(turns=4, system=100, block=16))
    by = {(r.session_id, r.turn): r for r in reqs}
    pairs = [(r, by[(r.session_id, r.turn + 1)]) for r in reqs if (r.session_id, r.turn + 1) in by]
    assert pairs
    for a, b in pairs[:20]:
        ids_a, ids_b = prompt_token_ids(a), prompt_token_ids(b)
        assert len(ids_a) == a.prompt_tokens and len(ids_b) == b.prompt_tokens
        assert ids_b[:a.prompt_tokens] == ids_a  # a real engine's prefix cache sees the sharing


def _bailian(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_conversation_trace_replays_closed_loop(tmp_path):
    rows = []
    for s in range(6):
        parent = -1
        for turn in range(3):
            chat = s * 10 + turn
            rows.append({"chat_id": chat, "parent_chat_id": parent, "timestamp": s * 0.5 + turn * 0.01,
                         "input_length": 200 * (turn + 1), "output_length": 40, "turn": turn + 1,
                         "hash_ids": list(range(s * 100, s * 100 + 13 * (turn + 1)))})
            parent = chat
    trace = _bailian(tmp_path / "conv.jsonl", rows)
    from lbbench.workloads.session_traces import is_session_trace, load_session_trace
    assert is_session_trace(trace)
    reqs = load_session_trace(trace)
    assert len({r.session_id for r in reqs}) == 6 and {r.turn for r in reqs} == {1, 2, 3}
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["run", "--profile", "llama3.1-8b-a100-v0", "--instances", "2", "--trace",
                                    str(trace), "--router", "session_affinity", "--prefix-caching", "on",
                                    "--out", str(out), "--format", "json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    df = pl.read_parquet(out / "requests.parquet").sort("session_id", "turn")
    pairs = df.with_columns(prev=pl.col("finish_s").shift(1).over("session_id")).drop_nulls("prev")
    assert pairs.height == 12
    # recorded 10 ms after the previous turn, which takes longer: sent when it finished
    assert ((pairs["arrival_s"] - pairs["prev"]).abs() < 1e-9).all()
    assert pairs["cached_prompt_tokens"].min() > 0  # the conversation so far is reused
    bad = _bailian(tmp_path / "bad.jsonl", [{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0,
                                              "input_length": "x", "output_length": 3}])
    res = CliRunner().invoke(main, ["run", "--trace", str(bad), "--router", "round_robin"])
    assert res.exit_code == 2 and "row 1: input_length" in res.output
