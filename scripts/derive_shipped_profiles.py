"""Derive the shipped Llama-3.1-8B profiles (``profiles/llama3.1-8b-*.toml``) as vLLM runs today.

Each is ``lbbench profile derive``'s profile (``lbbench.profiling.derive.derive_profile``): vLLM V1 with chunked
prefill and V1's default limits on the GPU (``max_num_seqs`` and ``max_num_batched_tokens``: 1,024 and 8,192 on an
H100, 256 and 2,048 on an A100 or an L4), ``max_model_len`` 8,192, bf16 weights and KV, every step priced by the
roofline with the shipped calibration's efficiency factors (``lbbench/profiling/data/calibration.toml``). A change
of the calibration changes them: run this (``make profiles``) and commit the result;
``tests/profiling/test_shipped_profiles.py`` fails until then.

The vLLM V0 profiles the paper's A100 setup ran on (``llama3.1-8b-*-v0``) and the paper's V100 profiles are not
derived here: they are kept as they were made (their ``[source]`` says how), so results on them stay identical.

    python scripts/derive_shipped_profiles.py            # write profiles/llama3.1-8b-*.toml
    python scripts/derive_shipped_profiles.py --check    # exit 1 if a shipped file differs from its derivation
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

import tomli_w

from lbbench.profiling.derive import derive_profile
from lbbench.profiling.gpus import get_gpu
from lbbench.profiling.models import load_model_config

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"

#: profile name -> (GPU, tensor parallelism); everything else is derive's default
SHIPPED: dict[str, tuple[str, int]] = {
    "llama3.1-8b-a100": ("a100-80gb", 1),
    "llama3.1-8b-a100-40gb": ("a100-40gb", 1),
    "llama3.1-8b-a100-tp2": ("a100-80gb", 2),
    "llama3.1-8b-h100": ("h100", 1),
    "llama3.1-8b-l4": ("l4", 1),
}


def derived(name: str) -> str:
    """The TOML text of shipped profile ``name`` as derived now."""
    gpu, tp = SHIPPED[name]
    return tomli_w.dumps(derive_profile(load_model_config("llama-3.1-8b"), get_gpu(gpu), dtype="bf16", tp=tp,
                                        name=name))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the shipped files instead of writing them")
    args = ap.parse_args()
    stale = []
    for name in SHIPPED:
        path = PROFILES_DIR / f"{name}.toml"
        text = derived(name)
        if args.check:
            if not path.is_file() or tomllib.loads(path.read_text()) != tomllib.loads(text):
                stale.append(name)
            print(f"{'DIFF' if name in stale else 'ok  '} {path.name}")
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(PROFILES_DIR.parent)}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
