"""`gpupool up` attacked through its conditions: a second scheduler, signals, a data directory
that others may read, that is read-only, or that another store used."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.up import free_port
from tests.support.live import Service, running, state, wait_for


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(Service(tmp_path))


def up_once(config: Path, *options: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    """`gpupool up` that is expected to refuse to start (it must exit on its own)."""
    command = [sys.executable, "-m", "gpupool", "up", "--config", str(config), *options]
    if user is not None:
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_a_second_scheduler_on_one_data_directory_is_refused_before_it_decides(
    service: Service, tmp_path: Path
) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(service.config.read_text().replace(str(service.port), str(free_port())))
    second = up_once(other)
    assert second.returncode == 2
    assert f"another gpupool up (pid {service.process.pid if service.process else ''}) uses the data directory" in (
        second.stderr + second.stdout
    )
    assert service.ready(), "the first one goes on"


def test_sigterm_stops_the_service_in_order_and_its_jobs_go_on(service: Service) -> None:
    job = service.submit("--", "sleep", "60")
    wait_for(lambda: state(service, job) == "running")
    assert service.process is not None
    service.process.send_signal(signal.SIGTERM)
    service.process.wait(timeout=20)
    out = service.output()
    assert service.process.returncode == 0, out
    assert "gpupool stopped (SIGTERM); running jobs go on" in out
    service.up()
    assert state(service, job) == "running", "adopted by the next gpupool up"


def test_a_data_directory_others_may_read_is_refused(service: Service) -> None:
    assert service.process is not None
    service.process.terminate()
    service.process.wait(timeout=20)
    service.data.chmod(0o755)
    refused = up_once(service.config)
    assert refused.returncode == 2
    assert "may be read or written by others (mode 755)" in refused.stderr
    assert f"chmod 700 {service.data}" in refused.stderr


def test_a_read_only_data_directory_is_refused_at_start(tmp_path: Path) -> None:
    folder = tmp_path / "readonly"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,mode=0700,size=1m", "tmpfs", str(folder)], check=False)
    if mounted.returncode != 0:
        pytest.skip("mounting a read-only file system needs root")
    try:
        config = tmp_path / "gpupool.yaml"
        config.write_text(f"service: {{data_dir: {folder}, port: {free_port()}, run_as: service}}\n")
        refused = up_once(config)
        assert refused.returncode == 2
        assert "cannot be written (a read-only file system, or no space)" in refused.stderr
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def test_a_data_directory_of_another_store_is_refused(service: Service) -> None:
    assert service.process is not None
    service.process.terminate()
    service.process.wait(timeout=20)
    for name in ("gpupool.db", "gpupool.db-wal", "gpupool.db-shm"):
        (service.data / name).unlink(missing_ok=True)  # a fresh store on the old data directory
    refused = up_once(service.config)
    assert refused.returncode == 2
    assert "belongs to store" in refused.stderr and "Use a fresh data_dir" in refused.stderr


def test_jobs_as_other_users_need_a_scheduler_that_can_switch_users(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs gpupool up as another user")
    folder = Path(tempfile.mkdtemp(prefix="gpupool-nobody-"))  # /tmp: reachable by another user
    os.chown(folder, 65534, 65534)
    config = folder / "gpupool.yaml"
    config.write_text(f"service: {{data_dir: {folder / 'data'}, port: {free_port()}, run_as: submitter}}\n")
    refused = up_once(config, user="65534")
    assert refused.returncode == 2
    assert (
        "service.run_as: 'submitter' runs jobs as other OS users, which needs gpupool up to run as root"
        in refused.stderr
    )
    assert "gpupool up --run-as service" in refused.stderr
    assert not (folder / "data").exists(), "nothing is made before the configuration is refused"
    shutil.rmtree(folder)


def test_a_second_scheduler_on_one_postgresql_store_is_refused(tmp_path: Path, postgres_url: str) -> None:
    import uuid

    import psycopg

    name = f"t{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    store = postgres_url.rsplit("/", 1)[0] + "/" + name
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
    first, second = Service(tmp_path / "one"), Service(tmp_path / "two")
    for service in (first, second):
        service.config.write_text(
            f"service: {{data_dir: {service.data}, port: {service.port}, run_as: service, store: '{store}'}}\n"
        )
    try:
        first.up()
        refused = up_once(second.config)
        assert refused.returncode == 2
        assert "another gpupool up leads the store" in refused.stderr
    finally:
        if first.process is not None:
            first.process.terminate()
            first.process.wait(timeout=20)


def test_a_data_directory_that_vanishes_stops_the_scheduler_loudly(service: Service) -> None:
    import httpx

    token = (service.data / "admin.token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}"}
    url = f"http://127.0.0.1:{service.port}"
    shutil.rmtree(service.data)

    def halted() -> bool:
        # Before the guard's next look, the store itself may fail (its files are gone) and
        # answer 503 for that; what must come, and stay, is the halt.
        answer = httpx.get(f"{url}/health")
        return answer.status_code == 503 and "the scheduler has stopped deciding" in answer.json()["store"]

    wait_for(halted)
    assert halted()
    body = {"command": ["true"], "priority": "low", "workdir": "/tmp"}
    refused = httpx.post(f"{url}/jobs", json=body, headers=headers)
    assert refused.status_code == 503, refused.text
    assert "no job is accepted now" in refused.json()["message"]
    assert service.process is not None
    service.process.terminate()
    service.process.wait(timeout=20)
    out = service.output()
    assert "gpupool stops deciding: the data directory's identity" in out


def test_a_sqlite_store_outside_the_data_directory_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "gpupool.yaml"
    elsewhere = f"sqlite:///{tmp_path / 'shared.db'}"
    config.write_text(f"service: {{data_dir: {tmp_path / 'data'}, run_as: service, store: '{elsewhere}'}}\n")
    refused = up_once(config)
    assert refused.returncode == 2
    assert "a SQLite store lives in the data directory" in refused.stderr


def test_job_folders_of_an_earlier_version_are_closed_up_at_start(tmp_path: Path) -> None:
    from gpupool.config.specs import ServiceSpec
    from gpupool.up import prepare_data_dir

    data = tmp_path / "data"
    (data / "jobs" / "7").mkdir(parents=True)
    data.chmod(0o700)
    (data / "jobs").chmod(0o755)
    (data / "jobs" / "7").chmod(0o755)
    prepare_data_dir(ServiceSpec(data_dir=str(data), run_as="service"))
    assert (data / "jobs").stat().st_mode & 0o777 == 0o700
    assert (data / "jobs" / "7").stat().st_mode & 0o777 == 0o700
