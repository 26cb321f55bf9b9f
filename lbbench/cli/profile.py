"""``lbbench profile derive|measure|calibrate``: where profiles come from (``lbbench fidelity``, in ``fidelity.py``,
says how true they are; the options the two share are in ``flags.py``)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import platform
import tomllib
from pathlib import Path

import click
import tomli_w

from ..engines.vllm.launcher import launch, visible_gpus
from ..experiment import annotated_requests
from ..profiles import load_profile
from ..profiling.gpus import get_gpu
from ..profiling.measure import MeasureError, Sweep, fit_profile, observations_json, run_sweep
from ..profiling.models import load_model_config
from ..routers import get_router
from ..sim.cluster import ClusterSim
from .common import launch_as_profile
from .flags import (api_server_option, backend_and_workload_options, cpus_per_instance_option, load_options,
                    log_dir_option, port_option, predictor_option, repeats_option, seed_option, ttft_fit_option,
                    vllm_python_option)


def write_profile_toml(profile: dict, out: str | Path) -> Path:
    """Write a profile dict (as ``derive_profile`` / ``fit_profile`` return) to ``out``."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(tomli_w.dumps(profile))
    return out


@click.group("profile")
def profile() -> None:
    """Make profiles: from first principles (derive) or from a live engine (measure)."""


@profile.command("derive")
@click.option("--model", "model_name", required=True,
              help="A shipped model config (llama-2-7b, llama-3.1-8b, llama-3.1-70b, mistral-7b, qwen2.5-7b, ...) "
                   "or a Hugging Face config.json path.")
@click.option("--gpu", required=True, help="GPU name (v100-16gb, v100-32gb, a10g, l4, l40s, a100-40gb, a100-80gb, "
                                           "h100, h200, mi300x).")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor-parallel GPUs.")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32", "fp8"]), default="bf16", show_default=True,
              help="The weights' dtype.")
@click.option("--kv-dtype", type=click.Choice(["auto", "bf16", "fp16", "fp8"]), default="auto", show_default=True,
              help="The KV cache's dtype (auto: the activations' 16 bits, as vLLM's --kv-cache-dtype auto).")
@click.option("--gpu-memory-utilization", type=click.FloatRange(0.05, 1.0), default=0.9, show_default=True)
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=None,
              help="Default: vLLM's (V1: 1024 on a GPU of 70 GiB or more that is not an A100, else 256; V0: 256).")
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=None,
              help="Default: vLLM's (with chunked prefill, V1: 8192 on a GPU of 70 GiB or more that is not an "
                   "A100, else 2048; without: max(max_model_len, 2048)).")
@click.option("--max-model-len", type=click.IntRange(min=16), default=None,
              help="Default: the model's max_position_embeddings, at most 8192.")
@click.option("--chunked-prefill/--no-chunked-prefill", default=True, show_default=True)
@click.option("--scheduler", type=click.Choice(["v1", "v0"]), default="v1", show_default=True,
              help="Engine semantics the simulator applies (v0: vLLM V0 without chunked prefill, as the paper ran).")
@click.option("--calibration", "calibration_file", default=None, type=click.Path(dir_okay=False),
              help="A calibration TOML (`lbbench profile fit --measured` writes one) whose efficiency factors and "
                   "front-end latency the profile takes. Default: the shipped one.")
@click.option("--prefill-mfu", type=click.FloatRange(0.01, 1.0), default=None,
              help="Override the calibration's share of peak FLOP/s large GEMMs reach.")
@click.option("--weight-bw-util", type=click.FloatRange(0.01, 1.0), default=None,
              help="Override the calibration's share of peak bandwidth reached streaming weights.")
@click.option("--roofline-sharpness", type=click.FloatRange(1.0, None), default=None,
              help="Override the calibration's soft-roofline sharpness (a large value: a hard max).")
@click.option("--kv-bw-util", type=click.FloatRange(0.01, 1.0), default=None,
              help="Override the calibration's share of peak bandwidth reached reading the KV cache.")
@click.option("--step-overhead-s", type=click.FloatRange(0.0, 1.0), default=None,
              help="Override the calibration's fixed per-step cost outside the layers' kernels.")
