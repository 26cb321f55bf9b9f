"""`lbbench paper`: runs a setup through `lbbench run` and prints it beside the paper."""

from __future__ import annotations

from click.testing import CliRunner

from lbbench.cli import paper as cli_paper
from lbbench.cli import main


def test_paper_setup_runs_and_prints_the_paper_numbers(tmp_path, monkeypatch):
    small = cli_paper.Setup(("--profile", "llama2-7b-v100", "--instances", "4", "--workload", "paper-mix",
                             "--rate", "20", "--requests", "40", "--router", "round_robin,wgrl",
                             "--predictor", "noisy:0.79", "--seeds", "1"), {"wgrl": 11.43})
    monkeypatch.setitem(cli_paper.SETUPS, "main", small)
    res = CliRunner().invoke(main, ["paper", "main", "--out", str(tmp_path / "p")])
    assert res.exit_code == 0, res.output
    assert "lbbench run --profile llama2-7b-v100 --instances 4" in res.output
    line = next(x for x in res.output.splitlines() if x.strip().startswith("wgrl") and "paper" in x)
    assert "paper +11.43 %" in line and "lbbench" in line
    assert (tmp_path / "p" / "summary.parquet").is_file()


def test_main_and_scale8_print_both_regimes_each_labelled(tmp_path, monkeypatch):
    for name in ("main", "scale8"):  # physics stays the setup's own (the users' default) profile
        s = cli_paper.SETUPS[name]
        assert s.flags[s.flags.index("--profile") + 1] == "llama2-7b-v100"
        assert s.regimes == (cli_paper.PAPER_REGIME,)
    small = cli_paper.Setup(("--profile", "llama2-7b-v100", "--instances", "4", "--workload", "paper-mix",
                             "--rate", "20", "--requests", "60", "--router", "round_robin,jsq,wgrl",
                             "--predictor", "noisy:0.79", "--seeds", "1"), {"wgrl": 11.43},
                            regimes=(cli_paper.PAPER_REGIME,))
    monkeypatch.setitem(cli_paper.SETUPS, "main", small)
    monkeypatch.setattr(cli_paper, "_without_missing_checkpoints",
                        lambda args, profile: _drop(args, "wgrl"))  # whether or not one is shipped yet
    out = tmp_path / "p"
    res = CliRunner().invoke(main, ["paper", "main", "--out", str(out)])
    assert res.exit_code == 0, res.output
    text = res.output
    assert "== llama2-7b-v100: physics-derived" in text
    assert "== llama2-7b-v100-paper: calibrated to the paper's round-robin mean E2E of 168 s" in text
    assert "lbbench run --profile llama2-7b-v100-paper --instances 4" in text
    for prof in ("llama2-7b-v100", "llama2-7b-v100-paper"):
        assert (out / prof / "summary.parquet").is_file()
    side = text[text.index("side by side"):].splitlines()
    jsq = next(x for x in side if x.strip().startswith("jsq"))
    assert jsq.count(" s ") == 2 and jsq.count("%") == 2  # a cell per regime
    wgrl = next(x for x in side if x.strip().startswith("wgrl"))
    assert " - " in wgrl and "+11.43 %" in wgrl  # physics only (left out of the calibrated run)
    import polars as pl
    phys = pl.read_parquet(out / "llama2-7b-v100" / "summary.parquet")
    cal = pl.read_parquet(out / "llama2-7b-v100-paper" / "summary.parquet")
    assert set(cal["router"]) == {"round_robin", "jsq"} and "wgrl" in set(phys["router"])


def _drop(args, router):
    out = list(args)
    i = out.index("--router")
    out[i + 1] = ",".join(r for r in out[i + 1].split(",") if r != router)
    return out


def test_learned_router_without_a_checkpoint_for_the_regime_is_left_out_with_a_note(capsys):
    args = ["--profile", "llama2-7b-v100", "--instances", "6", "--router", "round_robin,wgrl,jsq"]
    kept = cli_paper._without_missing_checkpoints(args, "llama2-7b-v100")
    assert kept[kept.index("--router") + 1] == "round_robin,jsq"
    assert "wgrl left out of the llama2-7b-v100 run" in capsys.readouterr().out
    four = cli_paper._without_missing_checkpoints(["--instances", "4", "--router", "wgrl"], "llama2-7b-v100")
    assert four[-1] == "wgrl"  # shipped for 4 x physics V100


def test_paper_setup_without_a_checkpoint_or_trace_exits_2(tmp_path, monkeypatch):
    runner = CliRunner()
    s8 = cli_paper.SETUPS["scale8"]
    six = cli_paper.Setup(tuple("6" if f == "8" else f for f in s8.flags), s8.paper_pct)
    monkeypatch.setitem(cli_paper.SETUPS, "scale8", six)  # no checkpoint is shipped for 6 instances
    res = runner.invoke(main, ["paper", "scale8", "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and "no shipped checkpoint for profile 'llama2-7b-v100' with 6 instances" in res.output
    res = runner.invoke(main, ["paper", "production", "--out", str(tmp_path / "q")])
    assert res.exit_code == 2 and "--trace" in res.output


def test_paper_production_trains_the_metadata_predictor_on_the_other_half(tmp_path, monkeypatch):
    import numpy as np

    rng = np.random.default_rng(0)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(360):  # one request every 10 s: an hour, as the real trace
        t = 10 * i
        lines.append(f"2023-11-16 {18 + t // 3600:02d}:{t // 60 % 60:02d}:{t % 60:02d}.0000000,"
                     f"{int(rng.integers(10, 900))},{int(rng.integers(5, 300))}")
    trace = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    trace.write_text("\n".join(lines) + "\n")
    prod = cli_paper.SETUPS["production"]
    small = cli_paper.Setup(tuple("40" if f == "2000" else f for f in prod.flags),
                            prod.paper_pct, prod.note)
    monkeypatch.setitem(cli_paper.SETUPS, "production", small)
    out = tmp_path / "prod"
    res = CliRunner().invoke(main, ["paper", "production", "--trace", str(trace), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "metadata predictor trained on AzureLLMInferenceTrace_conv.csv from 1800 s on" in res.output
    assert f"--predictor metadata:{out / 'metadata-predictor'}" in res.output
    from lbbench.predict.metadata import MetadataPredictor
    model = MetadataPredictor.load(out / "metadata-predictor")
    assert model.config.num_train_examples == round(180 * 0.8)  # rows from 1800 s on, less the test share
    assert any(x.strip().startswith("wgrl") and "vs strongest" in x for x in res.output.splitlines())
