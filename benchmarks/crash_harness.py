"""Crash harness: `kill -9` of `gpupool up` at many moments, then proof that nothing went wrong.

    .venv/bin/python -m benchmarks.crash_harness --kills 100
    .venv/bin/python -m benchmarks.crash_harness --kills 20 --sabotage duplicate   # must fail

Not a timed benchmark: a correctness run. In a temporary folder it writes a configuration, a
data directory for `gpupool up` and, outside it, a ledger. It submits a stream of mixed jobs
(four priority classes, 1 or 2 of 4 virtual GPUs, so that preemptions really happen), each a
small program (`JOB_PROGRAM`, written into the folder) that checkpoints and resumes with
`gpupool.job`. On start a job takes an exclusive non-blocking flock on its own lock file in the
ledger (a second process of the same job finds it held and writes DUPLICATE), and it appends one
JSON line per attempt start (job, attempt, pid, parent pid, time, GPUs, the step it resumed
from), per checkpoint commit (before the commit is reported to gpupool), and when it ends.
A submission whose answer was lost is tried again once the service is back, with the same
Idempotency-Key, as a client that retries does.

The service is killed with SIGKILL (only the service: jobs run on, to be adopted) at least
`--kills` times, at moments of several kinds: at start-up (within 300 ms of its start, or
in the 300 ms before /health answers, or just after), right after the answer to a submission,
in the middle of a burst of submissions, while a preemption is under way (a job in state
preempting), and at a random moment; each time it is started again on the same data directory.
Then the harness stops killing, waits for every job to end, stops the service, and checks (see
`crash_checks.py`): every job ended exactly once; attempts never overlapped, in the store nor as
processes; no GPU was held twice; every resume started from the newest committed checkpoint;
every submission answered 2xx exists, every retry got the job of the first try, and every job
was stored once. It prints its figures and every violation, and exits 1 if there was any.

`--sabotage duplicate` proves that it can fail: once, a third of the way through the kills,
it starts a second copy of a running attempt (its command line, environment and working
directory, read from /proc) as a broken scheduler would; the run must then exit 1.

100 kills take 7 to 10 minutes on 2 busy cores (a start of `gpupool up` takes 2-3 s there).

The harness makes itself the reaper of orphaned processes (PR_SET_CHILD_SUBREAPER) and reaps
them, as init does on a normal machine: the launchers of a killed `gpupool up` become its
children instead of zombies of a PID 1 that may not reap.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from benchmarks.crash_checks import TERMINAL, Submission, check_all, figures, read_ledger, read_store

GPUS = 4
CLASSES = {
    # Short minimum runtimes, so that a job can be preempted soon after it (re)starts; grace
    # periods long enough that no job is ever killed at its deadline (each leaves in ~2 s).
    "urgent": {"value": 1000, "may_preempt": True, "preemptible": False, "grace_period": "60s"},
    "high": {"value": 100, "may_preempt": True, "preemptible": True, "min_runtime": "1s", "grace_period": "60s"},
    "normal": {"value": 10, "may_preempt": True, "preemptible": True, "min_runtime": "1s", "grace_period": "60s"},
    "low": {"value": 0, "may_preempt": False, "preemptible": True, "min_runtime": "0.5s", "grace_period": "60s"},
}
TEAMS = ("vision", "nlp")

STARTUP_BEFORE = "at start-up, before /health answered"
STARTUP_AFTER = "at start-up, just after /health answered"
AFTER_ANSWER = "right after the answer to a submission"
BURST = "in the middle of a burst of submissions"
PREEMPTION = "while a preemption was under way"
RANDOM = "at a random moment"
KINDS = (STARTUP_BEFORE, STARTUP_AFTER, AFTER_ANSWER, BURST, PREEMPTION, RANDOM)

JOB_PROGRAM = r'''"""A job of the crash harness: a counter that checkpoints and resumes with gpupool.job, and
says in the ledger when it starts (and from which step), commits and ends."""
import argparse
import fcntl
import json
import os
import sys
import time

BEGAN = time.time()
JOB = int(os.environ.get("GPUPOOL_JOB_ID", "-1"))
ATTEMPT = int(os.environ.get("GPUPOOL_ATTEMPT", "-1"))


def record(ledger, kind, **fields):
    line = {"kind": kind, "job": JOB, "attempt": ATTEMPT, "pid": os.getpid(), "time": time.time(), **fields}
    fd = os.open(os.path.join(ledger, "ledger.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())  # one write: lines never interleave
    finally:
        os.close(fd)


class Work:
    def __init__(self):
        self.total = 0

    def state_dict(self):
        return {"total": self.total}

    def load_state_dict(self, state):
        self.total = state["total"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--drain", type=float, default=0.5)
    args = parser.parse_args()
    lock = os.open(os.path.join(args.ledger, f"job-{JOB}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held until this process ends
        locked = True
    except BlockingIOError:
        locked = False
        record(args.ledger, "duplicate", holder=os.pread(lock, 100, 0).decode(errors="replace").strip())
    if locked:
        os.ftruncate(lock, 0)
        os.pwrite(lock, f"pid {os.getpid()} attempt {ATTEMPT}".encode(), 0)

    from gpupool.job import Job

    work = Work()
    job = Job(work=work, save_every=args.save_every, heartbeat_every=0.5)
    report = job.link.report

    def reporting(kind, body):
        if kind == "checkpoint":  # committed on disk; the report to gpupool may find it down
            record(args.ledger, "commit", step=int(body["step"]))
        return report(kind, body)

    job.link.report = reporting
    gpus = [int(g) for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    restored = job.step if job.restored is not None else None
    record(args.ledger, "start", ppid=os.getppid(), began=BEGAN, restored=restored, gpus=gpus, seq=args.seq,
           locked=locked)
    how = "error"
    try:
        drained = False
        for step in job.steps(args.steps):
            time.sleep(args.step_seconds)
            work.total += step
            if not drained and job.link.notice() is not None:
                drained = True
                time.sleep(args.drain)  # a slow drain: the preemption stays under way a while
        job.finish()
        record(args.ledger, "done", total=work.total, expected=args.steps * (args.steps - 1) // 2)
        how = "done"
    except SystemExit as exc:
        how = "left" if exc.code == 75 else f"exit {exc.code}"
        raise
    except BaseException as exc:
        how = f"error {exc!r}"[:300]
        raise
    finally:
        record(args.ledger, "end", how=how)
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def harness_config(data_dir: Path, port: int, gpus: int = GPUS, interval: float = 0.2) -> dict[str, Any]:
    """The configuration of the `gpupool up` under test (one place, for keys to come)."""
    return {
        "classes": CLASSES,
        "teams": {team: {"weight": 1} for team in TEAMS},
        "policy": {"max_preemptions": 10},
        "service": {
            "data_dir": str(data_dir),
            "host": "127.0.0.1",
            "port": port,
            "virtual_gpus": gpus,
            "interval": interval,
            "run_as": "service",
        },
    }


# --- processes -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def kill_attempts(data_dir: Path) -> None:
    """SIGKILL the process group of every attempt launched under `data_dir` (its launcher has
    its attempt's folder on its command line), once the run is over or given up."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            group = os.getpgid(int(proc.name))
            if str(data_dir) in command and group != os.getpgid(0):
                os.killpg(group, signal.SIGKILL)


PR_SET_CHILD_SUBREAPER = 36


class Reaper:
    """Reaps every child of this process, orphans included (it asks to be their reaper), and
    keeps their exit codes: the harness never waits on its children in any other way."""

    def __init__(self) -> None:
        self.exited: dict[int, int] = {}
        self.lock = threading.Lock()
        libc = ctypes.CDLL(None, use_errno=True)
        self.subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        threading.Thread(target=self._run, name="reaper", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid, status = 0, 0
            if pid == 0:
                time.sleep(0.02)
                continue
            with self.lock:
                self.exited[pid] = os.waitstatus_to_exitcode(status)

    def spawn(self, argv: list[str], **options: Any) -> subprocess.Popen[bytes]:
        with self.lock:  # an exit of this pid recorded from now on is this process's
            process = subprocess.Popen(argv, **options)
            self.exited.pop(process.pid, None)
        return process

    def code(self, process: subprocess.Popen[bytes]) -> int | None:
        with self.lock:
            code = self.exited.get(process.pid)
        if code is not None:
            process.returncode = code  # so that subprocess never waits for it itself
        return code

    def wait(self, process: subprocess.Popen[bytes], timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while (code := self.code(process)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return code


class Service:
    """`gpupool up` as its own process, started and killed at will on one configuration."""

    def __init__(self, reaper: Reaper, config: Path, url: str, log: Path) -> None:
        self.reaper = reaper
        self.config = config
        self.url = url
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.spawned_at = 0.0
        self.starts = 0
        self.startup_seconds: list[float] = []
        self.http = httpx.Client(timeout=2.0, limits=httpx.Limits(max_keepalive_connections=0))

    def spawn(self) -> None:
        with self.log.open("ab") as out:
            out.write(f"--- start {self.starts + 1} at {time.time():.3f}\n".encode())
            out.flush()
            self.process = self.reaper.spawn(
                [sys.executable, "-m", "gpupool", "up", "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.spawned_at = time.monotonic()
        self.starts += 1

    def alive(self) -> bool:
        return self.process is not None and self.reaper.code(self.process) is None

    def exit_code(self) -> int | None:
        return self.reaper.code(self.process) if self.process is not None else None

    def healthy(self, timeout: float = 1.0) -> bool:
        try:
            return self.http.get(f"{self.url}/health", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout: float = 60.0) -> bool:
        """Whether it answers /health before `timeout` (False at once if it exited)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.alive():
            if self.healthy(timeout=0.5):
                self.startup_seconds.append(time.monotonic() - self.spawned_at)
                return True
            time.sleep(0.02)
        return False

    def expected_startup(self) -> float:
        recent = self.startup_seconds[-10:]
        return statistics.median(recent) if recent else 1.5

    def kill(self) -> None:
        """SIGKILL, and wait until it is gone (its data directory's lock with it)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)
        self.reaper.wait(self.process, 30)
        self.process = None

    def stop(self) -> int | None:
        """SIGTERM (it stops in order and exits 0); SIGKILL after 30 s. Its exit code."""
        if self.process is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGTERM)
        code = self.reaper.wait(self.process, 30)
        if code is None:
            self.kill()
        self.process = None
        return code

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


# --- the jobs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobPlan:
    seq: int
    team: str
    priority: str
    gpus: int
    steps: int
    step_seconds: float
    save_every: int
    drain: float

    @property
    def name(self) -> str:
        return f"crash-{self.seq:04d}"


class Stream:
    """The jobs to submit, made on demand from the run's random generator, `total` in all."""

    def __init__(self, rng: random.Random, total: int) -> None:
        self.rng = rng
        self.total = total
        self.made = 0

    def left(self) -> int:
        return self.total - self.made

    def next(self, priority: str | None = None, gpus: int | None = None) -> JobPlan:
        rng = self.rng
        self.made += 1
        return JobPlan(
            seq=self.made,
            team=rng.choice(TEAMS),
            priority=priority or rng.choices(("low", "normal", "high", "urgent"), (45, 30, 20, 5))[0],
            gpus=gpus or rng.choices((1, 2), (60, 40))[0],
            steps=rng.randint(20, 50),
            step_seconds=round(rng.uniform(0.06, 0.14), 3),
            save_every=rng.randint(3, 8),
            drain=round(rng.uniform(0.2, 1.5), 2),
        )


class Api:
    """The few calls the harness makes, each on a connection of its own (the service dies
    under them); the admin token is read once the service has written it."""

    def __init__(self, url: str, token_file: Path, program: Path, ledger: Path, workdir: Path) -> None:
        self.url = url
        self.token_file = token_file
        self.program = program
        self.ledger = ledger
        self.workdir = workdir
        self._token: str | None = None
        self.submissions: list[Submission] = []
        self.unanswered: dict[str, JobPlan] = {}
        """Submissions with no answer yet (or a 5xx), by name, to try again."""
        self.lock = threading.Lock()

    def headers(self) -> dict[str, str]:
        if self._token is None:
            self._token = self.token_file.read_text().strip()
        return {"Authorization": f"Bearer {self._token}"}

    def command(self, plan: JobPlan) -> list[str]:
        return [
            sys.executable,
            str(self.program),
            "--ledger",
            str(self.ledger),
            "--seq",
            str(plan.seq),
            "--steps",
            str(plan.steps),
            "--step-seconds",
            str(plan.step_seconds),
            "--save-every",
            str(plan.save_every),
            "--drain",
            str(plan.drain),
        ]

    def submit(self, plan: JobPlan) -> Submission:
        body = {
            "command": self.command(plan),
            "name": plan.name,
            "team": plan.team,
            "priority": plan.priority,
            "gpus": plan.gpus,
            "workdir": str(self.workdir),
            "env": {},
        }
        headers = {**self.headers(), "Idempotency-Key": plan.name}
        try:
            with httpx.Client(timeout=15.0) as http:
                answer = http.post(f"{self.url}/jobs", json=body, headers=headers)
            job_id = int(answer.json()["id"]) if answer.is_success else None
            replayed = answer.headers.get("Idempotent-Replayed") == "true"
            submission = Submission(plan.seq, plan.name, job_id, answer.status_code, replayed)
        except (httpx.HTTPError, ValueError, KeyError):
            submission = Submission(plan.seq, plan.name, None, None)
        with self.lock:
            self.submissions.append(submission)
            if submission.answered:
                self.unanswered.pop(plan.name, None)
            else:
                self.unanswered[plan.name] = plan
        return submission

    def retry(self, limit: int = 50) -> None:
        """Try again (same Idempotency-Key) the submissions whose answer was lost, or a 5xx."""
        with self.lock:
            plans = list(self.unanswered.values())[:limit]
        for plan in plans:
            self.submit(plan)

    def jobs(self, states: str | None = None) -> list[dict[str, Any]] | None:
        """The jobs (in those states), or None when the service did not answer."""
        try:
            with httpx.Client(timeout=10.0) as http:
                answer = http.get(
                    f"{self.url}/jobs", params={"state": states} if states else {}, headers=self.headers()
                )
            answer.raise_for_status()
            found: list[dict[str, Any]] = answer.json()
        except (httpx.HTTPError, ValueError, OSError):
            return None
        return found


# --- the campaign --------------------------------------------------------------------------------


class Abort(Exception):
    """The service cannot be brought back: the run stops and says why."""


@dataclass
class Harness:
    args: argparse.Namespace
    rng: random.Random
    service: Service
    api: Api
    stream: Stream
    reaper: Reaper
    ledger_file: Path
    say: Callable[[str], None]
    kills: Counter[str] = field(default_factory=Counter)
    kill_times: list[float] = field(default_factory=list)
    incidents: list[str] = field(default_factory=list)
    """What went wrong with the service itself: these count as violations."""
    unseen_preemptions: int = 0
    sabotage: subprocess.Popen[bytes] | None = None
    sabotaged: str = ""

    # --- the service -------------------------------------------------------------------------

    def ensure_up(self) -> None:
        """The service answering, started again if it is down; an exit nobody asked for, or a
        start that never answers, is an incident (three in a row abort the run)."""
        for _ in range(3):
            if self.service.alive():
                if self.service.healthy() or self.service.wait_healthy(60):
                    return
                self.incident(f"gpupool up runs but has not answered /health for 60 s:\n{self.service.tail()}")
                self.service.kill()
            elif self.service.process is not None:
                code = self.service.exit_code()
                self.incident(f"gpupool up exited by itself (exit code {code}):\n{self.service.tail()}")
                self.service.process = None
            self.service.spawn()
            if self.service.wait_healthy(60):
                return
            self.incident(f"gpupool up did not answer /health within 60 s of its start:\n{self.service.tail()}")
            self.service.kill()
        raise Abort("gpupool up could not be brought back three times in a row")

    def incident(self, what: str) -> None:
        self.incidents.append(what)
        self.say(f"[red]incident:[/] {what}")

    def kill(self) -> None:
        if self.service.process is not None and not self.service.alive():
            self.incident(f"gpupool up had exited by itself (exit code {self.service.exit_code()}) before a kill")
        self.kill_times.append(time.time())
        self.service.kill()

    # --- one kill of each kind ---------------------------------------------------------------

    def kill_at_startup(self) -> str:
        variant = self.rng.choice(("soon after its start", "just before /health", "just after /health"))
        self.service.spawn()
        if variant == "just after /health":
            if not self.service.wait_healthy(60):
                self.incident(f"gpupool up did not answer /health within 60 s of its start:\n{self.service.tail()}")
            time.sleep(self.rng.uniform(0, 0.3))
            self.kill()
            return STARTUP_AFTER
        if variant == "soon after its start":
            delay = self.rng.uniform(0, 0.3)
        else:
            expected = self.service.expected_startup()
            delay = max(0.0, self.rng.uniform(expected - 0.3, expected + 0.02))
        answered = False
        while time.monotonic() - self.service.spawned_at < delay:
            answered = answered or self.service.healthy(timeout=0.05)
            time.sleep(0.01)
        self.kill()
        return STARTUP_AFTER if answered else STARTUP_BEFORE

    def kill_after_answer(self) -> str:
        submission = self.api.submit(self.stream.next())
        if submission.status is None:
            self.kill()
            return RANDOM
        time.sleep(self.rng.uniform(0, 0.03))
        self.kill()
        return AFTER_ANSWER

    def kill_in_burst(self) -> str:
        count = min(self.stream.left(), self.rng.randint(3, 8))
        if count < 2:
            return self.kill_after_answer()
        plans = [self.stream.next() for _ in range(count)]
        answered = threading.Condition()
        answers = [0]

        def submit(plan: JobPlan) -> None:
            time.sleep(self.rng.uniform(0, 0.05))
            self.api.submit(plan)
            with answered:
                answers[0] += 1
                answered.notify_all()

        threads = [threading.Thread(target=submit, args=(plan,), daemon=True) for plan in plans]
        for thread in threads:
            thread.start()
        target = self.rng.randint(1, count - 1)
        with answered:
            answered.wait_for(lambda: answers[0] >= target, timeout=20)
        self.kill()
        for thread in threads:
            thread.join(timeout=30)
        return BURST

    def kill_in_preemption(self) -> str:
        """Fill the pool with low-priority work if it is not full, submit a job of a class and
        size that its running jobs must make room for, and kill while a job is in state
        preempting (a few polls into it: before, during or after its victims' drain)."""
        if self.stream.left() < 1:
            return self.kill_at_random()
        running = self.api.jobs("running,starting,preempting") or []
        busy = sum(int(j["gpus"]) for j in running)
        fillers = [
            self.api.submit(self.stream.next(priority="low", gpus=1))
            for _ in range(min(max(0, GPUS - busy), self.stream.left() - 1))
        ]
        if fillers:
            names = {s.name for s in fillers}
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                pending = self.api.jobs("pending,starting")
                if pending is not None and not names & {j["name"] for j in pending}:
                    break
                time.sleep(0.1)
            time.sleep(0.6)  # past the low class's minimum runtime
            running = self.api.jobs("running,starting,preempting") or []

        def victims(below: tuple[str, ...]) -> int:
            return sum(int(j["gpus"]) for j in running if j["state"] == "running" and j["priority"] in below)

        gpus = self.rng.choices((2, 1), (70, 30))[0]
        if victims(("low", "normal")) >= gpus and self.rng.random() < 0.6:
            priority = "high"
        elif victims(("low", "normal", "high")) >= 1:
            priority, gpus = "urgent", min(gpus, victims(("low", "normal", "high")))
        else:
            return self.kill_at_random()
        self.api.submit(self.stream.next(priority=priority, gpus=gpus))
        deadline = time.monotonic() + 6
        more = self.rng.randint(0, 6)
        seen = 0
        while time.monotonic() < deadline:
            if self.api.jobs("preempting"):
                seen += 1
                if seen > more:
                    self.kill()
                    return PREEMPTION
            time.sleep(0.02)
        self.unseen_preemptions += 1
        self.kill()
        return RANDOM

    def kill_at_random(self) -> str:
        time.sleep(self.rng.uniform(0, 2.0))
        self.kill()
        return RANDOM

    # --- sabotage ----------------------------------------------------------------------------

    def start_duplicate(self) -> bool:
        """Start a second copy of a running attempt: its command line, environment and working
        directory as /proc has them, as a scheduler that lost track of it would."""
        ledger = read_ledger(self.ledger_file)
        ended = {(e.job, e.attempt, e.pid) for e in ledger.ends}
        for start in sorted(ledger.starts, key=lambda s: -s.began):
            if (start.job, start.attempt, start.pid) in ended:
                continue
            proc = Path(f"/proc/{start.pid}")
            try:
                argv = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
                pairs = (item.partition(b"=") for item in (proc / "environ").read_bytes().split(b"\0") if item)
                env = {k.decode(): v.decode() for k, _, v in pairs}
                cwd = os.readlink(proc / "cwd")
            except OSError:
                continue
            if env.get("GPUPOOL_JOB_ID") != str(start.job) or env.get("GPUPOOL_ATTEMPT") != str(start.attempt):
                continue
            with (self.ledger_file.parent.parent / "sabotage.log").open("ab") as out:
                self.sabotage = self.reaper.spawn(
                    argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            copy = self.sabotage.pid
            self.sabotaged = f"a copy of job {start.job} attempt {start.attempt} (pid {start.pid}) as pid {copy}"
            self.say(f"[yellow]sabotage:[/] {self.sabotaged}")
            return True
        return False

    def stop_duplicate(self) -> None:
        if self.sabotage is None or self.reaper.code(self.sabotage) is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.sabotage.pid, signal.SIGTERM)  # it saves, says so and leaves
        if self.reaper.wait(self.sabotage, 15) is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.sabotage.pid, signal.SIGKILL)
            self.reaper.wait(self.sabotage, 10)

    # --- the run -----------------------------------------------------------------------------

    def pick(self) -> Callable[[], str]:
        if self.stream.left() == 0:
            return self.rng.choice((self.kill_at_startup, self.kill_at_random))
        actions = (self.kill_at_startup, self.kill_after_answer, self.kill_in_burst, self.kill_in_preemption)
        return self.rng.choices((*actions, self.kill_at_random), (20, 25, 20, 25, 10))[0]

    def campaign(self, progress: Progress, task: TaskID) -> None:
        # The very first start, on an empty data directory, is killed in its start-up too.
        action: Callable[[], str] = self.kill_at_startup
        while sum(self.kills.values()) < self.args.kills:
            if action != self.kill_at_startup:
                self.ensure_up()
                self.api.retry()
                time.sleep(self.rng.uniform(0.2, 1.2))
                due = self.args.sabotage == "duplicate" and not self.sabotaged
                if due and sum(self.kills.values()) >= self.args.kills // 3:
                    self.start_duplicate()
            kind = action()
            self.kills[kind] += 1
            progress.update(task, advance=1, description=f"kill -9 {kind}")
            action = self.pick()

    def drain(self, progress: Progress) -> None:
        """No more kills: submit what is left of the stream, wait for every job to end."""
        self.ensure_up()
        while self.stream.left():
            self.api.submit(self.stream.next())
        for _ in range(10):
            if not self.api.unanswered:
                break
            self.ensure_up()
            self.api.retry(limit=len(self.api.unanswered))
            time.sleep(0.5)
        task = progress.add_task("waiting for every job to end", total=None)
        deadline = time.monotonic() + self.args.timeout
        while True:
            jobs = self.api.jobs()
            if jobs is None:
                self.ensure_up()
                time.sleep(1.0)
                continue
            open_jobs = [j for j in jobs if j["state"] not in TERMINAL]
            progress.update(task, total=len(jobs), completed=len(jobs) - len(open_jobs))
            if not open_jobs:
                return
            if time.monotonic() > deadline:
                listed = ", ".join(f"{j['id']} {j['state']}" for j in open_jobs[:20])
                self.incident(
                    f"{len(open_jobs)} jobs had not ended {self.args.timeout:.0f} s after the kills: {listed}"
                )
                return
            time.sleep(1.0)

    def stray_processes(self, program: Path) -> list[str]:
        """Job processes still running once every job ended and the service stopped."""
        found = []
        ledger = read_ledger(self.ledger_file)
        sabotage = self.sabotage.pid if self.sabotage is not None else None
        for start in ledger.starts:
            if start.pid == sabotage:
                continue
            with contextlib.suppress(OSError):
                if str(program) in Path(f"/proc/{start.pid}/cmdline").read_bytes().decode(errors="replace"):
                    found.append(f"job {start.job} attempt {start.attempt}: pid {start.pid} still runs after the end")
        return found


def report(
    console: Console, run: dict[str, object], counts: dict[str, int], kills: Counter[str], violations: list[str]
) -> None:
    table = Table(title="crash harness", show_header=False)
    table.add_column("figure", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    for name, value in run.items():
        table.add_row(name, str(value))
    table.add_row("kill -9 of gpupool up", str(sum(kills.values())))
    for kind in KINDS:
        table.add_row(f"  {kind}", str(kills[kind]))
    for name, value in counts.items():
        table.add_row(name, str(value))
    table.add_row("violations", f"[{'red' if violations else 'green'}]{len(violations)}[/]")
    console.print(table)
    for violation in violations:
        console.print(f"[red]VIOLATION[/] {violation}", highlight=False, soft_wrap=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=100, help="kill -9 of gpupool up at least this many times")
    parser.add_argument("--jobs", type=int, default=200, help="jobs in the stream")
    parser.add_argument("--seed", type=int, default=None, help="the random generator's seed (default: a new one)")
    parser.add_argument("--sabotage", choices=("none", "duplicate"), default="none")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the jobs after the kills")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    rng = random.Random(seed)
    console = Console()

    root = Path(tempfile.mkdtemp(prefix="gpupool-crash-"))
    data, ledger_dir, workdir = root / "data", root / "ledger", root / "work"
    ledger_dir.mkdir(mode=0o755)
    workdir.mkdir()
    program = root / "crash_job.py"
    program.write_text(JOB_PROGRAM)
    port = free_port()
    config = root / "gpupool.yaml"
    config.write_text(yaml.safe_dump(harness_config(data, port)))
    url = f"http://127.0.0.1:{port}"

    reaper = Reaper()
    service = Service(reaper, config, url, root / "service.log")
    api = Api(url, data / "admin.token", program, ledger_dir, workdir)
    harness = Harness(
        args, rng, service, api, Stream(rng, args.jobs), reaper, ledger_dir / "ledger.jsonl", console.print
    )
    console.print(f"crash harness: seed {seed}, folder {root}, {args.kills} kills, {args.jobs} jobs")
    began = time.monotonic()
    stopped_with: int | None = None
    aborted = ""
    stray: list[str] = []
    try:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("kill -9", total=args.kills)
            try:
                harness.campaign(progress, task)
                harness.drain(progress)
            except Abort as exc:
                aborted = str(exc)
            stopped_with = service.stop()
        stray = harness.stray_processes(program)
        harness.stop_duplicate()
        store = read_store(data / "gpupool.db")
        ledger = read_ledger(ledger_dir / "ledger.jsonl")
        violations = [*harness.incidents, *check_all(store, ledger, api.submissions), *stray]
        if aborted:
            violations.insert(0, f"the run was aborted: {aborted}")
        if stopped_with != 0:
            violations.append(f"gpupool up, stopped with SIGTERM at the end, exited with {stopped_with}, not 0")
        counts = figures(store, ledger, api.submissions, harness.kill_times)
        startup = service.startup_seconds
        run: dict[str, object] = {
            "seed": seed,
            "wall time": f"{time.monotonic() - began:.0f} s",
            "service starts": service.starts,
            "start-up to /health (median)": f"{statistics.median(startup):.2f} s" if startup else "-",
            "preemptions awaited in vain (then killed at random)": harness.unseen_preemptions,
        }
        report(console, run, counts, harness.kills, violations)
        if args.sabotage != "none":
            console.print(f"sabotage: {harness.sabotaged or 'not carried out'}", highlight=False)
        if args.sabotage == "duplicate" and not harness.sabotaged:
            console.print("[red]the sabotage was never carried out (no running attempt was found)[/]")
            return 1
        return 1 if violations else 0
    finally:
        service.kill()
        harness.stop_duplicate()
        kill_attempts(data)
        if args.keep:
            console.print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
