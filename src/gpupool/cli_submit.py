"""`gpupool submit`: a job from a command line, in the submitter's environment (as `sbatch`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer

from gpupool.cli_common import ApiOption, ConfigOption, call, client, console, fail
from gpupool.units import parse_time_limit

PROTOCOL_PREFIX = "GPUPOOL_"
"""The job protocol's variables: the service sets them for each attempt, so the submitter's own
(its token above all, which must never reach a job) are not passed on."""


def job_environment(export: str, extra: list[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a job runs with, from Slurm's `--export` forms and `--env NAME=VALUE`.

    `ALL` (the default): the whole environment of the submitter; `NONE`: none of it; `A,B`: only
    those; `ALL,A=x` or `A=x`: set a value as well. Variables of the job protocol (`GPUPOOL_*`)
    are never taken from the submitter's environment.
    """
    chosen: dict[str, str] = {}
    items = [item.strip() for item in export.split(",") if item.strip()]
    if not items:
        raise fail("--export: give ALL, NONE or variable names (A,B or A=value)")
    for item in items:
        name, sep, value = item.partition("=")
        if item.upper() == "ALL":
            chosen.update(environ)
        elif item.upper() == "NONE":
            if len(items) > 1:
                raise fail("--export: NONE goes alone")
        elif not name.isidentifier():
            raise fail(f"--export: {item!r} is not a variable name")
        elif sep:
            chosen[name] = value
        elif name in environ:
            chosen[name] = environ[name]
    chosen = {k: v for k, v in chosen.items() if not k.startswith(PROTOCOL_PREFIX)}
    for item in extra:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise fail(f"--env {item!r}: use NAME=VALUE")
        if name == "GPUPOOL_TOKEN":
            raise fail("--env: GPUPOOL_TOKEN is set by gpupool for each attempt, and no token of yours goes to a job")
        chosen[name] = value
    return chosen


def submit(
    command: Annotated[list[str] | None, typer.Argument(help="The command to run, after --.")] = None,
    team: Annotated[str | None, typer.Option(help="Team (default: the token's team).")] = None,
    priority: Annotated[str, typer.Option(help="Priority class.")] = "normal",
    gpus: Annotated[int, typer.Option(help="GPUs, all or nothing.")] = 1,
    gpus_per_node: Annotated[int | None, typer.Option(help="GPUs on each node of a multi-node job.")] = None,
    gpu_type: Annotated[str | None, typer.Option(help="Only nodes with this GPU type.")] = None,
    name: Annotated[str, typer.Option("--name", "-J", help="A name to find the job by.")] = "",
    max_failures: Annotated[int, typer.Option(help="Retries after failed attempts.")] = 0,
    time: Annotated[
        str | None,
        typer.Option(
            "--time", "-t", help="Time limit over all attempts: minutes, HH:MM:SS, D-HH:MM, or 2h (then TIMEOUT)."
        ),
    ] = None,
    export: Annotated[
        str, typer.Option(help="The submitter's variables the job gets: ALL, NONE, or A,B (A=value sets one).")
    ] = "ALL",
    env: Annotated[list[str] | None, typer.Option(help="NAME=VALUE for the job, repeatable.")] = None,
    wrap: Annotated[str | None, typer.Option(help="Run this shell line (sh -c) instead of a command.")] = None,
    chdir: Annotated[
        Path | None, typer.Option("--chdir", "-D", help="Working directory of the job (default: this one).")
    ] = None,
    parsable: Annotated[bool, typer.Option("--parsable", help="Print the job id alone.")] = False,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """Submit a job: gpupool submit --gpus 2 --priority high -- python train.py"""
    if wrap is not None and command:
        raise fail("give a command after -- or --wrap, not both")
    argv = ["/bin/sh", "-c", wrap] if wrap is not None else list(command or [])
    if not argv:
        raise fail("give the command to run after --, or --wrap 'shell line'")
    workdir = (chdir or Path.cwd()).expanduser().absolute()
    try:
        time_limit = parse_time_limit(time) if time is not None else None
    except ValueError as exc:
        raise fail(f"--time: {exc}") from None
    body = {
        "command": argv,
        "team": team,
        "priority": priority,
        "gpus": gpus,
        "gpus_per_node": gpus_per_node,
        "gpu_type": gpu_type,
        "name": name,
        "workdir": str(workdir),
        "env": job_environment(export, env or [], os.environ),
        "max_failures": max_failures,
        "time_limit": time_limit,
    }
    job = call(client(config, api).submit, body)
    if parsable:
        console.print(str(job["id"]), highlight=False)
        return
    console.print(f"submitted job [bold]{job['id']}[/] ({job['name']}, team {job['team']}, {job['priority']})")
