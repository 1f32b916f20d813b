"""The scheduler's data directory as jobs use it: each job's folder (`jobs/<store id>-<job id>`)
with its checkpoints, its compilers' cache and its batch script, each attempt's folder, where
an attempt's logs go (the job's own `-o`/`-e` paths, Slurm's patterns expanded, or the
attempt's folder), and how tokens are kept (only their hashes reach the store).

The control loop makes and fills these folders; the API checks a submission's paths against
them and reads logs through them. One owner for where things are: no one else builds a path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from hashlib import sha256
from pathlib import Path
from typing import BinaryIO

from gpupool.errors import Conflict
from gpupool.executors.users import JobUser, give, open_as
from gpupool.store.schema import JobRow, StoreIdentityRow

MemberLogs = Callable[[int, int, int, str, Path], BinaryIO | None]
"""How the executor opens a member's log in an attempt's folder (`Executor.logs`)."""


def token_hash(token: str) -> str:
    """What the store keeps of a token (the admin's, a team's, a user's or an attempt's)."""
    return sha256(token.encode()).hexdigest()


def expand_log_path(
    template: str, job: int, attempt: int, name: str, array: int | None = None, index: int | None = None
) -> str:
    """Slurm's patterns in a log path: `%j` the job, `%A` its array, `%a` its index in the array,
    `%t` the attempt, `%x` the job's name, `%%` a percent sign."""
    values = {
        "j": str(job),
        "A": str(array if array is not None else job),
        "a": str(index if index is not None else ""),
        "t": str(attempt),
        "x": name,
        "%": "%",
    }
    return re.sub(r"%([jAatx%])", lambda m: values[m.group(1)], template)


def inside(path: Path, folder: Path) -> bool:
    """Whether `path`, its links followed, is `folder` or lies in it."""
    return path.resolve().is_relative_to(folder.resolve())


@dataclass
class Workspace:
    """The folders of the jobs of one store under `data_dir`. `identity_of` reads the store's
    identity (once, when a folder is first asked for)."""

    data_dir: Path
    identity_of: Callable[[], StoreIdentityRow]

    @cached_property
    def identity(self) -> StoreIdentityRow:
        return self.identity_of()

    @property
    def store_id(self) -> str:
        return self.identity.id

    def job_dir(self, job_id: int) -> Path:
        """`jobs/<store id>-<job id>`: a job of another store with the same id never shares
        its checkpoints, logs or exit records (jobs made before store ids keep `jobs/<id>`)."""
        if job_id < self.identity.legacy_below:
            return self.data_dir / "jobs" / str(job_id)
        return self.data_dir / "jobs" / f"{self.identity.id[:12]}-{job_id}"

    def attempt_dir(self, job_id: int, attempt: int) -> Path:
        return self.job_dir(job_id) / f"attempt-{attempt}"

    def job_folders(self, job_id: int, user: JobUser | None) -> tuple[Path, Path]:
        """The job's `checkpoints` and `cache` folders, made if new and given to its user."""
        checkpoints = self.job_dir(job_id) / "checkpoints"
        cache = self.job_dir(job_id) / "cache"
        for folder in (checkpoints, cache):
            folder.mkdir(parents=True, exist_ok=True)
        # Nobody but the scheduler lists its folders; a job's user reaches its own by name.
        for folder in (self.data_dir / "jobs", self.job_dir(job_id)):
            give(folder, None, 0o711 if user is not None else 0o700)
        for folder in (checkpoints, cache):
            give(folder, user, 0o700)
        return checkpoints, cache

    @staticmethod
    def log_template(job: JobRow, stream: str) -> str | None:
        """The job's own path for `stdout` or `stderr` (`-o`/`-e`), or None for its folder."""
        if stream == "stdout" or job.error is None:
            return job.output  # as sbatch: without -e, errors go where -o says
        return job.error

    def log_file(self, job: JobRow, attempt: int, stream: str) -> Path:
        """Where an attempt's `stdout` or `stderr` goes: the job's `-o`/`-e` path, or its folder."""
        template = self.log_template(job, stream)
        if template is None:
            return self.attempt_dir(job.id, attempt) / f"{stream}.log"
        expanded = expand_log_path(template, job.id, attempt, job.name, job.array_id, job.array_index)
        return Path(job.workdir) / expanded

    def checked_log_files(self, job: JobRow, attempt: int) -> tuple[Path, Path]:
        """The attempt's `stdout` and `stderr`; a `ValueError` if the job's own paths lead into
        the data directory (checked at submit, and again now: a link made since must not)."""
        stdout, stderr = (self.log_file(job, attempt, stream) for stream in ("stdout", "stderr"))
        if job.output is not None or job.error is not None:
            for path in (stdout, stderr):
                if inside(path, self.data_dir) and not inside(path, self.attempt_dir(job.id, attempt)):
                    raise ValueError(f"{path} is in the scheduler's data directory")
        return stdout, stderr

    def open_log(
        self, job: JobRow, attempt: int, stream: str, rank: int, member_logs: MemberLogs, user: JobUser | None
    ) -> BinaryIO | None:
        """A member's log, open for reading, or None if there is none yet. A job that runs as
        another OS user (`user`) chose where its `-o`/`-e` files are: such a path is opened with
        that user's rights (`open_as`), never the scheduler's (a link, a FIFO or a device there
        must not be opened as root); the logs in the job's own folder come from the executor
        (`member_logs`), wherever the member ran."""
        if self.log_template(job, stream) is None or rank != 0:
            return member_logs(job.id, attempt, rank, stream, self.attempt_dir(job.id, attempt))
        path = self.log_file(job, attempt, stream)
        if user is not None:
            try:
                return open_as(user, path)
            except OSError as exc:
                raise Conflict(f"job {job.label} writes its {stream} to {path}, which cannot be read: {exc}") from None
        try:
            return path.open("rb")
        except OSError:
            return None

    def script_file(self, job: JobRow, user: JobUser | None = None) -> Path:
        """The job's batch script as submitted, written once into its folder (its user's only)."""
        path = self.job_dir(job.id) / "script"
        if not path.exists():
            partial = path.with_suffix(".tmp")
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
            with os.fdopen(fd, "w") as stream:
                stream.write(job.script or "")
            os.replace(partial, path)
        give(path, user, 0o700)
        return path
