"""Shared fixtures for report tests: the committed run directories under ``data/``."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def v100_run() -> Path:
    return DATA / "v100"


@pytest.fixture(scope="session")
def a100_run() -> Path:
    return DATA / "a100"


@pytest.fixture(scope="session")
def live_run() -> Path:
    return DATA / "live"
