"""Real OS users for the tests that run jobs as someone else, and folders those users can reach
(pytest's own temporary folders are root's alone)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def os_user(name: str) -> None:
    """Make the OS user `name` (a system user, no home, no shell) unless there is one."""
    if subprocess.run(["id", name], capture_output=True, check=False).returncode != 0:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)


@contextmanager
def reachable_folder(prefix: str, mode: int = 0o711) -> Iterator[Path]:
    """A new folder under /tmp that other users may pass through (`mode`), removed afterwards."""
    top = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        top.chmod(mode)
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)
