"""Sessions from the command line: `gpupool run` (as srun runs a command), `gpupool shell` (as
`srun --pty bash` and salloc give a shell), `gpupool notebook` and `gpupool attach` (as
sattach). `run`, `shell` and `notebook` are `submit`'s options with another ending
(`submit.py`); what makes the request a session's and what follows the submission is here.

Exit codes (docs/slurm.md, "Exit codes"): the job's own, as `submit --wait` has them (125 when
cancelled, 124 at its time limit, 75 when it was preempted and waits in line again); 0 after a
detach (`~.`); 4 when the service cannot be reached.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Annotated, Any

import typer
from rich.markup import escape

from gpupool.cli import terminal
from gpupool.cli.common import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_PREEMPTED,
    ApiOption,
    ConfigOption,
    call,
    client,
    ended,
    errors,
    exit_code,
    fail,
    outcome_code,
    wait_for_outcome,
)
from gpupool.cli.jobs import Tail, one_job
from gpupool.client import Client
from gpupool.model import SessionKind
from gpupool.settle import JobState

RUNS = (JobState.RUNNING.value, JobState.PREEMPTING.value)
POLL = 0.2
"""Seconds between two looks at a session's job (its output, its state)."""


def say(message: str) -> None:
    """A line of gpupool's own, on standard error: standard output is the job's."""
    errors.print(f"[dim]gpupool:[/] {escape(message)}", highlight=False, soft_wrap=True)


def default_command(session: SessionKind | None) -> list[str]:
    """What a session runs when no command is given: your login shell, or the notebook server."""
    if session is SessionKind.SHELL:
        return [os.environ.get("SHELL") or "/bin/bash", "-l"]
    if session is SessionKind.NOTEBOOK:
        return [sys.executable, "-m", "gpupool.job.notebook"]
    return []


def as_session(session: SessionKind, options: dict[str, Any], body: dict[str, Any]) -> None:
    """`submit`'s request `body` made a session's; options a foreground job cannot take refused."""
    for option in ("array", "wait", "parsable"):
        if options[option]:
            raise fail(f"--{option}: gpupool {session} runs one job in the foreground; use gpupool submit")
    body["session"] = session.value
    body["name"] = body["name"] or (session.value if session is not SessionKind.RUN else "")


def in_foreground(session: SessionKind, api: Client, job: dict[str, Any]) -> int:
    """The submitted session followed to its end here (or a detach); its exit code."""
    say(f"job {job['label']} submitted ({job['name']}, team {job['team']}, {job['priority']})")
    follow_session = {
        SessionKind.RUN: run_session,
        SessionKind.SHELL: shell_session,
        SessionKind.NOTEBOOK: notebook_session,
    }
    return follow_session[session](api, job)


def waited(api: Client, job: dict[str, Any]) -> dict[str, Any]:
    """The job once it runs (or has ended), saying on standard error why it waits each time that
    changes. Ctrl-C meanwhile cancels it."""
    said = None
    try:
        while True:
            job = call(api.job, job["id"])
            if job["state"] in RUNS or ended(job):
                return job
            reason = job["wait_message"]
            if reason and reason != said:
                say(f"job {job['label']} waits: {reason}")
                said = reason
            time.sleep(POLL)
    except KeyboardInterrupt:
        call(api.cancel, job["id"])
        say(f"job {job['label']} cancelled before it started")
        raise typer.Exit(EXIT_CANCELLED) from None


def output_of(api: Client, job: dict[str, Any]) -> Callable[[], None]:
    """What prints the job's latest attempt's output as of now: its standard output to ours,
    its standard error to ours."""
    number = max(0, job["attempts"] - 1)
    tails = [(Tail(api, job["id"], "stdout", number), sys.stdout), (Tail(api, job["id"], "stderr", number), sys.stderr)]

    def drain() -> None:
        for tail, stream in tails:
            tail.drain(stream.write)
            stream.flush()

    return drain


