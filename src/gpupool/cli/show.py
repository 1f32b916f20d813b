"""A job in full, as `show` prints it: what it asked, its attempts and what each used, and what
each interruption cost (the interruptions' table `report` shows too)."""

from __future__ import annotations

import shlex
import time
from typing import Any

from rich.markup import escape

from gpupool.cli.common import console, ended, when
from gpupool.cli.table import Column, table
from gpupool.units import brief_seconds, clock_time, gpu_time, gpu_unit, human_bytes, human_seconds, plural


def label(job: dict[str, Any]) -> str:
    """The job as people name it (`ARRAYID_INDEX` for a task of an array)."""
    return str(job["label"])


ATTEMPT_COLUMNS = (
    Column("#", justify="right"),
    Column("GPUS", justify="right"),
    Column("STARTED"),
    Column("ENDED"),
    Column("OUTCOME"),
    Column("EXIT", justify="right"),
    Column("STEP", justify="right", drop=2),
    Column("CHECKPOINT", drop=1),
    Column("MAXRSS", justify="right", drop=3),
    Column("CPU", justify="right", drop=4),
    Column("GPUMEM", justify="right", drop=5),
)


def session_line(job: dict[str, Any]) -> str:
    """What kind of session the job is, and how long it was idle over its ended attempts."""
    idle = sum(a.get("idle_seconds") or 0.0 for a in job["history"])
    return f"a {job['session']} session: idle for {human_seconds(idle)} (counted once it ended)"


def show_job(job: dict[str, Any]) -> None:
    """`show` of one job, in full."""
    now = time.time()
    by = f", user {escape(job['user'])}" if job["user"] else ""
    console.print(
        f"[bold]job {label(job)}[/] {escape(job['name'])}: {job['state']}, team {escape(job['team'])}{by}, "
        f"{job['priority']}",
        highlight=False,
    )
    console.print(f"  command: {shlex.join(job['command'])}", highlight=False, soft_wrap=True, markup=False)
    console.print(f"  in: {job['workdir']}", highlight=False, soft_wrap=True, markup=False)
    layout = f" ({job['gpus_per_node']} per node)" if job["gpus_per_node"] else ""
    console.print(
        f"  {gpus_line(job)}{layout}; {plural(job['attempts'], 'attempt')}, "
        f"{plural(job['preemptions'], 'preemption')}; submitted {when(job['submit_time'], now)}",
        highlight=False,
        markup=False,
    )
    if job.get("session"):
        console.print(f"  {session_line(job)}", highlight=False, markup=False)
    asked = resources_line(job)
    if asked:
        console.print(f"  {asked}", highlight=False, markup=False)
    if job["time_limit"]:
        live = [a for a in job["history"] if a["ended_at"] is None and a["notice_at"] is None]
        used = job["run_seconds"] + sum(now - a["started_at"] for a in live)
        limit, spent = human_seconds(job["time_limit"]), human_seconds(used)
        console.print(f"  time limit {limit}, {spent} used (over all attempts)", highlight=False, markup=False)
    if job["dependencies"]:
        after = ", ".join(f"{kind}:{target}" for kind, target in job["dependencies"])
        met = " (met)" if job["dependency_met_at"] else ""
        console.print(f"  after: {after}{met}", highlight=False, markup=False)
    if job["wait_message"]:  # a pending job's only (the API's rule)
        console.print(
            f"  waits ({job['wait_reason']}): {job['wait_message']}", highlight=False, soft_wrap=True, markup=False
        )
    if job["history"]:
        rows = [
            [
                str(a["attempt"]),
                str(a.get("gpus") or job["gpus"]),
                when(a["started_at"], now),
                when(a["ended_at"], now),
                a["outcome"] or "live",
                "" if a["exit_code"] is None else str(a["exit_code"]),
                "" if a["step"] is None else str(a["step"]),
                when(a["last_checkpoint_at"], now),
                "" if a.get("peak_memory") is None else human_bytes(a["peak_memory"]),
                "" if a.get("cpu_seconds") is None else clock_time(a["cpu_seconds"]),
                "" if a.get("peak_gpu_memory") is None else human_bytes(a["peak_gpu_memory"]),
            ]
            for a in job["history"]
        ]
        console.print(table(ATTEMPT_COLUMNS, rows, console.width, title="attempts"))
    account = job.get("account")
    if account is not None:
        show_account(job, account)


def gpus_line(job: dict[str, Any]) -> str:
    """The GPUs it asks for; an elastic job's sizes, and those it ran at, in order."""
    sizes = job.get("sizes")
    if not sizes:
        return plural(job["gpus"], "GPU")
    ran: list[int] = []
    for attempt in job["history"]:
        if attempt.get("gpus") and attempt.get("outcome") != "not_launched" and ran[-1:] != [attempt["gpus"]]:
            ran.append(attempt["gpus"])
    at = f", ran at {' → '.join(map(str, ran))}" if ran else ""
    return f"{sizes[0]} to {plural(job['gpus'], 'GPU')} (elastic: {', '.join(map(str, sizes))}{at})"


