"""Group commit of submissions: concurrent ones share a transaction, each gets its own answer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from gpupool.api.batching import SubmissionWriter
from gpupool.errors import GpupoolError, NotFound
from gpupool.model import DEFAULT_CLASSES, Config
from gpupool.store import JobSpec, Store
from gpupool.store.schema import JobRow


class CountingStore(Store):
    """A real store that remembers the size of each batch, and can be made to fail once."""

    batches: list[int]
    fail_next: bool = False

    def submit_many(self, specs: Sequence[JobSpec], now: float) -> list[JobRow | GpupoolError]:
        self.batches.append(len(specs))
        if self.fail_next:
            self.fail_next = False
            raise OSError("disk full")
        return super().submit_many(specs, now)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CountingStore]:
    store = CountingStore.open(f"sqlite:///{tmp_path / 'gpupool.db'}")
    assert isinstance(store, CountingStore)
    store.batches = []
    store.sync_config(Config(DEFAULT_CLASSES))
    yield store
    store.close()


def test_concurrent_submissions_share_a_commit_and_each_gets_its_own_answer(store: CountingStore) -> None:
    woken = []
    writer = SubmissionWriter(store, lambda: 7.0, lambda: woken.append(True))

    async def burst() -> list[JobRow | BaseException]:
        specs = [JobSpec([f"job{i}"]) for i in range(5)] + [JobSpec(["bad"], team="nobody")]
        return await asyncio.gather(*(writer.submit(spec) for spec in specs), return_exceptions=True)

    *jobs, bad = asyncio.run(burst())
    assert isinstance(bad, NotFound)
    assert [j.name for j in jobs if isinstance(j, JobRow)] == [f"job{i}" for i in range(5)]
    assert store.batches == [6]
    assert woken == [True]
    assert all(j.submit_time == 7.0 for j in store.jobs())


def test_a_failed_commit_fails_its_batch_only_and_a_gone_client_breaks_nothing(store: CountingStore) -> None:
    writer = SubmissionWriter(store, lambda: 1.0, lambda: None)

    async def scenario() -> tuple[BaseException | None, str]:
        store.fail_next = True
        failed = await asyncio.gather(writer.submit(JobSpec(["lost"])), return_exceptions=True)
        gone = asyncio.create_task(writer.submit(JobSpec(["orphan"])))
        await asyncio.sleep(0)
        gone.cancel()
        later = await writer.submit(JobSpec(["later"]))
        error = failed[0] if isinstance(failed[0], BaseException) else None
        return error, later.name

    error, later = asyncio.run(scenario())
    assert isinstance(error, OSError)
    assert later == "later"
    # The orphan's client went away after it was queued: its job was still written, once.
    assert sorted(j.name for j in store.jobs()) == ["later", "orphan"]


def test_a_spec_the_database_refuses_fails_alone(store: CountingStore) -> None:
    writer = SubmissionWriter(store, lambda: 1.0, lambda: None)
    poison = JobSpec(["poison"], max_failures=10**20)  # past any integer column

    async def burst() -> list[JobRow | BaseException]:
        specs = [JobSpec(["a"]), poison, JobSpec(["b"])]
        return await asyncio.gather(*(writer.submit(spec) for spec in specs), return_exceptions=True)

    first, refused, last = asyncio.run(burst())
    assert isinstance(refused, Exception)
    assert isinstance(first, JobRow)
    assert isinstance(last, JobRow)
    assert sorted(j.name for j in store.jobs()) == ["a", "b"]
    assert store.batches == [3, 1, 1, 1]
