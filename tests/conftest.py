from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=200)
settings.register_profile("dev", deadline=None, max_examples=100)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """The public traces of ../shared/data/traces (or $GPUPOOL_TRACES)."""
    path = Path(os.environ.get("GPUPOOL_TRACES", REPO.parent / "shared" / "data" / "traces"))
    if not path.is_dir():
        pytest.fail(f"trace folder {path} is missing: tests read ../shared/data/traces")
    return path
