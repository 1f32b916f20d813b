"""The `gpupool` command line: one module per group of commands, put together here.

- `simulate` (replay a trace; `replay` holds the options it shares with `advise`), `advise`;
- `demo`;
- `up` (the service); `submit`, and the sessions it starts (`run`, `shell`; `attach`, in
  `sessions`, with the terminal in `terminal`); `jobs`: `queue`, `show`, `cancel`, `logs`; `events`;
  `changes`: `hold`, `release`, `update`, `requeue` (as scontrol); `login`; `backup`;
- `pool`: `pool`, `classes`, `team ...`, `user ...`; `report` (with `report_plots`); `export`.

What every command of the live service shares (the API client in `client`, exit codes,
errors) is `common`'s; tables that fit the terminal are `table`'s.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Annotated, Any

import typer
import typer.core
import typer.main

# The modules, not their commands: a command named as its module would hide it.
from gpupool.cli import (
    advise,
    backup,
    changes,
    demo,
    events,
    export,
    jobs,
    login,
    pool,
    report,
    sessions,
    simulate,
    submit,
    up,
)
from gpupool.cli.common import HELP, console

app = typer.Typer(
    rich_markup_mode=None,
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
    changes.hold,
    changes.release,
    changes.update,
    changes.requeue,
    jobs.logs,
    events.events,
    pool.pool,
    pool.classes,
    report.report,
    export.export,
    login.login,
    backup.backup,
)
for command in COMMANDS:
    app.command(context_settings=HELP)(command)
    if command is submit.submit:  # the sessions: submit's options, run in the foreground
        app.command("run", context_settings=HELP, help=submit.RUN_HELP)(submit.submit)
        app.command("shell", context_settings=HELP, help=submit.SHELL_HELP)(submit.submit)
        app.command("notebook", context_settings=HELP, help=submit.NOTEBOOK_HELP)(submit.submit)
        app.command("attach", context_settings=HELP)(sessions.attach)
app.add_typer(pool.team_app, name="team")
app.add_typer(pool.user_app, name="user")
app.command("advise", context_settings=HELP)(advise.advise_command)


class NamedArgument(typer.core.TyperArgument):
    """An argument shown by its name (`JOB`, `[JOB]...`), without its Python type
    (`<list[str]>`), nor braces around a required one (`{JOB}`): as Slurm's usage lines."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        name = str(self.display_name_raw) if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")


def named_values(command: Any) -> Any:
    """`command` (typer's click command) and its subcommands with every value shown by its name,
    as Slurm's help shows them (`--team TEAM`, `JOB...`), not by its Python type (`<str>`)."""
    for param in command.params:
        if isinstance(param, typer.core.TyperOption) and not param.is_flag and param.metavar is None and param.name:
            param.metavar = param.name.upper()
        elif type(param) is typer.core.TyperArgument:
            param.__class__ = NamedArgument
            param.metavar = param.metavar or (param.name or "value").upper()
    for sub in getattr(command, "commands", {}).values():
        named_values(sub)
    return command


def main() -> None:
    named_values(typer.main.get_command(app))()
