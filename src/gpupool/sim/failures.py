"""Node failures for a replay: when each node fails and how long its repair takes.

Each node has its own seeded stream, so that adding a node or a job changes no other node's
failures, and a run stays a pure function of its inputs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum


class Distribution(StrEnum):
    EXPONENTIAL = "exponential"
    """Memoryless: the times are drawn with the given means."""
    CONSTANT = "constant"
    """Every time is the mean itself (each node's first failure at a seeded phase)."""


@dataclass(frozen=True, slots=True)
class NodeFailures:
    """Every node fails after `mtbf` seconds up (on average) and is back `repair` seconds
    (on average) after it failed; every attempt with a GPU there is lost (`node_lost`)."""

    mtbf: float
    repair: float
    distribution: Distribution = Distribution.EXPONENTIAL
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.mtbf > 0:
            raise ValueError(f"a node's mean time between failures must be > 0, not {self.mtbf}")
        if not self.repair >= 0:
            raise ValueError(f"a node's repair time must be ≥ 0, not {self.repair}")

    def stream(self, node: str) -> NodeClock:
        return NodeClock(self, random.Random(f"{self.seed}/{node}"))


@dataclass(slots=True)
class NodeClock:
    """One node's failures, drawn as they are needed."""

    failures: NodeFailures
    rng: random.Random
    first: bool = True

    def up_for(self) -> float:
        """Seconds from the start (or from a repair) to the next failure."""
        mean = self.failures.mtbf
        if self.failures.distribution is Distribution.EXPONENTIAL:
            return self.rng.expovariate(1.0 / mean)
        if self.first:
            self.first = False
            return self.rng.uniform(0.0, mean)
        return mean

    def down_for(self) -> float:
        """Seconds a failure keeps the node out."""
        mean = self.failures.repair
        if self.failures.distribution is Distribution.EXPONENTIAL and mean > 0:
            return self.rng.expovariate(1.0 / mean)
        return mean
