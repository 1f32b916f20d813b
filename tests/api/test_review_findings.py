"""Findings of a review of the day-one change, each a test first: arrays past a thousand tasks,
dependencies on an array and one of its tasks, output paths, values out of range, markup."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpupool.api import Context, create_app
from gpupool.model import DEFAULT_CLASSES, Config, Node
from gpupool.service.loop import ControlLoop
from gpupool.service.workspace import token_hash
from gpupool.settle import JobState
from gpupool.store import JobSpec, Store
from tests.support.fakes import FakeExecutor

ADMIN = "admin-secret"
CONFIG = Config(DEFAULT_CLASSES)
HEADERS = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture
def api(store_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, Store, Path]]:
    store = Store.open(store_url)
    store.sync_config(CONFIG)
    store.set_nodes([Node("gpu0", 4, "virtual")], virtual=True)
    data = tmp_path / "data"
    data.mkdir()
    loop = ControlLoop(store, CONFIG, FakeExecutor(store), data)
    yield TestClient(create_app(Context(store, loop, token_hash(ADMIN)))), store, data
    store.close()


def refusal(client: TestClient, job: dict[str, Any], codes: tuple[int, ...] = (400,)) -> str:
    """The message of the API's refusal of `job`, refused with one of `codes`."""
    response = client.post("/jobs", json=job, headers=HEADERS)
    assert response.status_code in codes, response.text
    return str(response.json()["message"])


def test_an_array_lists_every_task_past_a_thousand(api: tuple[TestClient, Store, Path], tmp_path: Path) -> None:
    client, _, _ = api
    made = client.post(
        "/jobs", json={"command": ["true"], "array": "0-1199", "workdir": str(tmp_path)}, headers=HEADERS
    )
    assert made.status_code == 201, made.text
    tasks = client.get(f"/jobs?array={made.json()['id']}", headers=HEADERS).json()
    assert len(tasks) == 1200
    assert len(client.get("/jobs", headers=HEADERS).json()) == 1200, "a listing is not cut at 1,000"


@pytest.mark.parametrize("path", ["/jobs/99999999999", "/jobs?array=99999999999", "/events?job=99999999999"])
def test_an_id_out_of_range_is_a_clear_error_on_every_store(api: tuple[TestClient, Store, Path], path: str) -> None:
    client, _, _ = api
    response = client.get(path, headers=HEADERS)
    assert response.status_code in (400, 404, 422, 200), response.text
    assert response.status_code != 500


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"array": "5000000000"}, "array: "),
        ({"after": "ok:99999999999"}, "after: "),
        ({"output": "logs"}, "output: "),
        ({"error": "bad\u0000path"}, "error: "),
    ],
)
def test_bad_job_fields_are_refused_at_submit(
    api: tuple[TestClient, Store, Path], tmp_path: Path, fields: dict[str, str], message: str
) -> None:
    client, _, _ = api
    (tmp_path / "logs").mkdir()
    assert message in refusal(client, {"command": ["true"], "workdir": str(tmp_path), **fields}, codes=(400, 422))


def test_logs_and_work_never_go_into_the_data_directory(api: tuple[TestClient, Store, Path]) -> None:
    client, _, data = api
    (data / "admin.token").write_text("secret\n")
    for fields in ({"workdir": str(data)}, {"workdir": "/", "error": str(data / "admin.token")}):
        assert "data directory" in refusal(client, {"command": ["true"], **fields})


def test_a_dependency_on_an_array_and_on_one_of_its_tasks_waits_for_both(
    api: tuple[TestClient, Store, Path], tmp_path: Path
) -> None:
    _, store, _ = api
    tasks = store.submit_array(JobSpec(["true"], workdir=str(tmp_path), array=[0, 1, 2]), now=0.0)
    first, last = tasks[0].id, tasks[2].id
    waiting = store.submit(JobSpec(["true"], dependencies=[("ok", first), ("ok", last)]), now=1.0)
    store.settle_dependencies(now=2.0)
    assert store.job(waiting.id).state == JobState.PENDING.value
    [hold] = store.snapshot_with_holds(now=2.0)[1]
    assert f"waits for job {first} to succeed" in hold.message


@pytest.mark.parametrize(("field", "value"), [("output", "x" * 300 + ".log"), ("workdir", "/" + "y" * 300)])
def test_a_path_the_system_refuses_is_a_clear_error_not_a_500(
    api: tuple[TestClient, Store, Path], tmp_path: Path, field: str, value: str
) -> None:
    client, _, _ = api
    body = {"command": ["true"], "workdir": str(tmp_path), field: value}
    assert f"{field}: " in refusal(client, body, codes=(400, 422))


def test_an_array_limit_past_what_the_store_keeps_is_refused(
    api: tuple[TestClient, Store, Path], tmp_path: Path
) -> None:
    client, _, _ = api
    body = {"command": ["true"], "workdir": str(tmp_path), "array": "0-3%99999999999999999999"}
    assert "array: " in refusal(client, body)


def test_the_name_a_log_path_checks_is_the_one_the_job_gets(
    api: tuple[TestClient, Store, Path], tmp_path: Path
) -> None:
    client, _, _ = api
    (tmp_path / "train").mkdir()  # the job is named after its command: train
    body = {"command": ["train"], "workdir": str(tmp_path), "output": "%x"}
    assert "is a folder" in refusal(client, body)


def test_logs_leave_a_character_cut_at_the_end_for_the_next_read(tmp_path: Path) -> None:
    from gpupool.api.logs import read_part

    log = tmp_path / "stdout.log"
    log.write_bytes(b"caf" + "é".encode()[:1])
    with log.open("rb") as stream:
        assert read_part(stream, 0)[:2] == ("caf", 3)
    log.write_bytes("café\n".encode() + b"\xff")
    with log.open("rb") as stream:
        assert read_part(stream, 3)[:2] == ("é\n\ufffd", len("café\n".encode()) + 1)
