"""Day two on a shared machine: an admin and two students, ana (team nlp) and ben (team vision),
each an OS user whose jobs run as them (`run_as: submitter`), as the trial of issue 33 ran it.
Each step names the defect it found."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.config import client_config, service_config
from tests.support.live import Service, running, state, wait_for
from tests.support.users import os_user, reachable_folder

STUDENTS = {"ana": "nlp", "ben": "vision"}

LAB = """
service: {{data_dir: {data}, port: {port}, virtual_gpus: 4, interval: 0.2, run_as: submitter}}
classes:
  high: {{value: 100, may_preempt: true, preemptible: false, min_runtime: 0s, grace_period: 2s}}
  low: {{value: 0, may_preempt: false, preemptible: true, min_runtime: 0s, grace_period: 2s}}
teams:
  nlp: {{weight: 1, guaranteed_gpus: 2}}
  vision: {{weight: 1, guaranteed_gpus: 2}}
"""


@pytest.fixture
def lab() -> Iterator[Service]:
    """`gpupool up` on 4 virtual GPUs, jobs as their submitters, under /tmp (the students must
    pass through the data directory's parents), with a folder both may write (`work`)."""
    for name in STUDENTS:
        os_user(name)
    with reachable_folder("gpupool-day-two-") as top:
        work = top / "work"
        work.mkdir()
        work.chmod(0o1777)
        service = Service(top)
        service.config.write_text(LAB.format(data=service.data, port=service.port))
        service.work = work  # type: ignore[attr-defined]
        yield from running(service)


def token_of(added: subprocess.CompletedProcess[str]) -> str:
    assert added.returncode == 0, added.stderr
    return next(line.split()[-1] for line in added.stdout.splitlines() if "token" in line.lower())


class Student:
    def __init__(self, lab: Service, name: str) -> None:
        self.lab, self.name = lab, name
        self.env = dict(lab.env, GPUPOOL_TOKEN=token_of(lab.cli("user", "add", name, "--team", STUDENTS[name])))

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.lab.run_cli(self.env, *args, cwd=self.lab.work)  # type: ignore[attr-defined]

    def submit(self, *args: str) -> int:
        done = self.run("submit", "--parsable", *args)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.strip().split(";")[0])

    def json(self, *args: str) -> Any:
        done = self.run(*args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


def test_an_admin_and_two_students_through_a_day_of_ordinary_work(lab: Service) -> None:
    # 5: a guarantee the pool cannot keep, and a user no OS user could run for, are refused.
    too_much = lab.cli("team", "set", "vision", "--guaranteed-gpus", "20")
    assert too_much.returncode == 5, too_much.stderr
    assert "guarantees to 22 GPUs, and the pool has 4" in " ".join(too_much.stderr.split())
    assert subprocess.run(["id", "zed"], capture_output=True, check=False).returncode != 0
    zed = lab.cli("user", "add", "zed", "--team", "nlp")
    assert zed.returncode == 2 and "no OS user 'zed'" in zed.stderr, zed.stderr
    ana, ben = Student(lab, "ana"), Student(lab, "ben")

    # ben fills the pool with an array that writes with -o.
    array = ben.submit(
        "-p",
        "low",
        "--array",
        "0-3",
        "-o",
        "out-%A_%a.log",
        "--",
        "sh",
        "-c",
        "echo hi $GPUPOOL_ARRAY_INDEX; sleep 600",
    )
    tasks = [f"{array}_{i}" for i in range(4)]
    wait_for(lambda: all(j["state"] == "running" for j in ben.json("queue")))
    # 1: the scheduler serves a log its user wrote with -o, read with their rights.
    wait_for(lambda: ben.run("logs", tasks[1]).stdout == "hi 1\n")
    # 2: another team's tasks are listed by ARRAYID_INDEX, in the queue and in the pool.
    assert sorted(j["label"] for j in ana.json("queue")) == tasks
    listed = ana.run("queue").stdout
    assert all(t in listed for t in tasks), listed
    assert f"vision/{tasks[0]}" in " ".join(ana.run("pool").stdout.split())

    # ana's urgent job takes one of ben's GPUs: the notice names the task, and so do the events.
    urgent = ana.submit("-p", "high", "--", "sleep", "600")
    wait_for(lambda: state(lab, urgent) == "running", timeout=60)
    events = lab.get("/events").json()  # type: ignore[union-attr]
    [notice] = [e for e in events if e["kind"] == "preempting"]
    victim = notice["job_label"]
    assert victim in tasks and f"preempted job {victim} (team vision" in notice["message"], notice
    assert victim in lab.cli("events").stdout
    # 4: a running job has no reason to wait, though it waited for a drain before it started.
    mine = next(j for j in ana.json("queue") if j["id"] == urgent)
    assert mine["state"] == "running" and (mine["wait_reason"], mine["wait_message"]) == (None, None)
    # 2: show of an array's id shows every task.
    shown = ben.run("show", str(array)).stdout
    assert all(f"job {t} " in shown for t in tasks), shown
    refused = ben.run("logs", str(array))
    assert refused.returncode == 2 and f"name one, as {array}_0 to {array}_3" in refused.stderr

    # 6: Slurm's state names and codes, in any case.
    wait_for(lambda: state(lab, int(notice["job_id"])) == "pending", timeout=30)
    assert [j["label"] for j in ben.json("queue", "--state", "PD")] == [victim]
    assert [j["label"] for j in ben.json("queue", "-t", "pending")] == [victim]
    assert sorted(j["label"] for j in ben.json("queue", "-t", "R")) == sorted([*set(tasks) - {victim}, str(urgent)])
    bogus = ben.run("queue", "-t", "bogus")
    assert bogus.returncode == 2 and "'bogus' is not a job state" in bogus.stderr, bogus.stderr
    # 7: what does not exist is not found (exit 3), as the table of exit codes says.
    for wrong in (("-p", "vip"), ("--after", "9999")):
        done = ben.run("submit", *wrong, "--", "true")
        assert done.returncode == 3, (wrong, done.stderr)
    admin = {"Authorization": f"Bearer {(lab.data / 'admin.token').read_text().strip()}"}
    body = {"command": ["true"], "team": "nope", "user": "ana", "workdir": str(lab.work)}  # type: ignore[attr-defined]
    nope = httpx.post(f"http://127.0.0.1:{lab.port}/jobs", json=body, headers=admin)
    assert (nope.status_code, nope.json()["message"]) == (404, "team: unknown team 'nope'")

    # 3: an interrupted task cancelled while it waits ended: it waits for nothing.
    assert ben.run("cancel", str(array)).returncode == 0
    wait_for(
        lambda: all(j["state"] == "cancelled" for j in ben.json("queue", "-t", "all") if j["label"] in tasks),
        timeout=30,
    )
    report = lab.get("/report").json()  # type: ignore[union-attr]
    [cut] = [i for i in report["interruptions"] if i["job_label"] == victim]
    assert cut["delay"] is None and cut["job_ended"] is True
    wide = dict(lab.env, COLUMNS="200")
    assert "waiting" not in lab.run_cli(wide, "report").stdout

    # 10: logs -f started after a flaky job's first attempt shows that attempt too.
    flaky = ana.submit(
        "-p", "high", "--max-failures", "1", "--", "sh", "-c", "echo try; test -e again || { touch again; exit 3; }"
    )
    wait_for(lambda: state(lab, flaky) == "succeeded", timeout=60)
    assert ana.run("logs", "-f", str(flaky)).stdout == "try\ntry\n"


def test_the_command_line_finds_the_service_without_config_or_token_flags(lab: Service, tmp_path: Path) -> None:
    """12: the admin's command line with `GPUPOOL_CONFIG` (or /etc/gpupool's files) and no
    `--config`; a student's after `gpupool login`, with no `GPUPOOL_TOKEN`."""
    admin = dict(lab.env, GPUPOOL_CONFIG=str(lab.config))
    command = [sys.executable, "-m", "gpupool", "queue"]
    done = subprocess.run(command, env=admin, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    home = tmp_path / "home"
    ana = dict(admin, HOME=str(home), GPUPOOL_TOKEN=token_of(lab.cli("user", "add", "ana", "--team", "nlp")))
    token = ana.pop("GPUPOOL_TOKEN")
    nothing = subprocess.run(
        command, env=dict(ana, HOME=str(home)), capture_output=True, text=True, timeout=60, check=False
    )
    assert nothing.returncode == 0, "the admin token of the data directory, which root may read"
    wrong = subprocess.run(
        [sys.executable, "-m", "gpupool", "login", "--token-stdin"],
        env=ana,
        input="nonsense\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert wrong.returncode == 5, wrong.stderr
    assert not (home / ".config" / "gpupool" / "token").exists()
    login = subprocess.run(
        [sys.executable, "-m", "gpupool", "login", "--token-stdin"],
        env=ana,
        input=token + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert login.returncode == 0, login.stderr
    kept = home / ".config" / "gpupool" / "token"
    assert kept.read_text().strip() == token and kept.stat().st_mode & 0o777 == 0o600
    users = subprocess.run(
        [sys.executable, "-m", "gpupool", "user", "list"],
        env=ana,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert users.returncode == 0, users.stderr
    assert "ana" in users.stdout and "ben" not in users.stdout
    kept.chmod(0o644)
    loose = subprocess.run(command, env=ana, capture_output=True, text=True, timeout=60, check=False)
    assert loose.returncode != 0 and "chmod 600" in loose.stderr


def test_the_files_the_command_line_and_the_service_read_without_config(tmp_path: Path) -> None:
    system = tmp_path / "etc"
    assert client_config(None, {}, system) is None and service_config(None, {}, system) is None
    system.mkdir()
    (system / "gpupool.yaml").write_text("service: {port: 9000}\n")
    assert client_config(None, {}, system) == system / "gpupool.yaml"
    assert service_config(None, {}, system) == system / "gpupool.yaml"
    (system / "client.yaml").write_text("service: {api_url: 'http://gpu-box:9000'}\n")
    assert client_config(None, {}, system) == system / "client.yaml", "the users' file first"
    assert service_config(None, {}, system) == system / "gpupool.yaml"
    assert client_config(None, {"GPUPOOL_CONFIG": "/x.yaml"}, system) == Path("/x.yaml")
    assert client_config(Path("/y.yaml"), {"GPUPOOL_CONFIG": "/x.yaml"}, system) == Path("/y.yaml")


def test_jobs_change_after_submit_as_scontrol_changes_them_and_only_by_who_may(lab: Service) -> None:
    """hold, release, update and requeue, by the students and the admin: a student changes only
    their own team's jobs, never raises a time limit, never releases the admin's hold."""
    ana, ben = Student(lab, "ana"), Student(lab, "ben")
    for team in STUDENTS.values():  # no reclaim: ana's job waits for ben's to leave
        assert lab.cli("team", "set", team, "--guaranteed-gpus", "0").returncode == 0
    # ben's job says when it gets notice (SIGTERM), and leaves as a job on notice does.
    big = ben.submit("-p", "low", "--gpus", "4", "--wrap", 'trap "echo noticed; exit 75" TERM; sleep 600 & wait')
    wait_for(lambda: state(lab, big) == "running")
    waits = ana.submit("-p", "low", "--", "sleep", "600")
    wait_for(lambda: ana.json("show", str(waits))["wait_reason"] == "no_fit")

    assert ana.run("hold", str(waits)).returncode == 0
    wait_for(lambda: ana.json("show", str(waits))["wait_reason"] == "held")
    assert f"gpupool release {waits}" in ana.json("show", str(waits))["wait_message"]
    assert ana.run("release", str(waits)).returncode == 0
    wait_for(lambda: ana.json("show", str(waits))["wait_reason"] == "no_fit")
    assert lab.cli("hold", str(waits)).returncode == 0
    refused = ana.run("release", str(waits))
    assert refused.returncode == 5 and "only the admin may release it" in refused.stderr, refused.stderr
    assert lab.cli("release", str(waits)).returncode == 0
    assert ana.run("hold", str(big)).returncode == 5, "another team's job"
    running = lab.cli("hold", str(big))
    assert running.returncode == 5 and "only a waiting job" in running.stderr

    assert ana.run("update", str(waits), "--time", "10").returncode == 0
    higher = ana.run("update", str(waits), "-t", "20")
    assert higher.returncode == 5 and "only the admin raises a time limit" in higher.stderr, higher.stderr
    assert lab.cli("update", str(waits), "-t", "20").returncode == 0
    assert ana.json("show", str(waits))["time_limit"] == 20 * 60
    assert ana.run("update", str(waits), "-p", "vip").returncode == 3
    assert ana.run("update", str(waits), "--after", "9999").returncode == 3
    assert ana.run("update", str(big), "-t", "5").returncode == 5, "another team's job"
    kinds = [e["kind"] for e in ana.json("events", "--job", str(waits))]
    assert kinds.count("held") == 2 and kinds.count("released") == 2 and kinds.count("updated") == 2, kinds

    # ben requeues his own job: notice, it leaves, goes back in line, first in it, and runs again.
    assert ben.run("requeue", str(big)).returncode == 0
    wait_for(lambda: ben.json("show", str(big))["attempts"] == 2, timeout=60)
    shown = ben.json("show", str(big))
    assert shown["history"][0]["outcome"] == "preempted" and state(lab, waits) == "pending"
    assert shown["history"][0]["exit_code"] == 75, "it got notice (SIGTERM) and left, not killed at the deadline"
    assert ben.run("logs", str(big), "--attempt", "0").stdout == "noticed\n"
    assert shown["preemptions"] == 0, "a requeue by its owner does not count toward the preemption cap"
    assert any("requeued by a person" in e["message"] for e in ben.json("events", "--job", str(big)))
    assert ben.run("requeue", str(waits)).returncode == 5, "another team's job"
    waiting = ana.run("requeue", str(waits))
    assert waiting.returncode == 5 and "waits in line already" in waiting.stderr


def test_the_admin_removes_users_and_teams_and_sets_budgets_from_the_command_line(lab: Service) -> None:
    ana = Student(lab, "ana")
    job = ana.submit("-p", "low", "--", "sleep", "600")
    wait_for(lambda: state(lab, job) == "running")
    busy = lab.cli("user", "remove", "ana")
    assert busy.returncode == 5 and "user ana has 1 job that wait or run" in busy.stderr, busy.stderr
    assert lab.cli("cancel", str(job)).returncode == 0
    wait_for(lambda: state(lab, job) == "cancelled", timeout=30)
    team_busy = lab.cli("team", "remove", "nlp")
    assert team_busy.returncode == 5 and "team nlp has users (ana)" in team_busy.stderr, team_busy.stderr
    assert lab.cli("user", "remove", "ana").returncode == 0
    assert ana.run("queue").returncode == 5, "a removed user's token no longer works"
    assert lab.cli("user", "remove", "ana").returncode == 3

    budget = lab.cli("team", "budget", "vision", "high", "--gpu-hours", "5", "--window", "7d")
    assert budget.returncode == 0, budget.stderr
    assert "team vision: 5 GPU-h at high per 7.0 d (0.0 used)" in budget.stdout
    assert lab.cli("team", "budget", "vision", "vip", "--gpu-hours", "5").returncode == 3
    [vision] = [t for t in lab.get("/teams").json() if t["name"] == "vision"]  # type: ignore[union-attr]
    assert [(b["priority"], b["gpu_hours"], b["window"]) for b in vision["budgets"]] == [("high", 5.0, 7 * 86400.0)]
    assert lab.cli("team", "budget", "vision", "high", "--remove").returncode == 0
    assert lab.cli("team", "budget", "vision", "high", "--remove").returncode == 3

    assert lab.cli("team", "remove", "nlp").returncode == 0
    assert "nlp" not in [t["name"] for t in lab.get("/teams").json()]  # type: ignore[union-attr]
    assert lab.get(f"/jobs/{job}").json()["team"] == "nlp", "its ended jobs keep its name"  # type: ignore[union-attr]
    assert lab.cli("submit", "--team", "nlp", "--", "true").returncode in (2, 3)
    assert lab.cli("team", "remove", "default").returncode == 5
    again = lab.cli("team", "set", "nlp", "--guaranteed-gpus", "1")
    assert again.returncode == 0 and "weight 1, 1 GPU guaranteed" in again.stdout, "made anew, from the defaults"


def test_events_people_can_read_the_last_ones_of_a_kind_since_a_time_and_followed(lab: Service) -> None:
    ana = Student(lab, "ana")
    # A job that reports three checkpoints, as the job protocol has it (docs/job-protocol.md).
    report = (
        'for step in 1 2 3; do curl -sf -X POST -H "Authorization: Bearer $GPUPOOL_TOKEN" '
        '-H "Content-Type: application/json" -d "{\\"step\\": $step}" '
        '"$GPUPOOL_API/jobs/$GPUPOOL_JOB_ID/attempts/$GPUPOOL_ATTEMPT/checkpoint" >/dev/null || exit 1; done'
    )
    saving = ana.submit("-p", "low", "--wrap", report)
    wait_for(lambda: state(lab, saving) in ("succeeded", "failed"), timeout=60)
    every = ana.json("events", "--tail", "0")
    assert "checkpoint" not in {e["kind"] for e in every}, "checkpoint events are hidden unless asked for"
    saves = ana.json("events", "--type", "checkpoint", "--job", str(saving))
    assert state(lab, saving) == "succeeded" and len(saves) == 3, saves
    assert [e["kind"] for e in ana.json("events", "--tail", "2")] == [e["kind"] for e in every[-2:]]
    assert ana.json("events", "--since", "1h") == every
    assert ana.json("events", "--type", "submitted") == [e for e in every if e["kind"] == "submitted"]
    bad = ana.run("events", "--since", "soon")
    assert bad.returncode == 2 and "--since" in bad.stderr

    # Followed: each new event as a JSON line, until the job ends.
    later = ana.submit("-p", "low", "--", "sleep", "1")
    followed = ana.run("events", "-f", "--json", "--job", str(later), "--tail", "0")
    kinds = [json.loads(line)["kind"] for line in followed.stdout.splitlines()]
    assert followed.returncode == 0 and kinds[0] == "submitted" and kinds[-1] == "succeeded", kinds


class Receiver:
    """An HTTP server on loopback that keeps what each path was sent (a webhook's receiver)."""

    def __init__(self) -> None:
        got: dict[str, list[dict[str, Any]]] = {}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                got.setdefault(self.path, []).append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.got = got
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def events(self, path: str, job: int) -> list[str]:
        return [b["gpupool"]["event"] for b in self.got.get(path, []) if b["gpupool"].get("job") == job]


def test_a_job_and_the_service_are_told_of_starts_notices_and_ends_by_webhook(lab: Service) -> None:
    receiver = Receiver()
    try:
        lab.config.write_text(
            lab.config.read_text().replace("run_as: submitter", f"run_as: submitter, webhooks: ['{receiver.url}/lab']")
        )
        assert lab.process is not None
        lab.process.terminate()
        lab.process.wait(timeout=20)
        lab.up()
        ana = Student(lab, "ana")
        bad = ana.run("submit", "--notify", "file:///etc/passwd", "--", "true")
        assert bad.returncode == 2 and "notify:" in bad.stderr, bad.stderr
        quick = ana.submit("-p", "low", "--notify", f"{receiver.url}/ana", "--", "true")
        other = ana.submit("-p", "low", "--", "true")
        wait_for(lambda: receiver.events("/ana", quick) == ["running", "succeeded"], timeout=30)
        wait_for(lambda: receiver.events("/lab", other) == ["running", "succeeded"], timeout=30)
        assert receiver.events("/lab", quick) == ["running", "succeeded"], "the service's webhook hears of every job"
        assert receiver.events("/ana", other) == [], "a job's own URL hears of that job alone"
        [told] = [b for b in receiver.got["/ana"] if b["gpupool"]["event"] == "succeeded"]
        assert told["text"].startswith(f"gpupool: job {quick} (true, team nlp, user ana) succeeded")
    finally:
        receiver.server.shutdown()
