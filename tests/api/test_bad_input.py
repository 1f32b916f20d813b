"""Bad input is a clear 4xx in JSON, never a 500 nor a job that can only fail: numbers past what
the store holds, paths and arguments the system refuses, bodies past the documented limits,
loose types."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.apiworld import ADMIN, Api, auth, opened

BIG = 2**63
PAST_INT32 = 2**31


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    yield from opened(tmp_path)


@pytest.fixture
def running(api: Api) -> tuple[int, str]:
    """A running job and its attempt's token."""
    job = int(str(api.submit(ADMIN)["id"]))
    api.loop.tick(100.0)
    return job, api.executor.started[0].env["GPUPOOL_TOKEN"]


def as_json(body: dict[str, Any]) -> bytes:
    """JSON as Python writes it: NaN and Infinity as they are (httpx refuses to send them)."""
    return json.dumps(body).encode()


def json_auth(token: str) -> dict[str, str]:
    return auth(token) | {"content-type": "application/json"}


def assert_refused(response: Any, status: int = 422, field: str | None = None) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error", "message"}
    if field is not None:
        assert field in body["message"]


@pytest.mark.parametrize("number", [BIG, PAST_INT32, -1])
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/jobs/{n}"),
        ("GET", "/jobs/{n}/logs"),
        ("POST", "/jobs/{n}/cancel"),
        ("GET", "/jobs?array={n}"),
        ("GET", "/jobs?limit={n}"),
        ("GET", "/events?job={n}"),
        ("GET", "/events?after={n}"),
        ("GET", "/events?limit={n}"),
        ("GET", "/jobs/1/logs?attempt={n}"),
        ("POST", "/jobs/{n}/attempts/0/ack"),
        ("POST", "/jobs/1/attempts/{n}/complete"),
    ],
)
def test_integers_past_what_the_store_holds_are_refused_in_paths_and_queries(
    api: Api, running: tuple[int, str], method: str, path: str, number: int
) -> None:
    _, token = running
    response = api.client.request(
        method, path.format(n=number), headers=auth(ADMIN if "attempts" not in path else token)
    )
    assert_refused(response)


def test_a_log_offset_may_be_any_64_bit_position_but_not_past_it(api: Api, running: tuple[int, str]) -> None:
    job, _ = running
    far = api.client.get(f"/jobs/{job}/logs?offset={BIG - 1}", headers=auth(ADMIN))
    assert far.status_code == 200, far.text
    assert (far.text, far.headers["X-Next-Offset"]) == ("", str(BIG - 1))
    assert_refused(api.client.get(f"/jobs/{job}/logs?offset={BIG}", headers=auth(ADMIN)))
    assert_refused(api.client.get(f"/jobs/{job}/logs?offset=-1", headers=auth(ADMIN)))


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("heartbeat", {"step": BIG}),
        ("heartbeat", {"step": PAST_INT32}),
        ("heartbeat", {"restored_step": BIG}),
        ("heartbeat", {"step": -1}),
        ("checkpoint", {"step": BIG}),
        ("checkpoint", {"step": PAST_INT32}),
        ("heartbeat", {"restore_seconds": math.inf}),
        ("heartbeat", {"since_commit": math.nan}),
        ("checkpoint", {"seconds": math.inf}),
        ("checkpoint", {"background_seconds": math.inf}),
        ("checkpoint", {"background_seconds": -1}),
        ("heartbeat", {"restart_phases": {"\x1b[31mred": 1.0}}),
        ("heartbeat", {"restart_phases": {"x" * 41: 1.0}}),
        ("heartbeat", {"restart_phases": {f"p{i}": 1.0 for i in range(13)}}),
        ("heartbeat", {"restart_phases": {"imports": -1.0}}),
        ("heartbeat", {"first_step_seconds": math.inf}),
        ("checkpoint", {"path": "x" * 5000}),
    ],
)
def test_numbers_past_what_the_store_holds_are_refused_in_the_job_protocol(
    api: Api, running: tuple[int, str], action: str, body: dict[str, Any]
) -> None:
    job, token = running
    response = api.client.post(f"/jobs/{job}/attempts/0/{action}", content=as_json(body), headers=json_auth(token))
    assert_refused(response, field=next(iter(body)))


@pytest.mark.parametrize(
    "fields",
    [
        {"max_failures": BIG},
        {"gpus": BIG},
        {"time_limit": math.inf},
        {"time_limit": math.nan},
    ],
)
def test_numbers_past_what_the_store_holds_are_refused_at_submit(api: Api, fields: dict[str, Any]) -> None:
    body = {"command": ["true"], "workdir": str(api.workdir), **fields}
    assert_refused(api.client.post("/jobs", content=as_json(body), headers=json_auth(ADMIN)), field=next(iter(fields)))
    assert api.store.jobs() == []


