"""The attack of issue 9, as a test: a job of team A tries to become admin, to read team B's
work and to speak for B's job. With `run_as: team` (and `submitter`) every step is refused.

Runs as root (CI does): it makes the OS users it needs (gpupool-nlp, gpupool-vision, alice).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.live import Service, running, state, wait_for
from tests.support.users import os_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs jobs as other OS users: needs root")
PYTHON = "/usr/bin/python3"
"""An interpreter the jobs' users may run (the test's own may lie in root's home)."""

USERS = ("gpupool-nlp", "gpupool-vision", "alice")

ATTACK = textwrap.dedent(
    """
    import json, os, sys, urllib.request
    from pathlib import Path

    checkpoints = Path(os.environ["GPUPOOL_CHECKPOINT_DIR"])
    data = checkpoints.parents[2]
    victim_job, victim_pid = int(sys.argv[1]), int(sys.argv[2])
    store_prefix = checkpoints.parent.name.split("-")[0]
    victim_dir = data / "jobs" / f"{store_prefix}-{victim_job}"
    api, token = os.environ["GPUPOOL_API"], os.environ["GPUPOOL_TOKEN"]
    results = {"whoami": os.getuid()}

    def attempt(name, action):
        try:
            action()
            results[name] = "done"
        except OSError as exc:
            results[name] = f"refused: {exc.strerror}"

    def post(path, body=None, bearer=token):
        request = urllib.request.Request(
            api + path, data=json.dumps(body or {}).encode(), method="POST",
            headers={"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    attempt("read admin.token", lambda: (data / "admin.token").read_text())
    attempt("write gpupool.db", lambda: open(data / "gpupool.db", "ab").write(b"x"))
    attempt("list the data directory", lambda: list(data.iterdir()))
    attempt("list the job folders", lambda: list((data / "jobs").iterdir()))
    attempt("read the victim's checkpoints", lambda: list((victim_dir / "checkpoints").iterdir()))
    attempt("read the victim's compile cache", lambda: list((victim_dir / "cache").iterdir()))
    attempt("read the victim's log", lambda: (victim_dir / "attempt-0" / "stdout.log").read_text())
    attempt("read the victim's environment", lambda: Path(f"/proc/{victim_pid}/environ").read_bytes())
    attempt("signal the victim", lambda: os.kill(victim_pid, 0))
    own_attempt = checkpoints.parent / "attempt-0"
    attempt("forge its own exit record", lambda: (own_attempt / "exit.json").write_text('{"exit_code": 0}'))
    attempt("write its own checkpoints", lambda: (checkpoints / "mine").write_text("ok"))
    cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).parent
    attempt("write its own compile cache", lambda: (cache / "mine").write_text("ok"))
    tokens = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            tokens += [v for v in environ.read_bytes().split(b"\\0") if v.startswith(b"GPUPOOL_TOKEN=")]
        except OSError:
            pass
    results["tokens seen"] = len(set(tokens))
    results["complete the victim"] = post(f"/jobs/{victim_job}/attempts/0/complete")
    results["grant itself classes"] = post("/jobs/1/cancel")
    print(json.dumps(results))
    """
)


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Service]:
    """`gpupool up` with jobs run as one OS user per team, in a data directory under /tmp
    (the jobs' users must be able to pass through its parents)."""
    for name in USERS:
        os_user(name)
    top = Path(tempfile.mkdtemp(prefix="gpupool-trust-"))
    top.chmod(0o711)
    work = top / "work"
    work.mkdir()
    work.chmod(0o777)
    service = Service(top)
    service.config.write_text(service.config.read_text().replace("run_as: service", "run_as: team"))
    service.work = work  # type: ignore[attr-defined]
    try:
        yield from running(service)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def admin(service: Service) -> dict[str, str]:
    return {"Authorization": f"Bearer {(service.data / 'admin.token').read_text().strip()}"}