@click.option("--grad1", type=float, default=None, help="Mixing estimator grad1 (default: the prefill cost).")
@click.option("--grad2", type=float, default=None, help="Mixing estimator grad2 (default: the decode cost).")
@click.option("--min-step-s", type=float, default=None,
              help="Decision interval (default: the single-sequence step time).")
@click.option("--name", default=None, help="Profile name (default: MODEL-GPU[-tpN]).")
@click.option("--note", default=None,
              help="Say here why a factor was overridden, e.g. to match a published number (goes to [source]).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Profile TOML to write.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def derive_cmd(model_name: str, gpu: str, tp: int, dtype: str, kv_dtype: str, gpu_memory_utilization: float,
               max_num_seqs: int | None, max_num_batched_tokens: int | None, max_model_len: int | None,
               chunked_prefill: bool, scheduler: str, calibration_file: str | None, prefill_mfu: float | None,
               weight_bw_util: float | None, roofline_sharpness: float | None, kv_bw_util: float | None,
               step_overhead_s: float | None, grad1: float | None, grad2: float | None, min_step_s: float | None,
               name: str | None, note: str | None, out: str, fmt: str) -> None:
    """Derive a profile from a model config and a GPU: KV blocks as vLLM's memory profiler sizes them, and every
    step priced by a roofline (`[step] model = "roofline"`) whose efficiency factors are a calibration's (the
    shipped one, fitted to public vLLM measurements, unless --calibration or an override says otherwise). The
    engine is vLLM V1 with chunked prefill and its default limits unless told otherwise."""
    from ..profiling.calibration import load_calibration  # lazy: start-up time (the calibration file)
    from ..profiling.derive import EngineLimits, derive_profile  # lazy: start-up time (the roofline)

    model = load_model_config(model_name)
    g = get_gpu(gpu)
    cal = load_calibration(calibration_file)
    given = {"prefill_mfu": prefill_mfu, "weight_bw_util": weight_bw_util, "sharpness": roofline_sharpness,
             "kv_bw_util": kv_bw_util, "step_overhead_s": step_overhead_s}
    overridden = {k: v for k, v in given.items() if v is not None}
    if overridden:
        cal = dataclasses.replace(cal, eff=dataclasses.replace(cal.eff, **overridden))
    prof = derive_profile(
        model, g, dtype=dtype, kv_dtype=kv_dtype, tp=tp, name=name, calibration=cal,
        engine=EngineLimits(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                            max_model_len=max_model_len, chunked_prefill=chunked_prefill, scheduler=scheduler,
                            gpu_memory_utilization=gpu_memory_utilization))
    if overridden:
        prof["source"]["efficiency_overrides"] = (", ".join(f"{k} {v:g}" for k, v in overridden.items())
                                                  + " given to derive in place of the calibration's")
    if note:
        prof["source"]["note"] = note
    for key, value in (("grad1", grad1), ("grad2", grad2), ("min_step_s", min_step_s)):
        if value is not None:
            prof["mixing"][key] = value
            prof["source"][f"mixing.{key}"] = "given to derive (--" + key.replace("_", "-") + ")"
    path = write_profile_toml(prof, out)
    if fmt == "json":
        cited = ("method", "efficiency", "efficiency_overrides", "api_overhead_s", "engine", "note")
        click.echo(json.dumps({"path": str(path), **{k: prof[k] for k in ("step", "kv", "engine", "physics",
                                                                          "efficiency")},
                               "num_params": model.num_params,
                               "source": {k: prof["source"][k] for k in cited if k in prof["source"]}}, indent=2))
        return
    s, kv, e = prof["step"], prof["kv"], prof["engine"]
    click.echo(f"{prof['name']}: {model.num_params / 1e9:.2f} B parameters, "
               f"{prof['roofline']['kv_bytes_per_token'] / 1024:.0f} KiB KV per token per GPU")
    click.echo(f"  engine: vLLM {e['scheduler']}, chunked prefill {'on' if e['chunked_prefill'] else 'off'}, "
               f"max_num_seqs {e['max_num_seqs']}, max_num_batched_tokens {e['max_num_batched_tokens']}, "
               f"max_model_len {e['max_model_len']}")
    click.echo(f"  step: roofline; linear summary {s['base_s'] * 1e3:.2f} ms + {s['prefill_token_s'] * 1e6:.1f} "
               f"us/prefill token + {s['decode_seq_s'] * 1e6:.2f} us/decode seq + "
               f"{s['context_token_s'] * 1e9:.1f} ns/context token")
    click.echo(f"  KV: {kv['num_kv_blocks']} blocks of {kv['block_size']} "
               f"({kv['num_kv_blocks'] * kv['block_size']} tokens)")
    click.echo(f"  efficiency: {cal.describe()}" + (f"; overridden: {', '.join(overridden)}" if overridden else ""))
    click.echo(f"wrote {path}")


