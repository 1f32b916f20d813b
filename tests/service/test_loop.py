"""The control loop with a fake executor: what it records, launches, notifies and kills."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpupool.executors import Launch, NodeState, Started
from gpupool.executors.local import LocalExecutor
from gpupool.model import DEFAULT_CLASSES, Allocation, Config, ElasticPolicy, Node, Team
from gpupool.service.loop import ControlLoop
from gpupool.settle import JobState
from gpupool.store import JobSpec, Store
from tests.support.fakes import FakeExecutor

CONFIG = Config(DEFAULT_CLASSES, {"vision": Team("vision"), "nlp": Team("nlp")})


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(f"sqlite:///{tmp_path / 'gpupool.db'}")
    store.sync_config(CONFIG)
    store.set_nodes([Node("gpu0", 4, "virtual")], virtual=True)
    yield store
    store.close()


@pytest.fixture
def loop(store: Store, tmp_path: Path) -> ControlLoop:
    return ControlLoop(store, CONFIG, FakeExecutor(store), tmp_path / "data", api_url="http://127.0.0.1:1")


def fake(loop: ControlLoop) -> FakeExecutor:
    assert isinstance(loop.executor, FakeExecutor)
    return loop.executor


def restarted(loop: ControlLoop) -> ControlLoop:
    """The loop of a scheduler started again, with the local executor: the attempts' processes
    are gone, and what is known of them is in their folders."""
    loop.executor = LocalExecutor(NodeState(Node("n0", 4)))
    return loop


def ended_while_down(loop: ControlLoop, store: Store, name: str, text: str, at: float) -> int:
    """A job (100 s of time limit, one failure allowed) starts at 0; the file `name` of its
    attempt's folder says `text` and was last written at `at`; the scheduler, down meanwhile,
    starts again at 500 and reconciles. The job's id."""
    job = store.submit(JobSpec(["train"], team="vision", time_limit=100.0, max_failures=1), now=0.0)
    loop.tick(0.0)
    attempt_dir = loop.workspace.attempt_dir(job.id, 0)
    attempt_dir.mkdir(parents=True, exist_ok=True)
    written = attempt_dir / name
    written.write_text(text)
    os.utime(written, (at, at))
    restarted(loop).reconcile(now=500.0)
    return job.id


def test_a_submitted_job_is_launched_with_the_job_protocol(loop: ControlLoop, store: Store) -> None:
    job = store.submit(JobSpec(["python", "train.py"], team="vision", gpus=2, env={"SEED": "1"}), now=0.0)
    assert loop.tick(1.0)
    [launch] = fake(loop).started
    assert (launch.job_id, launch.attempt, list(launch.command)) == (job.id, 0, ["python", "train.py"])
    [member] = launch.members
    env = launch.member_env(member, "10.0.0.1", 29500)
    assert env["SEED"] == "1"
    assert (env["GPUPOOL_JOB_ID"], env["GPUPOOL_ATTEMPT"], env["CUDA_VISIBLE_DEVICES"]) == (str(job.id), "0", "0,1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"], env["RANK"]) == ("10.0.0.1", "29500", "1", "0")
    assert env["GPUPOOL_CHECKPOINT_DIR"] == str(loop.workspace.job_dir(job.id) / "checkpoints")
    assert env["GPUPOOL_NOTICE_FILE"] == str(loop.workspace.job_dir(job.id) / "attempt-0" / "notice")
    assert loop.workspace.job_dir(job.id).name == f"{store.identity().id[:12]}-{job.id}"
    assert len(env["GPUPOOL_TOKEN"]) >= 24
    assert store.job(job.id).state == JobState.RUNNING.value
    assert "GPUPOOL_INTERRUPTION_INTERVAL" not in env, "no interruption yet to measure it by"
    assert not loop.tick(2.0), "nothing left to do"