def resources_line(job: dict[str, Any]) -> str:
    """What the job asked besides GPUs, where it asked (the pool's defaults otherwise)."""
    parts = []
    if job.get("mem") is not None:
        parts.append(f"memory {human_bytes(job['mem'])} per node")
    if job.get("mem_per_gpu") is not None:
        parts.append(f"memory {human_bytes(job['mem_per_gpu'])} per GPU")
    if job.get("cpus_per_gpu") is not None:
        cpus = job["cpus_per_gpu"]
        parts.append(f"{cpus:g} {'CPU' if cpus == 1 else 'CPUs'} per GPU")
    return "asked: " + ", ".join(parts) if parts else ""


def show_account(job: dict[str, Any], account: dict[str, Any]) -> None:
    """What `show` says of a job's account: GPU time, restarts, saves, each interruption's cost."""
    goodput = f", goodput {account['goodput']:.1%}" if account["goodput"] is not None else ", goodput unknown"
    unreported = ""
    if account["unreported"] > 0:
        unreported = f", {gpu_time(account['unreported'])} unreported (the job does not report its progress)"
    console.print(
        f"  {gpu_time(account['allocated'])} allocated, {gpu_time(account['productive'])} productive"
        f"{unreported}{goodput}",
        highlight=False,
        markup=False,
    )
    for cost in account["attempts"]:
        if cost["phases"]:
            console.print(f"  {restart_line(cost, job)}", highlight=False, markup=False)
    blocked = sum(a["checkpoint"] for a in account["attempts"])
    background = sum(a["background"] for a in account["attempts"])
    if blocked or background:
        overlap = f", then written in the background for {gpu_time(background)}" if background else ""
        console.print(f"  checkpoints: saves blocked {gpu_time(blocked)}{overlap}", highlight=False, markup=False)
    if account["interruptions"]:
        console.print(interruptions_table(account["interruptions"], width=console.width, ended=ended(job)))


def restart_line(cost: dict[str, Any], job: dict[str, Any]) -> str:
    """Where an attempt's start-up went, in seconds (the account's GPU-seconds over its GPUs)."""
    ran = next((a.get("gpus") for a in job["history"] if a["attempt"] == cost["attempt"]), None)
    gpus = max(1, ran or job["gpus"])
    parts = ", ".join(f"{name} {brief_seconds(gpu_seconds / gpus)}" for name, gpu_seconds in cost["phases"].items())
    line = f"attempt {cost['attempt']} started up in {brief_seconds(cost['startup'] / gpus)}: {parts}"
    said = next((a.get("restart") or {} for a in job["history"] if a["attempt"] == cost["attempt"]), {})
    if said.get("first_step") is not None:
        line += f"; first step {brief_seconds(said['first_step'])}"
        if said.get("steady_step") is not None:
            line += f" (then {brief_seconds(said['steady_step'])} a step)"
    return line


def interruptions_table(
    interruptions: list[dict[str, Any]],
    *,
    width: int,
    jobs: bool = False,
    ended: bool = False,
    unit: tuple[str, float] | None = None,
    whole_reasons: bool = True,
) -> Any:
    """Each interruption with its cause, its reason and what it cost (GPU time). `ended` (or an
    interruption's `job_ended`): the job has ended, so one with no next attempt waits for
    nothing. `unit`: the GPU time unit of the report it is part of (else its own largest value's);
    `whole_reasons`: reasons wrap (else each is one line, cut)."""
    first = (Column("JOB"), Column("TEAM", shrink=3, drop=4), Column("CLASS", drop=5)) if jobs else (Column("#"),)
    unit_name, size = unit or gpu_unit(max((i["lost"] for i in interruptions), default=0.0))
    columns = (
        *first,
        Column("AT"),
        Column("CAUSE"),
        Column("WASTED", justify="right", drop=3),
        Column("DRAIN", justify="right", drop=2),
        Column("RESTART", justify="right", drop=1),
        Column("LOST", justify="right"),
        Column("WAITED", justify="right", drop=6),
        Column("REASON", shrink=1, minimum=16, drop=7, wrap=whole_reasons),
    )
    now = time.time()
    rows = []
    for i in interruptions:
        who = [i["job_label"], i["team"], i["priority"]] if jobs else [str(i["attempt"])]
        rows.append(
            [
                *who,
                when(i["at"], now),
                i["cause"],
                f"{i['wasted'] / size:.1f}",
                f"{i['drain'] / size:.1f}",
                "" if i["restart"] is None else f"{i['restart'] / size:.1f}",
                f"{i['lost'] / size:.1f}",
                ("—" if ended or i.get("job_ended") else "waiting") if i["delay"] is None else clock_time(i["delay"]),
                i["reason"],
            ]
        )
    return table(columns, rows, width, title=f"interruptions (GPU time lost, in {unit_name})")
