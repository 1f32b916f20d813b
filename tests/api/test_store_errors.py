"""A store that is busy, read-only or failing: the API goes on answering what it can, store calls
never hold up its event loop, and every error is JSON with a message."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, event

from gpupool.store import Store
from gpupool.store.engine import _sqlite_begin, _sqlite_pragmas
from tests.support.apiworld import ADMIN, CONFIG, Api, auth, make_api, opened

BUSY_TIMEOUT = 2.0


def sqlite_store(url: str, timeout: float = BUSY_TIMEOUT) -> Store:
    """A store as `Store.open` makes it, waiting `timeout` seconds for a lock instead of 30."""
    engine = create_engine(url, connect_args={"timeout": timeout, "check_same_thread": False})
    event.listen(engine, "connect", _sqlite_pragmas)
    event.listen(engine, "begin", _sqlite_begin)
    return Store(engine)


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[tuple[Api, str]]:
    """An API on a SQLite file whose write lock another connection holds, and a team's token."""
    path = tmp_path / "gpupool.db"
    Store.open(f"sqlite:///{path}").close()
    store = sqlite_store(f"sqlite:///{path}")
    api = make_api(store, tmp_path)
    team = api.team("nlp")
    api.submit(team)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    yield api, team
    holder.rollback()
    holder.close()
    store.close()


def test_while_a_write_waits_for_the_lock_reads_are_answered_and_the_write_ends_in_503(
    locked: tuple[Api, str],
) -> None:
    api, token = locked

    async def scenario() -> tuple[list[tuple[int, float]], httpx.Response, httpx.Response, bool]:
        transport = httpx.ASGITransport(app=api.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            body = {"command": ["true"], "workdir": str(api.workdir)}
            write = asyncio.create_task(client.post("/jobs", json=body, headers=auth(token)))
            cancel = asyncio.create_task(client.post("/jobs/1/cancel", headers=auth(token)))
            await asyncio.sleep(0.3)
            answered = []
            for path in ("/health", "/jobs", "/pool"):
                began = time.monotonic()
                response = await asyncio.wait_for(client.get(path, headers=auth(token)), timeout=BUSY_TIMEOUT / 2)
                answered.append((response.status_code, time.monotonic() - began))
            still_waiting = not write.done()
            return answered, await write, await cancel, still_waiting

    answered, write, cancel, still_waiting = asyncio.run(scenario())
    assert [status for status, _ in answered] == [200, 200, 200]
    assert still_waiting, "the reads were answered only after the write gave up"
    for refused in (write, cancel):
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"] == "Unavailable"
        assert "busy" in refused.json()["message"]
        assert int(refused.headers["Retry-After"]) >= 1
    assert len(api.store.jobs()) == 1


def test_a_read_only_store_answers_reads_and_refuses_writes_in_json(tmp_path: Path) -> None:
    path = tmp_path / "gpupool.db"
    writable = Store.open(f"sqlite:///{path}")
    api = make_api(writable, tmp_path)
    api.submit(ADMIN)
    writable.close()
    store = sqlite_store(f"sqlite:///file:{path}?mode=ro&uri=true")
    api = make_api_on(store, tmp_path)
    assert api.client.get("/jobs", headers=auth(ADMIN)).status_code == 200
    refused = api.client.post("/jobs", json={"command": ["true"], "workdir": str(api.workdir)}, headers=auth(ADMIN))
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"] == "Unavailable"
    assert "read-only" in refused.json()["message"] or "readonly" in refused.json()["message"]
    cancel = api.client.post("/jobs/1/cancel", headers=auth(ADMIN))
    assert cancel.status_code == 503, cancel.text
    store.close()


def make_api_on(store: Store, tmp_path: Path) -> Api:
    """`make_api` without writing the configuration (the store may be read-only)."""
    from fastapi.testclient import TestClient

    from gpupool.api import Context, create_app
    from gpupool.service.loop import ControlLoop
    from gpupool.service.workspace import token_hash
    from tests.support.fakes import FakeExecutor

    loop = ControlLoop(store, CONFIG, FakeExecutor(store), tmp_path / "data")
    app = create_app(Context(store, loop, token_hash(ADMIN)))
    return Api(app, TestClient(app), store, loop, tmp_path / "work")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    yield from opened(tmp_path)


def test_an_unexpected_error_is_a_500_in_json_and_is_logged(
    api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(**_: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(api.store, "jobs", broken)
    with caplog.at_level(logging.ERROR, logger="gpupool.api"):
        response = api.client.get("/jobs", headers=auth(ADMIN))
    assert response.status_code == 500
    assert response.json()["error"] == "InternalError"
    assert response.json()["message"].endswith("see the service log")
    assert "a bug" in caplog.text


def test_health_says_when_the_store_does_not_answer(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    def down() -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(api.store, "classes", down)
    response = api.client.get("/health")
    assert response.status_code == 503
    assert response.json()["status"] == "unavailable"
