"""bench/gpu_profile.py runs end to end (here on the CPU with a tiny config) and writes its table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_profile.py"


def test_gpu_profile_smoke_on_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_profile", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "gp"
    assert mod.main(["--device", "cpu", "--models", "tiny", "--prompts", "16,32", "--batches", "1,2",
                     "--contexts", "16", "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    phases = [(r["phase"], r["batch"]) for r in data["rows"]]
    assert phases == [("prefill", 1), ("prefill", 1), ("decode", 1), ("decode", 2)]
    assert all(r["measured_s"] > 0 for r in data["rows"])
    assert "| tiny | decode | 2 |" in out.with_suffix(".md").read_text()
    assert mod.guess_gpu("NVIDIA H200", 139.8) == "h200"
    assert mod.guess_gpu("NVIDIA A100-SXM4-40GB", 39.4) == "a100-40gb"
