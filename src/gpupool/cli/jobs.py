"""The commands about jobs: `queue` (as squeue), `show`, `cancel` (as scancel), `logs`, `events`.

A job is named by its id, or `ARRAY_INDEX` for a task of a job array; an array's id names the
whole array where Slurm's does (`cancel`, `queue`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.markup import escape

from gpupool.cli.common import (
    EXIT_PREEMPTED,
    EXIT_REFUSED,
    ApiOption,
    ConfigOption,
    JsonOption,
    call,
    client,
    console,
    ended,
    errors,
    exit_code,
    fail,
    outcome_code,
    print_json,
)
from gpupool.cli.show import label, show_job
from gpupool.cli.table import Column, table
from gpupool.client import Client
from gpupool.errors import GpupoolError, InvalidInput, NotFound
from gpupool.slurm import parse_states
from gpupool.units import clock_time

LIVE = "pending,starting,running,preempting"


def find(api: Client, ref: str) -> dict[str, Any]:
    """The job `ref` names: `12`, or `12_3` for task 3 of array 12; raises what is wrong."""
    array, sep, index = ref.partition("_")
    if not array.isdigit() or (sep and not index.isdigit()):
        raise InvalidInput(f"{ref!r} is not a job: give its id, or ARRAY_INDEX for a task of an array")
    if not sep:
        return api.job(int(array))
    for task in api.jobs(array=int(array)):
        if task["array_index"] == int(index):
            return dict(task)
    raise NotFound(f"no task {index} in array {array}")


def resolve(api: Client, ref: str) -> dict[str, Any]:
    """`find`, for commands that stop at the first error."""
    found: dict[str, Any] = call(find, api, ref)
    return found


def states_option(state: str | None) -> str | None:
    """`--state` as the API takes it: gpupool's or Slurm's state names and codes, any case
    (`slurm.parse_states`), as gpupool's names, comma-separated."""
    if not state:
        return None
    try:
        return ",".join(parse_states(state))
    except ValueError as exc:
        raise fail(f"--state: {exc}") from None


def ranges(numbers: list[int]) -> str:
    """`[0-3,7,9-10]` for 0 1 2 3 7 9 10."""
    parts = []
    numbers = sorted(numbers)
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return "[" + ",".join(parts) + "]"


