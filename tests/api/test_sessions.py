"""Sessions through the API (issue 35): who may reach a terminal, what a session is given when
it names no class, and a cancel that kills at once. The terminal itself, with real processes,
is tests/service/test_sessions_live.py's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from gpupool.api import notebooks
from gpupool.client import Client
from tests.support.apiworld import ADMIN, Api, World, auth, opened, populated


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    for api in opened(tmp_path):
        yield populated(api)


def shell_of(world: World, token: str) -> int:
    job = world.api.submit(token, session="shell", command=["/bin/sh"])
    world.api.loop.tick(world.api.now[0])
    return int(str(job["id"]))


def refused(api: Api, job: int, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    """The close code and the error message the terminal's WebSocket ends with."""
    with api.client.websocket_connect(f"/jobs/{job}/terminal", headers=headers) as socket:
        said = json.loads(socket.receive_text())
        with pytest.raises(WebSocketDisconnect) as closed:
            socket.receive_text()
    return closed.value.code, said


def test_only_the_sessions_own_user_and_the_admin_pass_the_terminals_door(world: World) -> None:
    api = world.api
    job = shell_of(world, world.tokens["a1"])
    for token, who in (("b1", "user b1"), ("a2", "user a2"), ("a", "team a"), ("b", "team b")):
        code, said = refused(api, job, auth(world.tokens[token]))
        assert code == 4403, (token, said)
        assert said["error"] == "Forbidden"
        assert who in said["message"]
    code, said = refused(api, job, {})
    assert (code, said["error"]) == (4401, "Unauthorized")
    code, said = refused(api, 424242, auth(ADMIN))
    assert (code, said["error"]) == (4404, "NotFound")


def test_a_batch_job_has_no_terminal_and_says_how_to_follow_it(world: World) -> None:
    code, said = refused(world.api, world.job_a, auth(world.tokens["a1"]))
    assert code == 4409
    assert "with no terminal" in said["message"]
    assert "gpupool logs -f" in said["message"]


def test_a_session_gets_the_sessions_class_and_its_time_limit_unless_it_names_them(world: World) -> None:
    api = world.api
    shell = api.submit(world.tokens["a1"], session="shell", command=["/bin/sh"])
    assert (shell["priority"], shell["time_limit"], shell["session"]) == ("interactive", 8 * 3600.0, "shell")
    named = api.submit(world.tokens["a1"], session="run", priority="low", time_limit=60.0)
    assert (named["priority"], named["time_limit"]) == ("low", 60.0)
    batch = api.submit(world.tokens["a1"])
    assert (batch["priority"], batch["time_limit"], batch["session"]) == ("normal", None, None)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"session": "shell", "gpus": 2, "gpus_per_node": 1}, "a shell session runs on one node"),
        ({"session": "notebook", "gpus": 8}, "can never fit: 8 GPUs as 1 member of 8"),
        ({"session": "notebook", "array": "0-3"}, "a notebook session is one job, not an array"),
        ({"session": "desktop"}, "session"),
    ],
)
def test_what_a_session_cannot_be_is_refused_at_submit(world: World, fields: dict[str, object], problem: str) -> None:
    body = {"command": ["/bin/sh"], "workdir": str(world.api.workdir), **fields}
    answer = world.api.client.post("/jobs", json=body, headers=auth(world.tokens["a1"]))
    assert answer.status_code in (400, 422), answer.text
    assert problem in answer.text


def test_cancel_now_kills_at_once_even_during_the_grace(world: World) -> None:
    api = world.api
    answer = api.client.post(f"/jobs/{world.job_a}/cancel", headers=auth(world.tokens["a1"]))
    assert answer.status_code == 200
    api.loop.tick(300.0)
    assert (world.job_a, 1) not in api.executor.killed  # notice first, with the class's grace
    answer = api.client.post(f"/jobs/{world.job_a}/cancel", params={"now": "true"}, headers=auth(world.tokens["a1"]))
    assert answer.status_code == 200
    api.loop.tick(301.0)
    assert (world.job_a, 1) in api.executor.killed
    kinds = [e.kind for e in api.store.events(job_id=world.job_a)]
    assert kinds.index("cancel_requested") < kinds.index("kill_requested")
    answer = api.client.post(f"/jobs/{world.job_b}/cancel", params={"now": "maybe"}, headers=auth(world.tokens["b1"]))
    assert answer.status_code == 422


def test_the_websocket_refuses_nothing_before_it_is_accepted(world: World) -> None:
    """Every refusal is said in the protocol (a message, then a close code), never a bare HTTP
    denial a terminal client could not show."""
    job = shell_of(world, world.tokens["a1"])
    try:
        refused(world.api, job, auth(world.tokens["b1"]))
    except WebSocketDenialResponse:  # pragma: no cover - what must not happen
        pytest.fail("the terminal's WebSocket was denied before it was accepted")


def test_inside_a_job_the_command_line_never_takes_the_attempts_token_for_a_persons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUPOOL_TOKEN", "the-attempts-token")
    monkeypatch.setenv("GPUPOOL_ATTEMPT", "0")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "gpupool").mkdir()
    (tmp_path / "gpupool" / "token").write_text("my-own-token")
    (tmp_path / "gpupool" / "token").chmod(0o600)
    assert Client.from_env("http://127.0.0.1:9", []).token == "my-own-token"
    monkeypatch.delenv("GPUPOOL_ATTEMPT")
    assert Client.from_env("http://127.0.0.1:9", []).token == "the-attempts-token"


@pytest.mark.parametrize(
    ("header", "passed"),
    [
        ("_xsrf=abc; Path=/ui/notebooks/7/", True),
        ("username-x=abc; path=/ui/notebooks/7", True),
        ("gpupool_token=stolen; Path=/ui/notebooks/7/", False),
        ("x=1; Path=/ui", False),
        ("x=1", False),
        ("x=1; Path=/ui/notebooks/70/", False),
    ],
)
def test_a_notebook_server_sets_cookies_only_for_its_own_path_and_never_gpupools(header: str, passed: bool) -> None:
    assert notebooks.allowed("Set-Cookie", header, "/ui/notebooks/7") is passed
    assert notebooks.allowed("Content-Type", "text/html", "/ui/notebooks/7")
