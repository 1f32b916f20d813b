"""The command line with a team's token: other teams' jobs are brief in `queue` and out of reach
of `cancel`; `logs` reads a log larger than one answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.api import limits
from gpupool.cli import app as cli
from gpupool.cli import jobs as cli_jobs
from gpupool.client import Client
from tests.support.apiworld import World, opened, populated


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    for api in opened(tmp_path):
        yield populated(api)


def as_token(world: World, monkeypatch: pytest.MonkeyPatch, token: str) -> None:
    """Make the command line talk to the test's app with `token`."""
    http = world.api.client
    http.headers["Authorization"] = f"Bearer {token}"
    api = Client("http://testserver", token)
    api.http = http
    monkeypatch.setattr(cli_jobs, "client", lambda *_: api)


def test_queue_shows_other_teams_jobs_briefly(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    as_token(world, monkeypatch, world.tokens["a"])
    done = CliRunner().invoke(cli, ["queue"], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    rows = {line.split()[0]: line for line in done.output.splitlines()[1:] if line.strip()}
    assert "a-job" in rows[str(world.job_a)]
    assert "b-secret" not in done.output
    assert rows[str(world.job_b)].split()[1:] == ["b", "normal", "running", "1"]


def test_cancel_by_filter_leaves_other_teams_jobs_alone(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    as_token(world, monkeypatch, world.tokens["a"])
    done = CliRunner().invoke(cli, ["cancel", "--state", "RUNNING"])
    assert done.exit_code == 0, done.output
    assert f"job {world.job_a}: running (stopping)" in done.output
    assert str(world.job_b) not in done.output
    assert world.api.store.job(world.job_b).cancel_requested_at is None


def test_logs_reads_past_what_one_answer_holds(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    job = world.api.store.job(world.job_a)
    text = "".join(f"line {i} é\n" for i in range(2000))
    world.api.loop.workspace.log_file(job, 1, "stdout").write_text(text)
    monkeypatch.setattr(limits, "LOG_BYTES", 1000)
    as_token(world, monkeypatch, world.tokens["a1"])
    done = CliRunner().invoke(cli, ["logs", str(world.job_a)])
    assert done.exit_code == 0, done.output
    assert done.output == text
