"""The store on both backends: SQLite in a file and a real PostgreSQL server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import inspect

from gpupool.errors import Conflict, InvalidInput, NotFound
from gpupool.model import DEFAULT_CLASSES, Allocation, Config, Plan, PriorityBudget, Reason, Start, Team
from gpupool.settle import JobState
from gpupool.store import JobSpec, JobUpdate, Store
from gpupool.store.engine import head, migrate, revision
from tests.support.fakes import two_node_store

CONFIG = Config(
    DEFAULT_CLASSES,
    {"nlp": Team("nlp", 2.0, 8, (PriorityBudget("high", 100.0, 86400.0),)), "vision": Team("vision")},
)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    yield from two_node_store(store_url, CONFIG)


def test_opening_migrates_to_the_newest_schema_and_again_changes_nothing(store: Store) -> None:
    assert revision(store.engine) == head()
    migrate(store.engine)
    assert revision(store.engine) == head()
    tables = set(inspect(store.engine).get_table_names())
    assert {"jobs", "attempts", "placements", "events", "teams", "priority_classes", "nodes"} <= tables


def test_a_submitted_job_is_pending_with_its_event(store: Store) -> None:
    job = store.submit(JobSpec(["python", "train.py"], team="nlp", priority="high", gpus=2), now=10.0)
    assert job.id > 0
    assert store.job(job.id).state == JobState.PENDING.value
    assert store.job(job.id).name == "python"
    events = store.events(job_id=job.id)
    assert [(e.kind, e.time) for e in events] == [("submitted", 10.0)]


def test_jobs_are_listed_by_state_and_team(store: Store) -> None:
    a = store.submit(JobSpec(["a"], team="nlp"), now=1.0)
    b = store.submit(JobSpec(["b"], team="vision"), now=2.0)
    store.cancel(b.id, now=3.0)
    assert [j.id for j in store.jobs(states=[JobState.PENDING])] == [a.id]
    assert [j.id for j in store.jobs(team="vision")] == [b.id]
    assert store.job(b.id).state == JobState.CANCELLED.value


@pytest.mark.parametrize(
    ("spec", "kind", "message"),
    [
        (JobSpec(["x"], team="nobody"), NotFound, "team: unknown team 'nobody'"),
        (
            JobSpec(["x"], priority="vip"),
            NotFound,
            "priority: unknown priority class 'vip' (known: urgent, interactive, high, normal, low)",
        ),
        (JobSpec(["x"], dependencies=[("ok", 999)]), NotFound, "after: no job 999"),
        (JobSpec(["x"], gpus=0), InvalidInput, "gpus: 0 is not a positive number of GPUs"),
        (JobSpec(["x"], gpus=6, gpus_per_node=4), InvalidInput, "gpus_per_node: 6 GPUs do not split into members of 4"),
        (JobSpec([]), InvalidInput, "command: give the command to run"),
    ],
)
def test_bad_submissions_say_what_is_wrong_and_change_nothing(
    store: Store, spec: JobSpec, kind: type[Exception], message: str
) -> None:
    with pytest.raises(kind) as caught:
        store.submit(spec, now=1.0)
    assert str(caught.value) == message
    assert store.jobs() == []
    assert store.events() == []


def test_submissions_share_one_transaction_and_a_bad_one_harms_no_other(store: Store) -> None:
    specs = [JobSpec(["a"], team="nlp"), JobSpec(["b"], team="nobody"), JobSpec(["c"], priority="high")]
    good, bad, other = store.submit_many(specs, now=5.0)
    assert isinstance(bad, NotFound)
    assert "unknown team 'nobody'" in str(bad)
    assert not isinstance(good, Exception)
    assert not isinstance(other, Exception)
    assert [(j.id, j.name) for j in store.jobs()] == [(good.id, "a"), (other.id, "c")]
    assert [e.job_id for e in store.events() if e.kind == "submitted"] == [good.id, other.id]


def test_a_gpu_is_never_held_by_two_live_attempts(store: Store) -> None:
    first = store.submit(JobSpec(["a"], gpus=2), now=1.0)
    second = store.submit(JobSpec(["b"], gpus=2), now=2.0)
    store.start_attempt(first.id, [Allocation("n0", (0, 1))], now=3.0, message="started")
    with pytest.raises(Conflict, match="held by another attempt"):
        store.start_attempt(second.id, [Allocation("n0", (1, 2))], now=4.0, message="started")
    # The refused start changed nothing: the job is still pending, with no attempt.
    assert store.job(second.id).state == JobState.PENDING.value
    assert store.job(second.id).attempts == 0
    assert store.release(first.id, 0, now=5.0) == 2
    store.start_attempt(second.id, [Allocation("n0", (1, 2))], now=6.0, message="started")
    assert sorted((p.node, p.gpu) for p in store.held()) == [("n0", 1), ("n0", 2)]


def test_cancelling_a_running_job_asks_for_its_attempt_to_stop(store: Store) -> None:
    job = store.submit(JobSpec(["a"]), now=1.0)
    store.start_attempt(job.id, [Allocation("n1", (0,))], now=2.0, message="started")
    store.mark_running(job.id, 0, {"pid": 1, "started": "1"}, now=2.0)
    assert store.cancel(job.id, now=3.0).state == JobState.RUNNING.value
    assert [(a.attempt, j.cancel_requested_at) for a, j in store.live_attempts_and_jobs()] == [(0, 3.0)]
    # It left cleanly on SIGTERM: still cancelled, not succeeded.
    assert store.end_attempt(job.id, 0, 0, now=4.0) is JobState.CANCELLED
    with pytest.raises(Conflict, match="already ended"):
        store.cancel(job.id, now=5.0)
    with pytest.raises(NotFound):
        store.job(999)


def test_a_state_change_the_state_machine_forbids_is_refused(store: Store) -> None:
    job = started(store)
    store.give_notice(job, for_job=9, deadline=10.0, now=3.0, message="preempted")
    with pytest.raises(Conflict, match=r"job \d+: cannot go from preempting to preempting"):
        store.give_notice(job, for_job=9, deadline=10.0, now=4.0, message="again")
    assert store.job(job).state == JobState.PREEMPTING.value


def test_configuration_is_synced_and_tokens_survive_a_resync(store: Store) -> None:
    store.sync_config(Config(DEFAULT_CLASSES, {"nlp": Team("nlp", 3.0, 16)}))
    with store.transaction() as s:
        from gpupool.store.schema import BudgetRow, TeamRow

        nlp = s.get(TeamRow, "nlp")
        assert nlp is not None
        assert (nlp.weight, nlp.guaranteed_gpus) == (3.0, 16)
        assert s.query(BudgetRow).count() == 0


def started(store: Store, gpus: int = 1, **spec: object) -> int:
    job = store.submit(JobSpec(["train"], gpus=gpus, **spec), now=1.0)  # type: ignore[arg-type]
    store.start_attempt(job.id, [Allocation("n0", tuple(range(gpus)))], now=2.0, message="started")
    store.mark_running(job.id, 0, {"pid": 4242, "started": "123456"}, now=2.5)
    return job.id


def test_exit_zero_without_notice_succeeds_and_frees_the_gpus(store: Store) -> None:
    job = started(store)
    assert store.job(job).state == JobState.RUNNING.value
    assert store.end_attempt(job, 0, 0, now=10.0) is JobState.SUCCEEDED
    assert store.held() == []
    assert store.job(job).ended_at == 10.0


def test_a_job_given_notice_is_requeued_even_when_it_exits_zero(store: Store) -> None:
    job = started(store, gpus=2)
    store.give_notice(job, for_job=99, deadline=40.0, now=10.0, message="preempted for 99")
    assert store.job(job).state == JobState.PREEMPTING.value
    assert store.end_attempt(job, 0, 0, now=12.0) is JobState.PENDING
    row = store.job(job)
    assert (row.preemptions, row.failures, row.attempts, row.submit_time) == (1, 0, 1, 1.0)
    assert store.held() == []
    kinds = [e.kind for e in store.events(job_id=job)]
    assert kinds == ["submitted", "starting", "running", "preempting", "pending"]


def test_a_requeued_job_waits_from_the_end_of_its_last_attempt_that_ran(store: Store) -> None:
    requeued = started(store, gpus=2)
    store.give_notice(requeued, for_job=99, deadline=40.0, now=10.0, message="preempted")
    store.end_attempt(requeued, 0, 0, now=12.0)
    store.start_attempt(requeued, [Allocation("n0", (0, 1))], now=13.0, message="started")
    store.retry_launch(requeued, 1, now=14.0, why="no process left to fork")
    fresh = store.submit(JobSpec(["train"], gpus=1), now=20.0).id
    pending = {int(j.id): j for j in store.snapshot(now=400.0).pending}
    assert (pending[requeued].queued_at, pending[requeued].waiting_since) == (12.0, 12.0)
    assert (pending[fresh].queued_at, pending[fresh].waiting_since) == (None, 20.0)


def test_a_job_that_waited_on_a_dependency_waits_in_line_from_when_it_was_met(store: Store) -> None:
    first = started(store)
    waiting = store.submit(JobSpec(["train"], gpus=2, dependencies=[("ok", first)]), now=1.5).id
    assert store.end_attempt(first, 0, 0, now=5.0) is JobState.SUCCEEDED
    store.settle_dependencies(now=6.0)
    [pending] = store.snapshot(now=400.0).pending
    assert (int(pending.id), pending.waiting_since) == (waiting, 6.0)


def test_a_job_that_reported_completion_succeeds_even_after_notice(store: Store) -> None:
    job = started(store)
    store.give_notice(job, for_job=99, deadline=40.0, now=10.0, message="preempted")
    store.report_completed(job, 0, now=11.0)
    assert store.end_attempt(job, 0, 143, now=12.0) is JobState.SUCCEEDED


def test_failures_are_retried_within_their_own_budget_then_fail(store: Store) -> None:
    job = started(store, max_failures=1)
    assert store.end_attempt(job, 0, 1, now=5.0) is JobState.PENDING
    store.start_attempt(job, [Allocation("n1", (0,))], now=6.0, message="started")
    store.mark_running(job, 1, {"pid": 4243, "started": "1"}, now=6.5)
    assert store.end_attempt(job, 1, 1, now=7.0) is JobState.FAILED
    assert (store.job(job).failures, store.job(job).exit_code) == (2, 1)


def test_reports_from_an_older_attempt_are_refused(store: Store) -> None:
    job = started(store, max_failures=3)
    store.end_attempt(job, 0, 1, now=5.0)
    store.start_attempt(job, [Allocation("n0", (0,))], now=6.0, message="started")
    for report in (
        lambda: store.heartbeat(job, 0, now=7.0, step=10, phase="train"),
        lambda: store.commit_checkpoint(job, 0, now=7.0, step=10, path="/ckpt"),
        lambda: store.report_completed(job, 0, now=7.0),
        lambda: store.end_attempt(job, 0, 0, now=7.0),
    ):
        with pytest.raises(Conflict, match=r"attempt 0 of job \d+ is not its live attempt"):
            report()


def test_heartbeats_and_commits_are_recorded_on_the_live_attempt(store: Store) -> None:
    job = started(store)
    store.heartbeat(job, 0, now=3.0, step=0, phase="restore")
    row = store.heartbeat(job, 0, now=4.0, step=1, phase="train")
    assert (row.step, row.phase, row.productive_at, row.notice_deadline) == (1, "train", 4.0, None)
    store.commit_checkpoint(job, 0, now=5.0, step=100, path="/ckpt/100")
    store.give_notice(job, for_job=7, deadline=65.0, now=6.0, message="preempted")
    assert store.heartbeat(job, 0, now=7.0, step=101, phase="save").notice_deadline == 65.0
    store.acknowledge(job, 0, now=7.5)
    with store.transaction() as s:
        from gpupool.store.schema import AttemptRow

        attempt = s.get(AttemptRow, (job, 0))
        assert attempt is not None
        assert (attempt.last_checkpoint_at, attempt.acked_at) == (5.0, 7.5)


def test_a_plan_is_recorded_whole_and_the_snapshot_reads_it_back(store: Store) -> None:
    from gpupool.policy import PoolState, decide

    low = store.submit(JobSpec(["sweep"], team="vision", priority="low", gpus=4), now=1.0)
    plan = decide(PoolState.of(store.snapshot(now=2.0)), CONFIG, 2.0)
    assert [s.job for s in plan.starts] == [str(low.id)]
    store.record_plan(plan, now=2.0)
    store.mark_running(low.id, 0, {"pid": 1, "started": "1"}, now=2.0)
    other = store.submit(JobSpec(["sweep"], team="vision", priority="low", gpus=4), now=3.0)
    urgent = store.submit(JobSpec(["pretrain"], team="nlp", priority="urgent", gpus=8), now=500.0)
    snapshot = store.snapshot(now=500.0)
    assert [r.job.id for r in snapshot.running] == [str(low.id)]
    assert [j.id for j in snapshot.pending] == [str(other.id), str(urgent.id)]
    plan = decide(PoolState.of(snapshot), CONFIG, 500.0)
    assert [(p.victim, p.for_job) for p in plan.preemptions] == [(str(low.id), str(urgent.id))]
    store.record_plan(plan, now=500.0)
    assert store.job(low.id).state == JobState.PREEMPTING.value
    assert store.job(other.id).wait_reason == "no_fit"
    again = store.snapshot(now=501.0)
    assert again.running[0].notice is not None
    assert again.running[0].notice.for_job == str(urgent.id)
    # Nothing new is decided while the victim drains: the urgent job holds its placement.
    assert decide(PoolState.of(again), CONFIG, 501.0).preemptions == ()


def test_a_plan_that_would_hold_a_held_gpu_writes_nothing(store: Store) -> None:
    from gpupool.model import Plan, Reason, Start

    a = store.submit(JobSpec(["a"], gpus=1), now=1.0)
    b = store.submit(JobSpec(["b"], gpus=1), now=1.0)
    store.start_attempt(a.id, [Allocation("n0", (0,))], now=2.0, message="started")
    clash = Plan(starts=(Start(str(b.id), (Allocation("n0", (0,)),), "normal", Reason.FREE_GPUS, "started"),))
    with pytest.raises(Conflict, match="nothing was recorded"):
        store.record_plan(clash, now=3.0)
    assert store.job(b.id).state == JobState.PENDING.value
    assert [e.kind for e in store.events(job_id=b.id)] == ["submitted"]


def test_budget_use_is_metered_inside_its_window(store: Store) -> None:
    job = store.submit(JobSpec(["x"], team="nlp", priority="high", gpus=2), now=0.0)
    store.start_attempt(job.id, [Allocation("n0", (0, 1))], now=0.0, message="started")
    store.mark_running(job.id, 0, {"pid": 1, "started": "1"}, now=0.0)
    assert store.snapshot(now=3600.0).usage[("nlp", "high")] == 2 * 3600.0
    store.end_attempt(job.id, 0, 0, now=7200.0)
    # A day's window seen two days later holds only the last day of it: nothing.
    assert store.snapshot(now=7200.0 + 86400.0 * 2).usage[("nlp", "high")] == 0.0


def test_a_cancel_racing_a_start_never_leaves_a_cancelled_job_with_a_live_attempt(store: Store) -> None:
    import threading
    import time

    job = store.submit(JobSpec(["a"], gpus=1), now=1.0)
    in_start = threading.Event()

    def slow_start() -> None:
        with store.transaction() as s:
            store.start_in(s, job.id, [Allocation("n0", (0,))], 2.0, "started")
            in_start.set()
            time.sleep(0.3)  # the cancel arrives while this start is not yet committed

    starter = threading.Thread(target=slow_start)
    starter.start()
    in_start.wait(5)
    store.cancel(job.id, now=2.1)
    starter.join()
    row = store.job(job.id)
    live = [a for a in store.live_attempts() if a.job_id == job.id]
    assert (row.state, row.cancel_requested_at, len(live)) == (JobState.STARTING.value, 2.1, 1)


def test_the_interruption_interval_counts_only_interruptions_the_job_could_not_act_on(store: Store) -> None:
    job = store.submit(JobSpec(["a"], priority="low", max_failures=3), now=0.0)
    store.start_attempt(job.id, [Allocation("n0", (0,))], now=0.0, message="started")
    store.end_attempt(job.id, 0, 1, now=100.0)  # a failure: unannounced
    store.start_attempt(job.id, [Allocation("n0", (0,))], now=110.0, message="started")
    store.give_notice(job.id, for_job=99, deadline=300.0, now=200.0, message="for 99")
    store.acknowledge(job.id, 1, now=205.0)
    store.end_attempt(job.id, 1, 75, now=210.0)  # a notice it acted on: not counted
    store.start_attempt(job.id, [Allocation("n0", (0,))], now=220.0, message="started")  # still running
    assert store.interruption_intervals(since=0.0, now=300.0) == {"low": pytest.approx((100 + 100 + 80) / 1)}
    assert store.interruption_intervals(since=150.0, now=300.0) == {}


def test_an_attempt_says_once_which_checkpoint_it_resumed_from_and_what_it_skipped(store: Store) -> None:
    job = started(store)
    skipped = ["step-000000020: its size differs from the manifest"]
    store.heartbeat(job, 0, 5.0, 10, "train", restored_step=10, restore_seconds=1.5, restore_skipped=skipped)
    store.heartbeat(job, 0, 6.0, 11, "train", restored_step=11, since_commit=3.0)
    [attempt] = store.attempts(job)
    assert (attempt.restored_step, attempt.restore_seconds, attempt.since_commit) == (10, 1.5, 3.0)
    [event] = [e for e in store.events(job_id=job) if e.kind == "restored"]
    assert event.message == f"resumed from the checkpoint of step 10; skipped {skipped[0]}"


def test_a_partial_team_update_changes_only_what_it_gives(store: Store) -> None:
    store.set_team("nlp", token_hash="h1")
    team = store.team("nlp")
    assert team is not None
    assert (team.weight, team.guaranteed_gpus, team.token_hash) == (2.0, 8, "h1")
    store.set_team("nlp", guaranteed_gpus=4)
    team = store.team("nlp")
    assert team is not None
    assert (team.weight, team.guaranteed_gpus, team.token_hash) == (2.0, 4, "h1")


def test_the_snapshot_carries_each_teams_policy_as_the_store_holds_it(store: Store) -> None:
    store.set_team("nlp", guaranteed_gpus=6)  # room in the pool of 8 for vision's
    store.set_team("vision", weight=3.0, guaranteed_gpus=2)
    teams = store.snapshot(now=5.0).teams
    assert teams is not None
    assert (teams["vision"].weight, teams["vision"].guaranteed_gpus) == (3.0, 2)
    assert teams["nlp"].budgets == (PriorityBudget("high", 100.0, 86400.0),)


def test_a_guarantee_that_would_bring_the_teams_above_the_pool_is_refused_and_changes_nothing(store: Store) -> None:
    """nlp holds all 8 GPUs of the pool as its guarantee: vision may not add one, may once nlp
    lowers its own; lowering is always taken. The file may say more (nodes may be down): the
    service warns of it."""
    with pytest.raises(Conflict, match=r"would bring the teams' guarantees to 9 GPUs, and the pool has 8"):
        store.set_team("vision", weight=2.0, guaranteed_gpus=1)
    vision = store.team("vision")
    assert vision is not None and (vision.weight, vision.guaranteed_gpus) == (1.0, 0), "nothing changed"
    assert store.guarantees_over_pool() is None
    store.set_team("nlp", guaranteed_gpus=5)
    assert store.set_team("vision", guaranteed_gpus=3).guaranteed_gpus == 3
    store.sync_config(Config(DEFAULT_CLASSES, {"nlp": Team("nlp", 2.0, 12)}))
    assert store.guarantees_over_pool() == (15, 8)


def test_the_file_seeds_teams_and_what_the_api_set_survives_a_restart_unless_the_file_changed(store: Store) -> None:
    store.set_team("nlp", weight=5.0)
    store.sync_config(CONFIG)  # a restart with the same file: the API's weight stays
    team = store.team("nlp")
    assert team is not None
    assert (team.weight, team.guaranteed_gpus) == (5.0, 8)
    edited = Config(DEFAULT_CLASSES, {"nlp": Team("nlp", 2.0, 12, (PriorityBudget("high", 100.0, 86400.0),))})
    store.sync_config(edited)  # the file's guarantee changed: it wins for that field alone
    team = store.team("nlp")
    assert team is not None
    assert (team.weight, team.guaranteed_gpus) == (5.0, 12)


def test_budget_use_is_metered_at_the_class_the_attempt_ran_at(store: Store) -> None:
    job = store.submit(JobSpec(["train"], team="nlp", priority="high", gpus=2), now=0.0)
    demoted = Plan(starts=(Start(str(job.id), (Allocation("n0", (0, 1)),), "normal", Reason.BUDGET_EXCEEDED, "x"),))
    store.record_plan(demoted, now=0.0)
    usage = store.snapshot(now=3600.0).usage
    assert usage[("nlp", "high")] == 0.0
    [running] = store.snapshot(now=3600.0).running
    assert running.priority == "normal"


def test_a_lost_node_requeues_its_job_apart_from_failures_and_preemptions_while_its_bound_lasts(
    store: Store,
) -> None:
    job = store.submit(JobSpec(["a"], priority="low", gpus=2, max_failures=0), now=0.0)
    for attempt in range(3):
        store.start_attempt(job.id, [Allocation("n0", (0,)), Allocation("n1", (0,))], now=10.0 * attempt, message="s")
        store.heartbeat(job.id, attempt, 10.0 * attempt + 1, 1, "train")
        state = store.end_attempt(
            job.id, attempt, None, 10.0 * attempt + 5, node_lost="node n1 died", max_node_losses=2
        )
        row = store.job(job.id)
        assert (row.failures, row.preemptions, row.node_losses) == (0, 0, attempt + 1)
        assert state is (JobState.PENDING if attempt < 2 else JobState.FAILED)
    messages = [e.message for e in store.events(job_id=job.id)]
    assert "requeued: node n1 died (node loss 1 of 2)" in messages
    assert any(m.startswith("failed: node n1 died, its node loss 3") for m in messages)
    [account] = store.accounts(now=100.0, job_ids=[job.id])
    assert [i.cause for i in account.interruptions] == ["node_lost"] * 3
    assert all(i.wasted > 0 for i in account.interruptions), "the work since its last commit is lost"
    assert store.interruption_intervals(since=0.0, now=100.0) == {"low": pytest.approx(15.0 / 3)}


def test_a_job_held_after_the_decision_read_it_is_not_started_and_nothing_is_recorded(store: Store) -> None:
    """A hold that commits between the loop's read and its write wins: the plan is refused
    whole (the loop decides again), and the job waits, held."""
    job = store.submit(JobSpec(["x"], team="nlp"), now=1.0)
    decided = Plan(starts=(Start(str(job.id), (Allocation("n0", (0,)),), "normal", Reason.FREE_GPUS, "x"),))
    store.hold_job(job.id, 2.0, by_admin=False)
    with pytest.raises(Conflict, match="was held"):
        store.record_plan(decided, now=3.0)
    held = store.job(job.id)
    assert (held.state, held.attempts, held.held_by) == ("pending", 0, "user")
    store.release_hold(job.id, 4.0, by_admin=False)
    store.record_plan(decided, now=5.0)
    assert store.job(job.id).state == "starting"


def test_an_update_that_would_make_jobs_wait_for_each_other_is_refused(store: Store) -> None:
    first = store.submit(JobSpec(["a"], team="nlp"), now=1.0)
    second = store.submit(JobSpec(["b"], team="nlp", dependencies=[("ok", first.id)]), now=2.0)
    third = store.submit(JobSpec(["c"], team="nlp", dependencies=[("any", second.id)]), now=3.0)
    with pytest.raises(InvalidInput, match="would wait for itself"):
        store.update_job(first.id, JobUpdate(dependencies=[("ok", third.id)]), 4.0, by_admin=False)
    with pytest.raises(InvalidInput, match="would wait for itself"):
        store.update_job(first.id, JobUpdate(dependencies=[("ok", first.id)]), 4.0, by_admin=False)
    assert store.job(first.id).dependencies is None
    store.update_job(third.id, JobUpdate(dependencies=[("ok", first.id)]), 5.0, by_admin=False)
    assert store.job(third.id).dependencies == [["ok", first.id]]


def test_a_shell_or_notebook_session_is_stored_on_one_node_whoever_submits_it(store: Store) -> None:
    """Its terminal or server is one process: all its GPUs on one node, never a gang's members,
    though the request named no GPUs per node (the rule is the store's, not only the API's)."""
    shell = store.submit(JobSpec(["bash"], gpus=2, session="shell"), now=0.0)
    batch = store.submit(JobSpec(["train"], gpus=2), now=0.0)
    assert (shell.gpus_per_node, batch.gpus_per_node) == (2, None)
