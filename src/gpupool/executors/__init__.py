"""Executors run attempts: one small interface, a local implementation, a fake for tests.

An executor knows processes, not policy. The control loop tells it to start an attempt, to
give one notice, or to kill one, and asks it which attempts have ended.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpupool.executors.users import JobUser


@dataclass(frozen=True, slots=True)
class Launch:
    """Everything needed to start one attempt of a job."""

    job_id: int
    attempt: int
    command: Sequence[str]
    workdir: Path
    env: Mapping[str, str]
    """The job's own variables plus the job protocol's (`GPUPOOL_*`, `CUDA_VISIBLE_DEVICES`)."""
    attempt_dir: Path
    """Logs, the notice file and the exit status of this attempt."""
    gpus: Mapping[str, Sequence[int]] = field(default_factory=dict)
    stdout: Path | None = None
    stderr: Path | None = None
    """Where its output goes (appended); None is `stdout.log`/`stderr.log` in `attempt_dir`."""
    user: JobUser | None = None
    """The OS user it runs as; None for the scheduler's own."""


@dataclass(frozen=True, slots=True)
class Handle:
    """How to find the attempt's process again, even after a restart of the scheduler: a pid
    alone may be reused, a pid with its start time may not."""

    pid: int
    started: str


@dataclass(frozen=True, slots=True)
class Exit:
    job_id: int
    attempt: int
    exit_code: int | None
    """None when the process is gone and its status could not be read."""
    why: str | None = None
    """What went wrong before the command started, when the launcher said."""
    started: bool = True
    """False when the command was never started, for the scheduler's reasons (no space, no
    process to fork): not the job's failure, so it is tried again after a back-off."""


class Executor(Protocol):
    def start(self, launch: Launch) -> Handle:
        """Start the attempt's process group and return at once."""
        ...

    def notify(self, job_id: int, attempt: int, deadline: float) -> None:
        """Give notice: write the notice file, then SIGTERM the process group."""
        ...

    def kill(self, job_id: int, attempt: int) -> None:
        """SIGKILL the attempt's process group (its deadline has passed, or it is cancelled)."""
        ...

    def poll(self) -> list[Exit]:
        """Attempts whose processes have ended since the last poll."""
        ...

    def adopt(self, job_id: int, attempt: int, handle: Handle, attempt_dir: Path) -> bool:
        """After a restart: watch an attempt started by an earlier scheduler if its process is
        still the same one; False if it is gone (its exit, if recorded, comes from `poll`)."""
        ...
