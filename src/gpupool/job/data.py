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
    """An endless batch sampler of a dataset of `size` items for rank `rank` of `world`. Each
    completed step uses the next `world × batch_size` items of the epoch's order, rank r the
    r-th `batch_size` of them; an epoch ends when fewer than a step's are left (drop last).
    With a `global_batch`, a step uses that many items whatever the world size: each rank takes
    `accumulation` batches of them, and the loop accumulates their gradients (an elastic job
    keeps its global batch, and so its learning rate's meaning, across a resize).
    The position is the items the epoch's completed steps used (`used`): a run resumed at
    another world size or batch size goes on from the very next item, none seen twice and
    none skipped (`resharded`)."""

    def __init__(
        self,
        size: int,
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world: int = 1,
        global_batch: int | None = None,
    ) -> None:
        if size < 1 or batch_size < 1:
            raise ValueError(f"size {size} and batch_size {batch_size} must be positive")
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in a world of {world}")
        if global_batch is not None and (global_batch < 1 or global_batch % (world * batch_size)):
            raise ValueError(
                f"global_batch {global_batch} is not a multiple of {world} ranks x batch_size {batch_size}"
            )
        self.size, self.batch_size, self.seed, self.shuffle = size, batch_size, seed, shuffle
        self.rank, self.world, self.global_batch = rank, world, global_batch
        self.step_items = global_batch or world * batch_size
        """Items one step uses, over every rank."""
        self.accumulation = self.step_items // (world * batch_size)
        """Batches each rank takes in one step, accumulating their gradients before the
        optimizer's step: 1, or, with a `global_batch`, as many as keep it at this world size
        (an elastic job shrunk to half its ranks takes twice as many)."""
        if size < self.step_items:
            raise ValueError(f"{size} items make no whole step of {self.step_items} over {world} ranks")
        self.epoch = 0
        self.used = 0
        """Items of this epoch's order that completed steps used, over every rank."""

    @property
    def position(self) -> int:
        """Steps of this epoch completed, at this world and batch size."""
        return self.used // self.step_items

    def order(self, epoch: int) -> numpy.ndarray:
        """The epoch's order of every item (every rank's)."""
        if self.shuffle:
            return numpy.random.default_rng([self.seed, epoch]).permutation(self.size)
        return numpy.arange(self.size)

    def __iter__(self) -> Iterator[list[int]]:
        epoch, used = self.epoch, self.used
        while True:
            order = self.order(epoch)
            while used + self.step_items <= self.size:
                # Batch k of the step, over every rank: rank r takes the (k x world + r)-th.
                for k in range(self.accumulation):
                    start = used + (k * self.world + self.rank) * self.batch_size
                    yield order[start : start + self.batch_size].tolist()
                used += self.step_items
            epoch, used = epoch + 1, 0

    def advance(self) -> None:
        """One step completed: it used `accumulation` batches on every rank."""
        self.used += self.step_items
        if self.used + self.step_items > self.size:
            self.epoch, self.used = self.epoch + 1, 0

    def resharded(self, state: dict[str, Any]) -> dict[str, Any]:
        """The saved position of a rank of another world size (or batch size), for this rank:
        the same epoch and items used, so that this run goes on from the very next item (which
        rank sees which item differs from an uninterrupted run: not bit-identical)."""
        if state.get("global_batch") != self.global_batch:
            raise ValueError(
                f"the checkpoint's global_batch was {state.get('global_batch')}; this run's is {self.global_batch}"
            )
        used = _used(state)
        epoch = state["epoch"]
        if used + self.step_items > self.size:  # not a whole step left at this size: the next epoch
            epoch, used = epoch + 1, 0
        return {
            **state,
            "rank": self.rank,
            "world": self.world,
            "batch_size": self.batch_size,
            "used": used,
            "epoch": epoch,
        }

    def _setup(self) -> dict[str, Any]:
        keys = ("seed", "size", "batch_size", "shuffle", "rank", "world", "global_batch")
        return {k: getattr(self, k) for k in keys}

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "used": self.used, **self._setup()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = {k: state.get(k) for k in self._setup()}  # an older checkpoint's global_batch is None
        if saved != self._setup():
            raise ValueError(f"the checkpoint's data was {saved}; this run's is {self._setup()}")
        self.epoch, self.used = state["epoch"], _used(state)


def _used(state: dict[str, Any]) -> int:
    """The items used of a saved position; from an older checkpoint, which kept each rank's
    batches (`position`), as many items (they were laid out across the ranks another way)."""
    if "used" in state:
        return int(state["used"])
    return int(state["position"]) * int(state["batch_size"]) * int(state["world"])