def test_jobs_are_told_how_often_their_class_was_interrupted_without_warning(loop: ControlLoop, store: Store) -> None:
    job = store.submit(JobSpec(["train"], team="vision", priority="low", max_failures=1), now=0.0)
    loop.tick(0.0)
    fake(loop).finish(job.id, 0, 1)  # failed after 100 s: an interruption it could not act on
    loop.tick(100.0)
    [first, retry] = fake(loop).started
    assert "GPUPOOL_INTERRUPTION_INTERVAL" not in first.env
    assert retry.env["GPUPOOL_INTERRUPTION_INTERVAL"] == "100"


def test_preemption_notice_deadline_kill_requeue_and_resume(loop: ControlLoop, store: Store) -> None:
    low = store.submit(JobSpec(["sweep"], team="vision", priority="low", gpus=4), now=0.0)
    loop.tick(0.0)
    high = store.submit(JobSpec(["pretrain"], team="nlp", priority="high", gpus=4), now=500.0)
    loop.tick(500.0)
    assert fake(loop).notified == [(low.id, 0, 560.0)]
    assert store.job(low.id).state == JobState.PREEMPTING.value
    loop.tick(530.0)
    assert fake(loop).killed == [], "the grace period is not over"
    # The victim ignores its notice: at the deadline it is killed, requeued, and the preemptor starts.
    loop.tick(560.0)
    assert fake(loop).killed == [(low.id, 0)]
    loop.tick(560.0)
    assert store.job(low.id).state == JobState.PENDING.value
    assert store.job(high.id).state == JobState.RUNNING.value
    fake(loop).finish(high.id, 0, 0)
    loop.tick(900.0)
    assert store.job(high.id).state == JobState.SUCCEEDED.value
    assert [(s.job_id, s.attempt) for s in fake(loop).started] == [(low.id, 0), (high.id, 0), (low.id, 1)]
    assert fake(loop).started[-1].env["GPUPOOL_ATTEMPT"] == "1"
    assert fake(loop).started[-1].env["GPUPOOL_CHECKPOINT_DIR"] == fake(loop).started[0].env["GPUPOOL_CHECKPOINT_DIR"]


def test_a_cooperating_victim_frees_its_gpus_before_the_deadline(loop: ControlLoop, store: Store) -> None:
    low = store.submit(JobSpec(["sweep"], team="vision", priority="low", gpus=4), now=0.0)
    loop.tick(0.0)
    high = store.submit(JobSpec(["pretrain"], team="nlp", priority="high", gpus=4), now=500.0)
    loop.tick(500.0)
    fake(loop).finish(low.id, 0, 0)  # saved its checkpoint and left
    loop.tick(500.2)
    assert store.job(high.id).state == JobState.RUNNING.value
    assert store.job(low.id).state == JobState.PENDING.value
    assert fake(loop).killed == []


def test_after_a_restart_live_processes_are_adopted_and_vanished_ones_requeued(
    loop: ControlLoop, store: Store, tmp_path: Path
) -> None:
    a = store.submit(JobSpec(["a"], gpus=2), now=0.0)
    b = store.submit(JobSpec(["b"], gpus=2), now=0.0)
    loop.tick(0.0)
    executor = fake(loop)
    executor.alive.discard((b.id, 0))  # b's process died while the scheduler was down
    restarted = ControlLoop(store, CONFIG, executor, tmp_path / "data")
    restarted.reconcile(10.0)
    assert store.job(a.id).state == JobState.RUNNING.value
    assert store.job(b.id).state == JobState.PENDING.value
    assert store.job(b.id).failures == 0
    restarted.tick(11.0)
    assert store.job(b.id).state == JobState.RUNNING.value
    assert len(store.held()) == 4


def test_one_arrival_preempts_exactly_one_victim_also_while_it_drains(store: Store, tmp_path: Path) -> None:
    store.set_nodes([Node("gpu1", 4, "virtual"), Node("gpu2", 4, "virtual")], virtual=True)
    loop = ControlLoop(store, CONFIG, FakeExecutor(store), tmp_path / "data")
    victims = [store.submit(JobSpec(["sweep"], team="vision", priority="low", gpus=4), now=0.0).id for _ in range(3)]
    loop.tick(0.0)
    assert all(store.job(v).state == JobState.RUNNING.value for v in victims)
    store.submit(JobSpec(["pretrain"], team="nlp", priority="high", gpus=4), now=500.0)
    for now in (500.0, 501.0, 510.0, 530.0):  # the victim drains; later decisions add no victim
        loop.tick(now)
        assert len(fake(loop).notified) == 1
    assert sum(store.job(v).state == JobState.PREEMPTING.value for v in victims) == 1


