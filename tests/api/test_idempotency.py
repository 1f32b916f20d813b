"""Idempotent submissions: a submission retried with its `Idempotency-Key` is one job, however
the retry arrives (after the answer was lost, or racing the first)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.store import JobSpec, Store
from gpupool.store.jobs import DuplicateSubmission, JobsStore
from tests.support.apiworld import ADMIN, Api, auth, opened


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    yield from opened(tmp_path)


def post(api: Api, body: dict[str, Any], key: str | None, token: str = ADMIN) -> httpx.Response:
    headers = auth(token) | ({"Idempotency-Key": key} if key is not None else {})
    response: httpx.Response = api.client.post("/jobs", json={"workdir": str(api.workdir), **body}, headers=headers)
    return response


def test_a_submission_retried_with_its_key_is_one_job_with_the_same_answer(api: Api) -> None:
    body = {"command": ["python", "train.py"], "gpus": 2, "name": "train"}
    first = post(api, body, "retry-me-1")
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    api.loop.tick(100.0)  # it starts: the answer to a retry is still the one the first request got
    again = post(api, body, "retry-me-1")
    assert again.status_code == 201, again.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert [j.id for j in api.store.jobs()] == [first.json()["id"]]
    assert api.store.job(first.json()["id"]).idempotency_key == "retry-me-1"
    other = post(api, body, "another-key")
    assert other.json()["id"] != first.json()["id"]
    assert len(api.store.jobs()) == 2


def test_without_a_key_every_submission_is_a_job(api: Api) -> None:
    for _ in range(2):
        assert post(api, {"command": ["true"]}, None).status_code == 201
    assert len(api.store.jobs()) == 2


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"command": ["python", "other.py"]}, "command"),
        ({"priority": "low"}, "priority"),
        ({"gpus": 1}, "gpus"),
        ({"name": "renamed"}, "name"),
        ({"env": {"A": "2"}}, "env"),
        ({"time_limit": 60}, "time_limit"),
        ({"max_failures": 3}, "max_failures"),
        ({"max_preemptions": 1}, "max_preemptions"),
        ({"after": "1"}, "after"),
        ({"array": "0-3"}, "array"),
        ({"script": "#!/bin/sh\ntrue\n"}, "script"),
        ({"output": "out-%j.log"}, "output"),
        ({"error": "err-%j.log"}, "error"),
        ({"gpu_type": "virtual"}, "gpu_type"),
        ({"user": "someone"}, "user"),
        ({"sizes": [1, 2]}, "sizes"),
    ],
)
def test_the_same_key_for_another_request_is_a_conflict(api: Api, change: dict[str, Any], field: str) -> None:
    seed = post(api, {"command": ["true"]}, None)  # job 1, for `after`
    assert seed.status_code == 201
    body = {"command": ["python", "train.py"], "gpus": 2, "name": "train", "env": {"A": "1"}}
    assert post(api, body, "k").status_code == 201
    refused = post(api, {**body, **change}, "k")
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "Conflict"
    assert "Idempotency-Key" in refused.json()["message"]
    assert field in refused.json()["message"]
    assert len(api.store.jobs()) == 2


def test_a_new_workdir_is_another_request(api: Api, tmp_path: Path) -> None:
    assert post(api, {"command": ["true"]}, "k").status_code == 201
    refused = post(api, {"command": ["true"], "workdir": str(tmp_path)}, "k")
    assert refused.status_code == 409
    assert "workdir" in refused.json()["message"]


def test_a_key_belongs_to_its_team(api: Api) -> None:
    a, b = api.team("a"), api.team("b")
    first = post(api, {"command": ["true"]}, "shared", a)
    second = post(api, {"command": ["true"]}, "shared", b)
    assert (first.status_code, second.status_code) == (201, 201)
    assert "idempotent-replayed" not in second.headers
    assert (first.json()["team"], second.json()["team"]) == ("a", "b")


@pytest.mark.parametrize("key", ["", "x" * 201, "tab\tin it", "del\x7f"])
def test_a_key_that_is_not_1_to_200_printable_characters_is_refused(api: Api, key: str) -> None:
    refused = post(api, {"command": ["true"]}, key)
    assert refused.status_code == 400, refused.text
    assert "Idempotency-Key" in refused.json()["message"]
    assert api.store.jobs() == []


def test_an_array_keeps_its_key_on_its_first_task(api: Api) -> None:
    body = {"command": ["true"], "array": "0-2"}
    first = post(api, body, "array-key")
    assert first.status_code == 201
    again = post(api, body, "array-key")
    assert again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    tasks = api.store.jobs()
    assert len(tasks) == 3
    assert [t.idempotency_key for t in tasks] == ["array-key", None, None]
    assert post(api, {**body, "array": "0-3"}, "array-key").status_code == 409


def test_concurrent_duplicates_make_one_job_and_get_the_same_answer(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    # Both requests pass the lookup before either is written: the write finds the other.
    looked: list[JobSpec] = []
    real = api.store.earlier_submission

    def blind_twice(spec: JobSpec) -> Any:
        looked.append(spec)
        return None if len(looked) <= 2 else real(spec)

    monkeypatch.setattr(api.store, "earlier_submission", blind_twice)
    body = {"command": ["true"], "workdir": str(api.workdir)}
    headers = auth(ADMIN) | {"Idempotency-Key": "race"}

    async def race() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=api.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return list(await asyncio.gather(*(client.post("/jobs", json=body, headers=headers) for _ in range(2))))

    one, two = asyncio.run(race())
    assert (one.status_code, two.status_code) == (201, 201), (one.text, two.text)
    assert one.json() == two.json()
    assert sorted(r.headers.get("Idempotent-Replayed", "") for r in (one, two)) == ["", "true"]
    assert len(api.store.jobs()) == 1


def test_a_duplicate_that_reaches_the_unique_index_is_still_one_job(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpupool.model import DEFAULT_CLASSES, Config

    store = Store.open(store_url)
    store.sync_config(Config(DEFAULT_CLASSES))
    # Two transactions that both found no job with the key: the second one's insert meets the index.
    monkeypatch.setattr(JobsStore, "_key_taken", staticmethod(lambda *_: None))
    spec = JobSpec(["true"], idempotency_key="k")
    [first] = store.submit_many([spec], 1.0)
    [second] = store.submit_many([spec], 2.0)
    assert not isinstance(first, Exception)
    assert isinstance(second, DuplicateSubmission)
    assert second.job_id == first.id
    assert [j.id for j in store.jobs()] == [first.id]
    with pytest.raises(DuplicateSubmission):
        store.submit_array(JobSpec(["true"], idempotency_key="k", array=[0, 1]), 3.0)
    assert len(store.jobs()) == 1
    store.close()