@pytest.mark.parametrize("since", ["inf", "-inf", "nan", "1e400"])
def test_a_report_since_no_finite_time_is_refused(api: Api, since: str) -> None:
    assert_refused(api.client.get(f"/report?since={since}", headers=auth(ADMIN)), field="since")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"command": ["/" + "c" * 300]}, "command"),
        ({"command": ["/opt/" + "c" * 256 + "/run"]}, "command"),
        ({"command": ["echo", "a\x00b"]}, "command"),
        ({"command": ["echo\x00"]}, "command"),
        ({"command": ["echo", "x" * 200_000]}, "command"),
        ({"command": ["echo", *["x" * 100_000] * 11]}, "command"),
        ({"env": {"A=B": "1"}}, "env"),
        ({"env": {"A": "1\x002"}}, "env"),
        ({"env": {"": "1"}}, "env"),
        ({"env": {"A": "x" * 200_000}}, "env"),
        ({"output": "x" * 247 + "%j.log"}, "output"),
        ({"error": "logs/" + "e" * 256 + "/err.log"}, "error"),
        ({"output": "o\x00ut.log"}, "output"),
        ({"workdir": "/tmp/" + "w" * 256}, "workdir"),
        ({"workdir": "/tmp/w\x00"}, "workdir"),
        ({"script": "echo no interpreter\n"}, "script"),
        ({"script": "#!/bin/sh\necho \x00\n"}, "script"),
        ({"script": "#!/" + "i" * 300 + "/sh\ntrue\n"}, "script"),
        ({"name": "n\x00"}, "name"),
    ],
)
def test_what_the_system_would_refuse_at_launch_is_refused_at_submit(
    api: Api, fields: dict[str, Any], field: str
) -> None:
    body = {"command": ["true"], "workdir": str(api.workdir), **fields}
    response = api.client.post("/jobs", json=body, headers=auth(ADMIN))
    assert response.status_code in (400, 422), response.text
    assert_refused(response, response.status_code, field)
    assert api.store.jobs() == []


def test_a_body_over_the_limit_is_refused_by_its_length_and_when_chunked(api: Api) -> None:
    big = b'{"command": ["true"], "env": {"A": "' + b"x" * (3 << 20) + b'"}}'
    headers = auth(ADMIN) | {"content-type": "application/json"}
    assert_refused(api.client.post("/jobs", content=big, headers=headers), 413, "2 MiB")

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(big), 1 << 16):
            yield big[start : start + (1 << 16)]

    assert_refused(api.client.post("/jobs", content=chunks(), headers=headers), 413, "2 MiB")
    assert api.store.jobs() == []


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"script": "#!/bin/sh\n" + "x" * 1_000_000}, "script"),
        ({"env": {f"V{i}": "x" * 100_000 for i in range(11)}}, "env"),
    ],
)
def test_fields_over_their_limits_are_refused(api: Api, fields: dict[str, Any], field: str) -> None:
    body = {"command": ["true"], "workdir": str(api.workdir), **fields}
    assert_refused(api.client.post("/jobs", json=body, headers=auth(ADMIN)), field=field)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/teams/a", {"new_token": "x"}, "new_token"),
        ("/teams/a", {"new_token": 1}, "new_token"),
        ("/teams/a", {"guaranteed_gpus": True}, "guaranteed_gpus"),
        ("/teams/a", {"weight": "2"}, "weight"),
        ("/users/u", {"team": "default", "new_token": "yes"}, "new_token"),
        ("/jobs", {"command": ["true"], "max_preemptions": True}, "max_preemptions"),
        ("/jobs", {"command": ["true"], "gpus": "2"}, "gpus"),
        ("/jobs", {"command": ["true"], "gpus": 2.0}, "gpus"),
        ("/jobs", {"command": "true"}, "command"),
        ("/jobs", {"command": ["true"], "env": {"A": 1}}, "env"),
    ],
)
def test_loose_values_are_refused(api: Api, path: str, body: dict[str, Any], field: str) -> None:
    method = "POST" if path == "/jobs" else "PUT"
    response = api.client.request(method, path, json=body, headers=auth(ADMIN))
    assert_refused(response, field=field)


def test_an_integer_is_a_number_of_seconds(api: Api) -> None:
    made = api.client.post(
        "/jobs", json={"command": ["true"], "workdir": str(api.workdir), "time_limit": 60}, headers=auth(ADMIN)
    )
    assert made.status_code == 201, made.text
    assert made.json()["time_limit"] == 60.0
    assert api.client.put("/teams/a", json={"weight": 2}, headers=auth(ADMIN)).json()["weight"] == 2.0


@pytest.mark.parametrize(
    ("path", "field"),
    [("/jobs?state=sleeping", "state"), ("/jobs?state=pending,", "state"), ("/jobs/1/logs?stream=stdin", "stream")],
)
def test_values_outside_their_enumeration_are_refused(
    api: Api, running: tuple[int, str], path: str, field: str
) -> None:
    assert_refused(api.client.get(path, headers=auth(ADMIN)), field=field)


def test_unknown_routes_and_methods_answer_json(api: Api) -> None:
    assert_refused(api.client.get("/nowhere", headers=auth(ADMIN)), 404)
    assert_refused(api.client.delete("/jobs", headers=auth(ADMIN)), 405)


def test_a_body_that_is_not_json_is_refused_in_json(api: Api) -> None:
    headers = auth(ADMIN) | {"content-type": "application/json"}
    assert_refused(api.client.post("/jobs", content=b"{not json", headers=headers), 422)
    assert_refused(api.client.post("/jobs", content=b"\xff\xfe", headers=headers), 422)


def test_a_body_that_cannot_be_decoded_is_a_400_in_json(api: Api) -> None:
    headers = auth(ADMIN) | {"content-type": "application/json"}
    for path, method in (("/jobs", "POST"), ("/teams/a", "PUT"), ("/users/u", "PUT")):
        response = api.client.request(method, path, content=b'{"command": ["\xff"]}', headers=headers)
        assert_refused(response, 400)
