"""Prefill/decode fleets through the CLI: a run with pair routers writes the transfer columns, fleet roles parse
and round-trip, and every bad input is one line naming its flag, exit 2."""

from __future__ import annotations

import polars as pl
import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.fleet import FleetEntry, parse_fleet
from lbbench.kv_links import LINKS, kv_bytes_per_token, parse_kv_link
from lbbench.profiles import load_profile

PD = "llama3.1-8b-h100:1:prefill,llama3.1-8b-a100:2:decode"


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_roles_parse_and_round_trip():
    fleet = parse_fleet(PD)
    assert fleet.roles() == ["prefill", "decode", "decode"] and fleet.is_disaggregated
    assert fleet.entries[1] == FleetEntry(load_profile("llama3.1-8b-a100"), 2, "decode")
    assert parse_fleet(fleet.spec()) == fleet and fleet.label == "h100x1-prefill+a100x2-decode"
    assert [s.role for s in fleet.instance_specs()] == ["prefill", "decode", "decode"]
    plain = parse_fleet("llama3.1-8b-a100:2")
    assert plain.roles() == ["mixed", "mixed"] and not plain.is_disaggregated and plain.spec() == "llama3.1-8b-a100:2"
    assert parse_fleet("llama3.1-8b-a100:2:mixed") == plain


def test_links_and_kv_bytes():
    assert parse_kv_link("rdma-400g").transfer_s(50e9) == pytest.approx(1.0 + 20e-6)  # 400 Gb/s = 50 GB/s
    assert parse_kv_link("nvlink4@0").transfer_s(450e9) == 1.0
    assert parse_kv_link("40e9@5e-5").bytes_s == 40e9 and set(LINKS) >= {"nvlink4", "rdma-400g", "pcie4"}
    # Llama-3.1-8B in bf16: 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes = 128 KiB
    assert kv_bytes_per_token(load_profile("llama3.1-8b-a100")) == 131072


def test_a_pd_run_writes_the_transfer_columns(tmp_path):
    out = tmp_path / "run"
    res = invoke("run", "--fleet", PD, "--router", "pd_llmd,pd_joint", "--workload", "poisson",
                 "--prompt-tokens", "1500", "--output-tokens", "20", "--rate", "4", "--requests", "60",
                 "--kv-link", "pcie4", "--out", str(out))
    assert res.exit_code == 0, res.output
    df = pl.read_parquet(out / "requests.parquet")
    assert df.height == 120 and df["error"].null_count() == 120
    assert set(df["prefill_instance"].drop_nulls().to_list()) == {0} and set(df["instance"].to_list()) <= {1, 2}
    moved = df.filter(pl.col("prefill_instance").is_not_null())
    assert moved.height == 120  # 1,500-token prompts always disaggregate on both
    assert (moved["transfer_bytes"] == 1499 * 131072.0).all()
    took = moved["kv_ready_s"] - moved["prefill_done_s"]
    assert (took >= 1499 * 131072 / 32e9).all()  # at least the bytes over PCIe 4.0


@pytest.mark.parametrize("args, flag, says", [
    (("--fleet", "llama3.1-8b-a100:2:prefil,llama3.1-8b-a100:2:decode", "--router", "pd_llmd"), "--fleet",
     "unknown role"),
    (("--fleet", "llama3.1-8b-a100:2:prefill", "--router", "pd_llmd"), "--fleet", "none that decodes"),
    (("--fleet", PD, "--router", "pd_llmd", "--kv-link", "0"), "--kv-link", "bandwidth > 0"),
    (("--fleet", PD, "--router", "pd_llmd", "--kv-link", "wifi"), "--kv-link", "neither a link"),
    (("--fleet", "llama3.1-8b-a100:4", "--router", "round_robin,pd_vllm"), "--router", "fleet with roles"),
    (("--fleet", PD, "--router", "round_robin"), "--router", "pair router"),
])
def test_bad_pd_input_is_one_line_naming_the_flag(args, flag, says, tmp_path):
    res = invoke("run", *args, "--requests", "10", "--out", str(tmp_path / "x"))
    assert res.exit_code == 2, res.output
    assert res.output.count("\n") == 1 and res.output.startswith(f"Error: {flag}: ") and says in res.output, res.output
