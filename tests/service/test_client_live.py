"""The Python API (`gpupool.client`) against `gpupool up`, as a notebook or a script uses it:
connect as the command line does, submit, wait, read the output, cancel."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.client import Unreachable, connect
from gpupool.errors import Conflict, NotFound
from tests.support.live import Service, running


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(Service(tmp_path))


def test_submit_wait_output_and_cancel_from_python(service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPOOL_CONFIG", str(service.config))
    monkeypatch.delenv("GPUPOOL_TOKEN", raising=False)
    monkeypatch.delenv("GPUPOOL_API", raising=False)
    pool = connect()  # the configuration's address, the admin token in its data directory
    job = pool.submit(["/bin/sh", "-c", "echo hello from $GPUPOOL_JOB_ID; exit 3"], priority="low", gpus=2)
    done = pool.wait(job["id"], timeout=60)
    assert (done["state"], done["exit_code"]) == ("failed", 3)
    assert pool.output(job["id"]) == f"hello from {job['id']}\n"

    sleeper = pool.submit(["sleep", "600"], priority="low")
    with pytest.raises(TimeoutError, match="still"):
        pool.wait(sleeper["id"], timeout=0.5)
    pool.cancel(sleeper["id"], now=True)
    assert pool.wait(sleeper["id"], timeout=60)["state"] == "cancelled"
    with pytest.raises(Conflict, match="already ended"):
        pool.cancel(sleeper["id"])
    with pytest.raises(NotFound):
        pool.job(424242)


def test_a_service_that_is_not_there_is_said_plainly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPOOL_TOKEN", "whatever")
    pool = connect(api="http://127.0.0.1:9")
    with pytest.raises(Unreachable, match="is `gpupool up` running"):
        pool.jobs()
