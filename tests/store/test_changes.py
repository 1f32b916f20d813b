"""The change journal and the reads of what changed (store/reads.py, service/snapshots.py), on both
backends: after every kind of write, the kept snapshot is the one a whole read gives, and a
read takes only the jobs that changed, including those of a transaction still open when an
earlier read began."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import func, select

from gpupool.model import DEFAULT_CLASSES, Allocation, Config, Grow, Node, Plan, Preempt, Reason, Team
from gpupool.service.snapshots import KeptSnapshots, SnapshotDrift
from gpupool.store import JobSpec, Store
from gpupool.store.schema import ChangeRow, JobRow
from tests.support.fakes import two_node_store

CONFIG = Config(DEFAULT_CLASSES, {"nlp": Team("nlp", guaranteed_gpus=2), "vision": Team("vision")})


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """Two nodes of 4 GPUs, on SQLite and PostgreSQL."""
    yield from two_node_store(store_url, CONFIG)


def reads_of_changes(store: Store) -> tuple[KeptSnapshots, Callable[[float], None]]:
    """Kept snapshots read whole at 0, and a read of what changed since that checks itself
    against a whole read (SnapshotDrift if a write left no change behind)."""
    snapshots = KeptSnapshots(store, check=True)
    snapshots.read(0.0)

    def read(now: float) -> None:
        snapshots.read(now)
        assert snapshots.read_whole_at == 0.0, "a read of changes, not of everything"

    return snapshots, read


def test_after_every_kind_of_write_the_kept_snapshot_is_a_whole_read(store: Store) -> None:
    snapshots, read = reads_of_changes(store)

    low = store.submit(JobSpec(["sweep"], team="vision", priority="low", gpus=4), now=1.0)
    first = store.submit(JobSpec(["a"], team="nlp", priority="low"), now=1.0)
    after = store.submit(JobSpec(["b"], team="nlp", dependencies=[("ok", first.id)]), now=1.0)
    tasks = store.submit_array(JobSpec(["t"], team="nlp", priority="low", array=[0, 1, 2], array_limit=1), now=1.0)
    read(1.0)
    assert {int(h.job) for h in snapshots.holds.values()} == {after.id, tasks[1].id, tasks[2].id}
    store.start_attempt(low.id, [Allocation("n0", (0, 1, 2, 3))], now=2.0, message="started")
    store.start_attempt(tasks[0].id, [Allocation("n1", (0,))], now=2.0, message="started")
    read(2.0)
    store.mark_running(low.id, 0, {"pid": 1}, now=3.0)
    store.heartbeat(low.id, 0, 10.0, step=5, phase="train")
    read(10.0)
    store.commit_checkpoint(low.id, 0, 20.0, step=10, path="/c/10")
    read(20.0)
    high = store.submit(JobSpec(["pretrain"], team="nlp", priority="high", gpus=4), now=30.0)
    store.give_notice(low.id, high.id, deadline=90.0, now=30.0, message="notice")
    read(30.0)
    store.end_attempt(low.id, 0, 0, now=40.0)  # left after notice: back in line
    read(40.0)
    store.end_attempt(tasks[0].id, 0, 0, now=41.0)  # the array's next task may start
    store.start_attempt(first.id, [Allocation("n1", (1,))], now=41.0, message="started")
    read(41.0)
    assert tasks[1].id not in {int(h.job) for h in snapshots.holds.values()}
    store.retry_launch(first.id, 0, now=42.0, why="fork failed")  # held for a back-off
    read(42.0)
    assert snapshots.holds[first.id].reason is Reason.LAUNCH_RETRY
    read(60.0)  # its back-off over: in line again, with nothing written
    assert first.id not in snapshots.holds
    store.cancel(tasks[2].id, now=61.0)
    store.set_team("vision", weight=2.0, guaranteed_gpus=1)
    read(61.0)
    store.sync_nodes([(Node("n0", 4, "virtual"), True)])  # n1 left: everything is read again
    snapshots.read(62.0)
    assert snapshots.read_whole_at == 62.0


def test_a_read_takes_only_the_jobs_that_changed(store: Store) -> None:
    for i in range(20):
        store.submit(JobSpec([str(i)], team="nlp", priority="low"), now=float(i))
    position = store.read_scheduling(20.0).position
    job = store.submit(JobSpec(["new"], team="vision"), now=21.0)
    read = store.read_scheduling(21.0, since=position)
    assert read.nodes is None
    assert [(j.id, j.pending is not None) for j in read.jobs] == [(job.id, True)]
    store.cancel(job.id, now=22.0)
    [gone] = store.read_scheduling(22.0, since=read.position).jobs
    assert (gone.id, gone.running, gone.pending) == (job.id, None, None)


def test_a_change_committed_after_a_read_began_is_read_next(store: Store) -> None:
    """A transaction that writes before a read and commits after it (PostgreSQL commits in any
    order): its job is in the next read, not lost below the position."""
    snapshots = KeptSnapshots(store, check=True)
    snapshots.read(0.0)
    early = store.submit(JobSpec(["early"], team="nlp"), now=1.0)
    with store.transaction() as s:
        late = s.get(JobRow, early.id)
        assert late is not None
        late.priority = "high"
        s.flush()
        snapshots.read(2.0)  # from another connection: not committed yet
        assert snapshots.state is not None and snapshots.state.line.jobs[str(early.id)].priority == "normal"
    snapshots.read(3.0)
    assert snapshots.state.line.jobs[str(early.id)].priority == "high"


def test_the_journal_is_pruned_of_what_was_read(store: Store) -> None:
    snapshots = KeptSnapshots(store, prune_every=2)
    for i in range(5):
        store.submit(JobSpec([str(i)]), now=float(i))
        snapshots.read(float(i))
    with store.reading() as s:
        left = s.scalar(select(func.count()).select_from(ChangeRow))
    assert left is not None and left <= 2, "changes read twice ago are gone"


def test_a_drift_is_said_and_the_next_read_starts_over(store: Store) -> None:
    snapshots = KeptSnapshots(store, check=True)
    store.submit(JobSpec(["a"]), now=0.0)
    snapshots.read(0.0)
    assert snapshots.state is not None
    snapshots.state.unqueue(next(iter(snapshots.state.line.jobs)))  # what a missed change would do
    store.submit(JobSpec(["b"]), now=1.0)
    with pytest.raises(SnapshotDrift, match="differs from the store in its jobs in line"):
        snapshots.read(1.0)
    snapshots.read(2.0)
    assert snapshots.read_whole_at == 2.0


def test_lists_of_jobs_too_long_for_one_query_are_read_in_parts(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The review found `IN (...)` lists as long as the jobs watched (time limits, arrays,
    dependencies): PostgreSQL's driver refuses a query of more than 65,535 parameters, which
    stopped the loop at every tick on a pool of 70,000 time-limited jobs. Read here two at a time."""
    from gpupool.store import base

    monkeypatch.setattr(base, "IN_AT_MOST", 2)
    spec = JobSpec(["train"], team="nlp", priority="low", time_limit=3600.0)
    limited = [store.submit(spec, now=0.0) for _ in range(5)]
    for i, job in enumerate(limited):
        store.start_attempt(job.id, [Allocation(f"n{i // 4}", (i % 4,))], now=1.0, message="started")
    first = store.submit(JobSpec(["first"], team="vision"), now=2.0)
    after = [store.submit(JobSpec([str(i)], dependencies=[("ok", first.id)]), now=2.0) for i in range(5)]
    tasks = store.submit_array(JobSpec(["t"], team="vision", array=list(range(5)), array_limit=1), now=2.0)
    assert sorted(a.job_id for a, _ in store.watched_attempts()) == [j.id for j in limited]
    snapshots = KeptSnapshots(store, check=True)
    snapshots.read(3.0)
    assert {j.id for j in after} | {t.id for t in tasks[1:]} <= set(snapshots.holds)
    store.submit(JobSpec(["other"]), now=4.0)
    snapshots.read(4.0)  # the watched ones are read again with the change, in parts
    assert not store.settle_dependencies(5.0), "nothing met yet"


