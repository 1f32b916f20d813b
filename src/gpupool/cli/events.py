"""`gpupool events`: what the scheduler decided and what happened to jobs, with why: the last
ones, since a time, of one job or of some kinds, and followed as they come."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer

from gpupool.cli.common import (
    ApiOption,
    ConfigOption,
    JsonOption,
    call,
    client,
    console,
    ended,
    fail,
    for_machines,
    print_json,
    when,
)
from gpupool.cli.jobs import resolve
from gpupool.cli.table import Column, table
from gpupool.client import Client
from gpupool.units import parse_duration

HIDDEN = ("checkpoint",)
"""Kinds shown only when asked for by `--type`: a job that saves every minute says so every
minute."""

COLUMNS = (Column("TIME"), Column("KIND"), Column("JOB", drop=1), Column("WHAT", shrink=1, minimum=20, wrap=True))


def events(
    job_ref: Annotated[str | None, typer.Option("--job", "-j", metavar="JOB", help="Only this job's events.")] = None,
    kinds: Annotated[
        str | None,
        typer.Option(
            "--type", "-T", metavar="KINDS", help="Only these kinds, comma-separated (checkpoint among them)."
        ),
    ] = None,
    since: Annotated[str | None, typer.Option(help="Only the last DURATION, e.g. 30m or 2d.")] = None,
    tail: Annotated[int, typer.Option("--tail", "-n", min=0, help="The last N events (0: all of them).")] = 50,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events (with --job: until the job ends).")
    ] = False,
    as_json: JsonOption = False,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """Every decision and state change, with its reason: the last 50, oldest first.

    Checkpoint events are left out unless --type names them."""
    api_client = client(config, api)
    job = resolve(api_client, job_ref) if job_ref is not None else None
    try:
        start = time.time() - parse_duration(since) if since is not None else None
    except ValueError as exc:
        raise fail(f"--since: {exc}") from None
    filters: dict[str, Any] = {"since": start, "kind": kinds, "hide": None if kinds else ",".join(HIDDEN)}
    found = call(read, api_client, job, 0, tail, filters)
    if as_json and not follow:
        print_json(found)
        return
    shown(found, as_json)
    seen = last(found)
    while follow:
        over = job is not None and ended(call(api_client.job, job["id"]))
        if not over:
            time.sleep(0.5)
        more = call(read, api_client, job, seen, 0, filters)
        shown(more, as_json)
        seen = last(more) or seen
        if over:
            return


def read(
    api: Client, job: dict[str, Any] | None, after: int, tail: int, filters: dict[str, Any]
) -> list[dict[str, Any]]:
    """The events after the id `after`: the last `tail` of them (0: every one, a page at a time)."""
    job_id = job["id"] if job is not None else None
    if tail:
        return api.events(job_id, after, limit=tail, newest=True, **filters)
    found: list[dict[str, Any]] = []
    while page := api.events(job_id, after, limit=1000, **filters):
        found += page
        after = page[-1]["id"]
    return found


def last(found: list[dict[str, Any]]) -> int:
    return int(found[-1]["id"]) if found else 0


def shown(found: list[dict[str, Any]], as_json: bool) -> None:
    """Print events as a table, or followed with --json as a stream of JSON objects, a line each."""
    if as_json:
        for event in found:
            print(json.dumps(for_machines(event)), flush=True)
        return
    if not found:
        return
    now = time.time()
    rows = [[when(e["time"], now), e["kind"], e["job_label"] or "", e["message"]] for e in found]
    console.print(table(COLUMNS, rows, console.width))
