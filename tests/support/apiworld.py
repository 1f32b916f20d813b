"""What the API's tests share: an app on a SQLite store in `tmp_path` with a fake executor, and
a small world of two teams, their users and running jobs. Test modules make their fixtures with
`opened` and `populated` (a conftest.py here would clash with the one above for mypy)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient

from gpupool.api import Context, create_app
from gpupool.model import DEFAULT_CLASSES, Config, Node
from gpupool.service.loop import ControlLoop
from gpupool.service.observer import Lineup, Observers
from gpupool.service.workspace import token_hash
from gpupool.store import Store
from gpupool.telemetry import Telemetry
from tests.support.fakes import FakeExecutor

ADMIN = "admin-secret"
CONFIG = Config(DEFAULT_CLASSES)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Api:
    app: FastAPI
    client: TestClient
    store: Store
    loop: ControlLoop
    workdir: Path
    now: list[float] = field(default_factory=lambda: [100.0])
    telemetry: Telemetry | None = None
    lineup: Lineup | None = None
    context: Context | None = None

    @property
    def executor(self) -> FakeExecutor:
        executor = self.loop.executor
        assert isinstance(executor, FakeExecutor)
        return executor

    def team(self, name: str, **policy: object) -> str:
        """Make a team with a token (and `policy`); its token."""
        response = self.client.put(f"/teams/{name}", json={"new_token": True, **policy}, headers=auth(ADMIN))
        assert response.status_code == 200, response.text
        token: str = response.json()["token"]
        return token

    def user(self, name: str, team: str) -> str:
        response = self.client.put(f"/users/{name}", json={"team": team, "new_token": True}, headers=auth(ADMIN))
        assert response.status_code == 200, response.text
        token: str = response.json()["token"]
        return token

    def submit(self, token: str, **fields: object) -> dict[str, object]:
        body = {"command": ["true"], "workdir": str(self.workdir), **fields}
        response = self.client.post("/jobs", json=body, headers=auth(token))
        assert response.status_code == 201, response.text
        job: dict[str, object] = response.json()
        return job


def make_api(store: Store, tmp_path: Path) -> Api:
    store.sync_config(CONFIG)
    store.set_nodes([Node("gpu0", 4, "virtual")], virtual=True)
    loop = ControlLoop(store, CONFIG, FakeExecutor(store), tmp_path / "data")
    now = [100.0]
    telemetry, lineup = Telemetry(store, clock=lambda: now[0]), Lineup()
    loop.observer = Observers([telemetry, lineup])
    context = Context(store, loop, token_hash(ADMIN), clock=lambda: now[0], telemetry=telemetry, lineup=lineup)
    app = create_app(context)
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    return Api(app, TestClient(app), store, loop, workdir, now, telemetry, lineup, context)


def opened(tmp_path: Path) -> Iterator[Api]:
    """An app on a new SQLite store in `tmp_path` (a fixture's body)."""
    store = Store.open(f"sqlite:///{tmp_path / 'gpupool.db'}")
    yield make_api(store, tmp_path)
    store.close()


@dataclass
class World:
    """Teams `a` and `b`; users `a1`, `a2` (team a) and `b1` (team b); one job of each team
    (submitted by `a1` and `b1`) that failed once and runs again, with output written."""

    api: Api
    tokens: dict[str, str]
    job_a: int
    job_b: int
    attempt_tokens: dict[int, str]


def populated(api: Api) -> World:
    tokens = {"a": api.team("a"), "b": api.team("b")}
    tokens |= {"a1": api.user("a1", "a"), "a2": api.user("a2", "a"), "b1": api.user("b1", "b")}
    job_a = int(str(api.submit(tokens["a1"], name="a-job", max_failures=1)["id"]))
    job_b = int(
        str(api.submit(tokens["b1"], name="b-secret", command=["train", "--key=b-secret"], max_failures=1)["id"])
    )
    api.loop.tick(100.0)
    for job in (job_a, job_b):
        api.executor.finish(job, 0, 1)
    api.loop.tick(200.0)
    api.now[0] = 300.0
    launched = {launch.job_id: launch for launch in api.executor.started if launch.attempt == 1}
    for job in (job_a, job_b):
        for stream in ("stdout", "stderr"):
            path = api.loop.workspace.log_file(api.store.job(job), 1, stream)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{stream} of job {job}\n")
    attempt_tokens = {job: launched[job].env["GPUPOOL_TOKEN"] for job in (job_a, job_b)}
    return World(api, tokens, job_a, job_b, attempt_tokens)
