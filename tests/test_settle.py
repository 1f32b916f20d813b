"""The one rule of an attempt's end, as the store and the simulator apply it."""

from __future__ import annotations

import pytest

from gpupool.settle import AttemptEnd, AttemptOutcome, JobCounts, JobState, settle

CASES = [
    (AttemptEnd(0), JobCounts(), AttemptOutcome.SUCCEEDED, JobState.SUCCEEDED),
    (AttemptEnd(1, completed=True), JobCounts(), AttemptOutcome.SUCCEEDED, JobState.SUCCEEDED),
    (AttemptEnd(0, noticed=True), JobCounts(), AttemptOutcome.PREEMPTED, JobState.PENDING),
    (AttemptEnd(0, completed=True, noticed=True), JobCounts(), AttemptOutcome.SUCCEEDED, JobState.SUCCEEDED),
    (AttemptEnd(0, cancel_requested=True), JobCounts(), AttemptOutcome.CANCELLED, JobState.CANCELLED),
    (AttemptEnd(0, completed=True, cancel_requested=True), JobCounts(), AttemptOutcome.SUCCEEDED, JobState.SUCCEEDED),
    (AttemptEnd(143, timed_out=True), JobCounts(time_limit=60), AttemptOutcome.TIMEOUT, JobState.TIMEOUT),
    (AttemptEnd(None), JobCounts(), AttemptOutcome.LOST, JobState.PENDING),
    (AttemptEnd(1), JobCounts(max_failures=1), AttemptOutcome.FAILED, JobState.PENDING),
    (AttemptEnd(1), JobCounts(failures=1, max_failures=1), AttemptOutcome.FAILED, JobState.FAILED),
    (AttemptEnd(None, node_lost="node n1 died"), JobCounts(), AttemptOutcome.NODE_LOST, JobState.PENDING),
    (
        AttemptEnd(None, node_lost="node n1 died"),
        JobCounts(node_losses=3, max_node_losses=3),
        AttemptOutcome.NODE_LOST,
        JobState.FAILED,
    ),
    (AttemptEnd(0, noticed=True), JobCounts(run_seconds=60, time_limit=60), AttemptOutcome.PREEMPTED, JobState.TIMEOUT),
]


@pytest.mark.parametrize(("end", "counts", "outcome", "state"), CASES)
def test_an_attempts_end_settles_its_job(
    end: AttemptEnd, counts: JobCounts, outcome: AttemptOutcome, state: JobState
) -> None:
    settled = settle(end, counts)
    assert (settled.outcome, settled.state) == (outcome, state), settled.message


def test_only_the_outcome_that_is_charged_moves_its_counter() -> None:
    assert settle(AttemptEnd(0, noticed=True), JobCounts(preemptions=2)).preemptions == 3
    failed = settle(AttemptEnd(1), JobCounts(max_failures=3))
    assert (failed.failures, failed.preemptions, failed.node_losses) == (1, 0, 0)
    lost = settle(AttemptEnd(None, node_lost="node n1 died"), JobCounts(failures=1))
    assert (lost.failures, lost.node_losses) == (1, 1)
    assert "node loss 1 of 3" in lost.message


def test_a_persons_requeue_goes_back_in_line_without_counting_as_a_preemption() -> None:
    counts = JobCounts(failures=0, max_failures=0, preemptions=3, node_losses=0, max_node_losses=3)
    requeued = settle(AttemptEnd(75, noticed=True, requeued=True), counts)
    assert (requeued.state, requeued.outcome, requeued.preemptions) == (JobState.PENDING, AttemptOutcome.PREEMPTED, 3)
    assert "requeued by a person" in requeued.message
    preempted = settle(AttemptEnd(75, noticed=True), counts)
    assert preempted.preemptions == 4


def test_a_job_killed_at_its_memory_limit_fails_out_of_memory_with_its_failure_budget() -> None:
    end = AttemptEnd(137, out_of_memory=True)
    retried = settle(end, JobCounts(max_failures=1))
    assert (retried.outcome, retried.state, retried.failures) == (AttemptOutcome.OUT_OF_MEMORY, JobState.PENDING, 1)
    assert retried.message == "failed (out of memory: killed at its memory limit, exit code 137); retry 1 of 1"
    final = settle(end, JobCounts(failures=1, max_failures=1))
    assert (final.outcome, final.state) == (AttemptOutcome.OUT_OF_MEMORY, JobState.FAILED)
    assert final.message == "failed (out of memory: killed at its memory limit, exit code 137)"


def test_a_kill_for_memory_is_no_failure_of_a_job_that_succeeded_or_was_preempted() -> None:
    assert settle(AttemptEnd(0, out_of_memory=True), JobCounts()).outcome == AttemptOutcome.SUCCEEDED
    noticed = settle(AttemptEnd(137, noticed=True, out_of_memory=True), JobCounts())
    assert (noticed.outcome, noticed.state) == (AttemptOutcome.PREEMPTED, JobState.PENDING)
    plain = settle(AttemptEnd(1), JobCounts())
    assert (plain.outcome, plain.message) == (AttemptOutcome.FAILED, "failed (exit code 1)")


def test_an_attempt_that_left_for_a_resize_runs_on_uncounted_unless_its_time_is_up() -> None:
    end = AttemptEnd(0, noticed=True, resized_to=4)
    settled = settle(end, JobCounts(preemptions=2))
    assert (settled.outcome, settled.state, settled.preemptions) == (AttemptOutcome.RESIZED, JobState.STARTING, 2)
    assert settled.message == "resized to 4 GPUs (exit code 0)"
    late = settle(end, JobCounts(run_seconds=3600.0, time_limit=3600.0))
    assert (late.outcome, late.state) == (AttemptOutcome.RESIZED, JobState.TIMEOUT)
