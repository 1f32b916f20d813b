"""What the operating system says about a process and an attempt's folder."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path


def process_started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None
    if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    return stat.rsplit(")", 1)[1].split()[19]


def recorded_exit(attempt_dir: Path) -> int | None:
    try:
        code: int = json.loads((attempt_dir / "exit.json").read_text())["exit_code"]
    except (OSError, ValueError, KeyError):
        return None
    return code


def recorded_exit_time(attempt_dir: Path) -> float | None:
    """When the launcher wrote the attempt's exit status (its file's time); None without one."""
    try:
        return (attempt_dir / "exit.json").stat().st_mtime
    except OSError:
        return None


def last_sign_of_life(attempt_dir: Path, logs: Sequence[Path], since: float) -> float:
    """The latest time an attempt's files were written (its logs grow while it runs): when it
    was last known alive, for one that ended with no exit recorded. At least `since`."""
    times = [since]
    for path in [*attempt_dir.glob("*"), *logs]:
        with contextlib.suppress(OSError):
            times.append(path.stat().st_mtime)
    return max(times)


def recorded_launcher(attempt_dir: Path) -> tuple[int, str] | None:
    """The launcher's pid and start time: as it wrote them when it started or, if the scheduler
    died before the launcher could write them, found among the running processes by the
    attempt folder on its command line (so no attempt can run unknown to a new scheduler)."""
    try:
        data = json.loads((attempt_dir / "launcher.json").read_text())
        return int(data["pid"]), str(data["started"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    wanted = str(attempt_dir).encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if len(args) > 2 and args[1].endswith(b"launch.sh") and args[2] == wanted:
            pid = int(cmdline.parent.name)
            started = process_started(pid)
            if started is not None:
                return pid, started
    return None
