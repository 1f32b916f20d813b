"""The closed form of a simulated job's progress, checkpoints and interruptions."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.sim.jobmodel import Attempt, Phase, interrupt

# Resumed attempt: 10 s restore, then 100 s of work between checkpoints, 5 s per save.
ATTEMPT = Attempt(start=0.0, restore=10.0, committed=50.0, work=1000.0, interval=100.0, save_cost=5.0)


def test_finish_time_counts_restore_work_and_every_save_but_the_last() -> None:
    # 950 s of work left: saves after 100, 200, ..., 900 s of it (9 saves).
    assert ATTEMPT.finish_time() == 10 + 950 + 9 * 5


def test_finish_time_without_checkpoints_is_restore_plus_work() -> None:
    attempt = Attempt(0.0, 10.0, 0.0, 300.0, math.inf, 5.0)
    assert attempt.finish_time() == 310.0
    assert attempt.next_commit_after(0.0) is None


@pytest.mark.parametrize(
    ("t", "phase", "progress", "committed", "last_commit"),
    [
        (5.0, Phase.RESTORE, 50.0, 50.0, None),
        (60.0, Phase.TRAIN, 100.0, 50.0, None),
        (112.0, Phase.SAVE, 150.0, 50.0, None),
        (115.0, Phase.TRAIN, 150.0, 150.0, 115.0),
        (225.0, Phase.TRAIN, 255.0, 250.0, 220.0),
    ],
)
def test_progress_at_a_time(
    t: float, phase: Phase, progress: float, committed: float, last_commit: float | None
) -> None:
    now = ATTEMPT.at(t)
    assert (now.phase, now.progress, now.committed, now.last_commit_at) == (
        phase,
        progress,
        committed,
        last_commit,
    )


def test_next_commit_is_the_end_of_the_next_save() -> None:
    assert ATTEMPT.next_commit_after(0.0) == 115.0
    assert ATTEMPT.next_commit_after(115.0) == 220.0


@pytest.mark.parametrize(
    ("t", "grace", "release", "committed", "wasted"),
    [
        (5.0, 60.0, 5.0, 50.0, 0.0),  # during restore: nothing to save (the restore is charged as restart)
        (60.0, 60.0, 65.0, 100.0, 0.0),  # emergency save fits the grace
        (60.0, 2.0, 60.0, 50.0, 50.0),  # it does not: stop at once, lose the work since the commit
        (112.0, 3.0, 115.0, 150.0, 0.0),  # mid-save, the rest of it fits: finish it
        (112.0, 1.0, 112.0, 50.0, 100.0),  # mid-save, it does not fit: the save is lost too
        (115.0, 60.0, 115.0, 150.0, 0.0),  # just committed: nothing new to save
    ],
)
def test_interruption(t: float, grace: float, release: float, committed: float, wasted: float) -> None:
    cut = interrupt(ATTEMPT, t, t + grace)
    assert (cut.release_at, cut.committed, cut.wasted) == (release, committed, wasted)


@settings(max_examples=300, deadline=None)
@given(
    start=st.floats(0, 1e6),
    restore=st.floats(0, 600),
    committed=st.floats(0, 5e4),
    work=st.floats(1, 1e5),
    interval=st.one_of(st.just(math.inf), st.floats(1, 1e4)),
    save_cost=st.floats(0, 300),
    offset=st.floats(0, 1),
)
def test_commits_around_is_the_last_commit_and_the_next(
    start: float, restore: float, committed: float, work: float, interval: float, save_cost: float, offset: float
) -> None:
    """The one-step form the engine follows commits with says what `at` and
    `next_commit_after` say, float for float."""
    attempt = Attempt(start, restore, committed, work, interval, save_cost)
    t = start + offset * (attempt.finish_time() - start)
    if t >= attempt.finish_time():
        return
    assert attempt.commits_around(t) == (attempt.at(t).last_commit_at, attempt.next_commit_after(t))


def test_a_commit_time_that_floor_rounds_across_is_still_found() -> None:
    """Times where floor((t - start) / cycle) rounds to the cycle before a commit computed at
    exactly t: the next commit must still come after t (a driver following commits looped)."""
    found = 0
    for start in (15_520.908, 1e6 / 3, 17_162.968674155385):
        attempt = Attempt(start, 30.0, 0.0, 1e9, 600.0, 10.0)
        for k in range(1, 2000):
            t = attempt.productive_start + k * 610.0
            last, following = attempt.commits_around(t)
            assert last == t and following is not None and following > t
            assert attempt.next_commit_after(t) == following and attempt.at(t).last_commit_at == t
            found += math.floor((t - attempt.productive_start) / 610.0) != k
    assert found, "no time where floor rounds across: the test shows nothing"
