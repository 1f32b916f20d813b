"""Which nodes of a replay are out for repair, since when, and what their outages cost."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpupool.model import Node
from gpupool.sim.failures import NodeClock, NodeFailures


@dataclass(slots=True)
class Outages:
    """The nodes out for repair, each node's failure clock, and every outage so far."""

    nodes: Sequence[Node]
    failures: NodeFailures
    clocks: dict[str, NodeClock] = field(default_factory=dict)
    down: dict[str, float] = field(default_factory=dict)
    """Nodes out for repair, and since when."""
    outages: list[tuple[str, float, float]] = field(default_factory=list)
    """(node, failed at, back at) of every outage that ended."""
    count: int = 0
    """Node failures so far."""
    down_gpu_seconds: float = 0.0
    """GPU-seconds of nodes out for repair, for the outages that ended."""
    gpus: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.gpus = {node.name: node.gpus for node in self.nodes}
        for node in self.nodes:
            self.clocks[node.name] = self.failures.stream(node.name)

    def up(self) -> tuple[Node, ...]:
        """The nodes not out for repair, in the order of `nodes`: what the core is shown."""
        return tuple(n for n in self.nodes if n.name not in self.down)

    def fail(self, name: str, now: float) -> float:
        """Node `name` fails at `now`; returns when it is back."""
        self.down[name] = now
        self.count += 1
        return now + self.clocks[name].down_for()

    def back(self, name: str, now: float) -> float:
        """Node `name` is back from repair at `now`; returns when it fails next."""
        since = self.down.pop(name)
        self.outages.append((name, since, now))
        self.down_gpu_seconds += (now - since) * self.gpus[name]
        return now + self.clocks[name].up_for()

    def close(self, end: float) -> None:
        """Nodes still out when the last job ended: their outage is counted up to then."""
        for name, since in sorted(self.down.items(), key=lambda item: item[1]):
            self.outages.append((name, since, max(since, end)))
            self.down_gpu_seconds += max(0.0, end - since) * self.gpus[name]
        self.down.clear()
