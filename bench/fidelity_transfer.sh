#!/usr/bin/env bash
# The transfer benchmark on a machine without GPUs: one vLLM CPU instance serving the tiny model, pinned to its own
# core with the client on another (--cpus-per-instance 1), so that the engine shares compute with nothing it is
# timed against. Measure a profile, calibrate it on a slice of the Azure conversation trace, check it on a Poisson
# mix and on a slice of the Mooncake synthetic trace (interleaved live repeats), then re-fit the same live replays
# each way (mean / split TTFT fit) with the residuals by prompt length and batch size.
# Needs `make vllm-env` and the shared traces ($TRACES). JSON and records in $OUT.
# With >= 4 cores, INSTANCES=2 runs two pinned instances (each on its own core, the client on the rest).
set -euo pipefail
cd "$(dirname "$0")/.."
L="${LBBENCH:-.venv/bin/lbbench}"
PY="${PYTHON:-.venv/bin/python}"
OUT="${OUT:-runs/fidelity-transfer}"
TRACES="${TRACES:-../shared/traces}"
REPEATS="${REPEATS:-3}"
REQUESTS="${REQUESTS:-80}"
INSTANCES="${INSTANCES:-1}"
RATE="${RATE:-1.5}"          # per instance (the Poisson mix at 4/3 of it)
mkdir -p "$OUT"
rate=$(python3 -c "print($RATE * $INSTANCES)")
prate=$(python3 -c "print(round($RATE * $INSTANCES * 4 / 3, 3))")
[ -f "$OUT/tiny.toml" ] || "$L" profile measure --launch tiny --instances "$INSTANCES" --cpus-per-instance 1 \
    --out "$OUT/tiny.toml" --log-dir "$OUT/measure-logs"
"$L" fidelity --profile "$OUT/tiny.toml" --launch tiny --instances "$INSTANCES" --cpus-per-instance 1 \
    --calibrate-on "trace:$TRACES/AzureLLMInferenceTrace_conv.csv?max_prompt_tokens=1000&requests=$REQUESTS&rate=$rate" \
    --check-on "workload:poisson?prompt_tokens=256:0.5&output_tokens=64:0.5&requests=$REQUESTS&rate=$prate" \
    --check-on "trace:$TRACES/synthetic_trace.jsonl?max_prompt_tokens=1000&requests=$REQUESTS&rate=$rate" \
    --router round_robin --repeats "$REPEATS" --out "$OUT/transfer" --log-dir "$OUT/transfer-logs"
"$PY" bench/fidelity_transfer.py "$OUT/transfer" --profile "$OUT/tiny.toml" --json "$OUT/refit.json"
