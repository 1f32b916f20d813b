"""`gpupool login`: keep the token an admin gave you in your own token file, so that no command
needs `GPUPOOL_TOKEN` (`client.token_file`)."""

from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from gpupool.cli.common import ApiOption, ConfigOption, call, client_url, console, fail
from gpupool.client import Client, token_file


def login(
    token_stdin: Annotated[
        bool, typer.Option("--token-stdin", help="Read the token from standard input instead of asking for it.")
    ] = False,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """Keep your token in ~/.config/gpupool/token (readable by you alone).

    Asks for the token your admin gave you (gpupool user add prints it), checks it with the
    service, and keeps it: every command then uses it unless GPUPOOL_TOKEN is set."""
    url = client_url(config, api)
    if token_stdin or not sys.stdin.isatty():
        token = sys.stdin.readline().strip()
    else:
        token = getpass.getpass("token: ").strip()
    if not token:
        raise fail("no token given")
    call(Client(url, token).request, "GET", "/classes")  # a token the service does not know: 401, exit 5
    path = token_file()
    keep(path, token)
    console.print(f"token kept in {path}; gpupool at {url} knows it", highlight=False, markup=False)


def keep(path: Path, token: str) -> None:
    """Write `token` to `path` as its user's alone, in a folder of theirs alone, whole or not."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = path.with_suffix(".tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as stream:
        stream.write(token + "\n")
    os.replace(partial, path)
