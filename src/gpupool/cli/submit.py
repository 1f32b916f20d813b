"""`gpupool submit`: a job from a command line or a batch script, in the submitter's
environment, with Slurm's options (`--time`, `--after`, `--array`, `-o`/`-e`, `--wrap`)."""

from __future__ import annotations

import getpass
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from gpupool.cli import sessions
from gpupool.cli.common import ApiOption, ConfigOption, call, client, console, fail, wait_for_outcome
from gpupool.model import SessionKind
from gpupool.shapes import parse_sizes
from gpupool.slurm import DIRECTIVE, directives
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
    # Submitted from inside a job: its compile caches are its own, not the new job's.
    cache = environ.get("GPUPOOL_CACHE_DIR")
    if cache:
        chosen = {k: v for k, v in chosen.items() if not v.startswith(cache.rstrip("/") + "/") and v != cache}
    for item in extra:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise fail(f"--env {item!r}: use NAME=VALUE")
        if name == "GPUPOOL_TOKEN":
            raise fail("--env: GPUPOOL_TOKEN is set by gpupool for each attempt, and no token of yours goes to a job")
        chosen[name] = value
    return chosen


def directives_in(script: str) -> bool:
    try:
        return bool(directives(script))
    except ValueError:
        return True  # a malformed directive: read it as a batch script, to say what is wrong


def batch_script(command: list[str]) -> str | None:
    """The text of the batch script `command` starts with: a file whose first line is `#!` and
    that has `#GPUPOOL` option lines at its top (as sbatch reads `#SBATCH`), or that is not
    executable. None for anything else, which runs in place, as it is when it runs (a script
    next to the modules it imports)."""
    if not command:
        return None
    path = Path(command[0])
    try:
        if not path.is_file():
            return None
        with path.open("rb") as stream:
            if stream.read(2) != b"#!":
                return None
        text = path.read_text(encoding="utf-8")
        # Not executable, it can only run as sbatch runs a script: from a copy gpupool makes.
        return text if directives_in(text) or not os.access(path, os.X_OK) else None
    except UnicodeDecodeError:
        return None  # a binary that happens to start with #!: run it as it is
    except OSError as exc:
        raise fail(f"{command[0]}: cannot read ({exc.strerror})") from None


def runnable(word: str) -> str:
    """A command the job can run from its own working directory: a file named here (`train.sh`,
    `./train.py`) by its absolute path, as the shell that submits would have found it; a name
    looked up in PATH as it is."""
    path = Path(word)
    if "/" not in word and not path.is_file():
        return word
    if path.is_file() and not os.access(path, os.X_OK):
        raise fail(f"{word}: not executable (chmod +x it, or run it with its interpreter)")
    return str(path.absolute()) if path.is_file() else word


