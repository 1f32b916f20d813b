"""Executors run attempts: one small interface (here), and two implementations of it.

- `local/`: attempts as process groups on this machine (`LocalExecutor`), and its GPUs.
- `ray/`: attempts as gangs over the nodes of a Ray cluster (`RayExecutor`, with adoption
  after a restart); only this package imports Ray, an optional extra.
- What runs a member on one machine, for the local executor and for each Ray node's launcher
  actor: `spawn` (start one under the launcher), `launcher` (the launcher process, and its
  fork server), `forks` (the fork server's client), `proc` (what the system says of a process
  and an attempt's folder), `users` (OS users).

An executor knows processes and machines, not policy. The control loop tells it to start an
attempt (one process per gang member, where the core placed it), to give one notice, or to kill
one; it asks which attempts run now, which have ended, and which nodes there are. Where an
attempt runs is the executor's business: the loop stores the executor's `Handle` for each
attempt without reading it, and gives it back after a restart (`adopt`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from gpupool.model import Node, Placement
from gpupool.settle import Usage

if TYPE_CHECKING:
    from gpupool.executors.users import JobUser

Key = tuple[int, int]
"""(job id, attempt)."""

Handle = dict[str, Any]
"""How the executor finds an attempt again, even from another scheduler process: JSON it alone
reads (the local executor's launcher pid and start time; Ray's actor names)."""


@dataclass(frozen=True, slots=True)
class Member:
    """One process of an attempt's gang: on one node, seeing that node's GPUs of the placement.
    `rank` is the member's place in the gang (0 is where the rendezvous is)."""

    rank: int
    node: str
    gpus: tuple[int, ...]


def executor_of(handle: Handle | None) -> str | None:
    """Which executor made a handle: `local` or `ray` (handles from before they said so are
    the local executor's, with a pid)."""
    if handle is None:
        return None
    kind = handle.get("executor")
    if isinstance(kind, str):
        return kind
    return "local" if "pid" in handle else None


def members_of(placement: Placement) -> tuple[Member, ...]:
    """One member per node of the placement, ranked in the placement's order."""
    return tuple(Member(rank, a.node, tuple(a.gpus)) for rank, a in enumerate(placement))


@dataclass(frozen=True, slots=True)
class Resources:
    """What a job asked for besides GPUs, in Slurm's terms; None is the pool's default."""

    mem: int | None = None
    """Bytes on each node (`--mem`)."""
    mem_per_gpu: int | None = None
    """Bytes for each GPU (`--mem-per-gpu`)."""
    cpus_per_gpu: float | None = None
    """CPUs for each GPU (`--cpus-per-gpu`)."""


@dataclass(frozen=True, slots=True)
class Launch:
    """Everything needed to start one attempt of a job."""

    job_id: int
    attempt: int
    command: Sequence[str]
    workdir: Path
    env: Mapping[str, str]
    """The job's own variables plus the job protocol's (`GPUPOOL_*`); what differs per member
    (GPUs, rank, rendezvous) is `member_env`'s."""
    attempt_dir: Path
    """Logs, the notice file and the exit status of this attempt."""
    members: tuple[Member, ...] = ()
    stdout: Path | None = None
    stderr: Path | None = None
    """Where rank 0's output goes (appended); None is `stdout.log`/`stderr.log` in `attempt_dir`."""
    user: JobUser | None = None
    """The OS user it runs as; None for the scheduler's own."""
    resources: Resources = Resources()
    tty: bool = False
    """Rank 0 runs on a terminal its launcher serves (a shell session): `Executor.terminal`."""

    def member_env(self, member: Member, master_addr: str, master_port: int) -> dict[str, str]:
        """A member's environment: `CUDA_VISIBLE_DEVICES` for its GPUs, in NVML's order (the
        PCI bus's, as gpupool numbers GPUs and fences their device nodes: CUDA's own default
        order, fastest first, may name another GPU by the same number), and the variables
        `torch.distributed` (`env://`) and `torchrun --nnodes` read, one process per node."""
        return {
            **self.env,
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in member.gpus),
            "GPUPOOL_NODE": member.node,
            "GPUPOOL_GPUS_ON_NODE": str(len(member.gpus)),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "WORLD_SIZE": str(len(self.members)),
            "RANK": str(member.rank),
            "NODE_RANK": str(member.rank),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
        }


