"""The operating-system user an attempt runs as, and the folders it may write.

Jobs are untrusted code. Under `run_as: submitter` (each gpupool user's jobs run as the OS
user of that name) or `run_as: team` (one OS user per team, `gpupool-<team>` unless
`job_user` says otherwise), a job cannot read the scheduler's store and tokens, nor another
user's jobs, their folders or their processes' environment (`/proc/PID/environ` is readable by
its own user only). The scheduler must then run as root. `run_as: service` runs jobs as the
scheduler's own user: for a single-user laptop only, where the jobs may read everything of the
scheduler's.
"""

from __future__ import annotations

import errno
import os
import pwd
import signal
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO


@dataclass(frozen=True, slots=True)
class JobUser:
    name: str
    uid: int
    gid: int
    home: str


class NoSuchUser(LookupError):
    """The OS user a job should run as does not exist or may not run jobs."""


def job_user(template: str | None, user: str | None, team: str) -> JobUser | None:
    """The OS user a job of `user` in `team` runs as, from the configuration's name template
    (`ServiceSpec.job_user_template`); None when jobs run as the scheduler's own user."""
    if template is None:
        return None
    if "{user}" in template and not user:
        raise NoSuchUser(
            "this pool runs jobs as the user who submits them (service.run_as: submitter), and this "
            "job names no user: submit with a user's token, or give the user with the admin's"
        )
    return lookup(template.format(user=user or "", team=team))


def lookup(name: str) -> JobUser:
    """The OS user `name`; never root, nor the scheduler's own user (that is `run_as: service`)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise NoSuchUser(f"there is no OS user {name!r} to run the job as (create it: useradd {name})") from None
    if entry.pw_uid == 0:
        raise NoSuchUser(f"OS user {name!r} is root: jobs never run as root")
    if entry.pw_uid == os.geteuid():
        raise NoSuchUser(f"OS user {name!r} is the scheduler's own: jobs run as another user")
    return JobUser(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def can_switch_users() -> bool:
    """Only root: a scheduler given capabilities instead would pass its ambient capabilities
    on to the jobs it starts as other users (they could become root)."""
    return os.geteuid() == 0


def give(path: Path, user: JobUser | None, mode: int) -> None:
    """Make `path` the job user's with `mode` (only `mode` when the job runs as the scheduler)."""
    if user is not None:
        os.chown(path, user.uid, user.gid)
    os.chmod(path, mode)


OPEN_TIMEOUT = 10.0
"""Seconds a file of a job's choosing is given to open before the reader gives up on it."""


def open_as(user: JobUser, path: Path) -> BinaryIO | None:
    """`path` opened for reading with `user`'s rights (their uid, group and supplementary
    groups), or None if it does not exist. A path a job chose (`-o`) may be a link, a FIFO or a
    device: opened as its user, a link leads only where the user may read; anything but a
    regular file is refused (`OSError`); non-blocking, so that a FIFO never hangs the caller.

    A forked child takes the user's identity, opens the file and hands the open file back over
    a Unix socket: it makes system calls only, then `_exit` (no interpreter of the user's to
    start: the scheduler's own may be out of the user's reach)."""
    groups = os.getgrouplist(user.name, user.gid)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child (its outcome is what the parent reads)
            code = 1
            try:
                ours.close()
                os.setgroups(groups)
                os.setgid(user.gid)
                os.setuid(user.uid)
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
                except OSError as exc:
                    theirs.sendall(f"{exc.errno} {exc.strerror}".encode())
                else:
                    socket.send_fds(theirs, [b"ok"], [fd])
                code = 0
            finally:
                os._exit(code)
        theirs.close()
        ours.settimeout(OPEN_TIMEOUT)
        try:
            message, fds, _, _ = socket.recv_fds(ours, 512, 1)
        except TimeoutError:
            # Its open() hangs (a FUSE mount of the user's, an NFS server gone): give up on it.
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise OSError(errno.ETIMEDOUT, f"{path} could not be opened within {OPEN_TIMEOUT:g} s") from None
        _, status = os.waitpid(pid, 0)
    if not fds:
        number, _, reason = message.decode(errors="replace").partition(" ")
        if not number.isdigit() or os.waitstatus_to_exitcode(status) != 0:
            raise OSError(f"could not open {path} as {user.name}")
        if int(number) == errno.ENOENT:
            return None
        raise OSError(int(number), reason)
    stream = os.fdopen(fds[0], "rb")
    if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
        stream.close()
        raise OSError(errno.EINVAL, f"{path} is not a regular file")
    return stream