def collapsed(jobs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Rows of `queue`: pending tasks of an array in one row, `12_[3-99%8]`, as squeue shows them."""
    rows: list[tuple[str, dict[str, Any]]] = []
    waiting: dict[int, list[dict[str, Any]]] = {}
    for job in jobs:
        if job.get("array_id") is not None and job["state"] == "pending":
            if job["array_id"] not in waiting:
                waiting[job["array_id"]] = []
                rows.append(("", {"array_group": job["array_id"]}))
            waiting[job["array_id"]].append(job)
        else:
            rows.append((label(job), job))
    out = []
    for name, job in rows:
        if "array_group" in job:
            tasks = waiting[job["array_group"]]
            first = tasks[0]
            limit = f"%{first['array_limit']}" if first["array_limit"] else ""
            out.append((f"{first['array_id']}_{ranges([t['array_index'] for t in tasks])}{limit}", first))
        else:
            out.append((name, job))
    return out


QUEUE_COLUMNS = (
    Column("JOBID", keep=True),
    Column("NAME", shrink=1, minimum=6),
    Column("TEAM", shrink=4, minimum=6),
    Column("USER", drop=2),
    Column("CLASS"),
    Column("STATE"),
    Column("GPUS", justify="right"),
    Column("TIME", justify="right"),
    Column("LIMIT", justify="right", drop=3),
    Column("NODES(REASON)", shrink=5, minimum=16),
)


def queue(
    all_jobs: Annotated[bool, typer.Option("--all", "-a", help="Ended jobs too.")] = False,
    team: Annotated[str | None, typer.Option("--team", "-A", help="Only this team's jobs.")] = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only this user's jobs.")] = None,
    state: Annotated[str | None, typer.Option("--state", "-t", help="Only these states, comma-separated.")] = None,
    name: Annotated[str | None, typer.Option("--name", "-n", help="Only jobs of this name.")] = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """The jobs that wait or run, like squeue.

    TIME is the run time of a running job, the wait of a pending one; NODES(REASON) where it
    runs, or why it waits (`show` says it in full)."""
    states = states_option(state) or (None if all_jobs else LIVE)
    api_client = client(config, api)
    jobs = call(lambda: api_client.jobs(state=states, team=team, user=user, name=name))
    if as_json:
        print_json(jobs)
        return
    now = time.time()
    rows = []
    for shown, job in collapsed(jobs):
        if job.get("brief"):
            # Another team's job: the API shows its id, team, class, state and GPUs only.
            rows.append([shown, "", job["team"], "", job["priority"], job["state"], str(job["gpus"]), "", "", ""])
            continue
        if job["running_since"] is not None:
            age = now - job["running_since"]
        else:
            age = (job["ended_at"] or now) - job["submit_time"]
        where = " ".join(f"{node}[{','.join(map(str, ids))}]" for node, ids in job["placement"].items())
        why = f"({job['wait_reason']})" if job["wait_reason"] else ""  # a pending job's only (the API's rule)
        rows.append(
            [
                shown,
                job["name"],
                job["team"],
                job["user"] or "",
                job["priority"],
                job["state"],
                gpus_now(job),
                clock_time(age),
                clock_time(job["time_limit"]) if job["time_limit"] else "",
                where or why,
            ]
        )
    console.print(table(QUEUE_COLUMNS, rows, console.width))


def gpus_now(job: dict[str, Any]) -> str:
    """The GPUs a job asks for; an elastic one's that holds GPUs, those it holds of its largest
    (`2/4`: shrunk to 2 of 4)."""
    held = sum(len(ids) for ids in job["placement"].values())
    return f"{held}/{job['gpus']}" if job.get("sizes") and held else str(job["gpus"])


def show(
    job_ref: Annotated[str, typer.Argument(metavar="JOB", help="A job id, ARRAY_INDEX, or an array's id.")],
    as_json: JsonOption = False,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """A job: what it asked, why it waits, its attempts and what each interruption cost. An
    array's id shows every task, as scontrol does."""
    api_client = client(config, api)
    job = resolve(api_client, job_ref)
    tasks = call(whole_array, api_client, job, job_ref)
    shown = [call(api_client.job, t["id"]) for t in tasks] if tasks else [job]
    if "history" not in shown[0] or not shown[0].get("account"):
        shown[0] = call(api_client.job, job["id"])
    if as_json:
        print_json(shown if tasks else shown[0])
        return
    for one in shown:
        show_job(one)


def whole_array(api: Client, job: dict[str, Any], ref: str) -> list[dict[str, Any]]:
    """The tasks of the array `ref` names by its id alone (`14`, not `14_0`), in index order;
    empty when `ref` names one job."""
    if "_" in ref or job.get("array_id") != job["id"]:
        return []
    return sorted(api.jobs(array=job["id"]), key=lambda t: t["array_index"])


def named(api: Client, refs: list[str]) -> tuple[list[tuple[dict[str, Any], list[dict[str, Any]]]], int]:
    """Each job `refs` names, with its array's tasks when the ref is an array's id alone (else
    none); and the exit code of the worst error among the refs that name no job (each said)."""
    found, worst = [], 0
    for ref in refs:
        try:
            job = find(api, ref)
            found.append((job, whole_array(api, job, ref)))
        except GpupoolError as exc:
            errors.print(f"[bold red]error:[/] {escape(ref)}: {escape(str(exc))}", highlight=False)
            worst = max(worst, exit_code(exc))
    return found, worst


def one_job(api: Client, ref: str) -> dict[str, Any]:
    """`resolve`, for commands about one job: an array's id alone is refused, naming its tasks."""
    job = resolve(api, ref)
    tasks = call(whole_array, api, job, ref)
    if tasks:
        last = tasks[-1]["array_index"]
        raise fail(f"{ref} is an array of {len(tasks)} tasks: name one, as {ref}_0 to {ref}_{last}")
    return job


def cancel(
    jobs: Annotated[
        list[str] | None, typer.Argument(metavar="JOB", help="Job ids, ARRAY_INDEX, or an array's id.")
    ] = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="Every live job of this user.")] = None,
    team: Annotated[str | None, typer.Option("--team", "-A", help="Every live job of this team.")] = None,
    state: Annotated[str | None, typer.Option("--state", "-t", help="Only jobs in these states.")] = None,
    name: Annotated[str | None, typer.Option("--name", "-n", help="Only jobs of this name.")] = None,
    now: Annotated[
        bool, typer.Option("--now", help="Kill running jobs at once, with no grace (also during their grace).")
    ] = False,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """Cancel jobs, as scancel.

    A waiting job ends at once; a running one gets SIGTERM, then SIGKILL after its class's
    grace (at once with --now). An array's id cancels all its tasks. Filters narrow the ids given, or pick the jobs
    when no id is given."""
    api_client = client(config, api)
    filtered = any(f is not None for f in (user, team, state, name))
    if not jobs and not filtered:
        raise fail("name the jobs to cancel, or choose them with --user, --team, --state or --name")
    targets: list[dict[str, Any]] = []
    found, worst = named(api_client, jobs or [])
    for job, tasks in found:
        if tasks:
            live = [t for t in tasks if not ended(t)]  # as scancel: the array's live tasks
            if not live:
                errors.print(f"[bold red]error:[/] array {job['id']} has already ended", highlight=False)
                worst = max(worst, EXIT_REFUSED)
            targets.extend(live)
        else:
            targets.append(job)
    if filtered:
        listed = call(lambda: api_client.jobs(state=states_option(state) or LIVE, team=team, user=user, name=name))
        chosen = [j for j in listed if not j.get("brief")]  # other teams' jobs are not the token's to cancel
        if jobs:
            ids = {j["id"] for j in chosen}
            targets = [t for t in targets if t["id"] in ids]
        else:
            targets = chosen
    seen: set[int] = set()
    for job in targets:
        if job["id"] in seen or (ended(job) and not jobs):
            continue
        seen.add(job["id"])
        try:
            done = api_client.cancel(job["id"], now)
        except GpupoolError as exc:
            errors.print(f"[bold red]error:[/] job {label(job)}: {escape(str(exc))}", highlight=False)
            worst = max(worst, exit_code(exc))
            continue
        stopping = " (stopping)" if done["state"] != "cancelled" else ""
        console.print(f"job {label(job)}: {done['state']}{stopping}", highlight=False, markup=False)
    if not targets and not worst:
        console.print("no job to cancel")
    raise typer.Exit(worst)


