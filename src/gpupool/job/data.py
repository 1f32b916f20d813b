"""Batches that resume exactly: the position in the data is kept in index space.

`Batches` is an endless batch sampler (indices, epoch after epoch) for a dataset of `size`
items. Each epoch's order comes from its own generator, seeded by (seed, epoch), never from the
global RNG, so a resumed run sees the same order. The position moves when a step completes
(`Job` calls `advance()`), not when a batch is fetched, so a DataLoader's workers may prefetch
ahead freely: a resume starts at the first batch no completed step used.

    batches = Batches(len(dataset), batch_size=32, seed=1)
    loader = DataLoader(dataset, batch_sampler=batches)   # or: for indices in batches
    job = Job(model=model, optimizer=optimizer, data=batches)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy


class Batches:
    def __init__(
        self, size: int, batch_size: int, *, seed: int = 0, shuffle: bool = True, rank: int = 0, world: int = 1
    ) -> None:
        if size < 1 or batch_size < 1:
            raise ValueError(f"size {size} and batch_size {batch_size} must be positive")
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in a world of {world}")
        self.size, self.batch_size, self.seed, self.shuffle = size, batch_size, seed, shuffle
        self.rank, self.world = rank, world
        self.per_epoch = size // world // batch_size
        if self.per_epoch < 1:
            raise ValueError(f"{size} items make no whole batch of {batch_size} for each of {world} ranks")
        self.epoch = 0
        self.position = 0
        """Batches of this epoch used by completed steps."""

    def order(self, epoch: int) -> numpy.ndarray:
        """This rank's indices for `epoch` (the drop-last part of an uneven split is left out)."""
        indices = numpy.arange(self.size)
        if self.shuffle:
            indices = numpy.random.default_rng([self.seed, epoch]).permutation(self.size)
        used = self.per_epoch * self.batch_size * self.world
        return indices[:used][self.rank :: self.world]

    def __iter__(self) -> Iterator[list[int]]:
        epoch, position = self.epoch, self.position
        while True:
            order = self.order(epoch)
            for start in range(position * self.batch_size, len(order), self.batch_size):
                yield order[start : start + self.batch_size].tolist()
            epoch, position = epoch + 1, 0

    def advance(self) -> None:
        """One step completed: it used one batch."""
        self.position += 1
        if self.position == self.per_epoch:
            self.epoch, self.position = self.epoch + 1, 0

    def resharded(self, state: dict[str, Any]) -> dict[str, Any]:
        """The saved position of a rank of another world size, for this rank: the same epoch,
        and as many of its items used in all, rounded down to whole batches of this world
        (a few items may be seen twice; which rank sees which item differs from an
        uninterrupted run, so the run is not bit-identical)."""
        used = state["position"] * state["batch_size"] * state["world"]
        position = min(used // (self.batch_size * self.world), self.per_epoch - 1)
        return {**state, "rank": self.rank, "world": self.world, "batch_size": self.batch_size, "position": position}

    def _setup(self) -> dict[str, Any]:
        keys = ("seed", "size", "batch_size", "shuffle", "rank", "world")
        return {k: getattr(self, k) for k in keys}

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, **self._setup()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = {k: state.get(k) for k in self._setup()}
        if saved != self._setup():
            raise ValueError(f"the checkpoint's data was {saved}; this run's is {self._setup()}")
        self.epoch, self.position = state["epoch"], state["position"]
