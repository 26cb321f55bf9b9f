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