def submit(service: Service, team: str, command: list[str], token: dict[str, str] | None = None) -> int:
    body = {"command": command, "team": team, "priority": "low", "gpus": 1, "workdir": str(service.work)}  # type: ignore[attr-defined]
    response = httpx.post(f"http://127.0.0.1:{service.port}/jobs", json=body, headers=token or admin(service))
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def test_a_job_of_one_team_reaches_nothing_of_the_scheduler_nor_of_another_team(shared: Service) -> None:
    for team in ("nlp", "vision"):
        response = httpx.put(f"http://127.0.0.1:{shared.port}/teams/{team}", json={}, headers=admin(shared))
        assert response.status_code == 200, response.text
    victim = submit(shared, "vision", ["sh", "-c", "echo secret-of-vision; sleep 60"])
    wait_for(lambda: state(shared, victim) == "running")
    pid = httpx.get(f"http://127.0.0.1:{shared.port}/jobs/{victim}", headers=admin(shared)).json()["history"][0][
        "handle"
    ]["pid"]
    script = shared.work / "attack.py"  # type: ignore[attr-defined]
    script.write_text(ATTACK)
    attacker = submit(shared, "nlp", [PYTHON, str(script), str(victim), str(pid)])
    wait_for(lambda: state(shared, attacker) in ("succeeded", "failed"))
    logs = httpx.get(f"http://127.0.0.1:{shared.port}/jobs/{attacker}/logs", headers=admin(shared)).text
    errors = httpx.get(
        f"http://127.0.0.1:{shared.port}/jobs/{attacker}/logs", params={"stream": "stderr"}, headers=admin(shared)
    ).text
    assert state(shared, attacker) == "succeeded", errors
    seen = json.loads(logs.strip().splitlines()[-1])
    import pwd

    assert seen.pop("whoami") == pwd.getpwnam("gpupool-nlp").pw_uid, "the job runs as its team's OS user"
    assert seen.pop("write its own checkpoints") == "done", "its own folder is its own"
    assert seen.pop("write its own compile cache") == "done"
    assert seen.pop("tokens seen") == 1, "no other attempt's token can be read"
    assert seen.pop("complete the victim") in (401, 403), "its token speaks for its own attempt only"
    assert seen.pop("grant itself classes") in (401, 403)
    assert all(str(outcome).startswith("refused") for outcome in seen.values()), seen
    assert state(shared, victim) == "running", "the victim was not touched"


def test_under_run_as_submitter_a_job_runs_as_its_user_and_opens_its_logs_with_their_rights(
    shared: Service,
) -> None:
    shared.config.write_text(shared.config.read_text().replace("run_as: team", "run_as: submitter"))
    assert shared.process is not None
    shared.process.terminate()
    shared.process.wait(timeout=20)
    shared.up()
    assert shared.cli("team", "set", "nlp").returncode == 0
    alice = shared.cli("user", "add", "alice", "--team", "nlp")
    assert alice.returncode == 0, alice.stderr
    token = next(line.split()[-1] for line in alice.stdout.splitlines() if "token" in line.lower())
    as_alice = dict(shared.env, GPUPOOL_TOKEN=token)
    mine = shared.run_cli(as_alice, "submit", "--parsable", "--priority", "low", "--", "id", "-un", cwd=shared.work)  # type: ignore[attr-defined]
    assert mine.returncode == 0, mine.stderr
    wait_for(lambda: state(shared, int(mine.stdout)) == "succeeded")
    assert shared.cli("logs", mine.stdout.strip()).stdout == "alice\n"
    before = Path("/etc/shadow").read_bytes()
    link = shared.work / "out.log"  # type: ignore[attr-defined]
    link.symlink_to("/etc/shadow")
    sneaky = shared.run_cli(
        as_alice,
        "submit",
        "--parsable",
        "--priority",
        "low",
        "-o",
        "out.log",
        "--",
        "echo",
        "x",
        cwd=shared.work,  # type: ignore[attr-defined]
    )
    assert sneaky.returncode == 0, sneaky.stderr
    job = int(sneaky.stdout)
    wait_for(lambda: state(shared, job) == "failed")
    assert Path("/etc/shadow").read_bytes() == before, "the log was opened with alice's rights"
    events = shared.cli("events", "--job", str(job)).stdout
    assert "Permission denied" in events, events
