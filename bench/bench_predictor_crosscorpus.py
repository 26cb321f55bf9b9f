"""Cross-corpus ranking of output-length predictors: train on one public
corpus, evaluate on corpora it never saw.

    python bench/bench_predictor_crosscorpus.py [--datasets ../shared/datasets] [--json FILE] [--quick]

Directions (the corpora as kept in the shared datasets folder):

* ``alpaca_eval -> vicuna_bench, self_instruct``: train on AlpacaEval's 805
  instructions x 9 models, test on the Vicuna questions (80 x 6 models) and
  the self-instruct user-oriented set (252 x text-davinci-002/003 + human);
* ``vicuna_bench + self_instruct -> alpaca_eval``: the reverse;
* ``all others -> X`` (unless ``--no-mixed``): train on every other shared
  corpus with response lengths (the three above and the Alpaca-style
  ``llamafactory_alpaca_en_demo``), test on the one left out.

AlpacaEval contains the Vicuna questions and the self-instruct instructions
(its ``vicuna`` and ``selfinstruct`` subsets). Every training row whose
prompt matches a test prompt (case, punctuation and the words "input" /
"output" folded, first 60 characters) is dropped before training, and every such test row is dropped
from the reverse direction's test set, so no test prompt was seen in any form.

Predictors: ``embed`` (frozen all-MiniLM-L6-v2 embedding + model name; layer
and head chosen on held-out *training* prompts), ``embed (no model name)``,
and the baseline ``bow ridge`` (hashed bag of words, ridge on log length, no
model name). Nothing is chosen on the test corpora.

Reported per test corpus: pooled Kendall tau (all generators together, so a
model's verbosity counts), within-generator tau per test model (what a router
serving that one model gets), accuracy against both majority baselines (the
training set's majority bucket, and the test set's own majority in hindsight),
p90 coverage and MAE; ``embed`` and ``embed ≤1 layer`` also in bf16 and int8. Generators are tagged
``same`` (the same model generated training answers: text-davinci-003),
``family`` (another snapshot of a trained model: gpt-3.5-turbo, vicuna-7b) or
``cross``.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from _common import DATASETS, log, torch_one_thread  # bench/_common.py, beside this script
from lbbench.predict import get_scheme
from lbbench.predict.data import Example, load_corpus
from lbbench.predict.evaluate import evaluate_dir
from lbbench.predict.regression import LengthTrainConfig, train_length_model

PREDICTORS: dict[str, LengthTrainConfig] = {
    "embed": LengthTrainConfig(features="encoder"),
    "embed (no model name)": LengthTrainConfig(features="encoder", use_model_name=False),
    "bow ridge": LengthTrainConfig(features="bow", heads=("ridge",), use_model_name=False),
    # within the 2 ms / request budget on one core (bench/bench_predictor.py): token embeddings or one layer
    "embed ≤1 layer": LengthTrainConfig(features="encoder", max_layers=1),
    # layer and head chosen leaving one task (source subset) of the training corpus out at a time
    "embed (task validation)": LengthTrainConfig(features="encoder", validation="task"),
}
#: test generator -> training generators it counts as "same" (identical model) or "family" (other snapshot)
SAME = {"text-davinci-003": {"text_davinci_003"}, "text_davinci_003": {"text-davinci-003"}}
FAMILY = {"gpt-3.5-turbo:20230327": {"gpt-3.5-turbo-0613"}, "gpt-3.5-turbo-0613": {"gpt-3.5-turbo:20230327"},
          "vicuna-7b:20230322-fp16": {"vicuna-7b-v1.5"}, "vicuna-7b-v1.5": {"vicuna-7b:20230322-fp16"}}


def prompt_key(prompt: str) -> str:
    """Case, punctuation and the self-instruct ``Input:``/``Output:`` markers
    folded away; the first 60 characters."""
    words = re.sub(r"\W+", " ", prompt.lower()).split()
    return " ".join(w for w in words if w not in ("input", "output"))[:60]


def relation(test_model: str | None, train_models: set[str]) -> str:
    if test_model in train_models or SAME.get(test_model or "", set()) & train_models:
        return "same"
    if FAMILY.get(test_model or "", set()) & train_models:
        return "family"
    return "cross"


def run_direction(name: str, train: list[Example], tests: dict[str, list[Example]], scheme: Any,
                  predictors: Sequence[str], log) -> list[dict[str, Any]]:
    test_keys = {prompt_key(e.prompt) for rows in tests.values() for e in rows}
    kept = [e for e in train if prompt_key(e.prompt) not in test_keys]
    log(f"[{name}] {len(train)} training rows, {len(train) - len(kept)} dropped as test prompts, "
        f"{len(kept)} used ({len({e.prompt for e in kept})} prompts)")
    train_models = {e.model for e in kept if e.model}
    out = []
    for pname in predictors:
        t0 = time.perf_counter()
        model = train_length_model(kept, scheme, PREDICTORS[pname])
        with tempfile.TemporaryDirectory() as d:
            model.save(d)
            for tname, rows in tests.items():
                rep = evaluate_dir(d, rows, precision="fp32",
                                   compare_precisions=pname.startswith("embed") and "no model" not in pname)
                for m in rep["per_model"]:
                    m["relation"] = relation(m["model"], train_models)
                out.append({"direction": name, "predictor": pname, "test": tname, "report": rep,
                            "chosen": rep.get("chosen"), "train_rows": len(kept)})
                log(f"[{name}] {pname:<22} -> {tname:<14} tau {rep['kendall_tau']:.3f} "
                    f"(within-model {rep['within_model_kendall_tau']:.3f}) acc {rep['accuracy']:.3f} "
                    f"(majority {rep['majority_baseline_accuracy']:.3f} / {rep['test_majority_accuracy']:.3f}) "
                    f"p90 cov {rep['p90_coverage']:.3f} ({time.perf_counter() - t0:.0f} s)")
    return out


def render(results: list[dict[str, Any]]) -> str:
    lines = ["| direction | predictor | test corpus | n | pooled τ | within-model τ | ρ | accuracy | majority (train / "
             "test) | p90 cov | MAE tok | τ bf16 / int8 | acc bf16 / int8 |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        rep = r["report"]
        prec = ("-" if "kendall_tau_bf16" not in rep else
                f"{rep['kendall_tau_bf16']:.3f} / {rep['kendall_tau_int8']:.3f}")
        pacc = ("-" if "accuracy_bf16" not in rep else f"{rep['accuracy_bf16']:.3f} / {rep['accuracy_int8']:.3f}")
        lines.append(f"| {r['direction']} | {r['predictor']} | {r['test']} | {rep['n']} | {rep['kendall_tau']:.3f} | "
                     f"{rep['within_model_kendall_tau']:.3f} | {rep['spearman_rho']:.3f} | {rep['accuracy']:.3f} | "
                     f"{rep['majority_baseline_accuracy']:.3f} / {rep['test_majority_accuracy']:.3f} | "
                     f"{rep['p90_coverage']:.3f} | {rep['mae_tokens']:.0f} | {prec} | {pacc} |")
    lines += ["", "Within-generator τ per test model (relation to the training generators):", "",
              "| direction | test model | relation | n | " + " | ".join(f"τ {p}" for p in PREDICTORS) + " |",
              "|---|---|---|---:|" + "---:|" * len(PREDICTORS)]
    by: dict[tuple[str, str], dict[str, dict]] = {}
    for r in results:
        for m in r["report"]["per_model"]:
            by.setdefault((r["direction"], m["model"]), {})[r["predictor"]] = m
    for (direction, model), cells in by.items():
        any_cell = next(iter(cells.values()))
        taus = " | ".join(f"{cells[p]['kendall_tau']:.3f}" if p in cells else "-" for p in PREDICTORS)
        lines.append(f"| {direction} | {model} | {any_cell['relation']} | {any_cell['n']} | {taus} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default=str(DATASETS))
    ap.add_argument("--json", help="also write the full reports here")
    ap.add_argument("--predictors", default="embed,embed (no model name),bow ridge",
                    help=f"comma-separated subset of: {', '.join(PREDICTORS)}")
    ap.add_argument("--no-mixed", action="store_true", help="skip the leave-one-corpus-out directions")
    ap.add_argument("--mixed-only", action="store_true", help="run the leave-one-corpus-out directions only")
    args = ap.parse_args()
    torch_one_thread()
    root = Path(args.datasets)
    scheme = get_scheme("paper")
    a = load_corpus(root / "alpaca_eval").examples
    b = load_corpus(root / "vicuna_bench_2023").examples
    c = load_corpus(root / "self_instruct_user_oriented").examples
    bc_keys = {prompt_key(e.prompt) for e in b + c}
    a_unseen = [e for e in a if prompt_key(e.prompt) not in bc_keys]
    predictors = [p.strip() for p in args.predictors.split(",") if p.strip()]
    for p in predictors:
        if p not in PREDICTORS:
            ap.error(f"--predictors: unknown {p!r}")
    results = []
    if not args.mixed_only:
        results += run_direction("alpaca_eval →", a, {"vicuna_bench": b, "self_instruct": c}, scheme, predictors,
                                 log)
        results += run_direction("vicuna_bench + self_instruct →", b + c, {"alpaca_eval": a_unseen}, scheme,
                                 predictors, log)
    if not args.no_mixed:
        # leave one corpus out: train on every other shared corpus with response lengths (incl. the
        # Alpaca-style GPT-4 demo set), test on the one left out
        d = load_corpus(root / "llamafactory_alpaca_en_demo").examples
        for tname, test, rest in (("vicuna_bench", b, a + c + d), ("self_instruct", c, a + b + d),
                                  ("alpaca_eval", a_unseen, b + c + d)):
            results += run_direction(f"all others → {tname}", rest, {tname: test}, scheme, predictors, log)
    print(render(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
