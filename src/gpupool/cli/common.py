"""What every command of the live service shares: the client, errors and exit codes.

Exit codes (documented in docs/slurm.md, "Exit codes"), distinct so that scripts can tell them apart:

    0  done
    1  the job failed (`submit --wait`, `logs -f`: the job's own exit code when it has one)
    2  usage error: a bad option, value or file
    3  not found: no such job, team or class
    4  cannot reach the service (or its store is busy): `submit` tries again for about 30 s first
    5  refused: the token may not do this, or the state forbids it now (forbidden, conflict)

`submit --wait` and `logs -f` end with the job's outcome instead: 0 succeeded, the job's own
exit code when it failed (128 + N when signal N ended it, 1 when unknown), 124 timeout (as GNU
`timeout`), 125 cancelled; `logs -f --attempt N` ends with 75 (EX_TEMPFAIL) when that attempt
was preempted and the job waits for its next one. For an array, the highest code of its tasks.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from gpupool.client import Client, Unavailable, Unreachable, connect
from gpupool.config import client_config, load_spec
from gpupool.errors import Conflict, Forbidden, GpupoolError, NotFound, Unauthorized
from gpupool.settle import ENDED, JobState

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNREACHABLE = 4
EXIT_REFUSED = 5
EXIT_PREEMPTED = 75
EXIT_TIMEOUT = 124
EXIT_CANCELLED = 125

HELP = {"help_option_names": ["-h", "--help"]}
"""`-h` as well as `--help`, on every command."""

console = Console()
errors = Console(stderr=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="YAML configuration (default: $GPUPOOL_CONFIG, else /etc/gpupool/client.yaml or gpupool.yaml).",
    ),
]
ApiOption = Annotated[
    str | None, typer.Option("--api", help="Address of the service (default: $GPUPOOL_API, else the configuration's).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for machines instead of a table.")]


def exit_code(error: GpupoolError) -> int:
    if isinstance(error, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(error, Unreachable | Unavailable):
        return EXIT_UNREACHABLE
    if isinstance(error, Forbidden | Unauthorized | Conflict):
        return EXIT_REFUSED
    return EXIT_USAGE


def fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    """Print `message` as an error; raise what this returns to exit with `code`."""
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=code)


def failed(error: GpupoolError) -> NoReturn:
    raise fail(str(error), exit_code(error)) from None


def outcome_code(job: dict[str, Any]) -> int:
    """The exit code that stands for an ended job's outcome (see the table above)."""
    state = job["state"]
    if state == JobState.SUCCEEDED.value:
        return 0
    if state == JobState.TIMEOUT.value:
        return EXIT_TIMEOUT
    if state == JobState.CANCELLED.value:
        return EXIT_CANCELLED
    code = job["exit_code"]
    if not isinstance(code, int) or code == 0:
        return EXIT_FAILED
    return 128 - code if code < 0 else min(code, 255)


def ended(job: dict[str, Any]) -> bool:
    return JobState(job["state"]) in ENDED


def wait_for_outcome(api: Client, job_id: int, *, quiet: bool = False, every: float = 0.5) -> int:
    """Wait until the job (every task, for an array) has ended; its outcome's exit code."""
    while True:
        jobs = call(lambda: api.jobs(array=job_id)) or [call(api.job, job_id)]
        if all(ended(j) for j in jobs):
            break
        time.sleep(every)
    if not quiet:
        for job in jobs:
            who = job["label"]
            code = "" if job["exit_code"] is None else f" (exit code {job['exit_code']})"
            errors.print(f"job {who}: {job['state']}{code}", highlight=False, markup=False)
    return max(outcome_code(j) for j in jobs)


TIME_FIELDS = frozenset({"at", "time", "since", "until", "submit_time", "running_since", "nominated_at"})


def for_machines(value: Any, key: str = "") -> Any:
    """API data for `--json`: points in time as ISO-8601 (UTC), durations and counts as numbers."""
    if isinstance(value, dict):
        return {k: for_machines(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [for_machines(v, key) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool) and (key in TIME_FIELDS or key.endswith("_at")):
        return datetime.fromtimestamp(value, UTC).isoformat()
    return value


def print_json(value: Any) -> None:
    console.out(json.dumps(for_machines(value), indent=2), highlight=False)


def when(timestamp: float | None, now: float | None = None) -> str:
    """A point in time for people: the time of day today, else the date and time."""
    if timestamp is None:
        return ""
    moment = datetime.fromtimestamp(timestamp)
    today = datetime.fromtimestamp(now if now is not None else time.time()).date()
    return moment.strftime("%H:%M:%S") if moment.date() == today else moment.strftime("%Y-%m-%d %H:%M")


def client_url(config: Path | None, api: str | None) -> str:
    """Where the service is: `--api`, else `$GPUPOOL_API`, else the configuration's."""
    try:
        return api or os.environ.get("GPUPOOL_API") or load_spec(client_config(config, os.environ)).service.url
    except GpupoolError as exc:
        failed(exc)


def client(config: Path | None, api: str | None) -> Client:
    """The API client (`gpupool.client.connect`: `--api` wins over `$GPUPOOL_API`, which wins
    over the configuration)."""
    try:
        return connect(api, config)
    except GpupoolError as exc:
        failed(exc)


def call(action: Any, *args: Any) -> Any:
    try:
        return action(*args)
    except GpupoolError as exc:
        failed(exc)


def prepare_output(path: Path, option: str, *, folder: bool = False) -> None:
    """Make the folders an output needs and check it can be written, before any long work."""
    directory = path if folder else path.parent
    if not folder and path.is_dir():
        raise fail(f"{option} {path}: is a folder; give a file name")
    if folder and path.exists() and not path.is_dir():
        raise fail(f"{option} {path}: is a file; give a folder")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise fail(f"{option} {path}: cannot make {directory} ({exc.strerror})") from None
    if not os.access(directory, os.W_OK):
        raise fail(f"{option} {path}: {directory} is not writable")