def test_after_every_write_of_a_resize_the_kept_snapshot_is_a_whole_read(store: Store) -> None:
    snapshots, read = reads_of_changes(store)

    spec = JobSpec(["train"], team="vision", priority="low", gpus=8, gpus_per_node=4, sizes=(4, 8))
    job = store.submit(spec, now=1.0)
    n0, n1 = Allocation("n0", (0, 1, 2, 3)), Allocation("n1", (0, 1, 2, 3))
    store.start_attempt(job.id, [n0], now=1.0, message="started")
    read(1.0)
    store.record_plan(Plan(grows=(Grow(str(job.id), 90.0, (n0, n1), "grows"),)), now=30.0)
    read(30.0)
    (growing,) = snapshots.read(31.0)[0].running.values()
    assert growing.holds == (n0, n1)
    store.end_attempt(job.id, 0, 0, now=40.0)  # its next attempt, at 8, at once
    read(40.0)
    high = store.submit(JobSpec(["eval"], team="nlp", priority="high", gpus=4), now=50.0)
    store.record_plan(
        Plan(preemptions=(Preempt(str(job.id), str(high.id), 99.0, Reason.PRIORITY, "shrank", (n0,)),)), 50.0
    )
    read(50.0)
    store.end_attempt(job.id, 1, 0, now=60.0)  # its next attempt, at 4, at once
    read(60.0)
    assert [a.gpus for a in store.attempts(job.id)] == [4, 8, 4]
