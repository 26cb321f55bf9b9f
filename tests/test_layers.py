"""Every import between lbbench's packages points down a floor (docs/architecture.md, "Floors"), and every import
inside a function says why it is lazy."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the floors of docs/architecture.md: a package may import its own floor's (without a cycle) and those below
FLOORS: dict[str, int] = {
    "core": 0, "errors": 0, "profiles": 0, "fleet": 0, "priority": 0, "dispatch": 0, "distributed": 0,
    "workloads": 0, "metrics": 0, "rundir": 0, "roofline": 0, "step_model": 0, "prefix_blocks": 0, "admission": 0,
    "kv_links": 0,
    "sim": 1, "predict": 1,
    "routers": 2, "engines": 2,
    "live": 3, "reports": 3,
    "harness": 4, "proxy": 4,
    "experiment": 5,
    "profiling": 6, "training": 6,
    "planning": 7, "measured": 7, "validation": 7,
    "cli": 8, "__main__": 9,
}


def _house_metrics():
    spec = importlib.util.spec_from_file_location("house_metrics", ROOT / "scripts" / "house_metrics.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["house_metrics"] = module
    spec.loader.exec_module(module)
    return module


def _package(name: str) -> str:
    return name.split(".")[1] if "." in name else ""


def test_every_import_between_packages_points_down_a_floor():
    hm = _house_metrics()
    modules = hm.load_modules(ROOT)
    known = set(modules)
    for info in modules.values():
        hm.collect_imports(info, known)
    up = []
    for name, info in modules.items():
        src = _package(name)
        if not src:
            continue  # the package's __init__ (its version)
        assert src in FLOORS, f"{src}: a new package; give it a floor here and in docs/architecture.md"
        for target in info.edges_top | info.edges_function:
            dst = _package(target)
            if dst and dst != src and FLOORS[dst] > FLOORS[src]:
                up.append(f"{name} -> {target}")
    assert not up, "imports running up a floor:\n" + "\n".join(up)
    assert "package-level cycles: 0" in hm.report(ROOT)


def test_every_lazy_import_says_why():
    hm = _house_metrics()
    modules = hm.load_modules(ROOT)
    known = set(modules)
    uncommented = []
    for name, info in modules.items():
        hm.collect_imports(info, known)
        uncommented += [name] * sum(n for (_, commented), n in info.lazy.items() if not commented)
    assert not uncommented, f"imports inside functions without a '# lazy: why' comment in: {sorted(set(uncommented))}"
