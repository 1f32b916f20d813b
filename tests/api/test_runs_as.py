"""The API goes through the service's checks of who a job runs as: a job no OS user could run is
refused at submit, and a job's own -o/-e file is opened with its user's rights, never the
scheduler's."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.apiworld import ADMIN, Api, auth, opened
from tests.support.users import os_user, reachable_folder

USER = "gpupool-default"


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


def test_a_log_file_of_the_jobs_choosing_is_read_with_its_users_rights_and_nothing_else(api: Api) -> None:
    """Jobs of team default run as OS user gpupool-default: the scheduler (root) serves the -o
    file that user wrote, and refuses, without hanging, what that user could not open or what
    is no plain file (a link to /etc/shadow, a root-only file, a FIFO)."""
    os_user(USER)
    with reachable_folder("gpupool-runs-as-", 0o755) as folder:
        entry = pwd.getpwnam(USER)
        mine = folder / "mine.log"
        mine.write_text("the job's own words\n")
        os.chown(mine, entry.pw_uid, entry.pw_gid)
        (folder / "root.log").write_text("root's alone\n")
        (folder / "root.log").chmod(0o600)
        (folder / "shadow.log").symlink_to("/etc/shadow")
        os.mkfifo(folder / "fifo.log")
        cases = (
            ("mine.log", 200, "the job's own words\n"),
            ("root.log", 409, "Permission denied"),
            ("shadow.log", 409, "Permission denied"),
            ("fifo.log", 409, "is not a regular file"),
        )
        jobs = [api.submit(ADMIN, workdir=str(folder), output=name)["id"] for name, _, _ in cases]
        api.loop.job_user = "gpupool-{team}"
        for job, (name, status, said) in zip(jobs, cases, strict=True):
            shown = api.client.get(f"/jobs/{job}/logs", headers=auth(ADMIN), params={"attempt": 0})
            assert shown.status_code == status, (name, shown.text)
            assert said in (shown.text if status == 200 else shown.json()["message"]), (name, shown.text)
