"""The everyday commands against `gpupool up`: users, cancel filters, the pool as sinfo shows
it, JSON for machines, and every table at 80 columns when piped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from tests.support.live import Service, running, state, wait_for


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(Service(tmp_path))


def test_a_users_token_submits_as_that_user_and_queue_cancel_and_report_know_users(service: Service) -> None:
    assert service.cli("team", "set", "nlp").returncode == 0
    added = service.cli("user", "add", "alice", "--team", "nlp")
    assert added.returncode == 0, added.stderr
    token = added.stdout.rsplit(": ", 1)[1].strip()
    as_alice = dict(service.env, GPUPOOL_TOKEN=token)
    mine = service.submit("--name", "x", "--", "sleep", "600", env=as_alice)
    other = service.submit("--name", "x", "--", "sleep", "600")
    assert service.get(f"/jobs/{mine}").json()["user"] == "alice"  # type: ignore[union-attr]
    assert service.get(f"/jobs/{mine}").json()["team"] == "nlp"  # type: ignore[union-attr]
    listed = json.loads(service.cli("queue", "--user", "alice", "--json").stdout)
    assert [j["id"] for j in listed] == [mine]
    assert "alice" in service.cli("user", "list").stdout
    cancelled = service.cli("cancel", "--user", "alice", "--name", "x")
    assert cancelled.returncode == 0, cancelled.stderr
    wait_for(lambda: state(service, mine) == "cancelled")
    assert state(service, other) != "cancelled"
    assert service.cli("cancel", str(other), "999").returncode == 3  # one cancelled, one not found
    wait_for(lambda: state(service, other) == "cancelled")
    report = json.loads(service.cli("report", "--json").stdout)
    assert "alice" in report["users"]


def test_pool_shows_draining_gpus_and_those_held_for_the_preemptor(tmp_path: Path) -> None:
    # A grace long enough that the victim still drains when the command line answers on a loaded
    # machine (2 s was not); its kill at the deadline is test_local_processes's.
    for service in running(Service(tmp_path, grace="120s")):
        shows_draining_and_held(service)


def shows_draining_and_held(service: Service) -> None:
    stubborn = service.submit("--", "sh", "-c", "trap '' TERM; sleep 600")
    wait_for(lambda: state(service, stubborn) == "running")
    big = service.submit("--priority", "high", "--gpus", "2", "--", "sleep", "600")
    wait_for(lambda: state(service, stubborn) == "preempting")
    wait_for(lambda: {g["state"] for g in pool_gpus(service)} == {"draining", "held"})
    gpus = pool_gpus(service)
    assert {(g["state"], g["for_job"]) for g in gpus} == {("draining", big), ("held", big)}
    shown = service.cli("pool").stdout
    assert f"held→{big}" in shown
    assert f"default/{stubborn}→{big}" in shown


def pool_gpus(service: Service) -> list[dict[str, object]]:
    response = service.get("/pool")
    assert response is not None
    gpus: list[dict[str, object]] = response.json()["nodes"][0]["gpu_states"]
    return gpus


def test_json_has_iso_times_and_numbers_for_durations(service: Service) -> None:
    job = service.submit("-t", "1:00:00", "--", "true")
    wait_for(lambda: state(service, job) == "succeeded")
    shown = json.loads(service.cli("show", str(job), "--json").stdout)
    assert datetime.fromisoformat(shown["submit_time"]).tzinfo is not None
    assert datetime.fromisoformat(shown["history"][0]["started_at"]).tzinfo is not None
    assert shown["time_limit"] == 3600.0
    assert shown["history"][0]["exit_code"] == 0


def test_health_answers_without_a_token(service: Service) -> None:
    response = httpx.get(f"http://127.0.0.1:{service.port}/health")
    assert (response.status_code, response.json()) == (200, {"status": "ok", "store": "ok"})


def test_every_table_fits_80_columns_when_piped(service: Service) -> None:
    assert service.cli("team", "set", "a-team-with-a-long-name", "--guaranteed-gpus", "1").returncode == 0
    running_job = service.submit("--name", "a-job-name-that-is-much-longer-than-any-column", "--", "sleep", "600")
    for _ in range(3):
        service.submit("--gpus", "2", "--after", str(running_job), "--", "true")
    service.submit("--array", "0-20%2", "--", "sleep", "1")
    wait_for(lambda: state(service, running_job) == "running")
    env = dict(service.env, COLUMNS="80")
    for command in (
        ["queue"],
        ["queue", "--all"],
        ["show", str(running_job)],
        ["pool"],
        ["team", "list"],
        ["report"],
        ["events"],
        ["classes"],
    ):
        out = service.run_cli(env, *command)
        assert out.returncode == 0, (command, out.stderr)
        too_wide = [line for line in out.stdout.splitlines() if len(line) > 80]
        assert not too_wide, (command, too_wide)
    queue = service.run_cli(env, "queue").stdout.splitlines()
    assert all(line.split()[0][0].isdigit() for line in queue[1:]), "a row wrapped onto a second line"
    assert any("_[" in line for line in queue), "the waiting tasks of an array share one row"


def test_version_and_short_help() -> None:
    env = {**os.environ, "COLUMNS": "80"}
    version = subprocess.run(
        [sys.executable, "-m", "gpupool", "--version"], capture_output=True, text=True, env=env, check=False
    )
    assert version.returncode == 0
    assert version.stdout.startswith("gpupool 0.")
    helped = subprocess.run(
        [sys.executable, "-m", "gpupool", "submit", "-h"], capture_output=True, text=True, env=env, check=False
    )
    assert helped.returncode == 0
    assert "--after" in helped.stdout
