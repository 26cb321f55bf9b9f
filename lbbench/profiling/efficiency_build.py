"""Build ``efficiency.toml``: fit the roofline factors on Vidur's A100 timings, check them on its H100 timings.

``lbbench profile fit-efficiency --vidur CHECKOUT --commit SHA`` runs :func:`build_table` on a checkout of
github.com/microsoft/vidur (MIT licence). For each model-size group and tensor parallelism found in the
reference GPU's files it fits one row (:func:`~lbbench.profiling.efficiency.fit_efficiency`, models pooled)
and records each file's error; then it applies those rows, untouched, to the same models on the held-out GPU
and records those errors as ``[[validation]]``. Nothing is tuned on the held-out files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .efficiency import MARGINAL_FROM_TOKENS, MARGINAL_TO_TOKENS, Fit, fit_efficiency, fit_errors
from .gpus import get_gpu
from .vidur import MeasurementError, read_block_timings

REPOSITORY = "github.com/microsoft/vidur"
LICENCE = "MIT"
#: model-size groups pooled into one fit (Vidur's org/model directory names)
GROUPS: dict[str, tuple[str, ...]] = {
    "7-8B": ("meta-llama/Llama-2-7b-hf", "meta-llama/Meta-Llama-3-8B"),
    "70B": ("meta-llama/Llama-2-70b-hf", "meta-llama/Meta-Llama-3-70B"),
}
#: Vidur's device directory -> our GPU table's name (Vidur's A100s are the 80 GB parts)
DEVICES = {"a100": "a100-80gb", "h100": "h100"}
MAX_NUM_TOKENS = 4096


def _file(root: Path, device: str, model: str) -> Path:
    return root / "data" / "profiling" / "compute" / device / model / "mlp.csv"


def _summary(errs: list[dict]) -> str:
    return (f"block-linear time over {sum(e['points'] for e in errs)} measured token counts 1-{MAX_NUM_TOKENS}: "
            f"mean |error| {np.mean([e['mean_abs_pct'] for e in errs]):.1f} %, worst "
            f"{max(e['max_abs_pct'] for e in errs):.1f} %, at powers of two worst "
            f"{max(e['pow2_max_abs_pct'] for e in errs):.1f} %")


def build_table(root: str | Path, commit: str, *, reference: str = "a100", held_out: str = "h100") -> dict:
    """The TOML-ready table (see the module docstring); ``commit`` is the checkout's commit, recorded."""
    root = Path(root)
    ref_gpu = get_gpu(DEVICES[reference])
    fits, validation = [], []
    for group, models in GROUPS.items():
        found = {m: read_block_timings(_file(root, reference, m), max_num_tokens=MAX_NUM_TOKENS)
                 for m in models if _file(root, reference, m).is_file()}
        if not found:
            continue
        tps = sorted(set.intersection(*(set(t) for t in found.values())))
        for tp in tps:
            timings = [found[m][tp] for m in found]
            fit = fit_efficiency(timings, ref_gpu)
            errs = [{"file": _rel(root, t.path), **fit_errors(t, ref_gpu, fit)} for t in timings]
            fits.append({
                "gpu": ref_gpu.name, "tp": tp, "group": group, "models": [m.split("/")[-1] for m in found],
                "block_weight_bytes_per_gpu": round(float(np.mean([t.block_params_per_gpu for t in timings])) * 2),
                "prefill_mfu": fit.prefill_mfu, "weight_bw_util": fit.weight_bw_util, "sharpness": fit.sharpness,
                "files": [_rel(root, t.path) for t in timings], "fit_error": _summary(errs), "errors": errs})
            held = get_gpu(DEVICES[held_out])
            for m in models:
                f = _file(root, held_out, m)
                if not f.is_file():
                    continue
                try:
                    t = read_block_timings(f, max_num_tokens=MAX_NUM_TOKENS)[tp]
                except KeyError:
                    continue
                validation.append({"gpu": held.name, "tp": tp, "group": group, "file": _rel(root, f),
                                   "fitted_on": ref_gpu.name,
                                   **fit_errors(t, held, Fit(fit.prefill_mfu, fit.weight_bw_util, fit.sharpness))})
    if not fits:
        raise MeasurementError(f"{root}: no {reference} mlp.csv of the models {sorted(sum(GROUPS.values(), ()))}")
    return {
        "source": {
            "repository": REPOSITORY, "commit": commit, "licence": LICENCE,
            "files": f"data/profiling/compute/<gpu>/<org>/<model>/mlp.csv (median column, rows up to "
                     f"{MAX_NUM_TOKENS} tokens)",
            "reference_gpu": ref_gpu.name, "held_out_gpu": get_gpu(DEVICES[held_out]).name,
            "method": "block-linear time = sum of the medians of input_layernorm, attn_pre_proj, attn_rope, "
                      "attn_post_proj, post_attention_layernorm, mlp_up_proj, mlp_act, mlp_down_proj and two adds; "
                      "weight_bw_util = mean over the 1-8 token rows of block weight bytes / (bandwidth x time); "
                      f"prefill_mfu = 2 x block weights / (peak x measured seconds per token from "
                      f"{MARGINAL_FROM_TOKENS} to {MARGINAL_TO_TOKENS} tokens), averaged over the group's models; "
                      "sharpness = least squares of the log error over every row",
            "not_measured": "attention, the LM head, the sampler, tensor-parallel all-reduce and the engine's own "
                            "overhead are not in these files; derive keeps its roofline and stated assumptions "
                            "for them",
            "device_assumption": "Vidur's 'a100' files are taken as the A100 80 GB SXM figures of the GPU table "
                                 "(312 TFLOP/s, 2,039 GB/s)",
        },
        "fit": fits,
        "validation": validation,
    }


def _rel(root: Path, path: str) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)
