"""Seniority (`policy.seniority_after`): a job that has waited long takes smaller jobs of its
class or lower that were submitted after it, never another team's below its guarantee
(docs/policy.md)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpupool.config import ConfigError, parse
from gpupool.model import DEFAULT_CLASSES, Config, FairShare, Job, Reason, Snapshot, Team
from tests.support.builders import fill, job, pool, summary
from tests.support.oracle import decide

NOW = 10_000.0
HOUR = 3600.0


def config(guarantees: dict[str, int] | None = None, **options: Any) -> Config:
    teams = {name: Team(name, guaranteed_gpus=g) for name, g in (guarantees or {}).items()}
    return Config(DEFAULT_CLASSES, teams, **{"seniority_after": HOUR, **options})


def gang(submit: float = 0.0, queued_at: float | None = None) -> Job:
    return replace(job("gang", team="a", cls="low", gpus=4, submit=submit, gpus_per_node=4), queued_at=queued_at)


def small(id: str, team: str = "b", submit: float = NOW - 60, cls: str = "low") -> Job:
    return job(id, team=team, cls=cls, gpus=1, submit=submit)


def backfilled(*jobs: Job) -> list[Any]:
    return fill(pool(1, 4), jobs, started=NOW - 1000)


def case(id: str, snapshot: Snapshot, cfg: Config, expected: list[tuple[object, ...]]) -> object:
    return pytest.param(snapshot, cfg, expected, id=id)


SMALL = [small(f"s{i}") for i in range(4)]

CASES = [
    case(
        "a-gang-that-waited-long-takes-the-small-jobs-submitted-after-it",
        Snapshot(pool(1, 4), backfilled(*SMALL), [gang()]),
        config(),
        [*(("preempt", s.id, "gang", "seniority") for s in SMALL), ("wait", "gang", "awaiting_drain")],
    ),
    case(
        "before-seniority_after-it-waits-like-any-low-job",
        Snapshot(pool(1, 4), backfilled(*SMALL), [gang(submit=NOW - HOUR + 1)]),
        config(),
        [("wait", "gang", "no_fit")],
    ),
    case(
        "off-by-default",
        Snapshot(pool(1, 4), backfilled(*SMALL), [gang()]),
        config(seniority_after=None),
        [("wait", "gang", "no_fit")],
    ),
    case(
        "a-job-submitted-before-it-is-never-taken",
        Snapshot(pool(1, 4), backfilled(*SMALL[:3], small("older", submit=-1.0)), [gang()]),
        config(),
        [("wait", "gang", "no_victims")],
    ),
    case(
        "a-job-as-large-is-never-taken-it-started-in-its-turn",
        Snapshot(pool(1, 4), backfilled(replace(gang(submit=NOW - 60), id="later-gang", team="b")), [gang()]),
        config(),
        [("wait", "gang", "no_victims")],
    ),
    case(
        "a-higher-class-is-never-taken",
        Snapshot(pool(1, 4), backfilled(*SMALL[:3], small("normal", cls="normal")), [gang()]),
        config(),
        [("wait", "gang", "no_victims")],
    ),
    case(
        "another-team-only-down-to-its-guarantee",
        Snapshot(pool(1, 4), backfilled(*SMALL), [gang()]),
        config({"b": 1}),
        [("wait", "gang", "no_victims")],
    ),
    case(
        "its-own-teams-later-jobs-whatever-the-guarantee",
        Snapshot(pool(1, 4), backfilled(*(replace(s, team="a") for s in SMALL)), [gang()]),
        config({"a": 4}),
        [*(("preempt", s.id, "gang", "seniority") for s in SMALL), ("wait", "gang", "awaiting_drain")],
    ),
    case(
        "a-requeued-job-counts-its-wait-from-its-requeue",
        Snapshot(pool(1, 4), backfilled(*SMALL), [gang(queued_at=NOW - 60)]),
        config(),
        [("wait", "gang", "no_fit")],
    ),
]


@pytest.mark.parametrize(("snapshot", "cfg", "expected"), CASES)
def test_scenario(snapshot: Snapshot, cfg: Config, expected: list[tuple[object, ...]]) -> None:
    assert summary(decide(snapshot, cfg, NOW)) == expected


def test_a_waiting_job_is_decided_again_when_it_becomes_senior() -> None:
    plan = decide(Snapshot(pool(1, 4), backfilled(*SMALL), [gang(submit=NOW - 600)]), config(), NOW)
    assert plan.retry_at == NOW - 600 + HOUR


def test_the_victim_is_told_how_long_its_preemptor_waited() -> None:
    plan = decide(Snapshot(pool(1, 4), backfilled(*SMALL), [gang(submit=NOW - 2 * HOUR)]), config(), NOW)
    assert "job gang has waited 2.0 h (policy.seniority_after), and was submitted before it" in (
        plan.preemptions[0].message
    )


def test_a_wait_names_the_guarantee_floor_that_keeps_seniority_out() -> None:
    plan = decide(Snapshot(pool(1, 4), backfilled(*SMALL), [gang()]), config({"b": 1}), NOW)
    [wait] = plan.waits
    assert wait.reason is Reason.NO_VICTIMS
    assert "guarantee floor: team b holds 4 GPUs, 1 guaranteed: 3 may be taken" in wait.message


def test_the_config_file_takes_a_duration() -> None:
    assert parse({"policy": {"seniority_after": "2h"}}).seniority_after == 2 * HOUR
    assert parse({}).seniority_after is None
    with pytest.raises(ConfigError, match="seniority_after"):
        parse({"policy": {"seniority_after": "soon"}})


# Review findings, each a test first.


def test_fair_share_does_not_take_back_a_senior_job_from_the_jobs_it_took() -> None:
    nodes = pool(2, 4)
    held = [
        fill(pool(1, 4), [replace(gang(), id="a1")], started=0.0)[0],
        *fill([nodes[1]], [gang()], started=NOW - 1000),
    ]
    snapshot = Snapshot(nodes, held, [small("v0", submit=50.0)])
    plan = decide(snapshot, config(fair_share=FairShare.PREEMPT), NOW)
    assert summary(plan) == [("wait", "v0", "no_victims")], "seniority took them; fair share took it back: ping-pong"


def test_jobs_seniority_could_never_take_set_no_retry_and_are_not_named() -> None:
    older = [job(f"o{i}", team="b", gpus=1, submit=-1.0) for i in range(2)]
    two = replace(gang(), gpus=2, gpus_per_node=2)
    plan = decide(Snapshot(pool(1, 2), fill(pool(1, 2), older, started=NOW - 30), [two]), config(), NOW)
    [wait] = plan.waits
    assert plan.retry_at is None
    assert "o0" not in wait.message


def test_its_own_later_jobs_inside_their_minimum_runtime_are_named_and_set_the_retry() -> None:
    mine = [replace(s, team="a") for s in SMALL]
    plan = decide(Snapshot(pool(1, 4), fill(pool(1, 4), mine, started=NOW - 30), [gang()]), config(), NOW)
    [wait] = plan.waits
    assert plan.retry_at == NOW - 30 + 120
    assert "inside their minimum runtime" in wait.message and "s0" in wait.message


def test_a_job_is_senior_at_the_very_instant_its_retry_was_set_for() -> None:
    since = 128968.99425378117
    pending = gang(submit=since)
    now = since + HOUR
    later = [replace(s, submit_time=since + 1) for s in SMALL]
    assert summary(decide(Snapshot(pool(1, 4), backfilled(*later), [pending]), config(), now))[0][0] == "preempt"


def test_a_nominated_job_does_not_close_the_search_to_an_older_alike_one() -> None:
    older = gang(submit=0.0)
    nominated = replace(gang(submit=100.0), id="nominated", nominated=True)
    others = [small(f"c{i}", submit=50.0) for i in range(4)]
    plan = decide(Snapshot(pool(1, 4), backfilled(*others), [older, nominated]), config(), NOW)
    assert [p.for_job for p in plan.preemptions] == ["gang"] * 4


def test_a_one_gpu_job_never_searches_by_seniority(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.policy.preempt import search

    calls: list[object] = []
    monkeypatch.setattr(search, "find_victims", lambda *args: calls.append(args))
    plan = decide(Snapshot(pool(1, 4), backfilled(*SMALL), [small("one", team="a", submit=-5.0)]), config(), NOW)
    assert calls == [] and plan.retry_at is None


# Second review.


def test_fair_share_still_takes_a_lower_class_job_that_could_never_take_it_back() -> None:
    from gpupool.model import PriorityScope

    held = fill(pool(2, 4), [job("L", team="b", gpus=4), job("M", team="b", gpus=4)])
    claimant = job("J", team="a", cls="normal", gpus=2, submit=100.0)
    cfg = config(fair_share=FairShare.PREEMPT, priority_preemption=PriorityScope.TEAM)
    plan = decide(Snapshot(pool(2, 4), held, [claimant]), cfg, NOW)
    assert [(p.victim, p.reason) for p in plan.preemptions] == [("L", Reason.FAIR_SHARE)]


def test_higher_class_or_guaranteed_jobs_set_no_retry_for_seniority() -> None:
    high = [small(f"h{i}", cls="high") for i in range(4)]
    plan = decide(Snapshot(pool(1, 4), fill(pool(1, 4), high, started=NOW - 30), [gang()]), config(), NOW)
    assert plan.retry_at is None
    guaranteed = fill(pool(1, 4), SMALL, started=NOW - 30)
    plan = decide(Snapshot(pool(1, 4), guaranteed, [gang()]), config({"b": 4}), NOW)
    assert plan.retry_at is None
    assert "minimum runtime" not in plan.waits[0].message


def test_a_minimum_runtime_ends_at_the_instant_it_says() -> None:
    from gpupool.model import DEFAULT_CLASSES as CLASSES
    from gpupool.policy.preempt.candidates import protection

    started = 131017.30750703551
    low = CLASSES[-1]
    ran = fill(pool(1, 4), [small("s")], started=started)[0]
    assert protection(ran, low, started + low.min_runtime, config()) is None


# The queue pass with waits unexplained (the simulator's) goes by jobs alike to hopeless ones.

# Gangs of one kind in submit order, waiting since: A not senior (senior at NOW + 3500), B
# senior, C not (NOW + 3550), D not (requeued, NOW + 1600: the first to become senior).
LINE = [("A", 0.0, NOW - 100), ("B", 10.0, None), ("C", 20.0, NOW - 50), ("D", 30.0, NOW - 2000)]


def line_behind_urgent_jobs() -> Snapshot:
    urgent = fill(pool(2, 4), [job(f"u{i}", team="b", cls="urgent", gpus=4) for i in range(2)])
    gangs = [replace(job(id, cls="low", gpus=2, submit=at, gpus_per_node=2), queued_at=q) for id, at, q in LINE]
    return Snapshot(pool(2, 4), urgent, gangs)


def test_gangs_passed_in_line_still_say_when_the_first_of_them_becomes_senior() -> None:
    """A gang may be senior: its kind is passed once its senior and its other jobs left are
    alike to hopeless ones; the retry is when the first of those passed becomes senior (D,
    after A and B were tried), as when every job is tried."""
    plan = decide(line_behind_urgent_jobs(), config(explain_waits=False), NOW)
    assert (plan.starts, plan.preemptions, plan.waits) == ((), (), ())
    assert plan.retry_at == NOW + 1600


def test_with_seniority_the_pass_tries_a_gang_kind_once_for_each_of_senior_and_not(jobs_tried: list[str]) -> None:
    from gpupool.policy import PoolState
    from gpupool.policy import decide as decide_once

    plan = decide_once(PoolState.of(line_behind_urgent_jobs()), config(explain_waits=False), NOW)
    assert jobs_tried == ["A", "B"] and plan.retry_at == NOW + 1600
