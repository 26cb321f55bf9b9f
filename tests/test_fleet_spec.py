"""Fleet specs: parsing, instance order, errors that name the entry, and the spec's round trip."""

import shutil
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.core import InstanceSpec
from lbbench.fleet import Fleet, FleetEntry, FleetError, parse_fleet
from lbbench.profiles import available_profiles, load_profile

LLAMA31 = ["llama3.1-8b-a100", "llama3.1-8b-l4", "llama3.1-8b-h100", "llama3.1-8b-a100-tp2"]


def test_parse_gives_one_profile_per_instance_in_order():
    fleet = parse_fleet("llama3.1-8b-a100:2, llama3.1-8b-l4:1")
    assert [p.name for p in fleet.profiles()] == ["llama3.1-8b-a100", "llama3.1-8b-a100", "llama3.1-8b-l4"]
    assert fleet.num_instances == 3 and not fleet.is_uniform
    assert fleet.entries[1] == FleetEntry(load_profile("llama3.1-8b-l4"), 1)
    specs = fleet.instance_specs()
    assert [s.profile_name for s in specs] == ["llama3.1-8b-a100"] * 2 + ["llama3.1-8b-l4"]
    assert specs[2].batch_decode_tokens_per_s < specs[0].batch_decode_tokens_per_s


def test_uniform_fleet_is_the_one_entry_case():
    a100 = load_profile("llama3.1-8b-a100")
    fleet = Fleet.uniform(a100, 4)
    assert fleet == parse_fleet("llama3.1-8b-a100:4") and fleet.is_uniform
    assert fleet.profiles() == [a100] * 4 and fleet.label == "llama3.1-8b-a100x4"
    assert parse_fleet("llama3.1-8b-a100:1,llama3.1-8b-a100:3").is_uniform


def test_label_drops_the_common_prefix():
    assert parse_fleet("llama3.1-8b-a100:2,llama3.1-8b-l4:2").label == "a100x2+l4x2"
    assert parse_fleet("llama3.1-8b-a100:1,llama3.1-8b-a100-tp2:1").label == "a100x1+a100-tp2x1"


def test_a_profile_path_is_an_entry_and_stays_a_path(tmp_path):
    path = tmp_path / "my-gpu.toml"
    shutil.copy(available_profiles()["llama3.1-8b-h100"], path)
    fleet = parse_fleet(f"{path}:2,llama3.1-8b-a100:1")
    assert fleet.profiles()[0].name == "llama3.1-8b-h100" and fleet.profiles()[0].path == str(path)
    assert fleet.spec() == f"{path}:2,llama3.1-8b-a100:1"


def test_to_toml_dict_is_valid_toml_and_reads_back():
    fleet = parse_fleet("llama3.1-8b-a100:2,llama3.1-8b-l4:2")
    d = fleet.to_toml_dict()
    assert d["num_instances"] == 4 and d["label"] == "a100x2+l4x2"
    assert [(e["profile"], e["count"]) for e in d["entries"]] == [("llama3.1-8b-a100", 2), ("llama3.1-8b-l4", 2)]
    assert d["entries"][1]["hardware"] == "NVIDIA L4 24 GB"
    text = "\n".join(f"{k} = {v!r}" for k, v in d.items() if k != "entries")
    assert tomllib.loads(text.replace("'", '"'))["spec"] == d["spec"]
    assert Fleet.from_toml_dict(d) == fleet


