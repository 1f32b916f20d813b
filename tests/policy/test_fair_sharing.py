"""Guarantees kept and shares rebalanced: one scenario per rule of reclaim, fair-share
preemption and the scope of priority preemption (docs/policy.md, section 4)."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.model import DEFAULT_CLASSES, Config, FairShare, Job, Node, PriorityScope, Reason, Snapshot, Team
from tests.support.builders import fill, job, on, pool, running, summary
from tests.support.oracle import decide

NOW = 10_000.0


def teams(**guarantees: int) -> dict[str, Team]:
    return {name: Team(name, guaranteed_gpus=g) for name, g in guarantees.items()}


def config(guarantees: dict[str, int], **options: Any) -> Config:
    return Config(DEFAULT_CLASSES, teams(**guarantees), **options)


def normal(id: str, team: str, gpus: int, submit: float = 0.0) -> Job:
    return job(id, team=team, cls="normal", gpus=gpus, submit=submit)


def case(id: str, snapshot: Snapshot, cfg: Config, expected: list[tuple[object, ...]]) -> object:
    return pytest.param(snapshot, cfg, expected, id=id)


CASES = [
    # 1. A guarantee is a promise: a job larger than the victim team's surplus may be taken.
    case(
        "reclaim-takes-a-whole-job-across-the-victims-guarantee-when-nothing-smaller-frees-a-placement",
        Snapshot(
            pool(1, 8),
            fill(pool(1, 8), [normal("a-big", "a", 6), normal("b0", "b", 2)]),
            [normal("b1", "b", 2)],
        ),
        config({"a": 4, "b": 4}),
        [("preempt", "a-big", "b1", "reclaim"), ("wait", "b1", "awaiting_drain")],
    ),
    case(
        "reclaim-across-a-guarantee-takes-the-set-that-goes-least-below-it",
        Snapshot(
            pool(2, 8),
            [
                running(normal("a6", "a", 6), on("n0", *range(6))),
                running(normal("b0", "b", 2), on("n0", 6, 7)),
                running(normal("a8", "a", 8), on("n1", *range(8))),
            ],
            [normal("b1", "b", 4)],
        ),
        config({"a": 10, "b": 6}),
        [("preempt", "a6", "b1", "reclaim"), ("wait", "b1", "awaiting_drain")],
    ),
    case(
        "reclaim-across-a-guarantee-takes-what-keeps-the-team-at-it-first-whatever-the-lost-work",
        Snapshot(
            pool(1, 4),
            [
                running(normal("b1", "b", 1), on("n0", 0)),
                running(normal("b2", "b", 3), on("n0", 1, 2, 3), last_ckpt=NOW - 1),
            ],
            [normal("a1", "a", 4)],
        ),
        config({"a": 4, "b": 1}),
        [("preempt", "b2", "a1", "reclaim"), ("preempt", "b1", "a1", "reclaim"), ("wait", "a1", "awaiting_drain")],
    ),
    case(
        "reclaim-across-guarantees-on-one-node-takes-the-job-that-goes-least-below",
        Snapshot(
            pool(1, 6),
            [
                running(normal("b1", "b", 4), on("n0", 0, 1, 2, 3), last_ckpt=NOW - 1),
                running(normal("c1", "c", 2), on("n0", 4, 5)),
            ],
            [normal("a1", "a", 2)],
        ),
        config({"a": 4, "b": 3, "c": 1}),
        [("preempt", "c1", "a1", "reclaim"), ("wait", "a1", "awaiting_drain")],
    ),
    case(
        "a-job-larger-than-its-teams-guarantee-still-reclaims-nothing",
        Snapshot(pool(1, 8), fill(pool(1, 8), [normal("a-big", "a", 8)]), [normal("b-big", "b", 6)]),
        config({"a": 4, "b": 4}),
        [("wait", "b-big", "no_victims")],
    ),
    # 2. Reclaim is decided on the team's GPUs once its own lower victims have left.
    case(
        "reclaim-counts-the-claimants-own-lower-job-leaving",
        Snapshot(
            pool(1, 8),
            fill(
                pool(1, 8),
                [job("b-low", team="b", cls="low", gpus=2), *(normal(f"a{i}", "a", 2) for i in range(3))],
            ),
            [normal("b1", "b", 4)],
        ),
        config({"a": 4, "b": 4}),
        [
            ("preempt", "b-low", "b1", "priority"),
            ("preempt", "a0", "b1", "reclaim"),
            ("wait", "b1", "awaiting_drain"),
        ],
    ),
    # 3. Reclaim takes from the team furthest above its guarantee first, not from the claimant.
    case(
        "reclaim-takes-from-the-team-above-its-guarantee-before-the-claimants-own-lower-job",
        Snapshot(
            pool(2, 8),
            [
                running(job("b-low", team="b", cls="low", gpus=4), on("n0", 0, 1, 2, 3)),
                running(normal("a-x", "a", 4), on("n0", 4, 5, 6, 7)),
                running(normal("a-y", "a", 4), on("n1", 0, 1, 2, 3)),
                running(normal("a-z", "a", 4), on("n1", 4, 5, 6, 7)),
            ],
            [normal("b1", "b", 4)],
        ),
        config({"a": 4, "b": 8}),
        [("preempt", "a-x", "b1", "reclaim"), ("wait", "b1", "awaiting_drain")],
    ),
    case(
        "reclaim-prefers-the-team-furthest-above-its-guarantee-over-a-cheaper-victim",
        Snapshot(
            pool(2, 8),
            [
                running(normal("c1", "c", 4), on("n0", 0, 1, 2, 3), last_ckpt=NOW - 10),
                running(normal("a1", "a", 4), on("n0", 4, 5, 6, 7)),
                running(normal("a2", "a", 4), on("n1", 0, 1, 2, 3)),
                running(normal("a3", "a", 4), on("n1", 4, 5, 6, 7)),
            ],
            [normal("b1", "b", 4)],
        ),
        config({"a": 0, "b": 8, "c": 0}),
        [("preempt", "a1", "b1", "reclaim"), ("wait", "b1", "awaiting_drain")],
    ),
    # 5. Fair-share preemption: from the highest weighted share, never below the claimant's.
    case(
        "fair-share-takes-from-the-team-with-the-highest-share-while-it-stays-at-or-above-the-claimants",
        Snapshot(
            pool(1, 8),
            fill(pool(1, 8), [*(normal(f"a{i}", "a", 2) for i in range(3)), normal("b0", "b", 2)]),
            [normal("b1", "b", 2), normal("b2", "b", 2, submit=1)],
        ),
        config({}, fair_share=FairShare.PREEMPT),
        [("preempt", "a0", "b1", "fair_share"), ("wait", "b1", "awaiting_drain"), ("wait", "b2", "no_victims")],
    ),
    case(
        "without-fair-share-an-equal-class-job-waits",
        Snapshot(
            pool(1, 8),
            fill(pool(1, 8), [*(normal(f"a{i}", "a", 2) for i in range(3)), normal("b0", "b", 2)]),
            [normal("b1", "b", 2)],
        ),
        config({}),
        [("wait", "b1", "no_victims")],
    ),
    case(
        "fair-share-never-takes-a-team-below-its-guarantee",
        Snapshot(
            pool(1, 8),
            fill(pool(1, 8), [*(normal(f"a{i}", "a", 2) for i in range(3)), normal("b0", "b", 2)]),
            [normal("b1", "b", 2)],
        ),
        config({"a": 6, "b": 2}, fair_share=FairShare.PREEMPT),
        [("wait", "b1", "no_victims")],
    ),
    # 6. The scope of priority preemption.
    *(
        case(
            f"priority-preemption-scope-{scope.value}",
            Snapshot(
                pool(1, 4),
                [
                    running(job("b-low", team="b", gpus=2), on("n0", 0, 1), last_ckpt=NOW - 5),
                    running(job("a-low", team="a", gpus=2), on("n0", 2, 3)),
                ],
                [job("a-high", team="a", cls="high", gpus=2)],
            ),
            config({"b": guarantee}, priority_preemption=scope),
            [("preempt", victim, "a-high", "priority"), ("wait", "a-high", "awaiting_drain")],
        )
        for scope, guarantee, victim in [
            (PriorityScope.POOL, 2, "b-low"),
            (PriorityScope.TEAM, 0, "a-low"),
            (PriorityScope.ABOVE_GUARANTEE, 2, "a-low"),
            (PriorityScope.ABOVE_GUARANTEE, 0, "b-low"),
        ]
    ),
    case(
        "priority-preemption-within-the-team-leaves-other-teams-alone",
        Snapshot(pool(1, 2), fill(pool(1, 2), [job("b-low", team="b", gpus=2)]), [job("a-high", cls="high", gpus=2)]),
        config({}, priority_preemption=PriorityScope.TEAM),
        [("wait", "a-high", "no_victims")],
    ),
]


@pytest.mark.parametrize(("snapshot", "cfg", "expected"), CASES)
def test_scenario(snapshot: Snapshot, cfg: Config, expected: list[tuple[object, ...]]) -> None:
    assert summary(decide(snapshot, cfg, NOW)) == expected


def wait_message(snapshot: Snapshot, cfg: Config, job_id: str) -> str:
    [wait] = [w for w in decide(snapshot, cfg, NOW).waits if w.job == job_id]
    assert wait.reason is Reason.NO_VICTIMS
    return wait.message


def test_a_wait_names_the_guarantee_floor_that_protects_a_team() -> None:
    snapshot = Snapshot(pool(1, 2), fill(pool(1, 2), [job("b-low", team="b", gpus=2)]), [job("h", cls="high", gpus=2)])
    message = wait_message(snapshot, config({"b": 2}, priority_preemption=PriorityScope.ABOVE_GUARANTEE), "h")
    assert "guarantee floor: team b holds 2 GPUs, 2 guaranteed (job b-low)" in message


def test_a_wait_names_the_guarantee_floor_that_limits_how_much_of_a_team_may_be_taken() -> None:
    nodes = pool(1, 8)
    sweeps = fill(nodes, [job(f"v{i}", team="b", gpus=1) for i in range(8)])
    snapshot = Snapshot(nodes, sweeps, [job("h", cls="high", gpus=8)])
    message = wait_message(snapshot, config({"b": 3}, priority_preemption=PriorityScope.ABOVE_GUARANTEE), "h")
    assert "guarantee floor: team b holds 8 GPUs, 3 guaranteed: 5 may be taken (jobs v0, v1, v2 and 5 more)" in message


def test_a_wait_names_the_fair_shares_that_keep_a_team_from_taking() -> None:
    running_jobs = fill(pool(1, 4), [normal("a0", "a", 2), normal("b0", "b", 2)])
    snapshot = Snapshot(pool(1, 4), running_jobs, [normal("b1", "b", 2)])
    message = wait_message(snapshot, config({}, fair_share=FairShare.PREEMPT), "b1")
    assert "fair share: team a would have a share of 0 after, below team b's 4 with this job (job a0)" in message


def test_a_wait_names_no_team_rule_for_a_job_another_rule_lets_it_take() -> None:
    nodes = pool(1, 4)
    held = [
        running(job("b1", team="b", gpus=2), on("n0", 0, 1)),
        running(job("b2", team="b", cls="urgent", gpus=2), on("n0", 2, 3)),
    ]
    cfg = Config(
        DEFAULT_CLASSES,
        {"a": Team("a", weight=4.0), "b": Team("b")},
        priority_preemption=PriorityScope.TEAM,
        fair_share=FairShare.PREEMPT,
    )
    message = wait_message(Snapshot(nodes, held, [job("a1", cls="high", gpus=4)]), cfg, "a1")
    assert "b1" not in message, "fair share may take b1: the team rule does not keep it"


def test_a_reclaim_wait_names_the_equal_class_jobs_whose_minimum_runtime_it_waits_for() -> None:
    young = running(normal("b0", "b", 4), on("n0", 0, 1, 2, 3), started=NOW - 60)
    plan = decide(Snapshot(pool(1, 4), [young], [normal("a1", "a", 2)]), config({"a": 4}), NOW)
    [wait] = plan.waits
    assert plan.retry_at == NOW - 60 + 300
    assert "inside their minimum runtime (normal: 5.0 min): job b0 for 4.0 min more" in wait.message


def test_jobs_alike_of_teams_with_different_shares_search_for_victims_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.policy import PoolState
    from gpupool.policy import decide as decide_once
    from gpupool.policy.preempt import search

    calls = []
    real = search.find_victims

    def counted(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(search, "find_victims", counted)
    names = "abcdefgh"
    nodes = pool(1, 4) + [Node(f"m{i}", 8, "other") for i in range(len(names))]
    held = [running(job("u", team="z", cls="urgent", gpus=4), on("n0", 0, 1, 2, 3))]
    held += [
        running(job(f"r{t}", team=t, cls="urgent", gpus=i + 1, gpu_type="other"), on(f"m{i}", *range(i + 1)))
        for i, t in enumerate(names)
    ]
    pending = [job(f"p{t}", team=t, cls="high", gpus=4, gpu_type="gpu") for t in names]
    decide_once(PoolState.of(Snapshot(nodes, held, pending)), config({}), NOW)
    assert len(calls) == 1, "a search that found nothing for one team finds nothing for the next"


def test_a_wait_names_a_priority_scope_that_keeps_other_teams_out() -> None:
    snapshot = Snapshot(pool(1, 2), fill(pool(1, 2), [job("b-low", team="b", gpus=2)]), [job("h", cls="high", gpus=2)])
    message = wait_message(snapshot, config({}, priority_preemption=PriorityScope.TEAM), "h")
    assert "priority preemption takes only team a's own jobs (policy.priority_preemption: team): job b-low" in message
