"""Each importer on small faithful inputs (``fixtures/README.md`` says where each format comes from), against rows
worked out by hand from the fixture's numbers."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import tomli_w
import yaml

from lbbench.measured import MeasuredError
from lbbench.measured.importers import detect, import_measured
from lbbench.measured.importers.inference_perf import line_timing_factor
from lbbench.measured.importers.mlperf import engine_args, identify_benchmark, read_conf

FIXTURES = Path(__file__).parent / "fixtures"
AIPERF = FIXTURES / "aiperf_qwen7b_rate6"


def _set(row, **expected):
    for k, v in expected.items():
        got = getattr(row, k)
        assert got == (pytest.approx(v, abs=0.006) if isinstance(v, float) else v), k  # rows keep 2-3 decimals


def test_vllm_bench_appended_runs_are_stages():
    rep = import_measured("auto", [FIXTURES / "vllm_bench_llama8b_h100.json"])
    assert rep.kinds == ["vllm-bench"] and not rep.problems and not rep.notes
    a, b = rep.rows
    # run 1: 5 requests, TTFT 20/22/25/30/41 ms, TPOT 10.0/10.2/10.5/11.0/12.0 ms, 128 tokens, 2.5 s
    _set(a, id="vllm_bench_llama8b_h100", stage=0, model="meta-llama/Llama-3.1-8B-Instruct", engine="vllm",
         gpu="h100", tp=1, max_num_seqs=256, output_tokens=128, ignore_eos=True,  # from --metadata
         arrival="poisson", rate_rps=4.0, requests=5, duration_s=2.5, prompt_tokens_mean=520.0,
         ttft_mean_ms=27.6, ttft_p50_ms=25.0, ttft_p90_ms=36.6, ttft_p99_ms=40.56,
         itl_mean_ms=10.74, tpot_p50_ms=10.5, tpot_p99_ms=11.96,
         e2e_mean_ms=27.6 + 127 * 10.74, e2e_p50_ms=25.0 + 127 * 10.5,
         throughput_rps=2.0, output_tok_s=256.0)
    _set(b, stage=1, rate_rps=8.0, itl_mean_ms=(11.0 + 11.2 + 11.6 + 12.1 + 13.3) / 5, throughput_rps=2.5)


def test_vllm_bench_refuses_what_the_schema_cannot_express(tmp_path):
    base = json.loads((FIXTURES / "vllm_bench_llama8b_h100.json").read_text().splitlines()[0])
    p = tmp_path / "runs.json"
    p.write_text("\n".join(json.dumps({**base, **change}) for change in (
        {"burstiness": 0.5}, {"max_concurrency": 16}, {"request_rate": "inf"})))
    rep = import_measured("vllm-bench", [p])
    assert [str(e).split("column arrival: ")[1] for e in rep.problems] == [
        "burstiness 0.5: gamma-distributed arrivals have no arrival kind in the schema",
        "max_concurrency 16: a concurrency-capped client does not send the offered arrival process, which the "
        "schema needs"]
    (burst,) = rep.rows
    assert (burst.stage, burst.arrival, burst.rate_rps) == (2, "burst", None)


def test_guidellm_open_loop_benchmarks():
    rep = import_measured("auto", [FIXTURES / "guidellm_benchmarks.json"], ["gpu=h100", "tp=1"])
    assert rep.kinds == ["guidellm"] and len(rep.problems) == 1  # the synchronous benchmark
    const, pois = rep.rows
    # constant 2 req/s: TTFT 32/33/35/36/40/45 ms, ITL 8.4/8.5/8.5/8.6/8.8/9.0 ms, 128 tokens
    _set(const, stage=1, arrival="constant", rate_rps=2.0, model="Qwen/Qwen2.5-7B-Instruct", output_tokens=128,
         requests=6, duration_s=3.0, prompt_tokens_mean=3083 / 6, prompt_tokens_max=520,
         ttft_mean_ms=221 / 6, ttft_p50_ms=35.5, itl_mean_ms=51.8 / 6, tpot_p50_ms=8.55,
         e2e_mean_ms=221 / 6 + 127 * 51.8 / 6, throughput_rps=1.98, output_tok_s=1.98 * 128)
    _set(pois, stage=2, arrival="poisson", rate_rps=4.0, throughput_rps=3.9)


def test_aiperf_json_and_csv_agree():
    j = import_measured("auto", [AIPERF / "profile_export_aiperf.json"], ["gpu=h100", "tp=1"])
    c = import_measured("auto", [AIPERF / "profile_export_aiperf.csv"],
                        ["gpu=h100", "tp=1", "model=Qwen/Qwen2.5-7B-Instruct", "arrival=poisson", "rate_rps=6"])
    assert j.kinds == c.kinds == ["aiperf"]
    (row,), (crow,) = j.rows, c.rows
    _set(row, id="aiperf_qwen7b_rate6", model="Qwen/Qwen2.5-7B-Instruct", arrival="poisson", rate_rps=6.0,
         output_tokens=200, ignore_eos=True, requests=300, duration_s=50.8, prompt_tokens_mean=1000.0,
         ttft_mean_ms=48.31, ttft_p90_ms=70.66, itl_mean_ms=10.54, tpot_p99_ms=12.2, e2e_p99_ms=2512.86,
         throughput_rps=5.9055, output_tok_s=1181.1)
    for col in ("ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms", "itl_mean_ms", "e2e_mean_ms", "requests", "duration_s",
                "output_tokens"):
        assert getattr(crow, col) == getattr(row, col), col
    assert crow.throughput_rps == 5.91  # the CSV keeps 2 decimals


def test_aiperf_concurrency_is_refused(tmp_path):
    data = json.loads((AIPERF / "profile_export_aiperf.json").read_text())
    data["input_config"]["loadgen"] = {"concurrency": 32, "request_count": 300}
    p = tmp_path / "profile_export_aiperf.json"
    p.write_text(json.dumps(data))
    rep = import_measured("aiperf", [p], ["gpu=h100", "tp=1"])
    assert not rep.rows and str(rep.problems[0]).endswith(
        "column arrival: concurrency 32: a concurrency-bound load has no arrival kind in the schema (poisson, "
        "constant, burst)")


# ---------------------------------------------------------------------------------------------- inference-perf
def test_line_timing_factor():
    """(E2E - TTFT) / TPOT = 2n + 1 means one timestamp per SSE line; n - 1 means one per token."""
    n, e2e, ttft = 247, 1.81032, 0.025037
    assert line_timing_factor(e2e, ttft, (e2e - ttft) / 495, n) == pytest.approx(495 / 246)
    assert line_timing_factor(e2e, ttft, (e2e - ttft) / 246, n) == 1.0
    assert line_timing_factor(e2e, ttft, (e2e - ttft) / 350, n) is None


def _stage(tpot_s, e2e_s=2.0, ttft_s=0.05, out_len=180.0):
    lat = {k: v for k, v in (("mean", 1), ("median", 1), ("p90", 1), ("p99", 1))}
    return {"load_summary": {"count": 100, "requested_rate": 2.0},
            "successes": {"count": 100, "latency": {
                "request_latency": {k: e2e_s * v for k, v in lat.items()},
                "time_to_first_token": {k: ttft_s * v for k, v in lat.items()},
                "time_per_output_token": {k: tpot_s * v for k, v in lat.items()}},
                "throughput": {"requests_per_sec": 1.9, "output_tokens_per_sec": 1.9 * out_len},
                "prompt_len": {"mean": 300.0, "max": 400.0}, "output_len": {"mean": out_len}},
            "failures": {"count": 0}}


def test_inference_perf_folder_timed_per_token(tmp_path):
    """A random-data Poisson run from a newer inference-perf (per-token timestamps): TPOT kept as measured."""
    d = tmp_path / "exp-1"
    (d / "results").mkdir(parents=True)
    (d / "exp-config.yaml").write_text(yaml.safe_dump({"model": "Qwen/Qwen2.5-7B-Instruct", "tensor_parallelism": 1,
                                                       "max_num_seqs": 64}))
    (d / "results" / "config.yaml").write_text(yaml.safe_dump({
        "data": {"type": "random", "output_distribution": {"min": 100, "max": 200, "mean": 150}},
        "load": {"type": "poisson", "stages": [{"rate": 2.0, "duration": 50}]},
        "server": {"type": "vllm", "model_name": "Qwen/Qwen2.5-7B-Instruct", "ignore_eos": False}}))
    (d / "results" / "stage_0_lifecycle_metrics.json").write_text(json.dumps(_stage((2.0 - 0.05) / 179)))
    rep = import_measured("auto", [tmp_path], ["gpu=h100"])
    assert rep.kinds == ["inference-perf"]
    (row,) = rep.rows
    _set(row, id="exp-1", arrival="poisson", rate_rps=2.0, duration_s=50.0, requests=100, output_tokens=200,
         max_num_seqs=64, replicas=1, weights_dtype="bf16", ignore_eos=False, prefix_groups=None,
         itl_mean_ms=1950 / 179, e2e_mean_ms=2000.0, throughput_rps=1.9, output_tok_s=342.0)
    assert rep.notes == ["exp-1: output_tokens is the output distribution's max (200), the cap each request asked "
                         "for"]


def test_inference_perf_unclear_timing_leaves_itl_empty(tmp_path):
    d = tmp_path / "exp-2"
    (d / "results").mkdir(parents=True)
    (d / "results" / "config.yaml").write_text(yaml.safe_dump({
        "data": {"type": "shared_prefix", "shared_prefix": {"num_groups": 2, "num_prompts_per_group": 3,
                                                           "system_prompt_len": 50, "question_len": 200,
                                                           "output_len": 100}},
        "load": {"type": "constant", "stages": [{"rate": 2.0, "duration": 50}]},
        "server": {"type": "vllm", "model_name": "meta-llama/Llama-2-7b-hf", "ignore_eos": True}}))
    (d / "results" / "stage_0_lifecycle_metrics.json").write_text(json.dumps(_stage(0.0131)))
    rep = import_measured("inference-perf", [d], ["gpu=h100", "tp=1"])
    (row,) = rep.rows
    assert row.itl_mean_ms is None and row.tpot_p50_ms is None and row.multi_turn is False
    assert row.output_tok_s == pytest.approx(1.9 * 100) and row.prefix_groups == 2
    assert any("cannot tell how TPOT was timed" in n for n in rep.notes)


# ---------------------------------------------------------------------------------------------- MLPerf
def test_identify_benchmark_from_mlperf_conf(tmp_path):
    conf = tmp_path / "mlperf.conf"
    conf.write_text("gptj.*.performance_sample_count_override = 13368\n"
                    "llama3_1-8b.*.performance_sample_count_override = 13368\n"
                    "llama3_1-8b-interactive.*.performance_sample_count_override = 13368\n"
                    "llama3_1-8b.*.use_token_latencies = 1\nllama3_1-8b-interactive.*.use_token_latencies = 1\n"
                    "llama3_1-8b.Server.ttft_latency = 2000\nllama3_1-8b.Server.tpot_latency = 100\n"
                    "llama3_1-8b-interactive.Server.ttft_latency = 500 # ms\n"
                    "llama3_1-8b-interactive.Server.tpot_latency = 30\n")
    log = {"effective_scenario": "Server", "effective_performance_sample_count": 13368,
           "requested_use_token_latencies": True, "requested_server_ttft_latency": 2_000_000_000,
           "requested_server_tpot_latency": 100_000_000}
    assert identify_benchmark(read_conf(conf), log) == ["llama3_1-8b"]
    offline = {"effective_scenario": "Offline", "effective_performance_sample_count": 13368,
               "requested_use_token_latencies": True}
    assert identify_benchmark(read_conf(conf), offline) == ["llama3_1-8b", "llama3_1-8b-interactive"]


def test_engine_args_from_a_harness_readme():
    readme = ("### Running the harness for MLPerf Server Scenario\n#### 1. On H100\n- A. Spin up the vllm server<br>\n"
              "```\nvllm serve --max-model-len 8192 --max_num_batched_tokens 2048 --max-num-seqs=256 "
              "--no-enable-prefix-caching --kv-cache-dtype fp8 -O3`\n```\n#### 2. On L40S\n"
              "vllm serve --max-num-seqs 64\n### Running the harness for MLPerf Offline Scenario\n#### 1. On H100\n"
              "python3 SUT.py --model <m> --max-model-len 4096 --max-num-seqs 1024 --tensor-parallel-size 2\n")
    flags, line = engine_args(readme, "Server", "H100")
    assert flags == {"max_model_len": 8192, "max_num_batched_tokens": 2048, "max_num_seqs": 256,
                     "prefix_caching": False, "kv_dtype": "fp8"}
    assert engine_args(readme, "Server", "L40S")[0] == {"max_num_seqs": 64}
    assert engine_args(readme, "Offline", "H100")[0] == {"max_model_len": 4096, "max_num_seqs": 1024, "tp": 2}
    assert engine_args(readme, "Server", "B200") is None


# ---------------------------------------------------------------------------------------------- lbbench live run
def _run_dir(tmp_path, backend="live", out_tokens=(101, 101, 101, 101), **config):
    d = tmp_path / "run"
    d.mkdir(parents=True)
    rows = []
    for router in ("jsq", "round_robin"):
        for rate in (2.0, 4.0):
            for i, (arr, ft, fin, err) in enumerate(((0.0, 0.05, 1.05, None), (0.5, 0.56, 1.66, None),
                                                     (1.0, 1.08, 2.28, None), (1.5, None, None, "HTTP 500"))):
                rows.append({"run_id": "live-demo", "router": router, "seed": 0, "request_id": i, "arrival_s": arr,
                             "dispatch_s": arr, "first_token_s": ft, "finish_s": fin, "prompt_tokens": 100 + 20 * i,
                             "output_tokens": out_tokens[i], "generated_tokens": 0 if err else 101, "error": err,
                             "rate_per_s": rate, "backend": backend})
    pl.DataFrame(rows).write_parquet(d / "requests.parquet")
    cfg = {"backend": backend, "model": "meta-llama/Llama-3.1-8B-Instruct", "engine": "vllm", "instances": 2,
           "endpoints": ["http://a:8000", "http://b:8000"], "burstiness": 1.0, "rates": [2.0, 4.0], **config}
    (d / "run.toml").write_text(tomli_w.dumps({"run_id": "live-demo", "complete": True, "config": cfg,
                                               "profile": {"model": "x", "max_num_seqs": 128}}))
    return d


def test_lbbench_live_run_rows(tmp_path):
    d = _run_dir(tmp_path)
    assert detect(d) == "lbbench-run"
    rep = import_measured("auto", [d], ["gpu=h100", "tp=1"])
    assert [r.key for r in rep.rows] == [("live-demo-jsq", 0), ("live-demo-jsq", 1), ("live-demo-round_robin", 0),
                                         ("live-demo-round_robin", 1)]
    # three completed requests: TTFT 50/60/80 ms, E2E 1050/1160/1280 ms, 101 tokens in 1.00/1.10/1.20 s after the
    # first; the failed one counts as sent; makespan 2.28 s, arrivals over 1.5 s
    _set(rep.rows[2], model="meta-llama/Llama-3.1-8B-Instruct", engine="vllm", replicas=2, ignore_eos=True,
         arrival="poisson", rate_rps=2.0, output_tokens=101, requests=4, duration_s=1.5, prompt_tokens_mean=130.0,
         prompt_tokens_max=160, ttft_mean_ms=190 / 3, ttft_p50_ms=60.0, ttft_p90_ms=76.0, ttft_p99_ms=79.6,
         e2e_mean_ms=3490 / 3, e2e_p90_ms=1256.0, itl_mean_ms=11.0, tpot_p50_ms=11.0, tpot_p99_ms=11.98,
         throughput_rps=3 / 2.28, output_tok_s=303 / 2.28, max_num_seqs=None)


def test_lbbench_run_refusals(tmp_path):
    with pytest.raises(MeasuredError, match="a sim run is not a measurement"):
        import_measured("lbbench-run", [_run_dir(tmp_path / "a", backend="sim")])
    rep = import_measured("lbbench-run", [_run_dir(tmp_path / "b", out_tokens=(50, 60, 70, 80))],
                          ["gpu=h100", "tp=1"])
    assert not rep.rows and str(rep.problems[0]).endswith(
        "column output_tokens: requests asked for 4 different output lengths (50-80): the schema describes one")