@pytest.mark.parametrize("spec, fragment", [
    ("", "empty spec"),
    ("   ", "empty spec"),
    ("llama3.1-8b-a100:2,,llama3.1-8b-l4:1", "entry 2 of"),
    ("llama3.1-8b-a100", "entry 'llama3.1-8b-a100': not NAME_OR_PATH:COUNT"),
    ("llama3.1-8b-a100:", "entry 'llama3.1-8b-a100:': not NAME_OR_PATH:COUNT"),
    (":2", "entry ':2': not NAME_OR_PATH:COUNT"),
    ("llama3.1-8b-a100:0", "entry 'llama3.1-8b-a100:0': count must be a positive integer, not 0"),
    ("llama3.1-8b-a100:-3", "count must be a positive integer, not -3"),
    ("llama3.1-8b-a100:2.5", "entry 'llama3.1-8b-a100:2.5': count '2.5' is not an integer"),
    ("llama3.1-8b-a100:two", "count 'two' is not an integer"),
    ("llama3.1-8b-a100:1,b200:2", "entry 'b200:2': unknown profile 'b200' (known: "),
    ("llama3.1-8b-a100:1,llama2-7b-v100:1", "entry 'llama2-7b-v100:1': model"),
])
def test_errors_are_one_line_naming_the_entry(spec, fragment):
    with pytest.raises(FleetError) as info:
        parse_fleet(spec)
    msg = str(info.value)
    assert fragment in msg and "\n" not in msg and msg.startswith("fleet: ")
    assert isinstance(info.value, ValueError)


def test_unknown_profile_lists_the_known_names():
    with pytest.raises(FleetError, match="llama3.1-8b-l4"):
        parse_fleet("nope:1")


def test_mixed_models_are_refused_with_both_models_named():
    with pytest.raises(FleetError, match="one fleet serves one model") as info:
        parse_fleet("llama3.1-8b-h100:1,llama2-7b-v100:1")
    assert "Llama-3.1-8B" in str(info.value)


def test_a_broken_profile_file_is_one_line_naming_the_entry(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("name = \n[step\n")
    with pytest.raises(FleetError) as info:
        parse_fleet(f"{path}:1")
    assert str(info.value).startswith(f"fleet: entry '{path}:1': ") and "\n" not in str(info.value)


def test_fleet_built_directly_checks_counts():
    with pytest.raises(FleetError, match="positive integer"):
        Fleet.uniform(load_profile("llama3.1-8b-a100"), 0)
    with pytest.raises(FleetError, match="no entries"):
        Fleet(())


def test_instance_spec_speed_figures_follow_the_step_time_model():
    p = load_profile("llama3.1-8b-a100")
    s = p.instance_spec()
    b = p.typical_decode_batch()
    assert b == 256  # max_num_seqs (vLLM V1's default on an A100); the KV cache holds 446 sequences of 1024 tokens
    assert s.batch_decode_tokens_per_s == pytest.approx(b / p.step_time_s(0, b, b * 1024))
    assert s.prefill_tokens_per_s == pytest.approx(1024 / p.step_time_s(1024, 0, 0))
    assert (s.max_num_seqs, s.kv_capacity_tokens, s.min_step_s) == (256, p.kv_capacity_tokens, p.min_step_s)
    l4 = load_profile("llama3.1-8b-l4")
    assert l4.typical_decode_batch() == l4.kv_capacity_tokens // 1024 < 256  # a 24 GB card holds fewer
    # an L4 decodes several times slower than an A100, an H100 faster
    speeds = {n: load_profile(n).instance_spec().batch_decode_tokens_per_s for n in LLAMA31}
    assert speeds["llama3.1-8b-l4"] * 5 < speeds["llama3.1-8b-a100"] < speeds["llama3.1-8b-h100"]


def test_instance_spec_defaults_are_unchanged():
    s = InstanceSpec()
    assert (s.max_num_seqs, s.kv_capacity_tokens, s.min_step_s) == (256, 1 << 30, 0.02)
    assert s.profile_name == "" and s.batch_decode_tokens_per_s > 0 and s.prefill_tokens_per_s > 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(LLAMA31), st.integers(1, 64)), min_size=1, max_size=5))
def test_parse_of_spec_is_the_fleet(rows):
    fleet = Fleet(tuple(FleetEntry(load_profile(n), c) for n, c in rows))
    assert parse_fleet(fleet.spec()) == fleet
    assert fleet.num_instances == sum(c for _, c in rows) == len(fleet.profiles())
