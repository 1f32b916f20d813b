"""A real PostgreSQL server on loopback for the tests: started once per test process, stopped
at the end. Uses the Debian `postgresql` package's binaries; as root, runs them as `postgres`
(the server refuses to run as root)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpupool.up import free_port


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl is None:
        raise RuntimeError("PostgreSQL is not installed: the store tests need Debian's `postgresql` package")
    return Path(pg_ctl).resolve().parent


@contextmanager
def postgres_server(*, durable: bool = False) -> Iterator[str]:
    """Yield the URL of a fresh server's `postgres` database, for user `gpupool`, trust auth.
    Tests run it without fsync; benchmarks ask for a `durable` one (PostgreSQL's defaults)."""
    bindir = _bindir()
    as_postgres: list[str] = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    root = Path(tempfile.mkdtemp(prefix="gpupool-pg-"))
    data, sockets = root / "data", root / "sockets"
    sockets.mkdir()
    if as_postgres:
        shutil.chown(root, "postgres")
        shutil.chown(sockets, "postgres")
    port = free_port()

    def run(*command: str) -> None:
        subprocess.run([*as_postgres, *command], check=True, capture_output=True, timeout=120)

    run(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "gpupool", "--no-sync")
    options = f"-p {port} -h 127.0.0.1 -k {sockets}" + ("" if durable else " -c fsync=off -c full_page_writes=off")
    run(str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "start")
    try:
        yield f"postgresql://gpupool@127.0.0.1:{port}/postgres"
    finally:
        run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)
