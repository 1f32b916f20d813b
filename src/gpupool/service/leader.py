"""One scheduler decides, and only while its data directory and its store are the ones it
started with.

- `lock_data_dir`: an exclusive lock (flock) on `DATA_DIR/lock`, taken before anything is
  decided; a second `gpupool up` on the same data directory is refused. The kernel drops it when
  the process dies, however it dies.
- `StoreLease`: on PostgreSQL, a session advisory lock on a connection of its own, for the whole
  store (several machines may share one store, not one data directory): while its connection
  lives, no other scheduler leads. If the connection is lost, the lease is lost, and the loop
  stops deciding until it has it again.
- `claim_data_dir`: the store's id in `DATA_DIR/store.id`: a data directory last used by another
  store (whose attempts may still run, unknown to this one) is refused.
- `Guard`: asked at every tick; it names what is wrong (the identity file gone or changed, the
  SQLite file replaced or removed, the lease lost), and the loop decides nothing meanwhile.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, Engine, text

from gpupool.errors import GpupoolError

log = logging.getLogger("gpupool.leader")

IDENTITY = "store.id"
LEASE_KEY = 0x67707570_6F6F6C  # "gpupool": one advisory lock per PostgreSQL database


class NotLeader(GpupoolError):
    """Another scheduler uses this data directory or store, or the directory is another store's."""


def lock_data_dir(data_dir: Path) -> int:
    """The open file that holds the data directory's lock (keep it open while running)."""
    path = data_dir / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise NotLeader(
            f"another gpupool up (pid {holder}) uses the data directory {data_dir}: one scheduler per data directory"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class StoreLease:
    """The PostgreSQL store's leader lease: a session advisory lock on a connection kept open."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.connection: Connection | None = None

    def acquire(self) -> bool:
        self.release()
        connection = self.engine.connect()
        # Autocommit: the lock belongs to the session, and no transaction stays open around it.
        connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        if connection.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": LEASE_KEY}).scalar_one():
            self.connection = connection
            return True
        connection.close()
        return False

    def held(self) -> bool:
        if self.connection is None:
            return False
        try:
            query = text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted"
            )
            return bool(self.connection.execute(query).scalar_one())
        except Exception:
            log.exception("the store's leader lease could not be checked")
            return False

    def release(self) -> None:
        if self.connection is not None:
            with contextlib.suppress(Exception):
                self.connection.close()
            self.connection = None


def claim_data_dir(data_dir: Path, store_id: str, fresh_store: bool) -> None:
    """Write the store's id into the data directory, or refuse one that is another store's.
    A data directory from before store ids, with job folders in it, is taken only by the store
    it was used with (one that had jobs when it got its id), not by a fresh one."""
    path = data_dir / IDENTITY
    try:
        found = path.read_text().strip()
    except FileNotFoundError:
        jobs = data_dir / "jobs"
        if fresh_store and jobs.is_dir() and any(jobs.iterdir()):
            raise NotLeader(
                f"the data directory {data_dir} holds job folders of an earlier store, and this store is new: "
                "attempts of the old one may still run, unknown to this one. Use a fresh data_dir"
            ) from None
        partial = path.with_suffix(".tmp")
        partial.write_text(store_id + "\n")
        os.replace(partial, path)
        return
    if found != store_id:
        raise NotLeader(
            f"the data directory {data_dir} belongs to store {found}, and this store is {store_id}: attempts of "
            f"that store may still run, unknown to this one. Use a fresh data_dir, or the store it was used with; "
            f"if no attempt of the old store runs any more, remove {path}"
        )


@dataclass
class Guard:
    data_dir: Path
    store_id: str
    database: Path | None = None
    """The SQLite file, when the store is one: it must stay the file that was opened."""
    lease: StoreLease | None = None
    every: float = 0.5
    """Seconds a verdict stands: the loop may tick many times a second under a burst of
    submissions, and the lease's check is a round trip to the database."""
    clock: Callable[[], float] = time.monotonic
    _fd: int | None = None
    _verdict: tuple[float, str | None] | None = None

    def __post_init__(self) -> None:
        if self.database is not None:
            # Held open (and never closed while SQLite runs, which would drop its locks), so
            # that the file's inode cannot be reused by another one made in its place.
            self._fd = os.open(self.database, os.O_RDONLY)

    def __call__(self) -> str | None:
        now = self.clock()
        if self._verdict is None or now - self._verdict[0] >= self.every:
            self._verdict = (now, self.check())
        return self._verdict[1]

    def check(self) -> str | None:
        try:
            found = (self.data_dir / IDENTITY).read_text().strip()
        except OSError as exc:
            return f"the data directory's identity {self.data_dir / IDENTITY} cannot be read ({exc.strerror})"
        if found != self.store_id:
            return f"{self.data_dir / IDENTITY} names store {found}, not this store ({self.store_id})"
        if self.database is not None and self._fd is not None:
            opened = os.fstat(self._fd)
            try:
                found_file = self.database.stat()
            except OSError as exc:
                return f"the store's file {self.database} is gone ({exc.strerror}): what is written now would be lost"
            if opened.st_nlink == 0 or (found_file.st_dev, found_file.st_ino) != (opened.st_dev, opened.st_ino):
                return f"the store's file {self.database} was replaced by another file"
        if self.lease is not None and not self.lease.held() and not self.lease.acquire():
            return "the store's leader lease is lost: another scheduler may lead"
        return None

    def close(self) -> None:
        """After the store is closed."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
