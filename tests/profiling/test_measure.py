"""Profile measurement: the fit recovers known coefficients, a partial sweep is kept and marked, and an endpoint
that is not vLLM is refused with one line."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.cli.profile import write_profile_toml
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig
from lbbench.engines.vllm.info import EngineInfo
from lbbench.profiles import load_profile
from lbbench.profiling.measure import Measurement, MeasureError, Observation, fit_profile, fit_step_model

TRUE = dict(api_overhead_s=0.004, base_s=0.008, prefill_token_s=1.5e-4, decode_seq_s=2e-4, context_token_s=5e-7)


def _points(noise_s: float = 0.0, seed: int = 0) -> list[Observation]:
    rng = np.random.default_rng(seed)
    obs = []
    for p in (16, 64, 256, 1024, 2048):
        t = TRUE["api_overhead_s"] + TRUE["base_s"] + TRUE["prefill_token_s"] * p
        obs.append(Observation("ttft", p, 0, 0, t + rng.normal(0, noise_s)))
    for b in (1, 4, 16, 64):
        for c in (16, 512, 1536):
            ctx = b * (c + 24)
            t = TRUE["base_s"] + TRUE["decode_seq_s"] * b + TRUE["context_token_s"] * ctx
            obs.append(Observation("step", 0, b, ctx, t + rng.normal(0, noise_s)))
    return obs


def test_fit_recovers_known_coefficients():
    fit = fit_step_model(_points())
    for k, v in TRUE.items():
        assert fit[k] == pytest.approx(v, rel=1e-6)
    assert fit["r2"] == pytest.approx(1.0)
    noisy = fit_step_model(_points(noise_s=2e-4))
    assert noisy["prefill_token_s"] == pytest.approx(TRUE["prefill_token_s"], rel=0.05)
    assert all(noisy[k] >= 0 for k in TRUE)


def test_fit_keeps_coefficients_non_negative():
    obs = [Observation("step", 0, b, 10.0 * b, 0.01 - 1e-5 * b) for b in (1, 2, 4, 8, 16, 32)]
    obs += [Observation("ttft", p, 0, 0, 0.01 + 1e-4 * p) for p in (16, 256, 1024)]
    fit = fit_step_model(obs)
    assert fit["decode_seq_s"] == 0.0 and fit["context_token_s"] == 0.0


def test_partial_measurement_is_written_and_marked(tmp_path):
    info = EngineInfo("http://x", "tiny", "0.32.0", 128, 2048, 4096, False)
    m = Measurement(info, _points(), complete=False, error="request failed during the sweep: HTTP 500")
    prof = fit_profile(m, name="p", max_num_seqs=64, max_num_batched_tokens=2048, chunked_prefill=True,
                       hardware="test")
    path = write_profile_toml(prof, tmp_path / "p.toml")
    data = tomllib.loads(path.read_text())
    assert data["measure"]["complete"] is False and "HTTP 500" in data["measure"]["error"]
    assert "INCOMPLETE" in data["source"]["method"]
    p = load_profile(path)
    assert p.num_kv_blocks == 2048 and p.block_size == 128
    assert p.prefill_token_s == pytest.approx(TRUE["prefill_token_s"], rel=1e-3)


def test_too_few_points_is_an_error():
    with pytest.raises(MeasureError, match="too few"):
        fit_step_model(_points()[:3])


def test_measure_refuses_an_endpoint_that_is_not_vllm(tmp_path):
    from lbbench.engines.vllm.emulator import free_port
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    res = CliRunner().invoke(main, ["profile", "measure", "--endpoint", url, "--out", str(tmp_path / "m.toml")])
    assert res.exit_code == 2
    assert "not a vLLM server" in res.output and len(res.output.strip().splitlines()) == 1


def test_measure_recovers_the_profile_an_emulated_engine_runs():
    """serve-sim times requests with a known profile and answers /version and vLLM's cache_config_info metric,
    so a sweep against it must read the KV cache exactly and fit coefficients close to the profile's."""
    from lbbench.profiling.measure import Sweep, run_sweep

    prof = load_profile("llama3.1-8b-a100-v0").with_overrides(chunked_prefill=True, scheduler="v1")
    sweep = Sweep(prefill_tokens=(16, 256, 1024, 2048), decode_batches=(1, 8, 32), decode_contexts=(16, 1024),
                  decode_tokens=24, repeats=2)
    with EmulatorFleet(FleetConfig(prof, 2)) as fleet:
        m = run_sweep(fleet.endpoints, sweep=sweep, max_num_seqs=64)
    assert m.complete, m.error
    assert m.engine.num_blocks == prof.num_kv_blocks and m.engine.block_size == prof.block_size
    fit = fit_step_model(m.observations)
    # real-time emulation on a shared test machine adds scheduling noise of a few ms: loose bounds
    assert fit["prefill_token_s"] == pytest.approx(prof.prefill_token_s, rel=0.25)
    assert fit["base_s"] + 8 * fit["decode_seq_s"] == pytest.approx(prof.base_s + 8 * prof.decode_seq_s, rel=0.3)