def logs(
    job_ref: Annotated[str, typer.Argument(metavar="JOB", help="A job id, or ARRAY_INDEX.")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job ends; exit with its outcome.")
    ] = False,
    attempt: Annotated[
        int | None, typer.Option(help="Attempt number (default: the latest; -f follows each, from the first).")
    ] = None,
    stderr: Annotated[bool, typer.Option("--stderr", help="Standard error instead of output.")] = False,
    rank: Annotated[int, typer.Option(min=0, help="Which member of a multi-node job (0 writes -o/-e).")] = 0,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """Print a job's output.

    With -f, follow it (through each new attempt unless --attempt) and end with the job's
    outcome as the exit code (see docs/slurm.md, "Exit codes")."""
    api_client = client(config, api)
    job = one_job(api_client, job_ref)
    stream = "stderr" if stderr else "stdout"
    # Followed, a job's output is every attempt's, from the first: a flaky job's first try too.
    number = attempt if attempt is not None else 0 if follow else max(0, job["attempts"] - 1)
    tail = Tail(api_client, job["id"], stream, number, rank=rank)

    def printed(text: str) -> None:
        console.out(text, end="", highlight=False)

    while True:
        tail.drain(printed)
        if not follow:
            return
        job = call(api_client.job, job["id"])
        if attempt is None and job["attempts"] - 1 > tail.attempt:
            # The next attempt: the end of this one first, then the next from its start, unless
            # every attempt writes one file.
            tail.drain(printed)
            template = job["error"] if stderr and job["error"] else job["output"]
            tail.attempt += 1
            tail.offset = tail.offset if template is not None and not PER_ATTEMPT.search(template) else 0
            continue
        if ended(job):
            tail.drain(printed)  # the last words of the attempt, then stop
            raise typer.Exit(outcome_code(job))
        if attempt is not None:
            mine = next((a for a in job["history"] if a["attempt"] == attempt), None)
            if mine is not None and mine["ended_at"] is not None and mine["outcome"] == "preempted":
                tail.drain(printed)
                raise typer.Exit(EXIT_PREEMPTED)
        time.sleep(0.5)


@dataclass
class Tail:
    """Where a reader of one member's output is: the attempt, and the byte offset in its file."""

    api: Client
    job_id: int
    stream: str
    attempt: int
    offset: int = 0
    rank: int = 0

    def drain(self, write: Callable[[str], object]) -> None:
        """Print what the attempt's file holds from `offset` on, as of now (an answer holds a
        few MiB at most: ask again while the file has more)."""
        while True:
            text, following, size = call(
                self.api.log_part, self.job_id, self.attempt, self.stream, self.offset, self.rank
            )
            if text:
                write(text)
            advanced, self.offset = following > self.offset, following
            if not advanced or self.offset >= size:
                return


PER_ATTEMPT = re.compile(r"(?<!%)(?:%%)*%t")
"""A log path with `%t` (not `%%t`, a percent sign and a t) gives each attempt its own file."""
