"""An executor without processes, and a small store, for the service's tests and benchmarks."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from gpupool.executors import Exit, Launch, NodeState, Progress, Recorded, Started, Terminal
from gpupool.model import Config, Node
from gpupool.store import Store


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

    def address(self, node: str) -> str:
        return "127.0.0.1"

    def terminal(self, job_id: int, attempt: int) -> Terminal:
        raise OSError("a fake executor runs no process: it has no terminal")


def two_node_store(url: str, config: Config) -> Iterator[Store]:
    """A fixture's body: the store at `url` with `config` and two virtual nodes of 4 GPUs, n0
    and n1, closed after the test."""
    store = Store.open(url)
    store.sync_config(config)
    store.set_nodes([Node("n0", 4, "virtual"), Node("n1", 4, "virtual")], virtual=True)
    yield store
    store.close()
