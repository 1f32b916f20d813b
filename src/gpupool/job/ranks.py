"""The ranks of a job: one process alone, or every rank of a torch.distributed job.

Ranks agree through a small all-reduce (MAX) of a few numbers on a CPU gloo group of their own,
made when the `Job` is: no GPU synchronisation, and no collective on the training's group, which
a save or a stop must never interleave with.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any


class Ranks:
    def __init__(self, *, alone: bool = False) -> None:
        """The ranks of torch.distributed's default group, or this process `alone`."""
        self.rank, self.world, self._group = 0, 1, None
        torch = sys.modules.get("torch")
        if torch is None or alone:
            return
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            self._group = dist.new_group(backend="gloo")  # collective: every rank makes it

    def close(self) -> None:
        """Leave torch.distributed, the process being about to end: the group of their own, then
        every other (gloo's threads, left to the interpreter's exit, abort it now and then: exit
        134 where the job left on notice)."""
        if self._group is None:
            return
        import torch

        torch.distributed.destroy_process_group(self._group)
        self._group = None
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    @property
    def group(self) -> Any:
        """The gloo group (None alone)."""
        return self._group

    @property
    def first(self) -> bool:
        return self.rank == 0

    def agree(self, values: Sequence[float]) -> list[float]:
        """The largest of each value over all ranks (alone: the values)."""
        if self._group is None:
            return list(values)
        import torch

        tensor = torch.tensor(list(values), dtype=torch.float64)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX, group=self._group)
        return [float(v) for v in tensor.tolist()]

    def share(self, value: Any) -> Any:
        """Rank 0's `value`, on every rank."""
        if self._group is None:
            return value
        import torch

        box = [value]
        torch.distributed.broadcast_object_list(box, src=0, group=self._group)
        return box[0]
