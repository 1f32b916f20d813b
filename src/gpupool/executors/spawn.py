"""One member of an attempt on this machine, as the launcher (`launcher.py`) takes it, and
telling it things: what the local executor does for its attempts, and what Ray's launcher
actors do on each node (both through a fork server of launchers, `forks.py`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.executors.cgroups import Cgroup, Layout, Request
from gpupool.executors.terminal import kill_session
from gpupool.executors.users import JobUser, give
from gpupool.settle import Usage

LAUNCHER = Path(__file__).with_name("launcher.py")
LAUNCHER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
"""The launcher's own environment: nothing of the job's reaches a process of the scheduler's."""


@dataclass(frozen=True, slots=True)
class Spawn:
    """One member's process: plain values, so that it travels to another node."""

    folder: Path
    """Its folder: the launcher's records, and its logs unless `stdout`/`stderr` say otherwise."""
    owner: str
    """Who its records belong to (`proc.owner`)."""
    user: JobUser | None
    workdir: Path
    command: Sequence[str]
    env: Mapping[str, str]
    stdout: Path | None = None
    stderr: Path | None = None
    contain: Request | None = None
    """Its cgroup, where the scheduler contains its attempts; None for a process group."""
    tty: bool = False
    """It runs on a terminal its launcher serves (`terminal.py`): a shell session's member."""

    def payload(self) -> dict[str, object]:
        """What the launcher reads on its standard input."""
        contain = self.contain.as_json() if self.contain is not None else None
        return {"env": dict(self.env), "contain": contain, "tty": self.tty}


def prepare(member: Spawn) -> list[str]:
    """The member's folder and logs made ready; the launcher's arguments. The folder is the
    scheduler's; the job may read its notice and records there, never write them."""
    folder = member.folder
    folder.mkdir(parents=True, exist_ok=True)
    give(folder, None, 0o711 if member.user is not None else 0o700)
    stdout = member.stdout or folder / "stdout.log"
    stderr = member.stderr or folder / "stderr.log"
    for path in (folder / "stdout.log", folder / "stderr.log"):
        if path in (stdout, stderr):
            # Made here, in a folder only the scheduler writes, then given to the job's user:
            # the job opens it to append and can never swap it for a link.
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600))
            give(path, member.user, 0o600)
    user = member.user.name if member.user is not None else "-"
    return [str(folder), member.owner, user, str(member.workdir), str(stdout), str(stderr), *member.command]


def write_notice(folder: Path, deadline: float) -> None:
    """The notice file the job protocol reads, written whole (a reader never sees half of it;
    a temporary file of this process's own, so that writers on several nodes never meet)."""
    notice = folder / "notice"
    partial = folder / f".notice.{os.uname().nodename}.{os.getpid()}.tmp"
    partial.write_text(json.dumps({"deadline": deadline}))
    partial.chmod(0o644)  # the job reads it; the scheduler's umask keeps the rest private
    os.replace(partial, notice)


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the member's session (its launcher leads it); gone already is no error: its exit
    is reported. No pid (0: none known) signals nothing (`killpg(0)` is the caller's own)."""
    if pid <= 0:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def kill(pid: int, contain: Request | None, folder: Path | None = None) -> None:
    """Kill a member: its launcher's session, a shell's own on its terminal (recorded in its
    `folder`), then every process of its cgroup, where it has one (what left the session dies
    too, and what the launcher had not started never starts)."""
    session = None
    if folder is not None and pid > 0:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            recorded = int(json.loads((folder / "terminal.json").read_text())["session"])
            session = recorded if _parent(recorded) == pid else None  # the launcher's child, no other
    signal_group(pid, signal.SIGKILL)
    if session is not None:
        kill_session(session)
    if contain is not None:
        # One pass, never a long wait: the caller is the control loop; the member's end, once
        # its cgroup is empty, is its launcher's to record (or `clear`'s, at the next poll).
        Cgroup(Layout.read(), contain.cgroup).kill(within=0.1)


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def clear(contain: Request | None, within: float | None = 0.1) -> tuple[bool, Usage | None]:
    """At a member's end: kill what is left in its cgroup, where its launcher could not (it was
    killed itself), for up to `within` seconds (None: until it is empty); whether it is empty,
    and what the cgroup counted. A member ends only once its cgroup is empty: one that is not
    is tried again later. No usage when there is no cgroup left (its launcher removed it)."""
    if contain is None:
        return True, None
    cgroup = Cgroup(Layout.read(), contain.cgroup)
    if not cgroup.exists():
        return True, None
    if not cgroup.kill(within):
        return False, None
    usage = Usage.from_json(cgroup.usage())
    cgroup.remove()
    return True, usage