def test_a_job_whose_process_cannot_start_fails_and_frees_its_gpus(store: Store, tmp_path: Path) -> None:
    class Refusing(FakeExecutor):
        def start(self, launch: Launch) -> Started:
            if launch.command[0] == "broken":
                raise LookupError("there is no OS user to run the job as")
            return super().start(launch)

    loop = ControlLoop(store, CONFIG, Refusing(store), tmp_path / "data")
    good = store.submit(JobSpec(["train"], gpus=2), now=0.0)
    bad = store.submit(JobSpec(["broken"], gpus=2), now=0.0)
    loop.tick(1.0)
    assert store.job(good.id).state == JobState.RUNNING.value
    assert (store.job(bad.id).state, store.job(bad.id).exit_code) == (JobState.FAILED.value, 127)
    assert sorted(p.job_id for p in store.held()) == [good.id, good.id]


def test_an_exit_the_store_could_not_take_is_recorded_at_the_next_tick(loop: ControlLoop, store: Store) -> None:
    job = store.submit(JobSpec(["train"]), now=0.0)
    loop.tick(0.0)
    fake(loop).finish(job.id, 0, 0)
    real = store.end_attempts
    store.end_attempts = lambda ended, now, max_node_losses=3, idle=None: (_ for _ in ()).throw(  # type: ignore[method-assign]
        RuntimeError("database is locked")
    )
    with pytest.raises(RuntimeError):
        loop.tick(1.0)
    store.end_attempts = real  # type: ignore[method-assign]
    loop.tick(2.0)
    assert store.job(job.id).state == JobState.SUCCEEDED.value


def test_a_job_that_ends_before_it_is_marked_running_succeeds(store: Store) -> None:
    job = store.submit(JobSpec(["true"]), now=0.0)
    store.start_attempt(job.id, [Allocation("gpu0", (0,))], now=1.0, message="started")
    assert store.end_attempts([(job.id, 0, 0, None, None, None)], now=1.1) == [JobState.SUCCEEDED]


def test_a_job_at_its_time_limit_gets_notice_then_ends_as_timeout(loop: ControlLoop, store: Store) -> None:
    job = store.submit(JobSpec(["train"], team="vision", time_limit=100.0), now=0.0)
    loop.tick(0.0)
    loop.tick(99.0)
    assert not fake(loop).notified
    assert loop.next_wakeup(99.0) <= 100.0, "the loop wakes up when the limit is reached"
    loop.tick(100.0)
    [(job_id, attempt, deadline)] = fake(loop).notified
    assert (job_id, attempt, deadline) == (job.id, 0, 100.0 + 120.0)  # the class's grace
    fake(loop).finish(job.id, 0, 75)  # it saved and left, as gpupool.job does on notice
    loop.tick(105.0)
    ended = store.job(job.id)
    assert (ended.state, ended.run_seconds) == (JobState.TIMEOUT.value, 105.0)
    assert [e.kind for e in store.events(job_id=job.id)][-2:] == ["time_limit", "timeout"]
    assert not loop.tick(500.0), "a timed-out job is not requeued"


def test_a_time_limit_counts_run_time_over_attempts_but_not_the_drain_of_a_preemption(
    loop: ControlLoop, store: Store
) -> None:
    job = store.submit(JobSpec(["train"], team="vision", priority="low", time_limit=100.0), now=0.0)
    loop.tick(0.0)
    store.give_notice(job.id, for_job=job.id, deadline=160.0, now=60.0, message="x")
    fake(loop).finish(job.id, 0, 75)  # released at 90 after a 30 s drain: 60 s counted
    loop.tick(90.0)  # requeued and started again at once: 40 s left
    assert store.job(job.id).run_seconds == 60.0
    assert [launch.attempt for launch in fake(loop).started] == [0, 1]
    loop.tick(129.0)
    assert not fake(loop).notified
    loop.tick(130.0)
    assert [n[:2] for n in fake(loop).notified] == [(job.id, 1)]