@dataclass(frozen=True, slots=True)
class Started:
    """What `start` returns: the handle to record, and whether every member runs already (a
    gang may wait for its placement; `poll` says when it runs)."""

    handle: Handle
    running: bool
    where: str
    """Where it runs, in a few words for the job's history (`running as pid 4242`); empty when
    it does not run yet (`Progress.running` says where once it does)."""


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
    process to fork, a gang not placed in time): not the job's failure, so it is tried again
    after a back-off."""
    ended_at: float | None = None
    """When it ended, if it ended while no scheduler watched and the executor knows."""
    node_lost: str | None = None
    """Set when it ended because a node it ran on died or hung (what happened, for people):
    an interruption of its own kind, not the job's failure."""
    usage: Usage | None = None
    """What its members used, as their cgroups counted it (summed over members; memory is the
    largest member's peak); None where it was not contained or not counted."""


@dataclass(frozen=True, slots=True)
class Progress:
    """What `poll` found since the last poll: attempts whose every member now runs, and
    attempts that ended (each reported once)."""

    running: dict[Key, str] = field(default_factory=dict)
    """Attempts whose every member runs now, with where they run (`Started.where`)."""
    ended: list[Exit] = field(default_factory=list)
    notes: list[tuple[int, int, str]] = field(default_factory=list)
    """What the executor did that people should see, for the job and attempt it concerns: a
    process an ended attempt left on a GPU, killed."""
    worked: set[Key] = field(default_factory=set)
    """Live attempts whose GPUs worked since the last poll, where the executor can tell (NVML's
    utilization): a session that computes is not idle."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """A live attempt as the store has it, for `adopt` after a restart."""

    job_id: int
    attempt: int
    handle: Handle | None
    """None when the scheduler died between starting it and recording its handle."""
    attempt_dir: Path
    logs: tuple[Path, ...]
    """Where its output went: when it ended unwatched, their last write is its last sign of life."""
    since: float
    """Its last known sign of life in the store (its last heartbeat, or its start)."""
    notice_deadline: float | None
    """A notice recorded for it: given again if the scheduler died before giving it."""


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node as the executor sees it now."""

    node: Node
    virtual: bool = False
    """Its GPUs are not real ones (a laptop, a test cluster): said so in the pool's view."""
    memory: int | None = None
    """Bytes of memory, where the executor knows (a job's `--mem` is checked against it)."""
    cpus: int | None = None
    dirty: tuple[tuple[int, str], ...] = ()
    """Its GPUs that a process of no live attempt holds, with that process (`nvml.describe`):
    kept from new jobs until it ends."""


class Terminal(Protocol):
    """One connection to a member's terminal: frames as `terminal.py` defines them."""

    def send(self, kind: bytes, payload: bytes = b"") -> None: ...

    def receive(self, timeout: float) -> list[tuple[bytes, bytes]] | None:
        """The frames that came within `timeout` s ([] if none); None once the terminal is gone."""
        ...

    def close(self) -> None: ...


class Executor(Protocol):
    def nodes(self) -> list[NodeState]:
        """The nodes that can run attempts now; one that is gone leaves the pool."""
        ...

    def start(self, launch: Launch) -> Started:
        """Start every member of the attempt where the launch says, and return at once."""
        ...

    def notify(self, job_id: int, attempt: int, deadline: float) -> None:
        """Give notice to every member: write the notice file, then SIGTERM its process group."""
        ...

    def kill(self, job_id: int, attempt: int) -> None:
        """SIGKILL every member (its deadline has passed, or it is cancelled)."""
        ...

    def poll(self) -> Progress:
        """Attempts that started running or ended since the last poll."""
        ...

    def adopt(self, recorded: Recorded) -> Started | Exit:
        """After a restart: watch an attempt started by an earlier scheduler if it still runs
        (its handle, and whether every member runs); else how it ended, as far as the executor
        can tell."""
        ...

    def logs(self, job_id: int, attempt: int, rank: int, stream: str, attempt_dir: Path) -> BinaryIO | None:
        """A member's `stdout` or `stderr` in the attempt's folder, open for reading, or None."""
        ...

    def address(self, node: str) -> str:
        """Where the scheduler reaches a server a member runs on `node` (a notebook's): the
        node's address, loopback for this machine; OSError for a node it does not have."""
        ...

    def terminal(self, job_id: int, attempt: int) -> Terminal:
        """A new connection to the terminal of the attempt's rank 0 (`Launch.tty`); OSError when
        it has none, or none any more."""
        ...

    def close(self) -> None:
        """Stop watching: the attempts run on, for the next scheduler to adopt."""
        ...