def run_session(api: Client, job: dict[str, Any]) -> int:
    """`gpupool run`: the job's output, live, until it ends. Ctrl-C cancels it (notice, then its
    class's grace); a second Ctrl-C kills it at once."""
    job = waited(api, job)
    interrupts = 0

    def interrupted(_signum: int, _frame: FrameType | None) -> None:
        nonlocal interrupts
        interrupts += 1

    previous = signal.signal(signal.SIGINT, interrupted)
    drain = output_of(api, job)
    try:
        acted = 0
        while True:
            if interrupts > acted:
                acted = interrupts
                call(api.cancel, job["id"], acted > 1)
                say(f"job {job['label']} " + ("killed" if acted > 1 else "cancelled: Ctrl-C again kills it now"))
            drain()
            job = call(api.job, job["id"])
            if ended(job):
                drain()
                return outcome_code(job)
            if job["state"] == JobState.PENDING.value:
                drain()
                say(f"job {job['label']} was preempted and waits in line: `gpupool logs -f {job['label']}` follows it")
                return EXIT_PREEMPTED
            time.sleep(POLL)
    finally:
        signal.signal(signal.SIGINT, previous)


def shell_session(api: Client, job: dict[str, Any]) -> int:
    """`gpupool shell`: this terminal joined to the job's once it runs."""
    job = waited(api, job)
    if ended(job):
        say(f"job {job['label']} ended before its terminal opened: {job['state']}")
        return outcome_code(job)
    return attached(api, job)


NOTEBOOK_WAIT = 180.0
"""Seconds `gpupool notebook` waits for the server to answer once the job runs."""


def notebook_session(api: Client, job: dict[str, Any]) -> int:
    """`gpupool notebook`: once its server answers, where to open it; the job runs on."""
    job = waited(api, job)
    label = job["label"]
    deadline = time.monotonic() + NOTEBOOK_WAIT
    try:
        while not ended(job):
            status = call(api.notebook_status, job["id"])
            if status.get("ready"):
                say(f"job {label}: the notebook is at {api.url}/ui/notebooks/{job['id']}/lab")
                say(f"sign in there with your token; `gpupool cancel {label}` ends it")
                return 0
            if time.monotonic() > deadline:
                say(f"job {label}'s notebook server does not answer yet: `gpupool logs {label}` says why")
                return EXIT_FAILED
            time.sleep(POLL)
            job = call(api.job, job["id"])
    except KeyboardInterrupt:
        call(api.cancel, job["id"])
        say(f"job {label} cancelled")
        return EXIT_CANCELLED
    say(f"job {label} ended before its notebook answered: {job['state']} (`gpupool logs {label}` says why)")
    return outcome_code(job)


def attached(api: Client, job: dict[str, Any]) -> int:
    """Join the shell session's terminal; the job's outcome once its shell ends, 0 on a detach."""
    joined = terminal.attach(api, job["id"])
    label = job["label"]
    if joined.error is not None:
        errors.print(f"\r\n[bold red]error:[/] job {label}: {escape(str(joined.error))}", highlight=False)
        if joined.exit_code is None:
            say(f"job {label} runs on: `gpupool attach {label}` comes back to it")
        return exit_code(joined.error)
    if joined.detached:
        say(f"detached from job {label}; it runs on: `gpupool attach {label}` comes back to it")
        return 0
    if joined.exit_code is None and not ending(api, job["id"]):
        say(f"the terminal of job {label} closed; it runs on: `gpupool attach {label}` comes back to it")
        return 0
    return wait_for_outcome(api, job["id"], quiet=True, every=POLL)


def ending(api: Client, job_id: int, within: float = 5.0) -> bool:
    """Whether the job ends within `within` seconds (its terminal closed with no exit status:
    the shell was killed at the end of its grace, its attempt with it)."""
    try:
        call(api.wait, job_id, within, POLL)
    except TimeoutError:
        return False
    return True


def follow(api: Client, job: dict[str, Any]) -> int:
    """`attach` to a job with no terminal: its output, live, until it ends (Ctrl-C stops
    following; the job runs on)."""
    drain = output_of(api, job)
    try:
        while True:
            drain()
            if ended(job):
                return outcome_code(job)
            time.sleep(POLL)
            job = call(api.job, job["id"])
    except KeyboardInterrupt:
        return 0


def attach(
    job_ref: Annotated[str, typer.Argument(metavar="JOB", help="A job id, or ARRAY_INDEX.")],
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """Attach to a running job, as sattach: a shell session's terminal (Enter ~ . detaches), or
    the output of any other job, live, until it ends."""
    api_client = client(config, api)
    job = one_job(api_client, job_ref)
    if job["session"] == SessionKind.SHELL.value and not ended(job):
        raise typer.Exit(attached(api_client, job))
    raise typer.Exit(follow(api_client, job))
