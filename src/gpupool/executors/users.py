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
import socket
import stat
import subprocess
import sys
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


_OPEN_AS = """
import os, socket, stat, sys
channel = socket.socket(fileno=int(sys.argv[1]))
try:
    fd = os.open(sys.argv[2], os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
except OSError as exc:
    channel.sendall(("%d %s" % (exc.errno, exc.strerror)).encode())
    sys.exit(0)
socket.send_fds(channel, [b"ok"], [fd])
"""
"""Opens a file with its user's rights and hands the open file back over a Unix socket (run as
`python -I -S -c`, as that user): the scheduler reads what the user may read, nothing else."""


def open_as(user: JobUser, path: Path) -> BinaryIO | None:
    """`path` opened for reading with `user`'s rights (their uid, group and supplementary
    groups), or None if it does not exist. A path a job chose (`-o`) may be a link, a FIFO or a
    device: opened as its user, a link leads only where the user may read; anything but a
    regular file is refused (`OSError`); non-blocking, so that a FIFO never hangs the caller."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _OPEN_AS, str(theirs.fileno()), str(path)],
            user=user.uid,
            group=user.gid,
            extra_groups=os.getgrouplist(user.name, user.gid),
            pass_fds=(theirs.fileno(),),
            env={},
            cwd="/",
            capture_output=True,
            timeout=30,
            check=False,
        )
        theirs.close()
        if done.returncode != 0:
            raise OSError(f"could not open {path} as {user.name}: {done.stderr.decode(errors='replace')[-500:]}")
        message, fds, _, _ = socket.recv_fds(ours, 512, 1)
    if not fds:
        number, _, reason = message.decode(errors="replace").partition(" ")
        if int(number or 0) == errno.ENOENT:
            return None
        raise OSError(int(number or 0), reason)
    stream = os.fdopen(fds[0], "rb")
    if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
        stream.close()
        raise OSError(errno.EINVAL, f"{path} is not a regular file")
    return stream
