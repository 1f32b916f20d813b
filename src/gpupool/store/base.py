"""What every part of the store shares: the engine, one transaction per call, and the one
place a job changes state (checked against the state machine, with its event)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session, sessionmaker

from gpupool.errors import Conflict, NotFound
from gpupool.model import job_label
from gpupool.settle import InvalidTransition, JobState, transition
from gpupool.store.engine import read_options
from gpupool.store.schema import EventRow, JobRow, StoreIdentityRow

T = TypeVar("T")


IN_AT_MOST = 10_000
"""Values in one `IN (...)` list: PostgreSQL's driver takes at most 65,535 parameters a query."""


def chunks(values: Iterable[T]) -> Iterator[list[T]]:
    """`values` in lists of at most IN_AT_MOST, for queries that name them in `IN (...)`."""
    items = list(values)
    for start in range(0, len(items), IN_AT_MOST):
        yield items[start : start + IN_AT_MOST]


def indexed(s: Session, columns: str, table: str, index: str, where: str) -> list[Any]:
    """`columns` of the rows of `table` where `where` holds, read through the partial index
    `index` whose condition `where` is, word for word: SQLite plans without statistics and
    would otherwise read every live or pending row."""
    hint = f" INDEXED BY {index}" if s.get_bind().dialect.name == "sqlite" else ""
    return list(s.execute(text(f"SELECT {columns} FROM {table}{hint} WHERE {where}")))


class StoreBase:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._reads = sessionmaker(engine.execution_options(**read_options(engine)), expire_on_commit=False)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        with self._sessions.begin() as session:
            yield session

    @contextmanager
    def reading(self) -> Iterator[Session]:
        """A transaction that only reads: it sees one consistent state and takes no write lock,
        so the API's writes go on while the control loop reads its snapshot."""
        with self._reads.begin() as session:
            yield session

    def identity(self) -> StoreIdentityRow:
        """The store's id (made once, by its migrations) and the first job of its folder layout."""
        with self.reading() as s:
            return s.scalars(select(StoreIdentityRow)).one()

    def labels(self, job_ids: Iterable[int]) -> dict[int, str]:
        """How people name each of these jobs (`model.job_label`); unknown ids are left out."""
        with self.reading() as s:
            return self.labels_in(s, job_ids)

    @staticmethod
    def labels_in(s: Session, job_ids: Iterable[int]) -> dict[int, str]:
        """`labels`, read in the session `s`."""
        wanted = sorted(set(job_ids))
        found: dict[int, str] = {}
        for at in range(0, len(wanted), 500):
            query = select(JobRow.id, JobRow.array_id, JobRow.array_index).where(JobRow.id.in_(wanted[at : at + 500]))
            found.update((job_id, job_label(job_id, array, index)) for job_id, array, index in s.execute(query))
        return found

    @staticmethod
    def locked_job(s: Session, job_id: int) -> JobRow:
        job = s.get(JobRow, job_id, with_for_update=True)
        if job is None:
            raise NotFound(f"no job {job_id}")
        return job

    @staticmethod
    def move(
        s: Session, job: JobRow, to: JobState, now: float, message: str, *, attempt: int | None = None, **data: Any
    ) -> None:
        """Change a job's state as the state machine allows, and record why."""
        try:
            transition(str(job.id), JobState(job.state), to)
        except InvalidTransition as exc:
            raise Conflict(str(exc)) from None
        s.add(
            EventRow(
                time=now,
                kind=to.value,
                job_id=job.id,
                attempt=attempt,
                reason=data.get("reason"),
                message=message,
                data={"from": job.state, **data},
            )
        )
        job.state = to.value
