"""The newcomer path: a run whose requests are rejected says how many, why, and what changes it, in one line."""

from click.testing import CliRunner

from lbbench.cli import main


def test_rejected_requests_are_named_with_the_fix(tmp_path):
    res = CliRunner().invoke(main, [
        "run", "--profile", "llama2-7b-v100", "--instances", "2", "--workload", "poisson",
        "--prompt-tokens", "1500:0.5", "--output-tokens", "400", "--rate", "5", "--requests", "50",
        "--out", str(tmp_path / "r"), "--format", "json"])
    assert res.exit_code == 0, res.output
    notes = [line for line in res.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1
    assert "requests were rejected" in notes[0] and "max_model_len (2048 tokens)" in notes[0]
    assert "--max-prompt-tokens" in notes[0]


def test_run_help_shows_examples():
    res = CliRunner().invoke(main, ["run", "--help"])
    assert res.exit_code == 0 and "Examples:" in res.output and "--launch tiny" in res.output
