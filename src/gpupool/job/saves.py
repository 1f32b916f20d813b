"""How a job's checkpoints are written: in line (training waits), or in the background.

A background save has two phases, as `torch.distributed.checkpoint.async_save` does. Staging
copies the state to CPU memory at the step boundary (`staging.Stager`); only that blocks
training, and only that is the checkpoint's cost in the accounting. Persisting writes the copy,
fsyncs and commits it (manifest last, rename, LATEST, the report to gpupool, prune: the very
protocol of an in-line save) while training goes on; gpupool is told how long that took, as
overlap, apart.

Persisting runs in a thread, not in a process (DCP's `AsyncCheckpointerType.PROCESS`):
- the time goes to `torch.save`'s writer and to fsync, which do not hold the GIL for long:
  measured (benchmarks/checkpoint_overhead.py), a step that leaves the CPU idle, as on a GPU,
  kept its time during a background write; the thread runs at the lowest CPU priority
  (`in_idle_time`), so that a CPU-bound step on two cores was 11 % slower beside it, not 40-70 %;
- a thread dies with the job. A writer process left running after a SIGKILL of the job could
  commit into the checkpoint directory while the next attempt already resumes from it;
- no second copy of the state through shared memory.

At most one save is in flight: the next save, in line or not, waits for it first. A save
abandoned (the job leaves before it could end) never commits after that: the rename that commits
it and the abandoning exclude each other (`InFlight.gate`). In a
torch.distributed job the ranks' background threads agree on a gloo group of their own, never
on the group the training loop's agreement uses (two threads' collectives on one group
interleave and deadlock). The commit happens only once every rank has written its files.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.job import sharded, state
from gpupool.job.checkpoints import Checkpoint, CheckpointDir, CheckpointError, in_idle_time
from gpupool.job.failpoints import failpoint
from gpupool.job.link import SchedulerLink
from gpupool.job.ranks import Ranks
from gpupool.job.staging import Stager

log = logging.getLogger("gpupool.job")


@dataclass(frozen=True)
class Saved:
    """A committed save."""

    step: int
    began: float
    """`time.monotonic()` at the step boundary the state is of."""
    blocked: float
    """Seconds training waited for it (staging only, for a background save)."""
    background: float
    """Seconds it was written and committed after training went on (0 in line)."""
    checkpoint: Checkpoint | None
    """On rank 0."""

    @property
    def whole(self) -> float:
        return self.blocked + self.background


class InFlight:
    """A background save under way."""

    def __init__(self, step: int, began: float, blocked: float) -> None:
        self.step, self.began, self.blocked = step, began, blocked
        self.done = threading.Event()
        self.saved: Saved | None = None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._abandoned = self._renamed = False

    def abandon(self) -> bool:
        """A job leaving before the save could end: it must not commit after this. False if it
        was committed already (renamed into place; its report may still be on its way)."""
        with self._lock:
            self._abandoned = True
            return not self._renamed

    @property
    def abandoned(self) -> bool:
        return self._abandoned

    @contextlib.contextmanager
    def gate(self) -> Iterator[bool]:
        """Around the rename that commits it: whether it may (not once abandoned)."""
        with self._lock:
            if self._abandoned:
                yield False
                return
            yield True
            self._renamed = True


class Saves:
    def __init__(self, checkpoints: CheckpointDir, ranks: Ranks, link: SchedulerLink, *, background: bool) -> None:
        self.checkpoints, self.ranks, self.link, self.background = checkpoints, ranks, link, background
        # Made by every rank alike, as a new group must be.
        self._writers = Ranks() if background else ranks
        self._stager = Stager()
        self.in_flight: InFlight | None = None

    def in_line(self, step: int, files: dict[str, Any]) -> Saved:
        """Write and commit `files` now (after the save in flight, if any); raises on every rank
        when one could not."""
        self.wait()
        began = time.monotonic()
        folder = self._folder(step)
        checkpoint, _ = self._write_and_commit(self.ranks, folder, step, files, None)
        saved = Saved(step, began, time.monotonic() - began, 0.0, checkpoint)
        self._report(saved)
        return saved

    def start(self, step: int, files: dict[str, Any]) -> InFlight:
        """Stage `files` and write them in the background (after the save in flight, if any)."""
        self.wait()
        began = time.monotonic()
        folder = self._folder(step)
        failpoint("save:staging")
        error: Exception | None = None
        try:
            staged = self._stager.stage(files)
        except Exception as exc:  # out of (pinned) memory, a value that cannot be copied
            error = exc
        self._agreed(self.ranks, step, error, "stage")
        flight = InFlight(step, began, time.monotonic() - began)
        thread = threading.Thread(target=self._persist, args=(flight, folder, staged), name="gpupool-save", daemon=True)
        self.in_flight = flight
        thread.start()
        return flight

    def _folder(self, step: int) -> Path:
        """Rank 0's fresh folder for checkpoint `step`, on every rank."""
        return Path(self.ranks.share(str(self.checkpoints.begin(step)) if self.ranks.first else None))

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the save in flight (at most `timeout` seconds); whether none is left."""
        return self.in_flight is None or self.in_flight.done.wait(timeout)

    def ended(self) -> InFlight | None:
        """The background save that ended since the last call, if one did."""
        flight = self.in_flight
        if flight is None or not flight.done.is_set():
            return None
        self.in_flight = None
        return flight

    def _persist(self, flight: InFlight, folder: Path, staged: dict[str, Any]) -> None:
        in_idle_time()
        try:
            checkpoint, committed = self._write_and_commit(self._writers, folder, flight.step, staged, flight)
            if committed:
                finished = time.monotonic()
                background = finished - flight.began - flight.blocked
                flight.saved = Saved(flight.step, flight.began, flight.blocked, background, checkpoint)
                self._report(flight.saved)
        except BaseException as exc:  # the trainer's thread raises it at its next step boundary
            flight.error = exc
        finally:
            flight.done.set()

    def _write_and_commit(
        self, ranks: Ranks, folder: Path, step: int, files: dict[str, Any], flight: InFlight | None
    ) -> tuple[Checkpoint | None, bool]:
        """Every rank writes its files; rank 0 commits once all have. (checkpoint on rank 0,
        whether it was committed, on every rank)."""
        error: Exception | None = None
        try:
            for name, value in files.items():
                if name.startswith("rank-"):
                    failpoint("save:between-files")
                if name == sharded.FOLDER:
                    failpoint("save:shards")
                    sharded.write(folder, value, ranks.group)
                else:
                    state.write(folder / name, value)
        except Exception as exc:
            error = exc
        self._agreed(ranks, step, error, "write")
        checkpoint = None
        if ranks.first:
            try:
                gate = flight.gate if flight is not None else None
                meta = {
                    "world": ranks.world,
                    "sharded": sharded.FOLDER in files,
                    "trained": sorted(files.get(sharded.FOLDER, ())),
                }
                checkpoint = self.checkpoints.commit(folder, step, meta, gate)
            except Exception as exc:
                error = exc
        committed, trouble = ranks.share((checkpoint is not None, None if error is None else str(error)))
        if error is not None:
            raise error
        if trouble is not None:
            raise CheckpointError(f"rank 0 could not commit checkpoint step {step}: {trouble}")
        return checkpoint, bool(committed)

    @staticmethod
    def _agreed(ranks: Ranks, step: int, error: Exception | None, what: str) -> None:
        """Raise on every rank when one could not `what` its part of checkpoint `step`."""
        (failed,) = ranks.agree([float(error is not None)])
        if error is not None:
            raise error
        if failed:
            raise CheckpointError(f"another rank could not {what} its part of checkpoint step {step}")

    def _report(self, saved: Saved) -> None:
        if saved.checkpoint is None:
            return
        path = str(saved.checkpoint.path)
        body = {"step": saved.step, "path": path, "seconds": saved.blocked, "background_seconds": saved.background}
        self.link.report("checkpoint", body)
