"""One real local Ray instance for the whole test session (Ray 2.5x has no local mode).

Without the ray extra these tests skip with the reason — except in CI (``CI`` set), where the extra is
installed and a missing ``ray`` fails them.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def ray_module():
    """``ray``, imported; without the ray extra the test skips (fails under CI)."""
    try:
        import ray
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("CI installs the ray extra (make venv-dev); `import ray` failed")
        pytest.skip("needs the ray extra: pip install 'lbbench[ray]'")
    return ray


@pytest.fixture(scope="session")
def ray_session(ray_module):
    ray = ray_module
    import unit_fns
    ray.cloudpickle.register_pickle_by_value(unit_fns)  # Ray workers do not have the tests on their path
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    if started:
        ray.shutdown()