@profile.command("efficiency")
@click.option("--vidur", "vidur_dir", default=None, type=click.Path(file_okay=False, exists=True),
              help="Refit from a checkout of github.com/microsoft/vidur (its data/profiling/compute/*/mlp.csv); "
                   "without it, show the shipped fit.")
@click.option("--commit", default=None, help="With --vidur: the checkout's commit, recorded in the table.")
@click.option("--out", default=None, type=click.Path(dir_okay=False),
              help="With --vidur: where to write the table (the shipped one is lbbench/profiling/efficiency.toml).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def efficiency_cmd(vidur_dir: str | None, commit: str | None, out: str | None, fmt: str) -> None:
    """The roofline efficiency factors derive uses, fitted to measured GPU timings: per tensor parallelism and
    model size, with the fit error on the A100 files and the held-out H100 check."""
    from ..profiling.efficiency import TABLE_PATH  # lazy: start-up time (the roofline's efficiency tables, ~15 ms)

    if vidur_dir is not None:
        # lazy: start-up time (the roofline's efficiency tables, ~15 ms)
        from ..profiling.efficiency_build import build_table

        if not commit or not out:
            raise click.UsageError("--vidur needs --commit SHA (the checkout's) and --out FILE")
        doc = build_table(vidur_dir, commit)
        Path(out).write_text(tomli_w.dumps(doc))
    else:
        doc = tomllib.loads(TABLE_PATH.read_text())
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    src = doc["source"]
    click.echo(f"measured: {src['repository']} commit {src['commit'][:12]} ({src['licence']}), {src['files']}")
    click.echo(f"{'gpu':10} {'tp':>2} {'models':28} {'MFU':>6} {'BW':>6} {'p':>5}  fit: mean / worst |error|")
    for r in doc["fit"]:
        errs = r["errors"]
        click.echo(f"{r['gpu']:10} {r['tp']:>2} {', '.join(r['models']):28} {r['prefill_mfu']:>6.3f} "
                   f"{r['weight_bw_util']:>6.3f} {r['sharpness']:>5.2f}  "
                   + "; ".join(f"{e['file'].split('/')[-2]} {e['mean_abs_pct']:.1f} / {e['max_abs_pct']:.1f} %"
                               for e in errs))
    for v in doc.get("validation", []):
        click.echo(f"held out {v['gpu']} TP {v['tp']} {v['file'].split('/')[-2]} (factors of {v['fitted_on']}): "
                   f"mean {v['mean_abs_pct']:.1f} %, worst {v['max_abs_pct']:.1f} % at {v['max_at_tokens']} tokens, "
                   f"prefill marginal {(v['marginal_pred_s'] / v['marginal_s'] - 1) * 100:+.1f} %")
    if out:
        click.echo(f"wrote {out}")


@profile.command("measure")
@click.option("--endpoint", multiple=True, help="A running vLLM server (base URL); repeat for several "
                                                "instances of one configuration (their points are pooled).")
@click.option("--launch", "launch_model", default=None,
              help="Start one vLLM server for this model (`tiny`: the tiny local model) and measure it.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Profile TOML to write.")
@click.option("--name", default=None, help="Profile name (default: the file name).")
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=64, show_default=True,
              help="The engine's max_num_seqs (passed to the server with --launch).")
@click.option("--max-num-batched-tokens", type=click.IntRange(min=16), default=2048, show_default=True,
              help="The engine's token budget per step (passed to the server with --launch).")