def with_directives(ctx: typer.Context, script: str, source: str) -> dict[str, Any]:
    """The options of `submit`: the script's `#GPUPOOL` lines, under those of the command line."""
    options = dict(ctx.params)
    try:
        words = directives(script)
    except ValueError as exc:
        raise fail(f"{source}: {DIRECTIVE} {exc}") from None
    if not words:
        return options
    command = ctx.command
    try:
        parsed = command.make_context(ctx.info_name, [*words, "--", "script"], parent=ctx.parent)
    except Exception as exc:  # click's usage errors (typer ships its own click)
        problem = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        raise fail(f"{source}: {DIRECTIVE} line: {problem}") from None
    given = {name for name in ctx.params if getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"}
    for name, value in parsed.params.items():
        if name != "command" and name not in given and not given & set(RIVALS.get(name, ())):
            options[name] = value
    return options


RIVALS = {
    "mem": ("mem_per_gpu",),
    "mem_per_gpu": ("mem",),
    "gpus": ("nodes",),
    "nodes": ("gpus",),
    "resize_step": ("gpus", "nodes"),
}
"""Options a script's line gives that the command line's overrides: one of two a job gives
(memory per node or per GPU; GPUs or nodes), or what goes with them (an elastic job's step
goes with the sizes the script gave)."""


def requested_gpus(
    gpus: str | None, nodes: str | None, step: str | None, gpus_per_node: int | None
) -> tuple[int, tuple[int, ...]]:
    """The GPUs of `--gpus N|MIN-MAX` or of `--nodes N|MIN-MAX` (whole nodes of
    `--gpus-per-node`), with `--resize-step`: (what it asks for, an elastic job's sizes or ())."""
    if nodes is not None:
        if gpus is not None:
            raise fail("give --gpus or --nodes, not both")
        if gpus_per_node is None:
            raise fail("--nodes goes with --gpus-per-node (the GPUs each node gives the job)")
        low, dash, high = nodes.strip().partition("-")
        try:
            counts = [int(low), *([int(high)] if dash else [])]
        except ValueError:
            raise fail(f"--nodes {nodes!r}: a number of nodes, or the fewest and the most, as 1-4") from None
        if min(counts) < 1:
            raise fail(f"--nodes {nodes}: at least 1 node")
        gpus = "-".join(str(count * gpus_per_node) for count in counts)
    try:
        return parse_sizes(gpus or "1", step, gpus_per_node)
    except ValueError as exc:
        said = str(exc)
        if nodes is not None:  # in the words the submitter used
            said = said.replace(f"--gpus {gpus}:", f"--nodes {nodes} ({gpus} GPUs):", 1)
        raise fail(said) from None


def request_body(o: dict[str, Any], argv: list[str], script: str | None) -> dict[str, Any]:
    """The API's submission from `submit`'s options (`o`, the script's directives merged in),
    the command and the batch script's text."""
    workdir = (o["chdir"] or Path.cwd()).expanduser().absolute()
    try:
        time_limit = parse_time_limit(o["time"]) if o["time"] is not None else None
    except ValueError as exc:
        raise fail(f"--time: {exc}") from None
    passed = ("team", "priority", "gpus_per_node", "gpu_type", "max_failures", "after", "array")
    gpus, sizes = requested_gpus(o["gpus"], o["nodes"], o["resize_step"], o["gpus_per_node"])
    return {
        **{name: o[name] for name in passed},
        "gpus": gpus,
        **({"sizes": list(sizes)} if sizes else {}),
        "command": argv,
        "name": o["name"] or (Path(argv[0]).name if script is not None else ""),
        "workdir": str(workdir),
        "env": job_environment(o["export"], o["env"] or [], os.environ),
        "time_limit": time_limit,
        "script": script,
        **{name: o[name] for name in ("output", "error", "notify", "mem", "mem_per_gpu", "cpus_per_gpu")},
        "user": getpass.getuser(),
    }


def submit(
    ctx: typer.Context,
    command: Annotated[
        list[str] | None, typer.Argument(help="The command after --, or a batch script and its arguments.")
    ] = None,
    team: Annotated[str | None, typer.Option(help="Team (default: the token's team).")] = None,
    priority: Annotated[
        str | None,
        typer.Option(
            "--priority", "-p", help="Priority class (default: normal; a session's: the pool's, interactive)."
        ),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(metavar="N|MIN-MAX", help="GPUs, all or nothing (default 1); MIN-MAX: an elastic job."),
    ] = None,
    resize_step: Annotated[
        str | None,
        typer.Option(
            metavar="N|pow2",
            help="An elastic job's sizes: MIN, MIN+N, ... or doubled (default: 1, a gang's GPUs per node).",
        ),
    ] = None,
    nodes: Annotated[
        str | None,
        typer.Option(metavar="N|MIN-MAX", help="Whole nodes of --gpus-per-node GPUs, instead of --gpus."),
    ] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="GPUs on each node of a multi-node job.")] = None,
    gpu_type: Annotated[str | None, typer.Option(help="Only nodes with this GPU type.")] = None,
    name: Annotated[str, typer.Option("--name", "-J", help="A name to find the job by.")] = "",
    max_failures: Annotated[int, typer.Option(help="Retries after failed attempts.")] = 0,
    mem: Annotated[
        str | None,
        typer.Option(metavar="SIZE", help="Memory on each node: 16G, 512M (a number is MB); its cgroup's limit."),
    ] = None,
    mem_per_gpu: Annotated[
        str | None,
        typer.Option(metavar="SIZE", help="Memory for each GPU (default: the pool's, or a node's memory / GPUs)."),
    ] = None,
    cpus_per_gpu: Annotated[
        float | None, typer.Option(metavar="CPUS", help="CPUs for each GPU (default: a node's CPUs / GPUs).")
    ] = None,
    time: Annotated[
        str | None,
        typer.Option("--time", "-t", help="Time limit over all attempts: minutes, HH:MM:SS, D-HH:MM, or 2h."),
    ] = None,
    after: Annotated[
        str | None, typer.Option("--after", "-d", help="Start after these jobs: 12, ok:12:13, notok:12, any:12.")
    ] = None,
    array: Annotated[
        str | None, typer.Option("--array", "-a", help="A job array: 0-99%8 (8 at once), 1,3,5-9.")
    ] = None,
    export: Annotated[
        str, typer.Option(help="The submitter's variables the job gets: ALL, NONE, or A,B (A=value sets one).")
    ] = "ALL",
    env: Annotated[list[str] | None, typer.Option(help="NAME=VALUE for the job, repeatable.")] = None,
    wrap: Annotated[str | None, typer.Option(help="Run this shell line (sh -c) instead of a command.")] = None,
    chdir: Annotated[
        Path | None, typer.Option("--chdir", "-D", help="Working directory of the job (default: this one).")
    ] = None,
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="Standard output to this file: %j job, %a index, %t attempt.")
    ] = None,
    error: Annotated[
        str | None, typer.Option("--error", "-e", help="Standard error to this file (default: -o's).")
    ] = None,
    notify: Annotated[
        str | None, typer.Option(help="A URL told when the job starts, ends or gets notice (a Slack webhook).")
    ] = None,
    parsable: Annotated[bool, typer.Option("--parsable", help="Print the job id alone.")] = False,
    wait: Annotated[bool, typer.Option("--wait", "-W", help="Wait for the job to end; exit with its outcome.")] = False,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """Submit a job: gpupool submit --gpus 2 --priority high -- python train.py

    A script (a file starting with #!) with #GPUPOOL option lines at its top, or one that is not
    executable, is a batch script, as sbatch reads #SBATCH: options on the command line win, and
    the job runs a copy of the script taken now. Any other command runs in place.
    """
    session = SessionKind(ctx.info_name) if ctx.info_name in tuple(SessionKind) else None
    argv = list(command or []) or (sessions.default_command(session) if wrap is None else [])
    script = batch_script(argv) if wrap is None else None
    if script is None and argv and wrap is None:
        argv[0] = runnable(argv[0])
    o = with_directives(ctx, script, argv[0]) if script is not None else dict(ctx.params)
    if o["wrap"] is not None and argv:
        raise fail("give a command after -- or --wrap, not both")
    if o["wrap"] is not None:
        argv = ["/bin/sh", "-c", o["wrap"]]
    if not argv:
        raise fail("give the command to run after --, a batch script, or --wrap 'shell line'")
    body = request_body(o, argv, script)
    if session is not None:
        sessions.as_session(session, o, body)
    api_client = client(config, api)
    # One key for every try of this submission: a retry after a lost answer is the same job.
    job = call(api_client.submit_body, body, str(uuid.uuid4()))
    if session is not None:
        raise typer.Exit(sessions.in_foreground(session, api_client, job))
    if o["parsable"]:
        console.print(str(job["id"]), highlight=False)
    else:
        kind = "array job" if job["task"] is not None else "job"
        about = escape(f"({job['name']}, team {job['team']}, {job['priority']})")
        console.print(f"submitted {kind} [bold]{job['id']}[/] {about}", highlight=False)
    if o["wait"]:
        raise typer.Exit(wait_for_outcome(api_client, job["id"], quiet=o["parsable"]))


