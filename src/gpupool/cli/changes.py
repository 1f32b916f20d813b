"""`hold`, `release`, `update` and `requeue`: what Slurm's scontrol changes of a job after it was
submitted (`api/changes.py` says the rules: a user only lowers a time limit, the admin's hold is
the admin's to release)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from gpupool.cli.common import ApiOption, ConfigOption, client, console, errors, exit_code, fail
from gpupool.cli.jobs import named
from gpupool.cli.show import label
from gpupool.client import Client
from gpupool.errors import GpupoolError
from gpupool.units import human_seconds, parse_time_limit

JobsArgument = Annotated[list[str], typer.Argument(metavar="JOB", help="Job ids, ARRAY_INDEX, or an array's id.")]


def each(refs: list[str], api_client: Client, change: Callable[[int], Any], said: Callable[[Any], str]) -> None:
    """`change` each job `refs` names (an array's id: each of its tasks, one at a time: a task
    that is running harms no other), printing what `said` of each job after it; exit with the
    worst error's code."""
    found, worst = named(api_client, refs)
    for job, tasks in found:
        targets = tasks or [job]
        for target in targets:
            try:
                changed = change(target["id"])
            except GpupoolError as exc:
                errors.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)  # it names the job
                worst = max(worst, exit_code(exc))
                continue
            console.print(said(changed), highlight=False, markup=False)
    raise typer.Exit(worst)


def act(refs: list[str], config: Path | None, api: str | None, action: str, done: str) -> None:
    """`action` (hold, release, requeue) on each job `refs` names, saying `done` of each."""
    api_client = client(config, api)
    each(refs, api_client, lambda job_id: api_client.act(job_id, action), lambda job: f"job {label(job)}: {done}")


def hold(jobs: JobsArgument, config: ConfigOption = None, api: ApiOption = None) -> None:
    """Hold waiting jobs, as scontrol hold: they keep their place in line but do not start
    until released (the admin's hold only by the admin)."""
    act(jobs, config, api, "hold", "held")


def release(jobs: JobsArgument, config: ConfigOption = None, api: ApiOption = None) -> None:
    """Release held jobs, as scontrol release: they wait in line again, in their place."""
    act(jobs, config, api, "release", "released")


def requeue(jobs: JobsArgument, config: ConfigOption = None, api: ApiOption = None) -> None:
    """Requeue running jobs, as scontrol requeue: each gets notice with its class's grace, as
    in a preemption, saves its checkpoint, leaves and waits in line again."""
    act(jobs, config, api, "requeue", "requeued (notice given)")


def update(
    job_ref: Annotated[str, typer.Argument(metavar="JOB", help="A job id, ARRAY_INDEX, or an array's id.")],
    time: Annotated[
        str | None,
        typer.Option(
            "--time", "-t", help="A new time limit: minutes, HH:MM:SS, D-HH:MM, or 2h (raised by the admin only)."
        ),
    ] = None,
    priority: Annotated[str | None, typer.Option("--priority", "-p", help="A new class, while it waits.")] = None,
    after: Annotated[
        str | None, typer.Option("--after", "-d", help="New dependencies, while it waits ('' for none).")
    ] = None,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """Change a job, as scontrol update: its time limit, or while it waits its class or its
    dependencies. Only the options given change."""
    change: dict[str, Any] = {}
    if time is not None:
        try:
            change["time_limit"] = parse_time_limit(time)
        except ValueError as exc:
            raise fail(f"--time: {exc}") from None
    if priority is not None:
        change["priority"] = priority
    if after is not None:
        change["after"] = after
    if not change:
        raise fail("give what to change: --time, --priority or --after")
    api_client = client(config, api)

    def said(job: Any) -> str:
        limit = human_seconds(job["time_limit"]) if job["time_limit"] else "none"
        return f"job {label(job)}: class {job['priority']}, time limit {limit}"

    each([job_ref], api_client, lambda job_id: api_client.update(job_id, change), said)