@click.option("--chunked-prefill", type=click.Choice(["on", "off", "both"]), default="on", show_default=True,
              help="Chunked prefill as the engine runs it (vLLM V1's default is on). `both` (with --launch) "
                   "measures the engine started each way and writes OUT-chunked.toml and OUT-no-chunked.toml.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Repeats of each prefill point.")
@click.option("--instances", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --launch: servers to start (the machine's cores split between them, as `lbbench launch` "
                   "does); each is measured in turn and the points pooled. Measure with the split you will run.")
@click.option("--hardware", default=None, help="What the engine runs on, for the profile (default: a guess).")
@vllm_python_option(help="Python of the vLLM environment (with --launch).")
@log_dir_option(default="runs/measure-logs")
@port_option("--port", default=8150, help="Port for the launched server.")
@cpus_per_instance_option()
@api_server_option
def measure_cmd(endpoint: tuple[str, ...], launch_model: str | None, out: str, name: str | None, max_num_seqs: int,
                max_num_batched_tokens: int, chunked_prefill: str, repeats: int, instances: int,
                hardware: str | None,
                vllm_python: str | None, log_dir: str, port: int, cpus_per_instance: int | None,
                api_server_cores: str) -> None:
    """Fit a profile to a live vLLM: a sweep of prefill sizes, decode batch sizes and context lengths, KV blocks
    read from the engine, least-squares step-time coefficients with residuals in [source]."""
    if bool(endpoint) == (launch_model is not None):
        raise click.UsageError("give exactly one of --endpoint URL or --launch MODEL")
    if chunked_prefill == "both" and launch_model is None:
        raise click.BadParameter("both needs --launch (an --endpoint runs one setting, as it was started)",
                                 param_hint="--chunked-prefill")
    if hardware is None:
        gpus = visible_gpus()
        hardware = f"{len(gpus)} GPU(s)" if gpus else f"CPU ({platform.machine()}, vLLM CPU build)"
    base = Path(out)
    if chunked_prefill == "both":
        runs = [(True, base.with_name(base.stem + "-chunked.toml")),
                (False, base.with_name(base.stem + "-no-chunked.toml"))]
    else:
        runs = [(chunked_prefill == "on", base)]
    for chunked, out_path in runs:
        extra = ["--no-enable-prefix-caching"]
        if not chunked:  # vLLM without chunked prefill needs max_num_batched_tokens >= max_model_len
            extra += ["--max-model-len", str(max_num_batched_tokens)]
        if launch_model is not None:
            ctx = launch(launch_model, instances, chunked_prefill=chunked, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens, vllm_python=vllm_python,
                         log_dir=log_dir, port_base=port, extra_args=extra, cpus_per_instance=cpus_per_instance,
                         front_end=api_server_cores)
        else:
            ctx = contextlib.nullcontext(list(endpoint))
        with ctx as urls:
            m = run_sweep(list(urls), sweep=Sweep(repeats=repeats), max_num_seqs=max_num_seqs,
                          progress=lambda what: click.echo(f"  measured {what}", err=True))
        obs_path = out_path.with_suffix(".observations.json")
        obs_path.parent.mkdir(parents=True, exist_ok=True)
        obs_path.write_text(observations_json(m))
        pname = name + out_path.stem[len(base.stem):] if name else out_path.stem
        prof = fit_profile(m, name=pname, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens, chunked_prefill=chunked,
                           hardware=hardware)
        write_profile_toml(prof, out_path)
        s = prof["step"]
        click.echo(f"{prof['name']}: step = {s['base_s'] * 1e3:.2f} ms + {s['prefill_token_s'] * 1e6:.2f} us/prefill "
                   f"token + {s['decode_seq_s'] * 1e6:.2f} us/decode seq + {s['context_token_s'] * 1e9:.2f} "
                   f"ns/context token; R2 {prof['measure']['r2']:.4f}; KV {prof['kv']['num_kv_blocks']} blocks of "
                   f"{prof['kv']['block_size']}; chunked prefill {'on' if chunked else 'off'}")
        click.echo(f"wrote {out_path} (points in {obs_path})")
        if not m.complete:
            raise MeasureError(f"sweep incomplete ({m.error}); {out_path} is marked complete = false")


@profile.command("calibrate")
@click.option("--profile", "profile_name", required=True,
              help="The measured profile (a .toml) to calibrate; the shape of its prefill and decode costs is kept.")
@backend_and_workload_options
@click.option("--router", default="round_robin", show_default=True, help="Router of the calibration replays.")
@load_options
@repeats_option(default=2, help="Live replays of the calibration requests (their means are fitted).")
@seed_option(default=1,
             help="Seed of the calibration requests: not the seed you evaluate on (fidelity's default is 0).")
@predictor_option
@vllm_python_option()
@ttft_fit_option(default="mean")
@log_dir_option(default="runs/calibrate-logs")
@port_option("--port-base", default=8170)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Calibrated profile TOML to write.")
def calibrate_cmd(profile_name: str, endpoint: tuple[str, ...], launch_model: str | None, instances: int,
                  cpus_per_instance: int | None, api_server_cores: str,
                  workload: str, trace: str | None, max_prompt_tokens: int | None, prompt_tokens: str,
                  output_tokens: str, router: str, requests: int, rate: float, repeats: int, seed: int,
                  predictor: str, vllm_python: str | None, ttft_fit: str, log_dir: str, port_base: int,
                  out: str) -> None:
    """Fit a measured profile to the regime of a live replay: one factor on the decode-step costs from the mean
    time between tokens, one on the prefill costs from the mean time to first token (end-to-end latency is fitted
    on neither). Validate on other requests with `lbbench fidelity --seed 0`."""
    path = Path(profile_name)
    if path.suffix != ".toml" or not path.is_file():
        raise click.BadParameter(f"{profile_name}: give the measured profile's .toml file", param_hint="--profile")
    # lazy: start-up time (calibration and fidelity's modules, ~20 ms)
    from ..profiling.calibrate import calibrated_toml, fit, live_replays

    prof = load_profile(path)
    ctx = launch_as_profile(prof, launch_model, endpoint, instances, vllm_python=vllm_python, log_dir=log_dir,
                             port_base=port_base, cpus_per_instance=cpus_per_instance,
                             api_server_cores=api_server_cores)
    reqs = annotated_requests(prof, profile_name, workload=workload, trace=trace, max_prompt_tokens=max_prompt_tokens,
                              rate=rate, requests=requests, seed=seed, prompt_tokens=prompt_tokens,
                              output_tokens=output_tokens, predictor=predictor)

    def make_router(n: int, p=prof):
        return get_router(router, num_instances=n, seed=seed, profile=p)

    with ctx as urls:
        n = len(urls)
        runs = live_replays(reqs, lambda: make_router(n), urls, prof, repeats=repeats, seed=seed,
                            progress=lambda what: click.echo(f"  {what}", err=True))
    cal = fit(prof, runs, lambda p: ClusterSim(p, n, reqs, seed=seed, run_id="calibrate-sim").run(make_router(n, p)),
              ttft=ttft_fit)
    what = (f"{len(reqs)} requests ({trace or workload}, seed {seed}, {rate:g} req/s), router {router}, "
            f"{n} instance(s), {repeats} replay(s)")
    doc = calibrated_toml(tomllib.loads(path.read_text()), cal, what=what)
    doc["name"] = Path(out).stem
    write_profile_toml(doc, out)
    click.echo(f"{doc['name']}: decode-step costs x{cal.decode_scale:.3f} (live mean TBT "
               f"{cal.live_mean_tbt_s * 1e3:.2f} ms), prefill costs x{cal.prefill_scale:.3f} (live mean TTFT "
               f"{cal.live_mean_ttft_s * 1e3:.1f} ms), API overhead {cal.api_overhead_s * 1e3:.2f} ms "
               f"({'fitted' if cal.ttft_fit == 'split' else 'as measured'}); "
               f"mean E2E live {cal.live_mean_e2e_s:.3f} s, simulated {cal.sim_before['mean_e2e_s']:.3f} s before, "
               f"{cal.sim_after['mean_e2e_s']:.3f} s after")
    click.echo(f"wrote {out}")


from .profile_fit import fit_cmd  # noqa: E402 - the subcommand lives in its own module

profile.add_command(fit_cmd)
