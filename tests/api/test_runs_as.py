"""The API goes through the service's checks of who a job runs as: a job no OS user could run is
refused at submit, and a job's own -o/-e file is never opened by the scheduler for another user."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.apiworld import ADMIN, Api, auth, opened


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    yield from opened(tmp_path)


def test_a_job_no_os_user_could_run_is_refused_at_submit(api: Api) -> None:
    api.loop.job_user = "{user}"
    body = {"command": ["true"], "workdir": str(api.workdir), "user": "no-such-os-user-here"}
    refused = api.client.post("/jobs", json=body, headers=auth(ADMIN))
    assert refused.status_code == 400, refused.text
    assert "no-such-os-user-here" in refused.json()["message"]
    assert api.store.jobs() == []


def test_a_log_file_of_the_jobs_choosing_is_never_opened_by_the_scheduler_for_another_user(api: Api) -> None:
    secret = api.workdir / "out.log"
    secret.write_text("not the job's to show\n")
    job = api.submit(ADMIN, output="out.log")
    api.loop.tick(100.0)
    shown = api.client.get(f"/jobs/{job['id']}/logs", headers=auth(ADMIN))
    assert shown.text == "not the job's to show\n"  # run_as service: the scheduler's own files
    api.loop.job_user = "gpupool-{team}"  # the path is the job's user's to choose: a link, a FIFO, a device
    refused = api.client.get(f"/jobs/{job['id']}/logs", headers=auth(ADMIN))
    assert refused.status_code == 409, refused.text
    assert "a file of its user's: read it there" in refused.json()["message"]