def test_a_job_killed_at_the_end_of_its_grace_after_its_limit_is_timed_out(loop: ControlLoop, store: Store) -> None:
    job = store.submit(JobSpec(["train"], team="vision", time_limit=10.0), now=0.0)
    loop.tick(0.0)
    loop.tick(10.0)  # notice; it ignores it
    loop.tick(10.0 + 120.0)  # the grace is over: SIGKILL
    assert fake(loop).killed == [(job.id, 0)]
    loop.tick(131.0)
    assert store.job(job.id).state == JobState.TIMEOUT.value


def test_a_job_out_of_time_after_a_failure_ends_as_timeout_instead_of_a_retry(loop: ControlLoop, store: Store) -> None:
    job = store.submit(JobSpec(["train"], team="vision", time_limit=50.0, max_failures=3), now=0.0)
    loop.tick(0.0)
    fake(loop).finish(job.id, 0, 1)
    loop.tick(60.0)  # it failed at 60, past its 50 s: no more run time for a retry
    assert store.job(job.id).state == JobState.TIMEOUT.value
    assert len(fake(loop).started) == 1


def test_the_scheduler_being_down_is_not_charged_to_a_time_limit(
    loop: ControlLoop, store: Store, tmp_path: Path
) -> None:
    job = ended_while_down(loop, store, "exit.json", '{"exit_code": 1}', at=10.0)  # it ended 10 s in
    assert store.job(job).run_seconds == 10.0
    assert store.job(job).state == JobState.PENDING.value, "90 s are left for its retry"


def test_a_job_in_its_time_limit_grace_is_draining_for_the_core(loop: ControlLoop, store: Store) -> None:
    job = store.submit(JobSpec(["train"], team="vision", gpus=4, time_limit=10.0), now=0.0)
    loop.tick(0.0)
    loop.tick(10.0)
    [running] = store.snapshot(now=11.0).running
    assert running.notice is not None
    assert running.notice.deadline == 10.0 + 120.0
    urgent = store.submit(JobSpec(["train"], team="nlp", priority="urgent", gpus=4), now=11.0)
    loop.tick(11.0)
    assert [n[0] for n in fake(loop).notified] == [job.id], "no one else is given notice: its GPUs come free"
    assert store.job(urgent.id).wait_reason == "awaiting_drain"


def test_a_launch_that_fails_for_the_jobs_reasons_says_why_in_its_event(loop: ControlLoop, store: Store) -> None:
    def refuse(launch: Launch) -> Started:
        raise ValueError("its log is in the data directory")

    fake(loop).start = refuse  # type: ignore[method-assign]
    job = store.submit(JobSpec(["train"], team="vision"), now=0.0)
    loop.tick(0.0)
    assert store.job(job.id).state == JobState.FAILED.value
    assert "could not start: its log is in the data directory" in store.events(job_id=job.id)[-1].message


def test_a_launch_that_fails_for_the_schedulers_reasons_is_retried_after_a_back_off(
    loop: ControlLoop, store: Store
) -> None:
    real = fake(loop).start
    failures = iter([OSError(errno.ENOSPC, "No space left on device"), OSError(errno.EAGAIN, "fork failed")])

    def flaky(launch: Launch) -> Started:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real(launch)

    fake(loop).start = flaky  # type: ignore[method-assign]
    job = store.submit(JobSpec(["train"], team="vision", max_failures=0), now=0.0)
    loop.tick(0.0)
    row = store.job(job.id)
    assert (row.state, row.failures, row.launch_failures) == (JobState.PENDING.value, 0, 1)
    assert "No space left on device" in store.events(job_id=job.id)[-1].message
    assert not store.held(), "its GPUs are free while it waits"
    loop.tick(4.0)
    assert store.job(job.id).wait_reason == "launch_retry" and "No space left" in str(store.job(job.id).wait_message)
    loop.tick(5.0)  # 5 s after the first failure: tried again, fails again (10 s now)
    assert store.job(job.id).launch_failures == 2
    loop.tick(14.0)
    assert store.job(job.id).state == JobState.PENDING.value
    loop.tick(15.0)
    row = store.job(job.id)
    assert (row.state, row.failures, row.launch_failures) == (JobState.RUNNING.value, 0, 0)
    assert [launch.attempt for launch in fake(loop).started] == [2]


