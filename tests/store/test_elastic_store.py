"""Elastic jobs in the store, on both backends: their sizes, a shrink's and a growth's notice
with the GPUs each keeps, and the next attempt that starts at once on them when the last ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select

from gpupool.errors import Conflict, InvalidInput
from gpupool.model import DEFAULT_CLASSES, Allocation, Config, ElasticPolicy, Grow, Node, Plan, Preempt, Reason, Team
from gpupool.policy import PoolState, decide
from gpupool.settle import JobState
from gpupool.store import JobSpec, Store
from gpupool.store.schema import PlacementRow
from tests.support.fakes import two_node_store

CONFIG = Config(DEFAULT_CLASSES, {"nlp": Team("nlp"), "vision": Team("vision")}, elastic=ElasticPolicy(60.0))
N0 = Allocation("n0", (0, 1, 2, 3))
N1 = Allocation("n1", (0, 1, 2, 3))


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    yield from two_node_store(store_url, CONFIG)


def elastic(store: Store, now: float = 1.0) -> int:
    """A low job of 2 to 8 GPUs, by 2, running at 8 on both nodes."""
    job = store.submit(JobSpec(["train"], team="vision", priority="low", gpus=8, sizes=(2, 4, 6, 8)), now=now)
    plan = decide(PoolState.of(store.snapshot(now)), CONFIG, now)
    assert [(s.job, s.placement) for s in plan.starts] == [(str(job.id), (N0, N1))]
    store.record_plan(plan, now)
    store.give_tokens({job.id: "hash"})
    store.mark_running(job.id, 0, {"pid": 1}, now)
    return job.id


def live_rows(store: Store, job_id: int) -> list[tuple[int, str, int, bool]]:
    with store.reading() as s:
        rows = s.scalars(select(PlacementRow).where(PlacementRow.job_id == job_id, PlacementRow.held_until.is_(None)))
        return sorted((r.attempt, r.node, r.gpu, bool(r.added)) for r in rows)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (JobSpec(["x"], gpus=8, sizes=(2, 4)), "sizes: the largest, 4, is not the job's gpus (8)"),
        (JobSpec(["x"], gpus=8, sizes=(8,)), "sizes: [8] are not two or more numbers of GPUs, smallest first"),
        (
            JobSpec(["x"], gpus=8, sizes=(4, 2, 8)),
            "sizes: [4, 2, 8] are not two or more numbers of GPUs, smallest first",
        ),
        (JobSpec(["x"], gpus=8, gpus_per_node=4, sizes=(2, 8)), "sizes: 2 GPUs do not split into members of 4"),
        (
            JobSpec(["x"], gpus=2, sizes=(1, 2), session="shell"),
            "sizes: a shell session runs at one size; give --gpus N",
        ),
    ],
)
def test_sizes_that_are_not_a_jobs_sizes_are_refused_saying_why(store: Store, spec: JobSpec, message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        store.submit(spec, now=1.0)
    assert str(caught.value) == message
    assert store.jobs() == []


def test_the_core_reads_an_elastic_job_with_its_sizes_and_each_attempt_with_its_own(store: Store) -> None:
    job_id = elastic(store)
    (running,) = store.snapshot(2.0).running
    assert (running.job.sizes, running.job.gpus, running.notice) == ((2, 4, 6, 8), 8, None)
    assert [a.gpus for a in store.attempts(job_id)] == [8]


def test_a_shrink_keeps_its_gpus_while_it_drains_and_its_next_attempt_starts_on_them_at_once(store: Store) -> None:
    job_id = elastic(store)
    high = store.submit(JobSpec(["eval"], team="nlp", priority="high", gpus=2), now=200.0)
    plan = decide(PoolState.of(store.snapshot(200.0)), CONFIG, 200.0)
    (shrink,) = plan.preemptions
    assert (shrink.victim, shrink.for_job, len(shrink.keep)) == (str(job_id), str(high.id), 2)
    assert sum(len(a.gpus) for a in shrink.keep) == 6
    store.record_plan(plan, 200.0)
    (draining,) = store.snapshot(201.0).running
    assert draining.notice is not None and draining.notice.keep == shrink.keep
    assert store.job(job_id).state == JobState.PREEMPTING.value

    assert store.end_attempt(job_id, 0, 0, 210.0) is JobState.STARTING
    resumed = store.attempts(job_id)[1]
    assert (resumed.gpus, resumed.started_at, resumed.token_hash) == (6, 210.0, None)
    assert store.attempts(job_id)[0].outcome == "resized"
    assert store.job(job_id).preemptions == 0, "a resize is no preemption"
    # The loop gives it a token, once, and learns where it runs.
    ((row, placement),) = store.give_tokens({job_id: "h1"}).values()
    assert (row.id, placement) == (job_id, shrink.keep)
    assert store.give_tokens({job_id: "h2"}) == {}
    # The high job starts on what the shrink freed.
    plan = decide(PoolState.of(store.snapshot(211.0)), CONFIG, 211.0)
    assert [s.job for s in plan.starts] == [str(high.id)]
    kept = {(a.node, g) for a in shrink.keep for g in a.gpus}
    assert not kept & {(a.node, g) for a in plan.starts[0].placement for g in a.gpus}


def test_a_growth_holds_the_free_gpus_it_adds_until_its_next_attempt_runs_on_all_of_them(store: Store) -> None:
    spec = JobSpec(["train"], team="vision", priority="low", gpus=8, gpus_per_node=4, sizes=(4, 8))
    job = store.submit(spec, now=1.0)
    store.start_attempt(job.id, [N0], 1.0, "started")
    store.mark_running(job.id, 0, {"pid": 1}, 1.0)
    plan = decide(PoolState.of(store.snapshot(100.0)), CONFIG, 100.0)
    (grow,) = plan.grows
    assert (grow.job, grow.placement) == (str(job.id), (N0, N1))
    store.record_plan(plan, 100.0)
    assert [r for r in live_rows(store, job.id) if r[3]] == [(0, "n1", g, True) for g in range(4)]
    (growing,) = store.snapshot(101.0).running
    assert (growing.placement, growing.holds, growing.job.gpus) == ((N0,), (N0, N1), 4)
    # Nobody else is given the GPUs it grows into.
    other = store.submit(JobSpec(["b"], team="nlp", gpus=1), now=102.0)
    assert decide(PoolState.of(store.snapshot(102.0)), CONFIG, 102.0).starts == ()
    assert store.end_attempt(job.id, 0, 0, 110.0) is JobState.STARTING
    assert live_rows(store, job.id) == [(1, node, g, False) for node in ("n0", "n1") for g in range(4)]
    assert store.attempts(job.id)[1].gpus == 8
    assert store.job(other.id).state == JobState.PENDING.value


def test_a_growth_onto_a_held_gpu_writes_nothing(store: Store) -> None:
    job = store.submit(JobSpec(["train"], team="vision", priority="low", gpus=8, sizes=(4, 8)), now=1.0)
    other = store.submit(JobSpec(["b"], team="nlp", gpus=1), now=1.0)
    store.start_attempt(job.id, [N0], 1.0, "started")
    store.start_attempt(other.id, [Allocation("n1", (0,))], 1.0, "started")
    grow = Grow(str(job.id), 200.0, (N0, N1), "grows")
    with pytest.raises(Conflict, match="nothing was recorded"):
        store.record_plan(Plan(grows=(grow,)), 100.0)
    assert store.attempts(job.id)[0].notice_at is None
    assert [r for r in live_rows(store, job.id) if r[3]] == []


def test_a_resized_job_with_no_run_time_left_ends_at_its_time_limit(store: Store) -> None:
    job = store.submit(
        JobSpec(["train"], team="vision", priority="low", gpus=8, sizes=(4, 8), time_limit=50.0), now=1.0
    )
    store.start_attempt(job.id, [N0, N1], 1.0, "started")
    high = store.submit(JobSpec(["eval"], team="nlp", priority="high", gpus=4), now=60.0)
    shrink = Preempt(str(job.id), str(high.id), 200.0, Reason.PRIORITY, "shrank", keep=(N0,))
    store.record_plan(Plan(preemptions=(shrink,)), 60.0)
    assert store.end_attempt(job.id, 0, 0, 70.0) is JobState.TIMEOUT
    assert live_rows(store, job.id) == []


def test_an_elastic_jobs_account_charges_each_attempt_at_its_size_and_the_resize_as_its_cause(store: Store) -> None:
    job_id = elastic(store)
    store.submit(JobSpec(["eval"], team="nlp", priority="high", gpus=2), now=200.0)
    store.record_plan(decide(PoolState.of(store.snapshot(200.0)), CONFIG, 200.0), 200.0)
    store.end_attempt(job_id, 0, 0, 210.0)
    (account,) = store.accounts(230.0, job_ids=[job_id])
    assert [a.allocated for a in account.attempts] == [8 * 209.0, 6 * 20.0]
    assert [i.cause for i in account.interruptions] == ["resized"]


def test_a_node_that_leaves_while_a_job_grows_onto_it_stops_nothing_and_the_job_goes_back_in_line(
    store: Store,
) -> None:
    spec = JobSpec(["train"], team="vision", priority="low", gpus=8, gpus_per_node=4, sizes=(4, 8))
    job = store.submit(spec, now=1.0)
    store.start_attempt(job.id, [N0], 1.0, "started")
    store.record_plan(decide(PoolState.of(store.snapshot(100.0)), CONFIG, 100.0), 100.0)
    store.sync_nodes([(Node("n0", 4, "virtual"), True)])  # n1 leaves
    (growing,) = store.snapshot(101.0).running
    assert growing.notice is not None and growing.notice.keep == (N0,), "nobody's GPUs are kept"
    PoolState.of(store.snapshot(101.0))  # the core's state takes it
    assert store.end_attempt(job.id, 0, 0, 110.0) is JobState.PENDING
    assert live_rows(store, job.id) == []
    assert "a GPU it kept is gone with its node" in store.events(job_id=job.id)[-1].message


def test_the_pool_shows_what_a_shrink_keeps_as_the_jobs_and_what_it_frees_as_draining(store: Store) -> None:
    job_id = elastic(store)
    high = store.submit(JobSpec(["eval"], team="nlp", priority="high", gpus=2), now=200.0)
    store.record_plan(decide(PoolState.of(store.snapshot(200.0)), CONFIG, 200.0), 200.0)
    _, views = store.pool_view()
    assert {(v.state, v.job, v.for_job) for v in views} == {("allocated", job_id, None), ("draining", job_id, high.id)}
    assert sum(v.state == "draining" for v in views) == 2


def test_the_pool_shows_the_gpus_a_growth_adds_as_held_for_the_job(store: Store) -> None:
    spec = JobSpec(["train"], team="vision", priority="low", gpus=8, gpus_per_node=4, sizes=(4, 8))
    job = store.submit(spec, now=1.0)
    store.start_attempt(job.id, [N0], 1.0, "started")
    store.record_plan(decide(PoolState.of(store.snapshot(100.0)), CONFIG, 100.0), 100.0)
    _, views = store.pool_view()
    assert {(v.node, v.state, v.job, v.for_job) for v in views} == {
        ("n0", "allocated", job.id, None),
        ("n1", "held", None, job.id),
    }
