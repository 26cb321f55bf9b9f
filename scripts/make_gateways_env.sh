#!/usr/bin/env bash
# Build .venv-gateways: production gateways to benchmark against lbbench's routers (and to check that lbbench
# drives them): SGLang's model gateway (`smg`, package sglang-router) and vllm-router. Both ship as binary wheels.
# Idempotent. Set GATEWAYS_ENV to build elsewhere, PYTHON to pick the interpreter.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
env_dir="${GATEWAYS_ENV:-$root/.venv-gateways}"
python="${PYTHON:-python3}"
if [ -x "$env_dir/bin/smg" ] && [ -x "$env_dir/bin/vllm-router" ]; then
    echo "gateways-env: $env_dir already works; nothing to do"
    exit 0
fi
[ -x "$env_dir/bin/python" ] || "$python" -m venv "$env_dir"
"$env_dir/bin/python" -m pip install --quiet --upgrade pip 2>&1 | grep -v "is ignored" || true
"$env_dir/bin/python" -m pip install --quiet "sglang-router>=0.3" "vllm-router>=0.1.17" 2>&1 | grep -v "is ignored" || true
[ -x "$env_dir/bin/smg" ] && [ -x "$env_dir/bin/vllm-router" ] || { echo "gateways-env: install failed" >&2; exit 1; }
echo "gateways-env: ready: $env_dir"
