from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
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


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real PostgreSQL server on loopback, one per test process."""
    from pgserver import postgres_server

    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database on each backend: a SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gpupool.db'}"
    import psycopg

    server: str = request.getfixturevalue("postgres_url")
    name = f"t{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return server.rsplit("/", 1)[0] + "/" + name