def test_api_overhead_shifts_what_the_client_sees():
    from lbbench.core import Decision, Request
    from lbbench.sim.cluster import ClusterSim

    class First:
        name = "first"

        def route(self, queue, view, now_s):
            return Decision(0, 0)

    base = load_profile("llama3.1-8b-a100-v0")
    reqs = [Request(i, 0.01 * i, 100, 20) for i in range(5)]
    plain = {r.request_id: r for r in ClusterSim(base, 1, reqs).run(First())}
    lagged = {r.request_id: r for r in ClusterSim(base.with_overrides(api_overhead_s=0.004), 1, reqs).run(First())}
    for i, a in plain.items():
        b = lagged[i]
        assert b.dispatch_s == a.dispatch_s
        assert b.first_token_s == pytest.approx(a.first_token_s + 0.004)
        assert b.finish_s == pytest.approx(a.finish_s + 0.004)
        assert b.tbt_mean_s == pytest.approx(a.tbt_mean_s)


def test_measure_both_chunked_settings_launches_each_and_writes_two_profiles(tmp_path, monkeypatch):
    """`--chunked-prefill both` starts the engine each way (here emulated instances stand in for the launched
    vLLM servers) and writes one profile per setting; without chunked prefill the server's max_model_len is the
    token budget, as vLLM requires."""
    import contextlib

    from lbbench.cli import profile as cli_profile
    from lbbench.profiling import measure

    calls = []
    prof = load_profile("llama3.1-8b-a100-v0")

    @contextlib.contextmanager
    def fake_launch(model, instances, **kw):
        calls.append(kw)
        with EmulatorFleet(FleetConfig(prof.with_overrides(chunked_prefill=kw["chunked_prefill"]), 1)) as fleet:
            yield fleet.endpoints

    monkeypatch.setattr(cli_profile, "launch", fake_launch)  # where `profile measure` looks them up
    small = measure.Sweep(prefill_tokens=(16, 256, 1024), decode_batches=(1, 8), decode_contexts=(16, 512),
                          decode_tokens=12, repeats=1)
    monkeypatch.setattr(cli_profile, "Sweep", lambda repeats: small)
    res = CliRunner().invoke(main, ["profile", "measure", "--launch", "m", "--chunked-prefill", "both",
                                    "--max-num-batched-tokens", "2048", "--out", str(tmp_path / "p.toml")])
    assert res.exit_code == 0, res.output
    assert [c["chunked_prefill"] for c in calls] == [True, False]
    assert "--max-model-len" not in calls[0]["extra_args"]
    assert calls[1]["extra_args"][-2:] == ["--max-model-len", "2048"]
    on, off = load_profile(tmp_path / "p-chunked.toml"), load_profile(tmp_path / "p-no-chunked.toml")
    assert on.chunked_prefill and not off.chunked_prefill
    assert (tmp_path / "p-no-chunked.observations.json").is_file()


def test_measure_both_needs_launch(tmp_path):
    res = CliRunner().invoke(main, ["profile", "measure", "--endpoint", "http://127.0.0.1:9", "--chunked-prefill",
                                    "both", "--out", str(tmp_path / "p.toml")])
    assert res.exit_code == 2 and "both needs --launch" in res.output
