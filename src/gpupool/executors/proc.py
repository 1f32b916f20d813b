"""What the operating system says about a process and an attempt's folder, and the last resort
against what outlived its scheduler (`kill_attempts`, for the demos and the tests)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Sequence
from pathlib import Path

from gpupool.settle import Usage


def process_started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None
    if there is no such process, or it has ended and waits to be reaped (a zombie runs nothing
    and must not keep its job's GPUs)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def owner(store_id: str, job_id: int, attempt: int) -> str:
    """Who a launcher's records belong to: one attempt of one job of one store."""
    return f"{store_id}:{job_id}:{attempt}"


def _record(path: Path, expected_owner: str | None) -> dict[str, object] | None:
    """A launcher's record, if it is there and is `expected_owner`'s (records of launchers
    older than owners have none, and are taken as the attempt's)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if expected_owner is not None and data.get("owner", expected_owner) != expected_owner:
        return None
    return data


def recorded_exit(attempt_dir: Path, expected_owner: str | None = None) -> int | None:
    data = _record(attempt_dir / "exit.json", expected_owner)
    code = data.get("exit_code") if data is not None else None
    return code if isinstance(code, int) else None


def not_started(attempt_dir: Path, expected_owner: str | None = None) -> str | None:
    """Why the launcher could not start the command for the scheduler's reasons, if it says so."""
    data = _record(attempt_dir / "exit.json", expected_owner)
    why = data.get("not_started") if data is not None else None
    return str(why) if why is not None else None


def outcome(attempt_dir: Path, expected_owner: str, code: int | None) -> tuple[int | None, str | None, str | None]:
    """How a member ended, from its launcher's records and what its process returned (`code`):
    its exit status (the command's, as recorded, else `code`), what went wrong before the
    command started when it failed, and why it was not started at all (the scheduler's
    reasons), if it was not."""
    data = _record(attempt_dir / "exit.json", expected_owner) or {}
    if data.get("not_started") is not None:
        return None, None, str(data["not_started"])
    recorded = data.get("exit_code")
    status = recorded if isinstance(recorded, int) else code
    return status, launch_error(attempt_dir) if status not in (0, None) else None, None


def recorded_usage(attempt_dir: Path, expected_owner: str) -> Usage | None:
    """What the member's cgroup counted, as its launcher recorded it at its end."""
    data = _record(attempt_dir / "exit.json", expected_owner) or {}
    return Usage.from_json(data.get("usage"))


def launch_error(attempt_dir: Path) -> str | None:
    """What the launcher said went wrong before the command started (a log it could not open),
    in one line, if anything."""
    try:
        text = (attempt_dir / "launcher.log").read_text(errors="replace").strip()
    except OSError:
        return None
    if not text:
        return None
    return text.splitlines()[-1].removeprefix("job: 1: ")[-300:]


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


def recorded_launcher(attempt_dir: Path, expected_owner: str | None = None) -> tuple[int, str] | None:
    """The launcher's pid and start time, as it recorded them before anyone learnt its pid (so
    a scheduler that died before recording its handle finds it by its record)."""
    data = _record(attempt_dir / "launcher.json", expected_owner)
    try:
        if data is not None:
            return int(str(data["pid"])), str(data["started"])
    except (KeyError, ValueError):
        pass
    return None


def kill_attempts(data_dir: Path) -> None:
    """SIGKILL every attempt launched under `data_dir`: each launcher (it works in its attempt's
    folder, and outlives a SIGTERM by design, so `pkill` would not do) with its process group,
    and the session of each of its children (a shell session's leads one of its own), as well
    as any process whose command line names `data_dir`."""
    launchers, children = set(), []
    own = os.getpgid(0)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            where = os.readlink(proc / "cwd")
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        children.append((int(proc.name), parent))
        if str(data_dir) in command or where == str(data_dir) or where.startswith(str(data_dir) + "/"):
            launchers.add(int(proc.name))
    groups = {os.getpgid(pid) for pid in launchers if _exists(pid)}
    groups |= {os.getpgid(pid) for pid, parent in children if parent in launchers and _exists(pid)}
    for group in groups - {own}:  # never the caller's own group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def _exists(pid: int) -> bool:
    try:
        os.getpgid(pid)
    except ProcessLookupError:
        return False
    return True
