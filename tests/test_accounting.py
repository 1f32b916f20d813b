"""The accounting of interruptions, on attempts whose costs are worked out by hand."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gpupool.accounting import AttemptRecord, Commit, account, totals


def test_a_victim_that_saved_on_notice_wasted_nothing_and_paid_drain_and_restart() -> None:
    first = AttemptRecord(
        0,
        2,
        allocated_at=0,
        released_at=110,
        productive_at=10,
        notice_at=100,
        commits=(Commit(50, step=40, seconds=2), Commit(108, step=95, seconds=3)),
        outcome="preempted",
        reason="for job 9",
    )
    second = AttemptRecord(
        1,
        2,
        allocated_at=200,
        released_at=300,
        productive_at=215,
        restored_step=95,
        restore_seconds=5,
        outcome="succeeded",
    )
    job = account(1, "nlp", "low", [second, first], now=400)
    a, b = job.attempts
    # The save made after the notice (at 108) is drain, not checkpoint: the buckets add up.
    assert (a.allocated, a.startup, a.checkpoint, a.drain, a.wasted) == (220, 20, 4, 20, 0)
    assert a.productive == 220 - 20 - 4 - 20
    assert (b.startup, b.restore, b.productive) == (30, 10, 170)
    (cut,) = job.interruptions
    assert (cut.at, cut.cause, cut.reason, cut.wasted, cut.drain, cut.restart, cut.delay) == (
        100,
        "preempted",
        "for job 9",
        0,
        20,
        30,
        90,
    )
    assert cut.lost == 50


def test_a_victim_killed_at_its_deadline_redoes_the_work_since_its_last_checkpoint() -> None:
    first = AttemptRecord(
        0,
        4,
        0,
        released_at=130,
        productive_at=10,
        notice_at=100,
        commits=(Commit(60, step=50, seconds=1),),
        outcome="preempted",
    )
    second = AttemptRecord(1, 4, 140, productive_at=150, restored_step=50)
    job = account(1, "nlp", "low", [first, second], now=200)
    (cut,) = job.interruptions
    # From the commit at 60 to the notice at 100: 40 s of work on 4 GPUs is done again.
    assert (cut.wasted, cut.drain, cut.restart) == (160, 120, 40)
    assert job.attempts[1].allocated == 4 * 60  # running: accounted up to now


def test_a_background_save_blocks_only_its_staging_and_work_after_the_staging_is_what_is_redone() -> None:
    # Step 50 staged from 59 to 60 (blocking), written while training went on, committed at 70.
    first = AttemptRecord(
        0,
        2,
        0,
        released_at=130,
        productive_at=10,
        notice_at=100,
        commits=(Commit(70, step=50, seconds=1, background=10),),
        outcome="preempted",
    )
    second = AttemptRecord(1, 2, 140, productive_at=150, restored_step=50)
    job = account(1, "nlp", "low", [first, second], now=200)
    a = job.attempts[0]
    assert (a.checkpoint, a.background) == (2 * 1, 2 * 10), "the write is overlap, apart from the blocking"
    (cut,) = job.interruptions
    assert cut.wasted == 2 * (100 - 60), "from the end of the staging, not from the commit"
    assert a.productive == 2 * (130 - 10 - 1 - 30 - 40)


def test_a_restart_is_broken_down_by_the_phases_the_job_reported_and_they_add_up_to_its_cost() -> None:
    first = AttemptRecord(0, 2, 0, released_at=100, productive_at=10, notice_at=90, outcome="preempted")
    # Allocated at 200, process started at 201.5; 4 s of imports, 2 of restore, 1 of data; the
    # first train heartbeat came at 209 (0.5 s the phases do not cover: other).
    phases = (("imports", 4.0), ("restore", 2.0), ("data position", 1.0))
    second = AttemptRecord(1, 2, 200, productive_at=209, process_started_at=201.5, phases=phases)
    job = account(1, "nlp", "low", [first, second], now=300)
    (cut,) = job.interruptions
    assert cut.restart == 2 * 9
    assert cut.restart_phases == {
        "launch": 2 * 1.5,
        "imports": 2 * 4.0,
        "restore": 2 * 2.0,
        "data position": 2 * 1.0,
        "other": 2 * 0.5,
    }
    assert list(cut.restart_phases) == ["launch", "imports", "restore", "data position", "other"], "in order"
    assert totals([job], key=lambda a: "pool")["pool"].restart_phases == cut.restart_phases
    # Over many jobs, a job's own phase names fold into other: no team reads another's names.
    own = AttemptRecord(1, 1, 200, productive_at=203, phases=(("load s3://secret", 2.0),))
    pooled = totals([account(3, "cv", "low", [first, own], now=300)], key=lambda a: "pool")["pool"]
    assert pooled.restart_phases == {"other": 3.0}
    # A job whose clock runs ahead of the scheduler's says more than the startup: cut to it.
    ahead = AttemptRecord(1, 1, 200, productive_at=203, process_started_at=202.0, phases=(("imports", 5.0),))
    (_, late) = account(2, "nlp", "low", [first, ahead], now=300).attempts
    assert late.phases == {"launch": 2.0, "imports": 1.0}
    assert sum(late.phases.values()) == late.startup


def test_a_failure_without_notice_wastes_up_to_its_end_and_older_checkpoints_waste_it_all() -> None:
    failed = AttemptRecord(0, 1, 0, released_at=100, productive_at=10, commits=(Commit(40, step=30),), outcome="failed")
    retry = AttemptRecord(1, 1, 100, released_at=150, productive_at=110, restored_step=30, outcome="lost")
    third = AttemptRecord(2, 1, 160, productive_at=170, restored_step=30)
    job = account(1, "cv", "normal", [failed, retry, third], now=180)
    first_cut, second_cut = job.interruptions
    assert (first_cut.cause, first_cut.wasted, first_cut.drain, first_cut.restart) == ("failed", 60, 0, 10)
    # Attempt 1 made no checkpoint: attempt 2 resumed from attempt 0's, all of 1's work is lost.
    assert (second_cut.cause, second_cut.wasted, second_cut.restart) == ("lost", 40, 10)


def test_a_job_that_never_says_what_it_restored_is_taken_to_resume_from_its_newest_checkpoint() -> None:
    first = AttemptRecord(
        0, 1, 0, released_at=100, productive_at=0, notice_at=90, commits=(Commit(30), Commit(70)), outcome="preempted"
    )
    job = account(1, "cv", "normal", [first], now=150)
    (cut,) = job.interruptions
    assert (cut.wasted, cut.drain, cut.restart, cut.delay) == (20, 10, None, None)


def test_a_notice_during_startup_is_counted_once() -> None:
    never = AttemptRecord(0, 1, 0, released_at=35, notice_at=15, outcome="preempted")
    late = AttemptRecord(0, 1, 0, released_at=20, productive_at=12, notice_at=5, outcome="preempted")
    for record in (never, late):
        (cost,) = account(1, "cv", "low", [record], now=50).attempts
        parts = (cost.startup, cost.checkpoint, cost.drain, cost.wasted, cost.productive)
        assert sum(parts) == cost.allocated, parts
    assert account(1, "cv", "low", [late], now=50).attempts[0].drain == 8


@given(
    allocated=st.floats(0, 100),
    lengths=st.lists(st.floats(0, 100), min_size=4, max_size=4),
    commits=st.lists(st.tuples(st.floats(0, 400), st.floats(0, 5), st.floats(0, 50)), max_size=4),
    noticed=st.booleans(),
    productive=st.booleans(),
)
@example(0.0, [60.0, 0.0, 0.0, 36.0], [(61.0, 0.0, 1.0), (96.0, 0.0, 36.0)], False, True)  # overlapping writes
def test_the_buckets_of_an_attempt_always_add_up_to_its_allocation(
    allocated: float, lengths: list[float], commits: list[tuple[float, float, float]], noticed: bool, productive: bool
) -> None:
    productive_at = allocated + lengths[0]
    notice_at = productive_at + lengths[1] - lengths[2] if noticed else None
    released_at = max(productive_at, notice_at or 0) + lengths[3]
    record = AttemptRecord(
        0, 2, allocated, released_at, productive_at if productive else None, notice_at,
        commits=tuple(
            Commit(allocated + t, seconds=d, background=b) for t, d, b in commits if allocated + t <= released_at
        ),
        outcome="preempted" if noticed else "failed",
    )  # fmt: skip
    (cost,) = account(1, "t", "low", [record], now=released_at).attempts
    parts = (cost.startup, cost.checkpoint, cost.drain, cost.wasted, cost.productive)
    assert all(p >= 0 for p in parts)
    assert sum(parts) == pytest.approx(cost.allocated)
    assert 0 <= cost.background <= cost.allocated - cost.startup - cost.drain + 1e-9


def test_background_writes_whose_reports_overlap_count_their_time_once() -> None:
    """The job reports each background write's length; two that say they went on at once (a
    job may start one before the last ends, or misreport) overlapped training only once."""
    commits = (Commit(61, background=1), Commit(96, background=36), Commit(90, background=10))
    record = AttemptRecord(0, 2, 0, released_at=96, productive_at=60, commits=commits, outcome="succeeded")
    (cost,) = account(1, "t", "low", [record], now=96).attempts
    assert cost.background == 2 * 36


def test_totals_give_goodput_per_team_and_for_the_pool() -> None:
    done = AttemptRecord(0, 2, 0, released_at=100, productive_at=20, outcome="succeeded")
    cut = AttemptRecord(0, 1, 0, released_at=50, productive_at=0, notice_at=50, outcome="preempted")
    jobs = [account(1, "a", "high", [done], now=100), account(2, "b", "low", [cut], now=100)]
    by_team = totals(jobs, lambda j: j.team)
    assert by_team["a"].goodput == pytest.approx(160 / 200)
    assert by_team["b"].goodput == 0.0
    pool = totals(jobs, lambda _: "pool")["pool"]
    assert (pool.jobs, pool.allocated, pool.productive, pool.interruptions, pool.lost) == (2, 250, 160, 1, 50)
    assert pool.causes == {"preempted": 1}


def test_a_job_that_never_reports_has_unreported_time_not_startup_and_no_goodput() -> None:
    """`sleep 30` on 4 GPUs: it succeeded, but said nothing of its progress."""
    quiet = AttemptRecord(0, 4, allocated_at=0, released_at=30, outcome="succeeded", reported=False)
    job = account(1, "nlp", "low", [quiet], now=60)
    [a] = job.attempts
    assert (a.allocated, a.unreported, a.startup, a.productive, a.wasted) == (120, 120, 0, 0, 0)
    assert job.goodput is None
    pool = totals([job], lambda _: "pool")["pool"]
    assert (pool.unreported, pool.goodput) == (120, None)


def test_an_unreported_job_preempted_pays_its_drain_and_nothing_it_cannot_know() -> None:
    first = AttemptRecord(0, 2, 0, 50, notice_at=40, outcome="preempted", reported=False)
    second = AttemptRecord(1, 2, 60, 100, outcome="succeeded", reported=False)
    job = account(1, "nlp", "low", [first, second], now=100)
    assert [(a.unreported, a.drain) for a in job.attempts] == [(100, 0), (80, 0)]
    [cut] = job.interruptions
    assert (cut.wasted, cut.drain, cut.restart) == (0, 20, 0)


def test_goodput_counts_only_the_time_jobs_reported_on() -> None:
    quiet = account(1, "a", "low", [AttemptRecord(0, 1, 0, 100, outcome="succeeded", reported=False)], now=100)
    busy = account(2, "a", "low", [AttemptRecord(0, 1, 0, 100, productive_at=0, outcome="succeeded")], now=100)
    assert totals([quiet, busy], lambda _: "pool")["pool"].goodput == 1.0


def test_a_job_that_never_reports_and_was_preempted_has_no_goodput_not_zero() -> None:
    quiet = AttemptRecord(0, 2, 0, 50, notice_at=40, outcome="preempted", reported=False)
    job = account(1, "nlp", "low", [quiet], now=60)
    assert job.goodput is None
    [cut] = job.interruptions
    assert cut.drain == 2 * 10
