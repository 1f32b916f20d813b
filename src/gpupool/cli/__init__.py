"""The `gpupool` command line: one module per group of commands, put together here.

- `simulate` (replay a trace; `replay` holds the options it shares with `advise`), `advise`;
- `demo`;
- `up` (the service); `submit`; `jobs`: `queue`, `show`, `cancel`, `logs`, `events`;
- `pool`: `pool`, `classes`, `team ...`, `user ...`; `report` (with `report_plots`); `export`.

What every command of the live service shares (the API client in `client`, exit codes,
errors) is `common`'s; tables that fit the terminal are `table`'s.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Annotated

import typer

# The modules, not their commands: a command named as its module would hide it.
from gpupool.cli import advise, demo, export, jobs, pool, report, simulate, submit, up
from gpupool.cli.common import HELP, console

app = typer.Typer(
    help="gpupool: one shared GPU pool, priority as a job attribute.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings=HELP,
)


def show_version(value: bool) -> None:
    if value:
        console.print(f"gpupool {version('gpupool')}", highlight=False)
        raise typer.Exit()


@app.callback()
def main_options(
    _version: Annotated[
        bool | None, typer.Option("--version", "-V", callback=show_version, is_eager=True, help="Print the version.")
    ] = None,
) -> None:
    """gpupool: one shared GPU pool, priority as a job attribute."""


# In the order `gpupool --help` lists them.
COMMANDS = (
    simulate.simulate,
    demo.demo,
    up.up,
    submit.submit,
    jobs.queue,
    jobs.show,
    jobs.cancel,
    jobs.logs,
    jobs.events,
    pool.pool,
    pool.classes,
    report.report,
    export.export,
)
for command in COMMANDS:
    app.command(context_settings=HELP)(command)
app.add_typer(pool.team_app, name="team")
app.add_typer(pool.user_app, name="user")
app.command("advise", context_settings=HELP)(advise.advise_command)


def main() -> None:
    app()
