"""The prefix reuse a workload intends (an infinite cache's hit rate) and the per-run check against the achieved one:
hand-computed rates, the two flags (``low``, ``no hashes``) from summary rows and from runs through the CLI."""

import json

import polars as pl
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from lbbench.cli import main
from lbbench.core import Request
from lbbench.prefix_blocks import block_keys
from lbbench.metrics.prefix_check import add_check, prefix_reuse_line
from lbbench.sim.prefix_cache import block_keys as engine_block_keys
from lbbench.workloads.prefix_reuse import intended_hit_rate, reuse_intent


def req(i, t, prompt, out, hashes, g=4, **kw):
    return Request(i, t, prompt, out, prefix_hashes=tuple(hashes) if hashes else None, prefix_block_tokens=g, **kw)


def test_hand_computed_intended_rate():
    # blocks of 4 tokens. A: prompt 8 (blocks 1, 2), answer 4 (block 9): nothing cached yet, 0 hits.
    # B: prompt 12 = A's prompt and answer: 3 blocks cached, at most prompt - 1 = 11 tokens served.
    # C: prompt 10, blocks 1, 7 (+2 tokens): the first block only, 4 tokens. D names no hashes: 0 of 6.
    reqs = [req(0, 0.0, 8, 4, (1, 2, 9)), req(1, 1.0, 12, 2, (1, 2, 9, 5)), req(2, 2.0, 10, 1, (1, 7, 8)),
            req(3, 3.0, 6, 1, None)]
    assert intended_hit_rate(reqs, 4) == pytest.approx((0 + 11 + 4 + 0) / (8 + 12 + 10 + 6))
    # in arrival order, whatever the list order
    assert intended_hit_rate(reqs[::-1], 4) == intended_hit_rate(reqs, 4)
    # an engine with 8-token blocks: B hits one full block (8), C none (its first 8-token block differs from A's)
    assert intended_hit_rate(reqs, 8) == pytest.approx(8 / 36)
    assert intended_hit_rate([req(0, 0.0, 8, 4, None)], 4) is None


def test_intent_and_the_no_hashes_case():
    later_turn = [req(0, 0.0, 8, 4, None, session_id=1, turn=0), req(1, 0.0, 20, 4, None, session_id=1, turn=1)]
    intent = reuse_intent(later_turn, 16)
    assert intent.intends_reuse and intent.intended_rate is None and intent.names_no_hashes
    single = reuse_intent([req(0, 0.0, 8, 4, None)], 16)
    assert not single.intends_reuse and not single.names_no_hashes
    assert reuse_intent([req(0, 0.0, 8, 4, None)], 16, declared=True).names_no_hashes


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=12), st.integers(1, 40), st.sampled_from([1, 4, 16]),
       st.integers(0, 30))
def test_keys_are_the_engines_keys(hashes, prompt, g, output):
    r = req(0, 0.0, prompt, output, hashes, g=g)
    for b in (4, 16):
        assert block_keys(r, b, limit_tokens=prompt + output) == engine_block_keys(r, b)
        # the partial tail block adds one key only when the hashes cover the whole limit
        tail = block_keys(r, b, partial=True)
        assert tail[:len(block_keys(r, b))] == block_keys(r, b)
        assert len(tail) - len(block_keys(r, b)) == int(len(hashes) * g >= prompt and prompt % b != 0)


def _row(router, intended, achieved, intends=True):
    return {"router": router, "intended_prefix_hit_rate": intended, "prefix_cache_hit_rate": achieved,
            "reuse_intended": intends}


def test_check_flags_rows():
    s = pl.DataFrame([_row("a", 0.6, 0.2), _row("b", 0.6, 0.31), _row("c", 0.1, 0.0), _row("d", None, 0.0),
                      _row("e", 0.6, None)],
                     schema={"router": pl.String, "intended_prefix_hit_rate": pl.Float64,
                             "prefix_cache_hit_rate": pl.Float64, "reuse_intended": pl.Boolean})
    out = add_check(s)
    # a: 0.2 < half of 0.6: low. b: over half: ok. c: 0.1 intended is not high: ok. d: reuse intended, no hashes.
    # e: caching off: nothing to compare
    assert out["prefix_hit_check"].to_list() == ["low", "ok", "ok", "no hashes", None]
    assert "reuse_intended" not in out.columns
    # nothing intended nor named: the summary stays as it was
    quiet = pl.DataFrame([_row("a", None, 0.1, intends=False)],
                         schema={"router": pl.String, "intended_prefix_hit_rate": pl.Float64,
                                 "prefix_cache_hit_rate": pl.Float64, "reuse_intended": pl.Boolean})
    assert add_check(quiet).columns == ["router", "prefix_cache_hit_rate"]


def test_line_says_what_was_flagged():
    rows = pl.DataFrame([_row("round_robin", 0.8, 0.1), _row("session_affinity", 0.8, 0.7)])
    line = prefix_reuse_line(add_check(rows))
    assert line == ("prefix reuse: intended 80.0 % of prompt tokens (an infinite cache); achieved 10.0 % "
                    "(round_robin) to 70.0 % (session_affinity); under 50% of it (flagged low): round_robin")
    all_low = prefix_reuse_line(add_check(pl.DataFrame([_row("x", 0.8, 0.1), _row("y", 0.8, 0.2)])))
    assert "FLAG: every router achieved under 50%" in all_low


def _run(tmp_path, *args):
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["run", "--profile", "llama3.1-8b-a100-v0", "--prefix-caching", "on",
                                    "--timeline-interval", "0", "--out", str(out), *args])
    assert res.exit_code == 0, res.output
    summary = pl.read_parquet(out / "summary.parquet")
    line = next((ln for ln in res.output.splitlines() if ln.startswith("prefix reuse:")), None)
    return summary, line


def test_run_flags_reuse_lost_by_routing(tmp_path):
    # long conversations without a shared system prompt: each turn re-sends the whole conversation (intended ~90 %);
    # round robin sends the turns of a conversation to 8 different instances and loses most of it
    summary, line = _run(tmp_path, "--workload", "sessions:system=0,turns=8,max_turns=8,think=0.5,user=64,output=64",
                         "--instances", "8", "--requests", "400", "--rate", "40",
                         "--router", "round_robin,session_affinity")
    checks = dict(zip(summary["router"], summary["prefix_hit_check"]))
    assert checks == {"round_robin": "low", "session_affinity": "ok"}
    intended = summary["intended_prefix_hit_rate"][0]
    achieved = dict(zip(summary["router"], summary["prefix_cache_hit_rate"]))
    assert intended > 0.7 and achieved["round_robin"] < 0.5 * intended <= achieved["session_affinity"] <= intended
    assert "flagged low): round_robin" in line


def test_run_flags_a_conversation_trace_without_hashes(tmp_path):
    trace = tmp_path / "conv.jsonl"
    rows = []
    for chat in range(20):  # 20 conversations of 3 turns, no hash_ids column
        for turn in range(3):
            rows.append({"chat_id": chat * 10 + turn, "parent_chat_id": chat * 10 + turn - 1 if turn else -1,
                         "timestamp": chat * 0.5 + turn * 2.0, "input_length": 200 * (turn + 1), "output_length": 30,
                         "turn": turn})
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    summary, line = _run(tmp_path, "--trace", str(trace), "--instances", "2", "--router", "round_robin")
    assert summary["prefix_hit_check"].to_list() == ["no hashes"]
    assert line.startswith("prefix reuse: the workload intends prefix reuse but its requests name no prefix hashes")
