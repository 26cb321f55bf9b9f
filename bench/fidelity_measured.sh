#!/usr/bin/env bash
# The simulator against public measurements of real vLLM servers on GPUs (docs/fidelity.md, "Against public GPU
# measurements"). No GPU needed: every number here comes from simulating measured runs and comparing.
#
# 1. import the raw files of ../shared/gpu-measurements into the measured-runs schema (the development table
#    rebuilt from its sources, with the hand-built CSV's wrong cells corrected: docs/measured.md);
# 2. fit the calibration on it (`lbbench profile fit`), unless FIT=0 (then the shipped calibration is used);
# 3. check the calibration on the hand-built development table as shipped, on the imported one, and on a GPU the
#    development set does not have (bench/data/measured-heldout-gpu.csv);
# 4. leave-one-model-out: refit without each model and report the error on it (CV_PARAMS: the factors refitted);
# 5. the MLPerf row's prompt-length assumption at means 800 and 1,250.
# Outputs in $OUT; the tables print as they come.
set -euo pipefail
cd "$(dirname "$0")/.."
L="${LBBENCH:-.venv/bin/lbbench}"
S="${SHARED:-../shared/gpu-measurements}"
OUT="${OUT:-runs/fidelity-measured}"
JOBS="${JOBS:-2}"
CV_PARAMS="${CV_PARAMS:-weight_bw_util,step_overhead_s,api_overhead_s}"
mkdir -p "$OUT"
"$L" measured import inference-perf "$S/inference-sim/training/default_args" --set gpu=h100 \
    --set engine_version=0.15.1 --model-configs "$S/model-configs" --out "$OUT/training.csv"
"$L" measured import inference-sim-table "$S/inference-sim/trainval_measured_with_workload.csv" --set gpu=h100 \
    --set engine=vllm --set engine_version=0.15.1 --set arrival=constant --set ignore_eos=true --set replicas=1 \
    --model-configs "$S/model-configs" --out "$OUT/trainval.csv"
"$L" measured import mlperf "$S/mlperf-v5.1/redhat-h100/Server" --set weights_dtype=fp8 --set prompt_tokens_max=2540 \
    --out "$OUT/mlperf.csv"
{ cat "$OUT/training.csv"; tail -n +2 "$OUT/trainval.csv"; tail -n +2 "$OUT/mlperf.csv"; } > "$OUT/dev-imported.csv"
CAL=()
if [ "${FIT:-1}" != 0 ]; then
    "$L" profile fit --measured "$OUT/dev-imported.csv" --rounds "${ROUNDS:-1}" --max-stage-s 300 --jobs "$JOBS" \
        --out "$OUT/calibration.toml" --report-dir "$OUT/fit"
    CAL=(--calibration "$OUT/calibration.toml")
fi
"$L" fidelity --measured "$S/measured-dev.csv" "${CAL[@]}" --sensitivity --jobs "$JOBS" --out "$OUT/dev-csv"
"$L" fidelity --measured "$OUT/dev-imported.csv" "${CAL[@]}" --jobs "$JOBS" --out "$OUT/dev-imported"
"$L" fidelity --measured bench/data/measured-heldout-gpu.csv "${CAL[@]}" --out "$OUT/heldout-gpu"
"$L" profile fit --measured "$OUT/dev-imported.csv" "${CAL[@]}" --params "$CV_PARAMS" --rounds 0 --max-stage-s 120 \
    --cross-validate model --jobs "$JOBS" --out "$OUT/cv-calibration.toml" --report-dir "$OUT/cv"
