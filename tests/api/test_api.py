"""The HTTP API: tokens, submission, listing, cancel, the job protocol, and errors as JSON."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpupool.api import Context, create_app
from gpupool.model import DEFAULT_CLASSES, Config, Node
from gpupool.service.loop import ControlLoop
from gpupool.service.workspace import token_hash
from gpupool.store import Store
from tests.support.fakes import FakeExecutor

ADMIN = "admin-secret"
CONFIG = Config(DEFAULT_CLASSES)


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[TestClient, Store, ControlLoop]]:
    store = Store.open(f"sqlite:///{tmp_path / 'gpupool.db'}")
    store.sync_config(CONFIG)
    store.set_nodes([Node("gpu0", 4, "virtual")], virtual=True)
    loop = ControlLoop(store, CONFIG, FakeExecutor(store), tmp_path / "data")
    now = [100.0]
    client = TestClient(create_app(Context(store, loop, token_hash(ADMIN), clock=lambda: now[0])))
    yield client, store, loop
    store.close()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def make_team(client: TestClient, name: str, classes: list[str] | None = None) -> str:
    body: dict[str, object] = {"guaranteed_gpus": 2, "new_token": True}
    if classes is not None:
        body["classes"] = classes
    response = client.put(f"/teams/{name}", json=body, headers=auth(ADMIN))
    assert response.status_code == 200, response.text
    token: str = response.json()["token"]
    return token


def test_a_team_submits_lists_shows_and_cancels_its_job(setup: tuple[TestClient, Store, ControlLoop]) -> None:
    client, _, _ = setup
    nlp = make_team(client, "nlp")
    created = client.post("/jobs", json={"command": ["python", "train.py"], "gpus": 2}, headers=auth(nlp))
    assert created.status_code == 201, created.text
    job = created.json()
    assert (job["team"], job["state"], job["gpus"], job["priority"]) == ("nlp", "pending", 2, "normal")
    listed = client.get("/jobs?state=pending", headers=auth(nlp)).json()
    assert [j["id"] for j in listed] == [job["id"]]
    assert client.get(f"/jobs/{job['id']}", headers=auth(nlp)).json()["history"] == []
    cancelled = client.post(f"/jobs/{job['id']}/cancel", headers=auth(nlp))
    assert cancelled.json()["state"] == "cancelled"
    kinds = [e["kind"] for e in client.get(f"/events?job={job['id']}", headers=auth(nlp)).json()]
    assert kinds == ["submitted", "cancelled"]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"command": ["x"], "priority": "vip"}, 404, "unknown priority class 'vip'"),
        (
            {"command": ["x"], "gpus": 16},
            400,
            "gpus: can never fit: 16 GPUs, and the nodes it may use have 4 GPUs in all",
        ),
        (
            {"command": ["x"], "gpus": 4, "gpus_per_node": 2},
            400,
            "gpus: can never fit: 4 GPUs as 2 members of 2 on separate nodes need 2 nodes with at least 2 GPUs; "
            "the pool has 1",
        ),
        (
            {"command": ["x"], "env": {"GPUPOOL_TOKEN": "stolen"}},
            422,
            "env: GPUPOOL_TOKEN is set by gpupool",
        ),
        ({"command": ["x"], "gpus": 0}, 422, "gpus: Input should be greater than or equal to 1"),
        ({"command": ["x"], "gpus": 4, "sizes": [2, 3]}, 400, "sizes: the largest, 3, is not the job's gpus (4)"),
        ({"command": ["x"], "gpus": 4, "sizes": [4, 2]}, 400, "sizes: [4, 2] are not two or more numbers"),
        ({"command": ["x"], "gpus": 4, "sizes": [0, 4]}, 422, "sizes.0: Input should be greater than or equal to 1"),
        (
            {"command": ["x"], "gpus": 2, "sizes": [1, 2], "session": "shell"},
            400,
            "sizes: a shell session runs at one size",
        ),
        (
            {"command": ["x"], "gpus": 8, "sizes": [6, 8]},
            400,
            "gpus: can never fit: 6 GPUs, and the nodes it may use have 4 GPUs in all (its smallest size)",
        ),
        ({"command": []}, 422, "command: List should have at least 1 item"),
        ({"command": ["x"], "colour": "red"}, 422, "colour: Extra inputs are not permitted"),
        ({"command": ["x"], "workdir": "/no/such/dir"}, 400, "workdir: '/no/such/dir' is not a directory"),
        ({"command": ["x"], "team": "vision"}, 403, "the token of team nlp may not act on jobs of team vision"),
        ({"command": ["x"], "priority": "urgent"}, 403, "team nlp may not use class urgent (allowed: normal, low)"),
    ],
)
def test_bad_requests_get_a_clear_error_and_change_nothing(
    setup: tuple[TestClient, Store, ControlLoop], body: dict[str, object], status: int, message: str
) -> None:
    client, store, _ = setup
    make_team(client, "vision")
    nlp = make_team(client, "nlp", classes=["normal", "low"])
    response = client.post("/jobs", json=body, headers=auth(nlp))
    assert response.status_code == status
    assert message in response.json()["message"]
    assert store.jobs() == []


def test_tokens_are_checked(setup: tuple[TestClient, Store, ControlLoop]) -> None:
    client, _, _ = setup
    assert client.get("/jobs").status_code == 401
    assert client.get("/jobs", headers=auth("nonsense")).status_code == 401
    nlp = make_team(client, "nlp")
    forbidden = client.put("/teams/rogue", json={}, headers=auth(nlp))
    assert (forbidden.status_code, forbidden.json()["error"]) == (403, "Forbidden")
    vision = make_team(client, "vision")
    job = client.post("/jobs", json={"command": ["x"]}, headers=auth(vision)).json()
    assert client.post(f"/jobs/{job['id']}/cancel", headers=auth(nlp)).status_code == 403
    assert client.get("/jobs/999", headers=auth(nlp)).status_code == 404


def test_the_job_protocol_heartbeat_carries_the_notice(setup: tuple[TestClient, Store, ControlLoop]) -> None:
    client, _, loop = setup
    job = client.post("/jobs", json={"command": ["x"], "priority": "low", "gpus": 4}, headers=auth(ADMIN)).json()
    loop.tick(100.0)
    executor = loop.executor
    assert isinstance(executor, FakeExecutor)
    token = executor.started[0].env["GPUPOOL_TOKEN"]
    [listed] = client.get("/jobs?state=running", headers=auth(ADMIN)).json()
    assert (listed["running_since"], listed["placement"]) == (100.0, {"gpu0": [0, 1, 2, 3]})
    base = f"/jobs/{job['id']}/attempts/0"
    beat = client.post(f"{base}/heartbeat", json={"step": 5, "phase": "train"}, headers=auth(token))
    assert beat.json() == {"notice": None}
    assert client.post(f"{base}/checkpoint", json={"step": 5, "path": "/c/5"}, headers=auth(token)).status_code == 204
    client.post("/jobs", json={"command": ["y"], "priority": "high", "gpus": 4}, headers=auth(ADMIN))
    loop.tick(300.0)
    notice = client.post(f"{base}/heartbeat", json={"step": 6, "phase": "save"}, headers=auth(token)).json()["notice"]
    assert notice["deadline"] == 360.0
    assert client.post(f"{base}/ack", headers=auth(token)).status_code == 204
    assert client.post(f"{base}/heartbeat", json={}, headers=auth("wrong")).status_code == 403
    assert client.post(f"/jobs/{job['id']}/attempts/1/heartbeat", json={}, headers=auth(token)).status_code == 409


def test_a_background_save_is_of_the_state_before_its_write_and_its_write_is_shown_apart(
    setup: tuple[TestClient, Store, ControlLoop],
) -> None:
    client, store, loop = setup  # the API's clock says 100
    job = client.post("/jobs", json={"command": ["x"], "gpus": 2}, headers=auth(ADMIN)).json()
    loop.tick(50.0)
    assert isinstance(loop.executor, FakeExecutor)
    token = loop.executor.started[0].env["GPUPOOL_TOKEN"]
    base = f"/jobs/{job['id']}/attempts/0"
    store.heartbeat(job["id"], 0, 60.0, 0, "train")  # training from 60; the API's reports come at 100
    body = {"step": 50, "path": "/c/50", "seconds": 0.5, "background_seconds": 12.0}
    assert client.post(f"{base}/checkpoint", json=body, headers=auth(token)).status_code == 204
    [attempt] = client.get(f"/jobs/{job['id']}", headers=auth(ADMIN)).json()["history"]
    at = attempt["last_checkpoint_at"]
    [commit] = store.checkpoints(job["id"])
    assert at == pytest.approx(commit.time - 12.0), "a crash now loses the work since the staging"
    assert commit.background_seconds == 12.0
    [event] = [e for e in store.events() if e.kind == "checkpoint"]
    assert "blocked training 0.5 s, then written in the background in 12 s" in event.message
    account = client.get(f"/jobs/{job['id']}", headers=auth(ADMIN)).json()["account"]
    assert account["attempts"][0]["background"] == 2 * 12.0
    assert account["attempts"][0]["checkpoint"] == 2 * 0.5


def test_a_job_that_fits_a_node_away_for_now_is_accepted(setup: tuple[TestClient, Store, ControlLoop]) -> None:
    client, store, _ = setup
    store.set_nodes([Node("big", 8, "virtual")], virtual=True)
    store.sync_nodes([(Node("gpu0", 4, "virtual"), True)])  # big left: rebooting, or set aside
    assert [n.name for n in store.nodes()] == ["gpu0"]
    created = client.post("/jobs", json={"command": ["train"], "gpus": 8, "team": "default"}, headers=auth(ADMIN))
    assert created.status_code == 201, created.text
    refused = client.post("/jobs", json={"command": ["train"], "gpus": 13, "team": "default"}, headers=auth(ADMIN))
    assert refused.status_code == 400, "more GPUs than the pool ever had"
