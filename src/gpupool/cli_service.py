"""The command line of the live service: `up`, `submit`, `queue`, `show`, `cancel`, `logs`, `events`."""

from __future__ import annotations

import shlex
import time
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from gpupool.cli_common import ApiOption, ConfigOption, call, client, console, fail
from gpupool.config import ConfigError, load_spec
from gpupool.model import ENDED, JobState
from gpupool.units import gpu_time, human_seconds, plural


def up(config: ConfigOption = None) -> None:
    """Run gpupool on this machine: API, control loop and local executor, until Ctrl-C."""
    from gpupool.up import shut_down, start

    try:
        spec = load_spec(config)
        running = start(spec)
    except (ConfigError, ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    label = "[yellow]virtual[/]" if running.gpus.virtual else "[green]real[/]"
    console.print(f"gpupool listening on [bold]{spec.service.url}[/] (API docs: {spec.service.url}/docs)")
    console.print(f"GPUs: {running.gpus.detail} ({label}); data: {spec.service.data_path}")
    console.print(f"admin token: {spec.service.data_path / 'admin.token'}")
    try:
        running.server.run()
    finally:
        shut_down(running)


def queue(
    all_jobs: Annotated[bool, typer.Option("--all", help="Ended jobs too.")] = False,
    team: Annotated[str | None, typer.Option(help="Only this team's jobs.")] = None,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """The jobs that wait or run, like squeue."""
    states = None if all_jobs else "pending,starting,running,preempting"
    api_client = client(config, api)
    jobs = call(lambda: api_client.jobs(state=states, team=team))
    now = time.time()
    table = Table(box=None, header_style="bold")
    for header in ("ID", "NAME", "TEAM", "CLASS", "STATE", "GPUS", "WAIT/RUN", "NODE/GPUS", "ATTEMPTS", "WHY"):
        table.add_column(header)
    for job in jobs:
        # Run time of the live attempt, else time in line (or, once ended, submit to end).
        if job["running_since"] is not None:
            age = now - job["running_since"]
        else:
            age = (job["ended_at"] or now) - job["submit_time"]
        where = " ".join(f"{node}[{','.join(map(str, ids))}]" for node, ids in job["placement"].items())
        why = job["wait_reason"] if job["state"] == "pending" and job["wait_reason"] else ""
        table.add_row(
            str(job["id"]),
            job["name"],
            job["team"],
            job["priority"],
            job["state"],
            str(job["gpus"]),
            human_seconds(age),
            where,
            str(job["attempts"]),
            why,
        )
    console.print(table)


def show(job_id: int, config: ConfigOption = None, api: ApiOption = None) -> None:
    """A job with its attempts, its GPU time, and each interruption with its reason and cost."""
    api_client = client(config, api)
    job = call(api_client.job, job_id)
    console.print(f"[bold]job {job['id']}[/] {job['name']}: {job['state']}, team {job['team']}, {job['priority']}")
    console.print(f"  command: {shlex.join(job['command'])}  (in {job['workdir']})", highlight=False)
    console.print(f"  {plural(job['gpus'], 'GPU')}; attempts {job['attempts']}, preemptions {job['preemptions']}")
    if job["wait_message"] and job["state"] == "pending":
        console.print(f"  waits: {job['wait_message']}")
    table = Table(title="attempts", box=None, header_style="bold")
    for header in ("#", "started", "ended", "outcome", "exit", "step", "last checkpoint"):
        table.add_column(header)
    for a in job["history"]:
        table.add_row(
            str(a["attempt"]),
            clock(a["started_at"]),
            clock(a["ended_at"]),
            a["outcome"] or "live",
            "" if a["exit_code"] is None else str(a["exit_code"]),
            "" if a["step"] is None else str(a["step"]),
            clock(a["last_checkpoint_at"]),
        )
    console.print(table)
    account = job.get("account")
    if account is None:
        return
    goodput = f", goodput {account['goodput']:.1%}" if account["goodput"] is not None else ", goodput unknown"
    unreported = ""
    if account["unreported"] > 0:
        unreported = f", {gpu_time(account['unreported'])} unreported (the job does not report its progress)"
    console.print(
        f"  {gpu_time(account['allocated'])} allocated, {gpu_time(account['productive'])} productive"
        f"{unreported}{goodput}"
    )
    if account["interruptions"]:
        console.print(interruptions_table(account["interruptions"]))


def interruptions_table(interruptions: list[dict[str, Any]], *, jobs: bool = False) -> Table:
    """Each interruption with its cause, its reason and what it cost (GPU time)."""
    table = Table(title="interruptions (GPU time lost)", box=None, header_style="bold")
    headers = ("job", "team", "class") if jobs else ("attempt",)
    for header in (*headers, "at", "cause", "wasted", "drain", "restart", "lost", "waited", "reason"):
        table.add_column(header, overflow="fold")
    for i in interruptions:
        first = (str(i["job"]), i["team"], i["priority"]) if jobs else (str(i["attempt"]),)
        table.add_row(
            *first,
            clock(i["at"]),
            i["cause"],
            gpu_time(i["wasted"]),
            gpu_time(i["drain"]),
            "" if i["restart"] is None else gpu_time(i["restart"]),
            gpu_time(i["lost"]),
            "waiting" if i["delay"] is None else human_seconds(i["delay"]),
            i["reason"],
        )
    return table


def cancel(job_id: int, config: ConfigOption = None, api: ApiOption = None) -> None:
    """Cancel a job: at once if it waits; a running one gets SIGTERM, then SIGKILL after its grace."""
    job = call(client(config, api).cancel, job_id)
    console.print(f"job {job['id']}: {job['state']}" + (" (stopping)" if job["state"] != "cancelled" else ""))


def logs(
    job_id: int,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    attempt: Annotated[int | None, typer.Option(help="Attempt number (default: the latest).")] = None,
    stderr: Annotated[bool, typer.Option("--stderr", help="Standard error instead of output.")] = False,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """Print a job's output."""
    api_client = client(config, api)
    offset = 0
    while True:
        text = call(api_client.logs, job_id, attempt, "stderr" if stderr else "stdout", offset)
        if text:
            console.out(text, end="", highlight=False)
            offset += len(text.encode())
        if not follow or JobState(call(api_client.job, job_id)["state"]) in ENDED:
            return
        time.sleep(0.5)


def events(
    job: Annotated[int | None, typer.Option(help="Only this job's events.")] = None,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """Every decision and state change, with its reason."""
    for event in call(client(config, api).events, job):
        subject = f"job {event['job_id']}" if event["job_id"] is not None else ""
        console.print(f"{clock(event['time'])} {event['kind']:<16} {subject:<8} {event['message']}", highlight=False)


team_app = typer.Typer(help="Teams: weights, guarantees, allowed classes, tokens (admin).", no_args_is_help=True)


@team_app.command("list")
def team_list(config: ConfigOption = None, api: ApiOption = None) -> None:
    """Every team with its weight, guarantee and allowed classes."""
    table = Table(box=None, header_style="bold")
    for header in ("TEAM", "WEIGHT", "GUARANTEED GPUS", "CLASSES"):
        table.add_column(header)
    for team in call(client(config, api).teams):
        classes = ", ".join(team["classes"]) if team["classes"] is not None else "all"
        table.add_row(team["name"], f"{team['weight']:g}", str(team["guaranteed_gpus"]), classes)
    console.print(table)


@team_app.command("set")
def team_set(
    name: str,
    weight: Annotated[float | None, typer.Option(help="Share of the pool relative to other teams.")] = None,
    guaranteed_gpus: Annotated[
        int | None, typer.Option(help="GPUs the team may reclaim from teams above theirs.")
    ] = None,
    classes: Annotated[str | None, typer.Option(help="Allowed priority classes, comma-separated, or 'all'.")] = None,
    new_token: Annotated[bool, typer.Option(help="Make a new token for the team (shown once).")] = False,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """Create or change a team: only the options given change."""
    body: dict[str, Any] = {"new_token": new_token}
    if weight is not None:
        body["weight"] = weight
    if guaranteed_gpus is not None:
        body["guaranteed_gpus"] = guaranteed_gpus
    if classes is not None:
        names = [c.strip() for c in classes.split(",") if c.strip()]
        body["classes"] = None if names == ["all"] else names
    team = call(client(config, api).set_team, name, body)
    console.print(
        f"team {team['name']}: weight {team['weight']:g}, {plural(team['guaranteed_gpus'], 'GPU')} guaranteed"
    )
    if team["token"]:
        console.print(f"token (shown once; give it to the team as GPUPOOL_TOKEN): {team['token']}")


def classes(config: ConfigOption = None, api: ApiOption = None) -> None:
    """The priority classes, most important first."""
    table = Table(box=None, header_style="bold")
    for header in ("CLASS", "VALUE", "MAY PREEMPT", "PREEMPTIBLE", "MIN RUNTIME", "GRACE"):
        table.add_column(header)
    for c in call(client(config, api).classes):
        table.add_row(
            c["name"],
            str(c["value"]),
            "yes" if c["may_preempt"] else "no",
            "yes" if c["preemptible"] else "no",
            human_seconds(c["min_runtime"]),
            human_seconds(c["grace_period"]),
        )
    console.print(table)


def clock(timestamp: float | None) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%H:%M:%S") if timestamp is not None else ""


def register(app: typer.Typer) -> None:
    from gpupool.cli_report import report
    from gpupool.cli_submit import submit

    for command in (up, submit, queue, show, cancel, logs, events, classes, report):
        app.command()(command)
    app.add_typer(team_app, name="team")
