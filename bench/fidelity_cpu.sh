#!/usr/bin/env bash
# The fidelity benchmark on a machine without GPUs: measure a profile from two vLLM CPU instances serving the tiny
# model, calibrate it on one Poisson request set (300 requests, seed 1, round robin), then replay other requests -- the Poisson
# mix with seed 0 and a slice of the Azure conversation trace -- live and in the simulator through three routers
# (3 interleaved live repeats each), with the measured profile and with the calibrated one.
# Needs `make vllm-env`. Prints the tables; JSON in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
L="${LBBENCH:-.venv/bin/lbbench}"
OUT="${OUT:-runs/fidelity-bench}"
TRACES="${TRACES:-../shared/traces}"
REPEATS="${REPEATS:-3}"
mkdir -p "$OUT"
MIX=(--workload poisson --prompt-tokens 256:0.5 --output-tokens 64:0.5 --rate 4)
POISSON=("${MIX[@]}" --requests 100)
"$L" profile measure --launch tiny --instances 2 --out "$OUT/tiny.toml" --log-dir "$OUT/measure-logs"
"$L" profile calibrate --profile "$OUT/tiny.toml" --launch tiny --instances 2 "${MIX[@]}" --requests 300 \
    --repeats 3 --seed 1 \
    --out "$OUT/tiny-cal.toml" --log-dir "$OUT/calibrate-logs"
run() {  # name, profile, then workload flags
    local name=$1 prof=$2; shift 2
    "$L" fidelity --profile "$OUT/$prof.toml" --seed 0 --launch tiny --instances 2 --router round_robin,jsq,least_requests \
        --repeats "$REPEATS" --log-dir "$OUT/$name-logs" --format json "$@" > "$OUT/$name.json"
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], \"rank_tau\", d[\"rank_tau\"]); [print(\"  \", r[\"router\"], {k: round(v, 3) for k, v in r.items() if isinstance(v, float)}) for r in d[\"routers\"]]" "$OUT/$name.json"
}
run poisson-cal tiny-cal "${POISSON[@]}"
run azure-cal tiny-cal --trace "$TRACES/AzureLLMInferenceTrace_conv.csv" --max-prompt-tokens 1024 --requests 80 --rate 3
[ -n "${SKIP_UNCALIBRATED:-}" ] || run poisson tiny "${POISSON[@]}"
[ -n "${SKIP_UNCALIBRATED:-}" ] || run azure tiny --trace "$TRACES/AzureLLMInferenceTrace_conv.csv" --max-prompt-tokens 1024 --requests 80 --rate 3