def test_an_attempt_that_ended_while_the_scheduler_was_down_ends_when_it_did(loop: ControlLoop, store: Store) -> None:
    # Its log's last write is its last sign of life: no exit was recorded (a reboot).
    job = ended_while_down(loop, store, "stdout.log", "working\n", at=30.0)
    assert store.job(job).run_seconds == 30.0
    [attempt] = store.attempts(job)
    assert attempt.ended_at == 30.0, "budgets and accounting are not charged the downtime either"
    assert all(p.held_until is None or p.held_until == 30.0 for p in store.held()) and not store.held()


def test_a_log_path_that_became_a_link_into_the_data_directory_is_not_opened(
    loop: ControlLoop, store: Store, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    loop.data_dir.mkdir(parents=True, exist_ok=True)
    (loop.data_dir / "admin.token").write_text("secret\n")
    job = store.submit(JobSpec(["train"], team="vision", workdir=str(work), output="out.log"), now=0.0)
    (work / "out.log").symlink_to(loop.data_dir / "admin.token")  # made after the submit's checks
    loop.tick(0.0)
    assert store.job(job.id).state == JobState.FAILED.value
    assert "in the scheduler's data directory" in store.events(job_id=job.id)[-1].message
    assert (loop.data_dir / "admin.token").read_text() == "secret\n"


def test_nothing_is_decided_while_the_guard_says_the_data_or_store_is_not_the_one_it_started_with(
    loop: ControlLoop, store: Store
) -> None:
    reasons = ["the data directory's identity is gone"]
    loop.guard = lambda: reasons[0] if reasons else None
    job = store.submit(JobSpec(["train"], team="vision"), now=0.0)
    assert not loop.tick(0.0)
    assert store.job(job.id).state == JobState.PENDING.value and not fake(loop).started
    assert loop.halted == "the data directory's identity is gone"
    reasons.clear()
    loop.tick(1.0)
    assert store.job(job.id).state == JobState.RUNNING.value and loop.halted is None


def test_the_guard_names_a_vanished_data_directory_and_a_replaced_store_file(tmp_path: Path) -> None:
    from gpupool.service.leader import Guard, claim_data_dir

    data = tmp_path / "data"
    data.mkdir()
    database = data / "gpupool.db"
    database.write_text("")
    claim_data_dir(data, "s1", fresh_store=True)
    guard = Guard(data, "s1", database)
    assert guard.check() is None and guard() is None
    database.unlink()
    database.write_text("")  # another file where the store was
    assert "was replaced by another file" in str(guard.check())
    for path in data.iterdir():
        path.unlink()
    data.rmdir()
    assert "identity" in str(guard.check()) and "cannot be read" in str(guard.check())
    assert guard() is None, "a verdict stands for a moment: the loop may tick many times a second"
    guard.clock = lambda: 1e9
    assert "identity" in str(guard())
    guard.close()


def test_a_guard_that_cannot_check_halts_the_loop(loop: ControlLoop, store: Store) -> None:
    def broken() -> str | None:
        raise OSError("the store's server does not answer")

    loop.guard = broken
    store.submit(JobSpec(["train"], team="vision"), now=0.0)
    assert not loop.tick(0.0)
    assert "could not check" in str(loop.halted) and not fake(loop).started


def test_an_attempt_its_launcher_could_not_start_goes_back_in_line_uncharged(loop: ControlLoop, store: Store) -> None:
    from gpupool.executors import Exit

    job = store.submit(JobSpec(["train"], team="vision", max_failures=0), now=0.0)
    loop.tick(0.0)
    fake(loop).alive.clear()
    fake(loop).ended.append(Exit(job.id, 0, None, "[Errno 28] No space left on device", started=False))
    loop.tick(1.0)
    row = store.job(job.id)
    assert (row.state, row.failures, row.launch_failures) == (JobState.PENDING.value, 0, 1)
    assert "No space left on device" in store.events(job_id=job.id)[-1].message


def test_a_gang_is_running_only_once_the_executor_says_every_member_runs(store: Store, tmp_path: Path) -> None:
    executor = FakeExecutor(pool=[Node("n0", 4, "virtual"), Node("n1", 4, "virtual")], gang_waits=True)
    loop = ControlLoop(store, CONFIG, executor, tmp_path / "data")
    job = store.submit(JobSpec(["train"], team="vision", gpus=8, gpus_per_node=4), now=0.0)
    loop.tick(1.0)
    [launch] = executor.started
    assert [(m.rank, m.node, m.gpus) for m in launch.members] == [(0, "n0", (0, 1, 2, 3)), (1, "n1", (0, 1, 2, 3))]
    assert launch.member_env(launch.members[1], "n0", 1)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert store.job(job.id).state == JobState.STARTING.value
    assert store.attempts(job.id)[0].handle is not None, "the handle is recorded before the gang runs"
    loop.tick(2.0)
    assert store.job(job.id).state == JobState.STARTING.value
    executor.run(job.id, 0)
    assert loop.tick(3.0)
    assert store.job(job.id).state == JobState.RUNNING.value


def test_a_gang_the_executor_could_not_place_goes_back_in_line_whole(store: Store, tmp_path: Path) -> None:
    executor = FakeExecutor(pool=[Node("n0", 4, "virtual"), Node("n1", 4, "virtual")], gang_waits=True)
    loop = ControlLoop(store, CONFIG, executor, tmp_path / "data")
    job = store.submit(JobSpec(["train"], team="vision", gpus=8, gpus_per_node=4, max_failures=0), now=0.0)
    loop.tick(1.0)
    executor.finish(job.id, 0, None, started=False)
    loop.tick(2.0)
    row = store.job(job.id)
    assert (row.state, row.failures, row.launch_failures) == (JobState.PENDING.value, 0, 1)
    assert not store.held(), "no member keeps a GPU"


def test_the_pool_follows_the_nodes_the_executor_has(store: Store, tmp_path: Path) -> None:
    executor = FakeExecutor(pool=[Node("n0", 4, "virtual")])
    loop = ControlLoop(store, CONFIG, executor, tmp_path / "data")
    small = store.submit(JobSpec(["train"], team="vision", gpus=4), now=0.0)
    loop.tick(0.0)
    assert [n.name for n in store.nodes()] == ["n0"]
    assert store.job(small.id).state == JobState.RUNNING.value
    big = store.submit(JobSpec(["train"], team="vision", gpus=8, gpus_per_node=4), now=1.0)
    loop.tick(1.0)
    assert store.job(big.id).state == JobState.PENDING.value
    executor.pool = [Node("n0", 4, "virtual"), Node("n2", 4, "virtual"), Node("n3", 4, "virtual")]
    loop.tick(2.0)
    assert store.job(big.id).state == JobState.RUNNING.value, "nodes that joined are used at the next decision"
    assert sorted({a.node for a in store.held() if a.job_id == big.id}) == ["n2", "n3"]
    executor.pool = [Node("n0", 4, "virtual"), Node("n3", 4, "virtual")]
    loop.tick(3.0)
    assert [n.name for n in store.nodes()] == ["n0", "n3"], "a node that left leaves the pool"
    snapshot = store.snapshot(now=3.0)
    assert {a.node for r in snapshot.running for a in r.placement} == {"n0", "n3"}


def test_gpupool_up_refuses_another_executor_than_the_one_whose_attempts_run(store: Store) -> None:
    from gpupool.config import ConfigError, parse_spec
    from gpupool.up import check_executor

    job = store.submit(JobSpec(["train"], team="vision"), now=0.0)
    store.start_attempt(job.id, [Allocation("gpu0", (0,))], now=1.0, message="started")
    store.mark_running(job.id, 0, {"pid": 4242, "started": "1"}, now=1.0)  # a handle from before kinds
    with pytest.raises(ConfigError, match=r"service.executor: ray, but 1 attempt the local executor started"):
        check_executor(store, parse_spec({"service": {"executor": "ray"}}).service)
    check_executor(store, parse_spec({}).service)


def filled_with_depth(store: Store, tmp_path: Path, depth: int) -> ControlLoop:
    """A loop that explains the first `depth` jobs in line that wait, its 4 GPUs taken by
    vision's job "big"."""
    loop = ControlLoop(store, replace(CONFIG, explain_depth=depth), FakeExecutor(store), tmp_path / "data")
    store.submit(JobSpec(["big"], team="vision", gpus=4), now=0.0)
    loop.tick(0.0)
    return loop


def test_jobs_past_the_explained_depth_are_told_they_wait_in_line_once(store: Store, tmp_path: Path) -> None:
    loop = filled_with_depth(store, tmp_path, 2)
    waiting = [store.submit(JobSpec([str(i)], team="nlp", gpus=2), now=1.0).id for i in range(5)]
    loop.tick(1.0)
    reasons = [store.job(j).wait_reason for j in waiting]
    assert reasons == ["no_victims", "no_victims", "in_line", "in_line", "in_line"]
    assert "worked out for the first 2 jobs in line that wait" in (store.job(waiting[4]).wait_message or "")
    loop.tick(2.0)
    assert [store.job(j).wait_reason for j in waiting] == reasons, "told once, then left as they were"


# Review findings on the explained depth.


def test_a_task_its_array_releases_past_the_depth_says_it_waits_in_line(store: Store, tmp_path: Path) -> None:
    """The review found a task released by its array's limit past the depth keep `array_limit`
    in the store, though no limit held it any more."""
    config = replace(CONFIG, explain_depth=1)
    store.set_team("nlp", weight=10.0)  # its jobs go first in line
    loop = ControlLoop(store, config, FakeExecutor(store), tmp_path / "data")
    store.submit(JobSpec(["big"], team="vision", gpus=2), now=0.0)
    tasks = store.submit_array(JobSpec(["t"], team="vision", gpus=2, array=[0, 1], array_limit=1), now=0.0)
    loop.tick(0.0)
    assert store.job(tasks[1].id).wait_reason == "array_limit"
    for name in ("x1", "x2"):
        store.submit(JobSpec([name], team="nlp", gpus=2), now=1.0)
    loop.tick(1.0)
    fake(loop).finish(tasks[0].id, 0, 0)
    loop.tick(2.0)
    loop.tick(3.0)
    assert not [w for w in store.snapshot_with_holds(3.0)[1] if int(w.job) == tasks[1].id], "no limit holds it"
    assert store.job(tasks[1].id).wait_reason == "in_line"


def test_a_restart_keeps_the_reasons_of_jobs_past_the_depth(store: Store, tmp_path: Path) -> None:
    """The review found every job past the depth told `in_line` again after a restart, its
    recorded reason (from the decision that explained it) lost."""
    loop = filled_with_depth(store, tmp_path, 2)
    later = [store.submit(JobSpec([str(i)], team="nlp", gpus=2), now=1.0).id for i in range(2)]
    loop.tick(1.0)
    earlier = [store.submit(JobSpec([str(i)], team="nlp", gpus=2), now=0.5).id for i in range(2)]
    loop.tick(2.0)
    before = [store.job(j).wait_reason for j in (*earlier, *later)]
    assert before == ["no_victims"] * 4, "the later ones were explained when they came in, within the depth"
    ControlLoop(store, loop.config, fake(loop), tmp_path / "data").tick(3.0)
    assert [store.job(j).wait_reason for j in (*earlier, *later)] == before


def test_a_job_that_held_gpus_and_no_longer_does_past_the_depth_frees_them_in_the_store(
    store: Store, tmp_path: Path
) -> None:
    """A preemptor whose victims left while more important jobs took the GPUs, past the depth:
    the store no longer shows it holding them."""
    config = replace(CONFIG, explain_depth=1)
    loop = ControlLoop(store, config, FakeExecutor(store), tmp_path / "data")
    low = store.submit(JobSpec(["low"], team="vision", priority="low", gpus=4), now=0.0)
    loop.tick(0.0)
    high = store.submit(JobSpec(["high"], team="nlp", priority="high", gpus=4), now=700.0)
    loop.tick(700.0)
    assert store.job(high.id).wait_reason == "awaiting_drain" and store.job(high.id).held_gpus
    urgent = [store.submit(JobSpec(["u"], team="vision", priority="urgent", gpus=4), now=701.0) for _ in range(2)]
    fake(loop).finish(low.id, 0, 0)
    loop.tick(702.0)
    loop.tick(703.0)
    assert store.job(urgent[0].id).state == JobState.RUNNING.value
    row = store.job(high.id)
    assert (row.state, row.wait_reason, row.held_gpus) == ("pending", "in_line", None)


def test_a_job_released_past_the_depth_no_longer_says_it_is_held(store: Store, tmp_path: Path) -> None:
    """The review found a job released past `explain_depth` keep the words "held ... until
    released": a person's hold is one of the reasons that hold a job back (`model.HELD_BACK`)."""
    loop = ControlLoop(store, replace(CONFIG, explain_depth=1), FakeExecutor(store), tmp_path / "data")
    store.submit(JobSpec(["big"], team="nlp", gpus=4), now=0.0)
    waiting = [store.submit(JobSpec([str(i)], team="nlp"), now=1.0 + i).id for i in range(3)]
    loop.tick(1.0)
    store.hold_job(waiting[-1], 2.0, by_admin=False)
    loop.tick(2.0)
    assert store.job(waiting[-1]).wait_reason == "held"
    store.release_hold(waiting[-1], 3.0, by_admin=False)
    loop.tick(3.0)
    assert store.job(waiting[-1]).wait_reason == "in_line", "past the depth: it waits in line"


def test_an_elastic_job_shrinks_and_grows_back_and_each_next_attempt_is_launched_at_once(
    store: Store, tmp_path: Path
) -> None:
    config = replace(CONFIG, elastic=ElasticPolicy(60.0))
    loop = ControlLoop(store, config, FakeExecutor(store), tmp_path / "data", api_url="http://127.0.0.1:1")
    job = store.submit(JobSpec(["train"], team="vision", priority="low", gpus=4, sizes=(2, 4)), now=0.0)
    loop.tick(0.0)
    high = store.submit(JobSpec(["eval"], team="nlp", priority="high", gpus=2), now=200.0)
    loop.tick(200.0)
    assert [n[:2] for n in fake(loop).notified] == [(job.id, 0)]
    fake(loop).finish(job.id, 0, 0)
    # The store is out of reach as the loop would give the next attempt its token: it tries again.
    give_tokens = store.give_tokens

    def unreachable(_: object) -> None:
        raise OSError("the store is out of reach")

    store.give_tokens = unreachable  # type: ignore[method-assign,assignment]
    with pytest.raises(OSError, match="out of reach"):
        loop.tick(201.0)
    store.give_tokens = give_tokens  # type: ignore[method-assign]
    loop.tick(202.0)
    launches = [(launch.job_id, launch.attempt, len(launch.members[0].gpus)) for launch in fake(loop).started]
    assert launches == [(job.id, 0, 4), (job.id, 1, 2), (high.id, 0, 2)]
    assert store.job(job.id).state == JobState.RUNNING.value
    fake(loop).finish(high.id, 0, 0)
    loop.tick(230.0)
    assert len(fake(loop).notified) == 1, "no growth before 60 s at its size"
    loop.tick(270.0)
    assert [n[:2] for n in fake(loop).notified][1:] == [(job.id, 1)], "grown, once it had run 60 s at 2 GPUs"
    fake(loop).finish(job.id, 1, 0)
    loop.tick(271.0)
    assert [(s.job_id, s.attempt, len(s.members[0].gpus)) for s in fake(loop).started][-1] == (job.id, 2, 4)
    assert [a.outcome for a in store.attempts(job.id)] == ["resized", "resized", None]
