"""Builders that keep scheduling scenarios short, for gpupool's tests and for yours.

snapshot = Snapshot(
    nodes=pool(nodes=2, gpus=8),
    running=[running(job("a", cls="low", gpus=8), on("n0", *range(8)), started=0)],
    pending=[job("b", cls="high", gpus=8)],
)
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from gpupool.executors import Exit, Launch, NodeState, Progress, Recorded, Started
from gpupool.model import Allocation, Config, Job, Node, Notice, Placement, Plan, RunningJob

if TYPE_CHECKING:
    from gpupool.store import Store


def pool(
    nodes: int = 1, gpus: int = 8, gpu_type: str = "gpu", prefix: str = "n", team: str | None = None
) -> list[Node]:
    """`nodes` identical nodes named f"{prefix}{i}"."""
    return [Node(f"{prefix}{i}", gpus, gpu_type, team) for i in range(nodes)]


def job(
    id: str,
    team: str = "a",
    cls: str = "low",
    gpus: int = 1,
    submit: float = 0.0,
    gpus_per_node: int | None = None,
    gpu_type: str | None = None,
    preemptions: int = 0,
    max_preemptions: int | None = None,
    restart: float = 0.0,
) -> Job:
    return Job(id, team, cls, gpus, submit, gpus_per_node, gpu_type, preemptions, max_preemptions, restart)


def on(node: str, *gpus: int) -> Placement:
    """One allocation: `on("n0", 0, 1)`; add placements with `+` for gangs."""
    return (Allocation(node, tuple(gpus)),)


def running(
    job: Job,
    placement: Placement,
    started: float = 0.0,
    last_ckpt: float | None = None,
    notice_for: str | None = None,
    deadline: float = 0.0,
) -> RunningJob:
    notice = Notice(notice_for, deadline) if notice_for is not None else None
    return RunningJob(job, placement, started, last_ckpt, notice)


def fill(nodes: Iterable[Node], jobs: Iterable[Job], started: float = 0.0) -> list[RunningJob]:
    """Pack `jobs` onto `nodes` in order, lowest GPU ids first (no checkpoints yet)."""
    out = []
    free = [(n.name, list(range(n.gpus))) for n in nodes]
    for j in jobs:
        for name, ids in free:
            if len(ids) >= j.gpus:
                out.append(running(j, on(name, *ids[: j.gpus]), started))
                del ids[: j.gpus]
                break
        else:
            raise ValueError(f"job {j.id} does not fit")
    return out


def summary(plan: Plan) -> list[tuple[object, ...]]:
    """A plan without its prose: what a scenario table compares."""
    rows: list[tuple[object, ...]] = []
    rows += [("start", s.job, tuple((a.node, a.gpus) for a in s.placement), s.reason.value) for s in plan.starts]
    rows += [("preempt", p.victim, p.for_job, p.reason.value) for p in plan.preemptions]
    rows += [("wait", w.job, w.reason.value) for w in plan.waits]
    return rows


class FakeExecutor:
    """An executor without processes: it records what it was told, and a test ends attempts
    with `finish(job, attempt, exit_code)`. With `gang_waits`, a started attempt runs only once
    the test says so (`run(job, attempt)`), as a gang waiting for its placement would. Its
    nodes are `pool` when a test sets it, else those the test put in `store`."""

    def __init__(
        self, store: Store | None = None, pool: Sequence[Node] | None = None, gang_waits: bool = False
    ) -> None:
        self.store = store
        self.pool = pool
        self.gang_waits = gang_waits
        self.started: list[Launch] = []
        self.notified: list[tuple[int, int, float]] = []
        self.killed: list[tuple[int, int]] = []
        self.alive: set[tuple[int, int]] = set()
        self.ended: list[Exit] = []
        self.now_running: dict[tuple[int, int], str] = {}
        self.pids = iter(range(1000, 10**9))
        self.adopted: list[Recorded] = []

    def nodes(self) -> list[NodeState]:
        if self.pool is not None:
            return [NodeState(node) for node in self.pool]
        if self.store is None:
            return []
        return [NodeState(Node(n.name, n.gpus, n.gpu_type, n.team), n.virtual) for n in self.store.nodes()]

    def start(self, launch: Launch) -> Started:
        self.started.append(launch)
        self.alive.add((launch.job_id, launch.attempt))
        pid = next(self.pids)
        return Started({"pid": pid}, not self.gang_waits, f"as pid {pid}")

    def run(self, job_id: int, attempt: int) -> None:
        self.now_running[(job_id, attempt)] = "on the fake's nodes"

    def notify(self, job_id: int, attempt: int, deadline: float) -> None:
        self.notified.append((job_id, attempt, deadline))

    def kill(self, job_id: int, attempt: int) -> None:
        self.killed.append((job_id, attempt))
        self.finish(job_id, attempt, -9)

    def finish(self, job_id: int, attempt: int, exit_code: int | None, *, started: bool = True) -> None:
        if (job_id, attempt) in self.alive:
            self.alive.discard((job_id, attempt))
            self.ended.append(Exit(job_id, attempt, exit_code, started=started))

    def poll(self) -> Progress:
        progress = Progress(self.now_running, self.ended)
        self.now_running, self.ended = {}, []
        return progress

    def adopt(self, recorded: Recorded) -> Started | Exit:
        self.adopted.append(recorded)
        if (recorded.job_id, recorded.attempt) in self.alive:
            return Started(recorded.handle or {}, True, "adopted")
        return Exit(recorded.job_id, recorded.attempt, None)

    def close(self) -> None:
        pass

    def logs(self, job_id: int, attempt: int, rank: int, stream: str, attempt_dir: Path) -> BinaryIO | None:
        try:
            return (attempt_dir / f"{stream}.log").open("rb") if rank == 0 else None
        except OSError:
            return None


def two_node_store(url: str, config: Config) -> Iterator[Store]:
    """A fixture's body: the store at `url` with `config` and two virtual nodes of 4 GPUs, n0
    and n1, closed after the test."""
    from gpupool.store import Store

    store = Store.open(url)
    store.sync_config(config)
    store.set_nodes([Node("n0", 4, "virtual"), Node("n1", 4, "virtual")], virtual=True)
    yield store
    store.close()


def kill_attempts(data_dir: Path) -> None:
    """SIGKILL the process group of every attempt launched under `data_dir` (its launcher names
    its attempt folder; the launcher outlives a SIGTERM by design, so `pkill` would not do)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            group = os.getpgid(int(proc.name))
            if str(data_dir) in command and group != os.getpgid(0):  # never the tests' own group
                os.killpg(group, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def wait_for(condition: Callable[[], bool], timeout: float = 30.0, every: float = 0.02) -> float:
    """Poll `condition` until it holds; return the seconds it took, or fail after `timeout`."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"timed out after {timeout} s")
        time.sleep(every)
    return time.monotonic() - began
