import polars as pl
import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig, zero_latency_profile


@pytest.fixture(scope="module")
def fleet():
    """Two emulated instances that answer at once (zero-latency profile), for a test module."""
    with EmulatorFleet(FleetConfig(zero_latency_profile(), 2)) as f:
        yield f


@pytest.fixture
def run_on_fleet(fleet, tmp_path):
    """``run(*options)``: ``lbbench run`` of a Poisson workload (32-token prompts, 8-token outputs) against
    ``fleet`` into ``tmp_path``, asserted to exit 0; returns the CLI result and the requests table."""

    def run(*options: str):
        args = ["run", "--workload", "poisson", "--prompt-tokens", "32", "--output-tokens", "8",
                "--profile", "llama3.1-8b-a100-v0", "--out", str(tmp_path), "--format", "json", *options]
        for url in fleet.endpoints:
            args += ["--endpoint", url]
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, res.output
        return res, pl.read_parquet(tmp_path / "requests.parquet")

    return run
