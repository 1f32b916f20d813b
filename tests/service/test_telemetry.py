"""The metrics against the store: a scripted day with a preemption through the control loop
(a fake executor, a real store), read the way Prometheus reads them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.accounting import Totals, totals
from gpupool.model import DEFAULT_CLASSES, Config, ElasticPolicy, Node
from gpupool.service.loop import ControlLoop
from gpupool.store import JobSpec, Store
from gpupool.store.tail import Tail
from gpupool.telemetry import Telemetry
from tests.support.fakes import FakeExecutor

CONFIG = Config(DEFAULT_CLASSES)


class Day:
    def __init__(self, store_url: str, tmp_path: Path) -> None:
        self.store = Store.open(store_url)
        self.store.sync_config(CONFIG)
        self.store.set_nodes([Node("n0", 2, "a100")], virtual=True)
        self.store.set_team("vision", guaranteed_gpus=0)
        self.store.set_team("nlp", guaranteed_gpus=1)
        self.executor = FakeExecutor(self.store)
        self.telemetry = Telemetry(self.store)
        self.loop = ControlLoop(self.store, CONFIG, self.executor, tmp_path / "data", observer=self.telemetry)
        self.workdir = str(tmp_path)

    def submit(self, team: str, priority: str, now: float) -> int:
        return self.store.submit(JobSpec(["true"], team, priority, 2, workdir=self.workdir), now).id

    def value(self, name: str, **labels: str) -> float:
        families = text_string_to_metric_families(self.telemetry.exposition().decode())
        found = [s.value for f in families for s in f.samples if s.name == name and s.labels == labels]
        assert len(found) == 1, f"no sample {name} {labels}"
        return found[0]

    def total(self, name: str, **labels: str) -> float:
        """The sum over the samples of `name` whose labels include `labels`."""
        families = text_string_to_metric_families(self.telemetry.exposition().decode())
        return sum(
            s.value
            for f in families
            for s in f.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )


@pytest.fixture
def day(store_url: str, tmp_path: Path) -> Day:
    return Day(store_url, tmp_path)


def test_a_preemption_is_counted_as_the_store_accounts_it(day: Day) -> None:
    low = day.submit("vision", "low", 0.0)
    day.loop.tick(0.0)
    day.store.heartbeat(low, 0, 10.0, 1, "train")
    day.store.commit_checkpoint(low, 0, 50.0, 5, None, 2.0)
    high = day.submit("nlp", "high", 200.0)
    day.loop.tick(200.0)
    day.telemetry.refresh(201.0)
    assert day.value("gpupool_gpus", gpu_type="a100", state="draining") == 2
    assert day.value("gpupool_jobs", state="preempting", team="vision", **{"class": "low"}) == 1
    assert day.value("gpupool_pending_jobs", team="nlp", reason="awaiting_drain", **{"class": "high"}) == 1
    assert day.value("gpupool_preemptions_total", team="vision", reason="priority", **{"class": "low"}) == 1
    assert day.value("gpupool_interruptions_total", team="vision", kind="preemption", **{"class": "low"}) == 0

    day.executor.finish(low, 0, 75)
    day.loop.tick(230.0)
    day.store.heartbeat(high, 0, 240.0, 1, "train")
    day.telemetry.refresh(241.0)
    # The victim is back in line: its interruption's restart is not known yet, so not counted.
    assert day.value("gpupool_interruptions_total", team="vision", kind="preemption", **{"class": "low"}) == 0
    assert day.value("gpupool_gpus", gpu_type="a100", state="allocated") == 2

    day.executor.finish(high, 0, 0)
    day.loop.tick(300.0)
    day.store.heartbeat(low, 1, 320.0, 6, "train", restored_step=5, restore_seconds=4.0)
    day.telemetry.refresh(330.0)
    # The next attempt reached its first productive step: the interruption's cost is final.
    account = next(a for a in day.store.accounts(330.0) if a.job_id == low)
    (interruption,) = account.interruptions
    lost = {
        bucket: day.value(
            "gpupool_lost_gpu_seconds_total", team="vision", kind="preemption", bucket=bucket, **{"class": "low"}
        )
        for bucket in ("wasted", "drain", "restart")
    }
    assert lost == pytest.approx({"wasted": interruption.wasted, "drain": interruption.drain, "restart": 40.0})
    assert interruption.restart == pytest.approx(40.0)
    assert day.value("gpupool_interruptions_total", team="vision", kind="preemption", **{"class": "low"}) == 1

    day.executor.finish(low, 1, 0)
    day.loop.tick(400.0)
    day.telemetry.refresh(400.0)
    pool = totals(day.store.accounts(400.0), lambda _: "pool")["pool"]
    assert_equal_to_store(day, pool)
    assert day.total("gpupool_jobs_submitted_total") == 2
    assert day.total("gpupool_jobs_finished_total", state="succeeded") == 2
    assert day.total("gpupool_attempts_started_total", kind="first") == 2
    assert day.total("gpupool_attempts_started_total", kind="resume") == 1
    assert day.total("gpupool_checkpoint_commits_total") == 1
    assert day.value("gpupool_checkpoint_blocking_seconds_sum", **{"class": "low"}) == 2.0
    # Waits: the low job 0 s, the high one 30 s (notice to drain), the requeued low one 70 s.
    assert day.value("gpupool_queue_wait_seconds_sum", kind="first", **{"class": "high"}) == 30.0
    assert day.value("gpupool_queue_wait_seconds_sum", kind="requeued", **{"class": "low"}) == 70.0
    assert day.value("gpupool_gpus", gpu_type="a100", state="idle") == 2
    assert day.total("gpupool_decision_duration_seconds_count") >= 3

    # A service started again reads the whole log: the same counters.
    again = Telemetry(day.store)
    again.refresh(400.0)
    day.telemetry = again
    assert_equal_to_store(day, pool)
    assert day.total("gpupool_attempts_started_total") == 3


def assert_equal_to_store(day: Day, pool: Totals) -> None:
    assert day.total("gpupool_lost_gpu_seconds_total") == pytest.approx(pool.lost)
    assert day.total("gpupool_interruptions_total") == pool.interruptions
    uses = {
        use: day.total("gpupool_allocated_gpu_seconds_total", use=use)
        for use in ("productive", "startup", "checkpoint", "drain", "wasted", "unreported")
    }
    assert sum(uses.values()) == pytest.approx(pool.allocated)
    assert uses["productive"] == pytest.approx(pool.productive)
    assert uses["wasted"] == pytest.approx(pool.wasted)
    assert uses["drain"] == pytest.approx(pool.drain)
    assert uses["checkpoint"] == pytest.approx(pool.checkpoint)


def test_every_class_and_team_is_given_before_anything_happens(day: Day) -> None:
    day.telemetry.refresh(0.0)
    for team in ("vision", "nlp", "default"):
        for cls in ("high", "normal", "low"):
            assert day.value("gpupool_jobs", state="pending", team=team, **{"class": cls}) == 0
            assert day.value("gpupool_team_allocated_gpus", team=team, **{"class": cls}) == 0
            labels = {"team": team, "kind": "preemption", "bucket": "wasted", "class": cls}
            assert day.value("gpupool_lost_gpu_seconds_total", **labels) == 0
    assert day.value("gpupool_team_guaranteed_gpus", team="nlp") == 1
    assert day.value("gpupool_gpus", gpu_type="a100", state="idle") == 2
    assert day.value("gpupool_telemetry_caught_up") == 1


def test_an_id_skipped_by_a_transaction_not_yet_committed_is_read_when_it_comes() -> None:
    tail = Tail(patience=60.0)
    assert tail.fresh([1, 2, 4], now=0.0) == {1, 2, 4}
    assert tail.gaps == {3: 0.0}
    assert tail.fresh([3, 5], now=1.0) == {3, 5}
    assert tail.fresh([3], now=2.0) == set()  # read twice: counted once
    assert tail.fresh([7], now=3.0) == {7}
    assert tail.fresh([], now=100.0) == set()
    assert tail.gaps == {}  # rolled back, given up on


def test_gpus_are_counted_by_state_as_the_pool_shows_them(day: Day) -> None:
    small = day.store.submit(JobSpec(["true"], "vision", "low", 1, workdir=day.workdir), 0.0).id
    day.loop.tick(0.0)
    day.submit("nlp", "high", 300.0)
    day.loop.tick(300.0)
    day.telemetry.refresh(300.0)
    _, gpus = day.store.pool_view()
    assert sorted(g.state for g in gpus) == ["draining", "held"]
    for state in ("draining", "held"):
        assert day.value("gpupool_gpus", gpu_type="a100", state=state) == 1
        assert day.value("gpupool_node_gpus", node="n0", gpu_type="a100", state=state) == 1
    assert day.value("gpupool_gpus", gpu_type="a100", state="idle") == 0
    day.executor.finish(small, 0, 75)
    day.loop.tick(310.0)
    day.store.sync_nodes([])  # the node leaves the pool
    day.telemetry.refresh(311.0)
    assert day.value("gpupool_gpus", gpu_type="a100", state="down") == 2
    assert day.value("gpupool_nodes", gpu_type="a100", state="down") == 1
    assert day.value("gpupool_nodes", gpu_type="a100", state="up") == 0


# --- review findings ----------------------------------------------------------------------------


def test_a_refresh_that_fails_midway_loses_nothing(day: Day, monkeypatch: pytest.MonkeyPatch) -> None:
    job = day.submit("vision", "low", 0.0)
    day.loop.tick(0.0)
    day.executor.finish(job, 0, 0)
    day.loop.tick(100.0)
    real = day.store.attempt_records

    def broken(**_: object) -> object:
        raise OSError("database is locked")

    monkeypatch.setattr(day.store, "attempt_records", broken)
    with pytest.raises(OSError, match="locked"):
        day.telemetry.refresh(101.0)
    monkeypatch.setattr(day.store, "attempt_records", real)
    day.telemetry.refresh(102.0)
    day.telemetry.refresh(103.0)
    assert day.total("gpupool_allocated_gpu_seconds_total") == pytest.approx(200.0)
    assert day.total("gpupool_jobs_finished_total") == 1


def test_a_jobs_wait_starts_when_its_dependency_is_met(day: Day) -> None:
    first = day.submit("vision", "low", 0.0)
    day.loop.tick(0.0)
    spec = JobSpec(["true"], "nlp", "high", 2, workdir=day.workdir, dependencies=[("ok", first)])
    after = day.store.submit(spec, 10.0).id
    day.loop.tick(10.0)
    day.telemetry.refresh(3000.0)
    # Waiting on its dependency is not waiting for GPUs: no oldest-pending time for it yet.
    assert day.total("gpupool_oldest_pending_queued_timestamp_seconds", **{"class": "high"}) == 0
    day.executor.finish(first, 0, 0)
    day.loop.tick(3600.0)
    day.loop.tick(3601.0)
    assert day.store.job(after).state == "running"
    day.telemetry.refresh(3602.0)
    assert day.value("gpupool_queue_wait_seconds_sum", kind="first", **{"class": "high"}) <= 1.0


def test_a_launch_the_scheduler_retries_is_neither_a_resume_nor_a_new_wait(day: Day) -> None:
    day.executor.gang_waits = True  # a launch that has not reported running yet
    job = day.submit("nlp", "high", 0.0)
    day.loop.tick(0.0)
    day.store.retry_launch(job, 0, 1.0, "no space left on device")  # as carry_out does on an OSError
    day.telemetry.refresh(100.0)
    assert day.value("gpupool_oldest_pending_queued_timestamp_seconds", team="nlp", **{"class": "high"}) == 0.0
    day.loop.tick(200.0)
    day.executor.run(job, 1)
    day.loop.tick(200.0)
    assert day.store.job(job).state == "running"
    day.telemetry.refresh(201.0)
    assert day.total("gpupool_attempts_started_total", kind="resume") == 0
    assert day.total("gpupool_attempts_started_total", kind="first") == 1
    assert day.value("gpupool_queue_wait_seconds_count", kind="first", **{"class": "high"}) == 1
    assert day.value("gpupool_queue_wait_seconds_sum", kind="first", **{"class": "high"}) == 200.0
    assert day.total("gpupool_queue_wait_seconds_count", kind="requeued") == 0


def test_a_node_that_came_back_smaller_has_no_negative_idle_gpus(day: Day) -> None:
    day.submit("vision", "low", 0.0)
    day.loop.tick(0.0)
    day.store.sync_nodes([(Node("n0", 1, "a100"), True)])
    day.telemetry.refresh(1.0)
    _, gpus = day.store.pool_view()
    assert [g.state for g in gpus] == ["allocated"]
    assert day.value("gpupool_node_gpus", node="n0", gpu_type="a100", state="allocated") == 1
    assert day.total("gpupool_node_gpus", node="n0", state="idle") == 0
    assert day.value("gpupool_gpus", gpu_type="a100", state="idle") == 0


def test_an_elastic_jobs_resizes_are_counted_and_neither_is_a_wait_or_a_growth_a_preemption(
    store_url: str, tmp_path: Path
) -> None:
    day = Day(store_url, tmp_path)
    day.loop.config = replace(CONFIG, elastic=ElasticPolicy(60.0))
    spec = JobSpec(["train"], "vision", "low", 2, workdir=day.workdir, sizes=(1, 2))
    job = day.store.submit(spec, 0.0).id
    day.loop.tick(0.0)
    day.store.heartbeat(job, 0, 10.0, 1, "train")
    high = day.store.submit(JobSpec(["eval"], "nlp", "high", 1, workdir=day.workdir), 200.0).id
    day.loop.tick(200.0)  # shrunk to 1 GPU for the high job
    day.store.commit_checkpoint(job, 0, 202.0, 1, None, 1.0)
    day.executor.finish(job, 0, 0)
    day.loop.tick(210.0)
    day.store.heartbeat(job, 1, 220.0, 2, "train")
    day.executor.finish(high, 0, 0)
    day.loop.tick(230.0)
    day.loop.tick(280.0)  # grown back, once it ran 60 s at 1 GPU
    day.store.commit_checkpoint(job, 1, 282.0, 2, None, 1.0)  # it saves on notice
    day.executor.finish(job, 1, 0)
    day.loop.tick(290.0)
    day.store.heartbeat(job, 2, 300.0, 3, "train")
    day.telemetry.refresh(301.0)
    low = {"class": "low", "team": "vision"}
    assert [a.gpus for a in day.store.attempts(job)] == [2, 1, 2]
    assert day.value("gpupool_resizes_total", direction="shrink", **low) == 1
    assert day.value("gpupool_resizes_total", direction="grow", **low) == 1
    assert day.value("gpupool_preemptions_total", reason="priority", **low) == 1, "the shrink, not the growth"
    assert day.total("gpupool_preemptions_total", reason="grow") == 0
    assert day.value("gpupool_attempts_started_total", kind="resize", **low) == 2
    assert day.total("gpupool_queue_wait_seconds_count", kind="requeued") == 0, "a resize is no wait in line"
    account = next(a for a in day.store.accounts(301.0) if a.job_id == job)
    assert day.value("gpupool_shrink_kept_gpu_seconds_total", **low) == pytest.approx(account.attempts[1].productive)
    assert account.attempts[1].productive == pytest.approx(60.0), "1 GPU from its first step at 220 to 280"
    assert day.value("gpupool_interruptions_total", kind="resize", **low) == 2
