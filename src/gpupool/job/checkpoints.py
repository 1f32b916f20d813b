"""Checkpoints on disk: an atomic commit, and resume from the newest checkpoint that is whole.

In the job's checkpoint directory ($GPUPOOL_CHECKPOINT_DIR):

    step-000000120/                 committed: its files, and MANIFEST.json written last
    step-000000130.tmp-1-3fa2c9d1/  a save under way, or torn by a crash: never read, removed later
    LATEST                          the name of the newest committed checkpoint

A save writes into a directory of its own, fsyncs every file, writes the manifest (every file
with its size), renames the directory into place (the commit), then moves `LATEST` (for people
and tools); older checkpoints are pruned only after that. The SHA-256 of every file is then
taken in a background thread (DIGESTS.json), so hashing never blocks training. A crash at any point leaves the
newest committed checkpoint as it was. Resume tries every committed checkpoint newest first,
checking each file against its manifest, and sets aside the damaged ones it skipped; it raises
rather than start over when checkpoints exist but none loads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gpupool.job.failpoints import failpoint

log = logging.getLogger("gpupool.job")

MANIFEST = "MANIFEST.json"
DIGESTS = "DIGESTS.json"
LATEST = "LATEST"
FORMAT = 1
COMMITTED = re.compile(r"^step-(\d{9})$")
T = TypeVar("T")


class CheckpointError(RuntimeError):
    """Checkpoints exist but none can be used: resuming from scratch would silently lose them."""


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    manifest: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class Restored:
    """What a resume found: the checkpoint it used, and the newer ones it had to skip, with why."""

    checkpoint: Checkpoint
    skipped: tuple[str, ...] = ()


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory's entry list makes a rename durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically: a temporary file, fsync, rename, fsync of the folder."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    with tmp.open("wb") as stream:
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def in_idle_time() -> None:
    """Run the calling thread at the lowest CPU priority (Linux: nice 19 for this thread alone),
    so that the work it does in the background takes the cores training leaves idle. Measured
    on a CPU-bound training step (benchmarks/checkpoint_overhead.py): a background write at
    normal priority slowed the step by 40-70 % on two cores; at nice 19 by 11 %, the write
    taking longer instead."""
    if sys.platform == "linux":  # elsewhere PRIO_PROCESS would take the thread id for a process id
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def write_digests(folder: Path, names: list[str]) -> None:
    """SHA-256 of a committed checkpoint's files, taken after the commit so that hashing never
    blocks training; a resume checks them when they are there (sizes always)."""
    in_idle_time()
    with contextlib.suppress(OSError):  # pruned meanwhile: nothing left to check
        digests = {name: digest(folder / name) for name in names}
        write_durably(folder / DIGESTS, json.dumps(digests, indent=1).encode())


def digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()


class CheckpointDir:
    def __init__(self, root: Path, *, keep: int = 2, attempt: int = 0) -> None:
        if keep < 1:
            raise ValueError(f"keep: {keep}; keep at least the newest checkpoint")
        self.root = root
        self.keep = keep
        self.attempt = attempt
        self._hashers: list[threading.Thread] = []
        root.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def name(step: int) -> str:
        return f"step-{step:09d}"

    # --- saving -------------------------------------------------------------------------------

    def begin(self, step: int) -> Path:
        """A fresh directory, unique to this save, for the files of checkpoint `step`."""
        tmp = self.root / f"{self.name(step)}.tmp-{self.attempt}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        return tmp

    def commit(
        self,
        tmp: Path,
        step: int,
        meta: dict[str, Any] | None = None,
        gate: Callable[[], contextlib.AbstractContextManager[bool]] | None = None,
    ) -> Checkpoint | None:
        """Make the files written into `tmp` checkpoint `step`: fsync, manifest, rename, LATEST,
        then prune. Every step of it is a failpoint for the crash tests. `gate`, when given, is
        entered around the rename: if it yields False the save is dropped (None), uncommitted."""
        files = {}
        for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
            fsync_path(path)
            files[str(path.relative_to(tmp))] = {"bytes": path.stat().st_size}
        manifest = {"format": FORMAT, "step": step, "attempt": self.attempt, "files": files, **(meta or {})}
        failpoint("save:before-manifest")
        write_durably(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        failpoint("save:before-rename")
        final = self.root / self.name(step)
        if final.exists():
            # The same step saved again: the state at a step boundary is the same, so a whole
            # copy stays and this one goes; a damaged copy is no checkpoint to lose.
            existing = next((c for c in self.committed() if c.path == final), None)
            if existing is not None and self.whole(existing):
                shutil.rmtree(tmp, ignore_errors=True)
                return existing
            self._discard(final)
        with gate() if gate is not None else contextlib.nullcontext(True) as go:
            if not go:
                shutil.rmtree(tmp, ignore_errors=True)
                return None
            os.rename(tmp, final)
        fsync_path(self.root)
        failpoint("save:before-latest")
        write_durably(self.root / LATEST, (final.name + "\n").encode())
        self.prune(keeping=final)
        # Saves far apart (as they are) never overlap their hashing; saves back to back may.
        self._hashers = [h for h in self._hashers if h.is_alive()]
        hasher = threading.Thread(target=write_digests, args=(final, list(files)), daemon=True)
        hasher.start()
        self._hashers.append(hasher)
        return Checkpoint(step, final, manifest)

    def wait_for_digests(self, timeout: float | None = None) -> None:
        """Wait until the digests of the commits so far are written (at most `timeout` seconds each)."""
        for hasher in self._hashers:
            hasher.join(timeout)

    def save(self, step: int, write: Callable[[Path], None], meta: dict[str, Any] | None = None) -> Checkpoint:
        """Checkpoint `step`: `write(folder)` writes its files into a fresh folder, then commit."""
        tmp = self.begin(step)
        write(tmp)
        checkpoint = self.commit(tmp, step, meta)
        assert checkpoint is not None, "no gate: always committed"
        return checkpoint

    def prune(self, keeping: Path) -> None:
        """After the commit of `keeping`: remove committed checkpoints beyond the newest `keep`,
        damaged ones set aside by a resume, and torn saves (a job saves one checkpoint at a time,
        and never runs two attempts at once, so no other save can be under way)."""
        others = [c for c in self.committed() if c.path != keeping]
        for old in others[self.keep - 1 :]:
            failpoint("save:during-prune")
            self._discard(old.path)
        for pattern in ("step-*.damaged-*", "step-*.tmp-*", "step-*.trash-*"):
            for debris in self.root.glob(pattern):
                shutil.rmtree(debris, ignore_errors=True)

    def _discard(self, folder: Path) -> None:
        """Remove a checkpoint folder: renamed first, so that a crash halfway leaves debris the
        next prune removes, never a folder that looks like a checkpoint."""
        trash = folder.with_name(f"{folder.name}.trash-{uuid.uuid4().hex[:8]}")
        os.rename(folder, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def whole(self, checkpoint: Checkpoint) -> bool:
        try:
            self.verify(checkpoint)
        except CheckpointError:
            return False
        return True

    # --- resuming ------------------------------------------------------------------------------

    def committed(self) -> list[Checkpoint]:
        """Committed checkpoints, newest first (a folder without a readable manifest is not one)."""
        found = []
        for path in self.root.iterdir():
            match = COMMITTED.match(path.name)
            if match is None:
                continue
            try:
                manifest = json.loads((path / MANIFEST).read_text())
            except (OSError, ValueError):
                continue
            found.append(Checkpoint(int(match.group(1)), path, manifest))
        return sorted(found, key=lambda c: c.step, reverse=True)

    @staticmethod
    def verify(checkpoint: Checkpoint) -> None:
        """Raise CheckpointError unless every file of the manifest is there with its size, and
        its SHA-256 where the digests were written."""
        try:
            digests = json.loads((checkpoint.path / DIGESTS).read_text())
        except (OSError, ValueError):
            digests = {}
        files = checkpoint.manifest.get("files", {})
        if checkpoint.manifest.get("sharded") and "sharded/.metadata" not in files:  # DCP's, written last
            raise CheckpointError(f"{checkpoint.path} has no sharded/.metadata: its shards were never all written")
        for name, expected in files.items():
            path = checkpoint.path / name
            if not path.is_file():
                raise CheckpointError(f"{path} is missing")
            if path.stat().st_size != expected["bytes"]:
                raise CheckpointError(f"{path} is damaged (its size differs from the manifest)")
            if name in digests and digest(path) != digests[name]:
                raise CheckpointError(f"{path} is damaged (its SHA-256 differs from the one taken at commit)")

    def restore(self, load: Callable[[Checkpoint], T]) -> tuple[Restored, T] | None:
        """Load the newest whole checkpoint with `load`; None when there is no checkpoint at all."""
        candidates = self.committed()
        if not candidates:
            return None
        skipped = []
        damaged = []
        for checkpoint in candidates:
            try:
                self.verify(checkpoint)
            except CheckpointError as exc:
                damaged.append(checkpoint)
                skipped.append(f"{checkpoint.path.name}: {exc}")
                continue
            try:
                value = load(checkpoint)
            except Exception as exc:  # whole on disk, but it does not load (here, now): kept
                log.warning("checkpoint %s cannot be used: %s", checkpoint.path.name, exc)
                skipped.append(f"{checkpoint.path.name}: {exc}")
                continue
            for bad in damaged:
                # Set aside, so that no later resume or prune takes it for a whole checkpoint.
                log.warning("checkpoint %s is damaged; set aside", bad.path.name)
                with contextlib.suppress(FileNotFoundError):  # another rank set it aside first
                    os.rename(bad.path, bad.path.with_name(f"{bad.path.name}.damaged-{self.attempt}"))
            return Restored(checkpoint, tuple(skipped)), value
        raise CheckpointError(
            f"{len(candidates)} checkpoint(s) in {self.root} and none loads; refusing to start over: "
            + "; ".join(skipped)
        )
