"""What the API may ask of the running service, and nothing more: the API holds a `Service`,
never the control loop itself. `ControlLoop` (loop.py) is one; the API's tests pass it too.

The API reads and writes the store itself (jobs, teams, reports); what it needs of the loop is
to wake it after a change, to know whether it has stopped deciding, the workspace (where jobs'
folders and logs are) and the two things that depend on who jobs run as. Of what the loop
tells its observers, the queue page reads the line (`Line`: observer.Lineup is one).
"""

from __future__ import annotations

from typing import BinaryIO, Protocol

from gpupool.service.workspace import Workspace
from gpupool.store.schema import JobRow


class Terminal(Protocol):
    """One connection to a shell session's terminal (`sessions.SessionTerminal` is one)."""

    key: tuple[int, int]
    """The attempt (job, attempt) whose terminal it is."""

    def screen(self) -> None:
        """Ask for what the terminal showed last (its last 64 KiB), before what comes next."""
        ...

    def keys(self, data: bytes) -> None:
        """Type `data` into the terminal."""
        ...

    def resize(self, rows: int, cols: int) -> None: ...

    def output(self, timeout: float) -> tuple[bytes, int | None] | None:
        """What the terminal showed within `timeout` s (b"" if nothing), with the shell's exit
        code once it ended (then nothing follows); None once the terminal is gone."""
        ...

    def close(self) -> None: ...


class SessionsView(Protocol):
    """The running sessions, as the API reaches them (`service.sessions.Sessions` is this)."""

    def open_terminal(self, job: JobRow) -> Terminal:
        """A connection to the running shell session's terminal; `Conflict` when it has none."""
        ...

    def notebook(self, job: JobRow) -> tuple[str, str]:
        """Where the running notebook session's server answers (`http://ADDRESS:PORT`, on its
        node) and its token; `Conflict` while there is none."""
        ...

    def warning(self, job: int) -> str | None:
        """What the session of `job` was warned of (its reclaim, when idle), while it stays idle."""
        ...

    def active(self, key: tuple[int, int], now: float) -> None:
        """The session's attempt `key` was used (a keystroke): not idle."""
        ...

    def attach(self, key: tuple[int, int], now: float, change: int) -> None:
        """A terminal attached to the session's attempt `key` (1) or left it (-1)."""
        ...


class Service(Protocol):
    @property
    def halted(self) -> str | None:
        """Why the scheduler decides nothing now (its data directory or its store is not the one
        it started with, or another scheduler leads), or None while it decides."""
        ...

    @property
    def workspace(self) -> Workspace:
        """The data directory: jobs' folders, their attempts' folders and logs."""
        ...

    @property
    def dirty(self) -> dict[str, dict[int, str]]:
        """Per node, its GPUs that a process of no live attempt holds, with that process."""
        ...

    @property
    def sessions(self) -> SessionsView:
        """The running sessions: terminals, notebooks' servers, activity."""
        ...

    def wake(self) -> None:
        """Decide soon: a job was submitted or cancelled, or a team's policy changed."""
        ...

    def check_runnable(self, user: str | None, team: str) -> None:
        """Refuse, at submit, a job no OS user could run: `InvalidInput` saying why."""
        ...

    def check_resources(
        self, gpus: int, gpus_per_node: int | None, mem: int | None, mem_per_gpu: int | None, cpus: float | None
    ) -> None:
        """Refuse, at submit, memory or CPUs no node has: `InvalidInput` naming the limit."""
        ...

    def job_defaults(self, priority: str | None, session: str | None) -> tuple[str, float | None]:
        """What a submission that names no class gets (`normal`, or the sessions' class for a
        session), and the time limit of the class it runs at when it gives none."""
        ...

    def open_log(self, job: JobRow, attempt: int, stream: str, rank: int = 0) -> BinaryIO | None:
        """A member's log, open for reading, or None if there is none yet; a file a job of
        another OS user chose is opened with that user's rights (a `Conflict` if it cannot be)."""
        ...


class Line(Protocol):
    @property
    def places(self) -> dict[int, int]:
        """Each pending job's place in line at the last decision (1: next)."""
        ...
