"""Persistence: SQLite in the data directory by default, PostgreSQL by URL.

`Store` is one object with every operation; each call is one transaction, and rows come back
detached (plain values, safe to read after it), never bound to a session.
"""

from __future__ import annotations

from gpupool.store.accounts import AccountsStore
from gpupool.store.changes import ChangesStore, JobUpdate
from gpupool.store.engine import migrate, open_engine
from gpupool.store.jobs import JobSpec, JobsStore
from gpupool.store.pool import DEFAULT_TEAM, UNCHANGED, PoolStore
from gpupool.store.reports import ReportsStore
from gpupool.store.scheduling import SchedulingStore
from gpupool.store.telemetry import TelemetryStore
from gpupool.store.views import ViewsStore

__all__ = ["DEFAULT_TEAM", "UNCHANGED", "JobSpec", "JobUpdate", "Store"]


class Store(
    PoolStore, JobsStore, SchedulingStore, ReportsStore, ChangesStore, AccountsStore, ViewsStore, TelemetryStore
):
    @classmethod
    def open(cls, url: str) -> Store:
        """Connect to `url` and bring its schema to the newest revision. A store that cannot be
        reached raises StoreUnavailable (one line: the URL, password masked, and why)."""
        engine = open_engine(url)
        migrate(engine)
        return cls(engine)
