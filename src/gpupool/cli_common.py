"""What every command of the live service shares: the client, errors and exit codes.

Exit codes (documented in the README), distinct so that scripts can tell them apart:

    0  done
    1  the job failed (`submit --wait`, `logs -f`: the job's own exit code when it has one)
    2  usage error: a bad option, value or file
    3  not found: no such job, team or class
    4  cannot reach the service
    5  refused: the token may not do this, or the state forbids it now (forbidden, conflict)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from gpupool.client import Client, Unreachable
from gpupool.config import load_spec
from gpupool.errors import Conflict, Forbidden, GpupoolError, NotFound, Unauthorized

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNREACHABLE = 4
EXIT_REFUSED = 5

console = Console()
errors = Console(stderr=True)

ConfigOption = Annotated[Path | None, typer.Option("--config", help="YAML configuration (defaults when omitted).")]
ApiOption = Annotated[
    str | None, typer.Option("--api", help="Address of the service (default: $GPUPOOL_API, else the configuration's).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for machines instead of a table.")]


def exit_code(error: GpupoolError) -> int:
    if isinstance(error, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(error, Unreachable):
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


def client(config: Path | None, api: str | None) -> Client:
    """The API client: `--api` wins over `$GPUPOOL_API`, which wins over the configuration."""
    try:
        spec = load_spec(config)
        return Client.from_env(api or os.environ.get("GPUPOOL_API") or spec.service.url, spec.service.data_path)
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
