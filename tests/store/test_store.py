"""The store on both backends: SQLite in a file and a real PostgreSQL server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import inspect

from gpupool.errors import Conflict, InvalidInput, NotFound
from gpupool.model import DEFAULT_CLASSES, Allocation, Config, JobState, Node, PriorityBudget, Team
from gpupool.store.engine import head, migrate, revision
from gpupool.store.store import JobSpec, Store

CONFIG = Config(
    DEFAULT_CLASSES,
    {"nlp": Team("nlp", 2.0, 8, (PriorityBudget("high", 100.0, 86400.0),)), "vision": Team("vision")},
)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    store = Store.open(store_url)
    store.sync_config(CONFIG)
    store.set_nodes([Node("n0", 4, "virtual"), Node("n1", 4, "virtual")], virtual=True)
    yield store
    store.close()


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
    store.cancel_pending(b.id, now=3.0)
    assert [j.id for j in store.jobs(states=[JobState.PENDING])] == [a.id]
    assert [j.id for j in store.jobs(team="vision")] == [b.id]
    assert store.job(b.id).state == JobState.CANCELLED.value


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (JobSpec(["x"], team="nobody"), "team: unknown team 'nobody'"),
        (JobSpec(["x"], priority="vip"), "priority: unknown priority class 'vip' (known: urgent, high, normal, low)"),
        (JobSpec(["x"], gpus=0), "gpus: 0 is not a positive number of GPUs"),
        (JobSpec(["x"], gpus=6, gpus_per_node=4), "gpus_per_node: 6 GPUs do not split into members of 4"),
        (JobSpec([]), "command: give the command to run"),
    ],
)
def test_bad_submissions_say_what_is_wrong_and_change_nothing(store: Store, spec: JobSpec, message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        store.submit(spec, now=1.0)
    assert str(caught.value) == message
    assert store.jobs() == []
    assert store.events() == []


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


def test_a_state_change_the_state_machine_forbids_is_refused(store: Store) -> None:
    job = store.submit(JobSpec(["a"]), now=1.0)
    store.start_attempt(job.id, [Allocation("n1", (0,))], now=2.0, message="started")
    with pytest.raises(Conflict, match="only a pending job"):
        store.cancel_pending(job.id, now=3.0)
    with pytest.raises(NotFound):
        store.job(999)


def test_configuration_is_synced_and_tokens_survive_a_resync(store: Store) -> None:
    store.sync_config(Config(DEFAULT_CLASSES, {"nlp": Team("nlp", 3.0, 16)}))
    with store.transaction() as s:
        from gpupool.store.schema import BudgetRow, TeamRow

        nlp = s.get(TeamRow, "nlp")
        assert nlp is not None
        assert (nlp.weight, nlp.guaranteed_gpus) == (3.0, 16)
        assert s.query(BudgetRow).count() == 0
