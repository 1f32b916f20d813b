"""Resuming a job: every rank loads the same checkpoint, the newest that every rank can load.

Rank 0 walks the committed checkpoints newest first (`CheckpointDir.restore`: files checked
against the manifest, damaged ones set aside); for each whole one it asks every rank to load
it, and the ranks agree whether all of them did. A checkpoint some rank cannot load (a shard it
cannot read, a state that does not fit) is skipped by all, and the next older one is tried, as
one process alone would; when none loads, every rank raises rather than start over. A sharded
load is a collective (DCP reads each rank's shards): this walk keeps the ranks in step.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from gpupool.job import sharded, state
from gpupool.job.checkpoints import Checkpoint, CheckpointDir, CheckpointError, Restored
from gpupool.job.ranks import Ranks

log = logging.getLogger("gpupool.job")
T = TypeVar("T")


def resume(checkpoints: CheckpointDir, ranks: Ranks, load: Callable[[Checkpoint], T]) -> tuple[Restored, T] | None:
    """The checkpoint every rank loaded with `load`, and what `load` gave; None when there is none."""
    if ranks.first:

        def everywhere(checkpoint: Checkpoint) -> T:
            ranks.share(("load", checkpoint))
            return _agreed(ranks, load, checkpoint)

        try:
            found = checkpoints.restore(everywhere)
        except CheckpointError as exc:
            ranks.share(("failed", exc))
            raise
        ranks.share(("done", found[0] if found is not None else None))
        return found
    loaded: T | None = None
    while True:
        kind, value = ranks.share(None)
        if kind == "load":
            try:
                loaded = _agreed(ranks, load, value)
            except Exception as exc:  # rank 0 goes on to an older one: so do we
                log.warning("checkpoint %s cannot be used here: %s", value.path.name, exc)
            continue
        if kind == "failed":
            raise value
        return None if value is None else (value, loaded)  # type: ignore[return-value]


def _agreed(ranks: Ranks, load: Callable[[Checkpoint], T], checkpoint: Checkpoint) -> T:
    error: Exception | None = None
    try:
        result = load(checkpoint)
    except Exception as exc:
        error = exc
    (failed,) = ranks.agree([float(error is not None)])
    if error is not None:
        raise error
    if failed:
        raise CheckpointError(f"another rank could not load {checkpoint.path.name}")
    return result


class Loader:
    """Loads a checkpoint into a job's objects (the `load` of `resume`); returns its RNG state."""

    def __init__(self, ranks: Ranks, plain: dict[str, Any], trained: dict[str, sharded.Trained], data: Any) -> None:
        self.ranks, self.plain, self.trained, self.data = ranks, plain, trained, data

    def __call__(self, checkpoint: Checkpoint) -> dict[str, Any]:
        world = checkpoint.manifest.get("world", 1)
        # At another world size (an elastic job resized): every rank loads rank 0's objects, as
        # at the same size (replicated state, as DDP's), DCP reshards sharded state, and each
        # rank takes the random state and data position of a rank that was.
        resharded = world != self.ranks.world
        if resharded and self.data is not None and not hasattr(self.data, "resharded"):
            raise CheckpointError(
                f"{checkpoint.path.name} was written by {world} ranks: `data` must say how its position "
                "moves to another world size (a `resharded` method, as `Batches` has)"
            )
        if bool(checkpoint.manifest.get("sharded")) != bool(self.trained):
            written = "sharded" if checkpoint.manifest.get("sharded") else "not sharded"
            raise CheckpointError(f"{checkpoint.path.name} is {written}; this run's state is the other way")
        objects = state.read(checkpoint.path / "objects.pt")
        # Resharded, a rank takes the random state and data position of a rank that was.
        rank = state.read(checkpoint.path / state.rank_file(self.ranks.rank % world))
        missing = (set(self.plain) - set(objects)) | (set(self.trained) - set(checkpoint.manifest.get("trained", ())))
        if missing:
            raise CheckpointError(f"{checkpoint.path.name} has no state for {', '.join(sorted(missing))}")
        if self.trained:
            sharded.read(checkpoint.path, self.trained, self.ranks.group)
        for name, obj in self.plain.items():
            saved = objects[name]
            # A module copies the mapped tensors into its own; anything else (an optimizer) would
            # keep them, and the file mapped, for the attempt's life: a copy in memory instead.
            obj.load_state_dict(saved if _copies_in(obj) else copy.deepcopy(saved))
        if self.data is not None:
            saved = rank["data"]
            if resharded:
                saved = self.data.resharded(saved)
            self.data.load_state_dict(saved)
        if resharded:
            log.warning(
                "%s resharded from %s ranks to %s: not bit-identical", checkpoint.path.name, world, self.ranks.world
            )
        rng: dict[str, Any] = copy.deepcopy(rank["rng"])
        return rng


def _copies_in(obj: Any) -> bool:
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)
