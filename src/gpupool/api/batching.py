"""Group commit for submissions: the submissions received by the time a commit begins share it,
so a burst of clients pays one transaction (one log flush on PostgreSQL) per batch, not per job.
A lone submission is written at once, alone. The commit runs in a worker thread: a store that
waits for a lock never holds up the API's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gpupool.store import JobSpec, Store
from gpupool.store.schema import JobRow


class SubmissionWriter:
    def __init__(self, store: Store, clock: Callable[[], float], written: Callable[[], None]) -> None:
        self.store = store
        self.clock = clock
        self.written = written
        """Called after each commit (it wakes the control loop)."""
        self._waiting: list[tuple[JobSpec, asyncio.Future[JobRow]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def submit(self, spec: JobSpec) -> JobRow:
        """The job once it is committed, or the error that says what is wrong with `spec`."""
        done: asyncio.Future[JobRow] = asyncio.get_running_loop().create_future()
        self._waiting.append((spec, done))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write())
        return await done

    async def _write(self) -> None:
        try:
            while self._waiting:
                # One turn of the event loop first: requests already received join this batch.
                await asyncio.sleep(0)
                batch, self._waiting = self._waiting, []
                specs = [spec for spec, _ in batch]
                # In a worker thread: the hand-off costs more than a quick commit, but a commit
                # that waits (a lock held, a slow disk) must not stop every other request.
                results = await asyncio.to_thread(self._commit, specs)
                self.written()
                for (_, done), result in zip(batch, results, strict=True):
                    if done.done():  # its client went away; the job stands, like any submitted one
                        continue
                    if isinstance(result, BaseException):
                        done.set_exception(result)
                    else:
                        done.set_result(result)
        finally:
            self._writer = None

    def _commit(self, specs: list[JobSpec]) -> list[JobRow | BaseException]:
        """One transaction for the batch; if the database refuses it, one per spec, so that a
        spec it refuses fails alone."""
        try:
            return list(self.store.submit_many(specs, self.clock()))
        except Exception as exc:
            if len(specs) == 1:
                return [exc]
        results: list[JobRow | BaseException] = []
        for spec in specs:
            results.extend(self._commit([spec]))
        return results