RUN_HELP = """Run a command as a job in the foreground, as srun: gpupool run --gpus 1 -- python eval.py

It waits for the start, streams the job's standard output and error here, and exits with its
exit code (125 cancelled, 124 time limit, 75 preempted). Ctrl-C cancels the job (notice, then its
class's grace); a second Ctrl-C kills it at once. Takes submit's options; its class is the pool's
sessions' class (interactive) unless -p names one."""

SHELL_HELP = """A shell on the pool's GPUs, as srun --pty bash: gpupool shell --gpus 1 --time 2h

A terminal on the node that holds the job's GPUs, as the job's user, inside its limits, with
CUDA_VISIBLE_DEVICES set. Its exit ends the job. Enter ~ . detaches; gpupool attach JOB comes back
(within sessions.detach_grace). An idle session is warned, then ended (its class's idle_after).
Takes submit's options (a command after -- instead of your shell)."""

NOTEBOOK_HELP = """JupyterLab on the pool's GPUs, behind the service: gpupool notebook --gpus 1 --time 4h

Starts a Jupyter server as a job (gpupool[notebook] where it runs), waits until it answers and
prints its address: the service proxies it, behind the dashboard's sign-in (your token), with no
tunnel and no second token. It runs until gpupool cancel JOB, its time limit, or its class's
idle_after with no kernel activity. Takes submit's options."""
