"""`gpupool backup`: a copy of the SQLite store taken while the service runs, with SQLite's own
online backup (a plain copy of a database being written may hold half a transaction)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Annotated

import typer

from gpupool.cli.common import console, fail, prepare_output
from gpupool.config import ConfigError, load_spec, service_config


def backup(
    to: Annotated[Path, typer.Argument(metavar="FILE", help="Where to write the copy (a new file).")],
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", help="The service's configuration (default: $GPUPOOL_CONFIG, else /etc/gpupool/gpupool.yaml)."
        ),
    ] = None,
) -> None:
    """Copy the service's SQLite store to FILE while it runs (as root, who may read it).

    A PostgreSQL store is backed up with pg_dump instead."""
    try:
        service = load_spec(service_config(config, os.environ)).service
    except ConfigError as exc:
        raise fail(str(exc)) from None
    from gpupool.store.engine import DATABASE  # here: the command line loads no store at start

    if service.store is not None:
        raise fail(f"the store is {service.store.split('@')[-1]}, not SQLite: back it up with pg_dump")
    source = service.data_path / DATABASE
    if not source.is_file():
        raise fail(f"no store at {source}: is service.data_dir the service's?", 3)
    if to.exists():
        raise fail(f"{to} exists already: give a new file")
    prepare_output(to, "FILE")
    fd = os.open(to, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # the store holds token hashes
    os.close(fd)
    with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as original, sqlite3.connect(to) as copy:
        original.backup(copy)
    console.print(f"{source} copied to {to}", highlight=False, markup=False)
