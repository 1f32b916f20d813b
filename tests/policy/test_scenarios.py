"""Table-driven scenarios, one per rule of the core: `decide` on a small snapshot, compared as
a summary (what starts where, who is preempted for whom, who waits and why)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from gpupool.model import (
    DEFAULT_CLASSES,
    Config,
    Node,
    PlacementRule,
    PriorityBudget,
    QueueMode,
    QueueOrder,
    RunningJob,
    Snapshot,
    Team,
)
from tests.support.builders import fill, job, on, pool, running, summary
from tests.support.oracle import decide

NOW = 10_000.0
BASE = Config(DEFAULT_CLASSES)
TEAMS = Config(
    DEFAULT_CLASSES,
    teams={"a": Team("a", guaranteed_gpus=4), "b": Team("b", guaranteed_gpus=4)},
)
FIRST_FIT = Config(DEFAULT_CLASSES, placement=PlacementRule.FIRST_FIT)
TWO = pool(2, 8)
EIGHT_LOW = [job(f"l{i}", cls="low", gpus=2) for i in range(8)]


def case(
    id: str,
    snapshot: Snapshot,
    expected: list[tuple[object, ...]],
    config: Config = BASE,
) -> object:
    return pytest.param(snapshot, config, expected, id=id)


CASES = [
    # --- placement ---------------------------------------------------------------------
    case(
        "best-fit-packs-into-the-fullest-node",
        Snapshot(TWO, fill(TWO, [job("x", gpus=5)]), [job("a", gpus=2)]),
        [("start", "a", (("n0", (5, 6)),), "free_gpus")],
    ),
    case(
        "first-fit-takes-the-first-node-that-fits",
        Snapshot(TWO, [running(job("x", gpus=5), on("n1", 0, 1, 2, 3, 4))], [job("a", gpus=2)]),
        [("start", "a", (("n0", (0, 1)),), "free_gpus")],
        FIRST_FIT,
    ),
    case(
        "best-fit-gang-member-takes-the-fullest-node",
        Snapshot(
            pool(3, 8),
            [running(job("x", gpus=2), on("n0", 0, 1)), running(job("y", gpus=3), on("n2", 0, 1, 2))],
            [job("a", gpus=12)],
        ),
        [("start", "a", (("n1", tuple(range(8))), ("n2", (3, 4, 5, 6))), "free_gpus")],
    ),
    case(
        "first-fit-gang-member-takes-the-first-node",
        Snapshot(
            pool(3, 8),
            [running(job("x", gpus=2), on("n0", 0, 1)), running(job("y", gpus=3), on("n2", 0, 1, 2))],
            [job("a", gpus=12)],
        ),
        [("start", "a", (("n1", tuple(range(8))), ("n0", (2, 3, 4, 5))), "free_gpus")],
        FIRST_FIT,
    ),
    case(
        "multi-node-job-takes-fewest-nodes",
        Snapshot(pool(3, 8), [], [job("a", gpus=12)]),
        [("start", "a", (("n0", tuple(range(8))), ("n1", (0, 1, 2, 3))), "free_gpus")],
    ),
    case(
        "gpus-per-node-spreads-equal-members",
        Snapshot(pool(3, 8), [], [job("a", gpus=6, gpus_per_node=2)]),
        [("start", "a", (("n0", (0, 1)), ("n1", (0, 1)), ("n2", (0, 1))), "free_gpus")],
    ),
    case(
        "gang-is-all-or-nothing",
        Snapshot(TWO, fill(TWO, [job("x", gpus=4, cls="high")]), [job("a", gpus=16)]),
        [("wait", "a", "no_fit")],
    ),
    case(
        "gpu-type-must-match",
        Snapshot(
            [Node("v0", 8, "v100"), Node("h0", 8, "h100")],
            [],
            [job("a", gpus=4, gpu_type="h100"), job("b", gpus=8, gpu_type="v100", submit=1)],
        ),
        [
            ("start", "a", (("h0", (0, 1, 2, 3)),), "free_gpus"),
            ("start", "b", (("v0", tuple(range(8))),), "free_gpus"),
        ],
    ),
    case(
        "dedicated-nodes-serve-only-their-team",
        Snapshot(
            pool(1, 8, prefix="a", team="a") + pool(1, 8, prefix="b", team="b"),
            [],
            [job("x", team="a", gpus=8), job("y", team="a", gpus=8, submit=1)],
        ),
        [("start", "x", (("a0", tuple(range(8))),), "free_gpus"), ("wait", "y", "no_fit")],
    ),
    case(
        "larger-than-the-pool-never-fits",
        Snapshot(TWO, [], [job("a", gpus=32, cls="urgent")]),
        [("wait", "a", "never_fits")],
    ),
    case(
        "a-gang-fills-nodes-of-mixed-sizes-on-as-few-as-possible",
        Snapshot([Node("big", 8), Node("s0", 4), Node("s1", 4), Node("s2", 4)], [], [job("a", gpus=16)]),
        [("start", "a", (("big", tuple(range(8))), ("s0", (0, 1, 2, 3)), ("s1", (0, 1, 2, 3))), "free_gpus")],
    ),
    # --- queue order -------------------------------------------------------------------
    case(
        "higher-class-goes-first",
        Snapshot(pool(1, 8), [], [job("lo", cls="low", gpus=8), job("hi", cls="normal", gpus=8, submit=9)]),
        [("start", "hi", (("n0", tuple(range(8))),), "free_gpus"), ("wait", "lo", "no_fit")],
    ),
    case(
        "lower-weighted-share-goes-first",
        Snapshot(
            pool(2, 4),
            fill(pool(2, 4), [job("held", team="a", gpus=2, cls="normal")]),
            [job("a1", team="a", gpus=4), job("b1", team="b", gpus=4, submit=5)],
        ),
        [("start", "b1", (("n1", (0, 1, 2, 3)),), "free_gpus"), ("wait", "a1", "no_fit")],
    ),
    case(
        "submit-time-breaks-ties-and-requeued-jobs-keep-theirs",
        Snapshot(pool(1, 4), [], [job("new", gpus=4, submit=50), job("requeued", gpus=4, submit=10, preemptions=1)]),
        [("start", "requeued", (("n0", (0, 1, 2, 3)),), "free_gpus"), ("wait", "new", "no_fit")],
    ),
    case(
        "backfill-lets-a-small-job-pass-a-big-one",
        Snapshot(
            pool(1, 8),
            fill(pool(1, 8), [job("x", gpus=6, cls="high")]),
            [job("big", gpus=8), job("small", gpus=2, submit=5)],
        ),
        [("start", "small", (("n0", (6, 7)),), "free_gpus"), ("wait", "big", "no_fit")],
    ),
    case(
        "strict-queue-blocks-behind-the-head",
        Snapshot(
            pool(1, 8),
            fill(pool(1, 8), [job("x", gpus=6, cls="high")]),
            [job("big", gpus=8), job("small", gpus=2, submit=5)],
        ),
        [("wait", "big", "no_fit"), ("wait", "small", "queue_blocked")],
        replace(BASE, queue=QueueMode.STRICT, order=QueueOrder.FIFO, preemption=False),
    ),
    case(
        "strict-queue-blocks-only-the-partition-it-shares",
        Snapshot(
            pool(1, 4, prefix="a", team="a") + pool(1, 4, prefix="b", team="b"),
            [],
            [job("a-big", team="a", gpus=8), job("b-small", team="b", gpus=2, submit=5)],
        ),
        [("start", "b-small", (("b0", (0, 1)),), "free_gpus"), ("wait", "a-big", "never_fits")],
        replace(BASE, queue=QueueMode.STRICT, order=QueueOrder.FIFO, preemption=False),
    ),
    case(
        "strict-queue-blocks-only-the-busy-partition",
        Snapshot(
            pool(1, 4, prefix="a", team="a") + pool(1, 4, prefix="b", team="b"),
            [running(job("busy", team="a", gpus=4), on("a0", 0, 1, 2, 3))],
            [
                job("a-next", team="a", gpus=4),
                job("a-small", team="a", gpus=1, submit=3),
                job("b-small", team="b", submit=5),
            ],
        ),
        [
            ("start", "b-small", (("b0", (0,)),), "free_gpus"),
            ("wait", "a-next", "no_fit"),
            ("wait", "a-small", "queue_blocked"),
        ],
        replace(BASE, queue=QueueMode.STRICT, order=QueueOrder.FIFO, preemption=False),
    ),
    # --- priority preemption -----------------------------------------------------------
    case(
        "victim-with-the-least-lost-work-is-chosen",
        Snapshot(
            pool(1, 4),
            [
                running(job("old-ckpt", gpus=2), on("n0", 0, 1), started=0, last_ckpt=1000),
                running(job("fresh-ckpt", gpus=2), on("n0", 2, 3), started=0, last_ckpt=NOW - 10),
            ],
            [job("h", cls="high", gpus=2)],
        ),
        [("preempt", "fresh-ckpt", "h", "priority"), ("wait", "h", "awaiting_drain")],
    ),
    case(
        "lower-class-is-preempted-before-a-cheaper-higher-one",
        Snapshot(
            pool(2, 4),
            [
                running(job("normal", cls="normal", gpus=4), on("n0", 0, 1, 2, 3), started=0, last_ckpt=NOW - 1),
                running(job("low", cls="low", gpus=4), on("n1", 0, 1, 2, 3), started=0),
            ],
            [job("h", cls="high", gpus=4)],
        ),
        [("preempt", "low", "h", "priority"), ("wait", "h", "awaiting_drain")],
    ),
    case(
        "at-the-same-highest-class-the-node-whose-other-victims-are-lower-goes-first",
        Snapshot(
            pool(2, 4),
            [
                running(job("n0-a", cls="normal", gpus=2), on("n0", 0, 1), started=0, last_ckpt=NOW - 1),
                running(job("n0-b", cls="normal", gpus=2), on("n0", 2, 3), started=0, last_ckpt=NOW - 1),
                running(job("n1-normal", cls="normal", gpus=2), on("n1", 0, 1), started=0),
                running(job("n1-low", cls="low", gpus=2), on("n1", 2, 3), started=0),
            ],
            [job("u", cls="urgent", gpus=4)],
        ),
        [
            ("preempt", "n1-low", "u", "priority"),
            ("preempt", "n1-normal", "u", "priority"),
            ("wait", "u", "awaiting_drain"),
        ],
    ),
    case(
        "fewer-victims-at-equal-lost-work",
        Snapshot(
            pool(2, 4),
            [running(job("big", gpus=4), on("n0", 0, 1, 2, 3), started=NOW - 1000)]
            + [running(job(f"s{i}", gpus=1), on("n1", i), started=NOW - 1000) for i in range(4)],
            [job("h", cls="high", gpus=4)],
        ),
        [("preempt", "big", "h", "priority"), ("wait", "h", "awaiting_drain")],
    ),
    case(
        "victims-not-needed-are-reprieved",
        Snapshot(
            pool(1, 8),
            [
                running(job("a1", gpus=1), on("n0", 0), started=0, last_ckpt=NOW - 5),
                running(job("a2", gpus=1), on("n0", 1), started=0, last_ckpt=NOW - 6),
                running(job("big", gpus=4), on("n0", 2, 3, 4, 5), started=0, last_ckpt=NOW - 7),
            ],
            [job("h", cls="high", gpus=6)],
        ),
        [("preempt", "big", "h", "priority"), ("wait", "h", "awaiting_drain")],
    ),
    case(
        "a-multi-node-gang-preempts-on-as-many-nodes-as-it-needs",
        Snapshot(
            pool(3, 8),
            fill(
                pool(3, 8),
                [job("n", cls="normal", gpus=8, submit=0)] + [job(f"l{i}", gpus=8) for i in range(2)],
            ),
            [job("h", cls="high", gpus=16, gpus_per_node=8)],
        ),
        [
            ("preempt", "l0", "h", "priority"),
            ("preempt", "l1", "h", "priority"),
            ("wait", "h", "awaiting_drain"),
        ],
    ),
    case(
        "a-victim-needed-on-one-node-is-reprieved-when-a-spanning-one-covers-the-gang",
        Snapshot(
            pool(2, 4),
            [
                running(job("x", gpus=2), on("n0", 0, 1), started=0, last_ckpt=NOW - 1),
                running(job("y", gpus=4), on("n0", 2, 3) + on("n1", 0, 1), started=0, last_ckpt=NOW - 100),
                running(job("u", cls="urgent", gpus=2), on("n1", 2, 3)),
            ],
            [job("g", cls="high", gpus=4, gpus_per_node=2)],
        ),
        [("preempt", "y", "g", "priority"), ("wait", "g", "awaiting_drain")],
    ),
    case(
        "no-preemption-unless-the-job-then-fits",
        Snapshot(
            pool(1, 8),
            [
                running(job("u", cls="urgent", gpus=4), on("n0", 0, 1, 2, 3)),
                running(job("l", cls="low", gpus=4), on("n0", 4, 5, 6, 7)),
            ],
            [job("h", cls="high", gpus=8)],
        ),
        [("wait", "h", "no_victims")],
    ),
    case(
        "low-class-may-not-preempt",
        Snapshot(pool(1, 2), fill(pool(1, 2), [job("x", cls="low", gpus=2)]), [job("y", cls="low", gpus=2)]),
        [("wait", "y", "no_fit")],
    ),
    case(
        "equal-class-is-never-preempted-without-reclaim",
        Snapshot(pool(1, 2), fill(pool(1, 2), [job("x", cls="high", gpus=2)]), [job("y", cls="high", gpus=2)]),
        [("wait", "y", "no_victims")],
    ),
    # --- protection --------------------------------------------------------------------
    case(
        "minimum-runtime-protects",
        Snapshot(
            pool(1, 2),
            [running(job("x", cls="low", gpus=2), on("n0", 0, 1), started=NOW - 60)],
            [job("h", cls="high", gpus=2)],
        ),
        [("wait", "h", "no_victims")],
    ),
    case(
        "non-preemptible-class-is-protected",
        Snapshot(
            pool(1, 2),
            [running(job("x", cls="urgent", gpus=2), on("n0", 0, 1))],
            [job("h", cls="urgent", gpus=2)],
        ),
        [("wait", "h", "no_victims")],
    ),
    case(
        "preemption-cap-protects",
        Snapshot(
            pool(1, 2),
            [running(job("x", gpus=2, preemptions=3, max_preemptions=3), on("n0", 0, 1))],
            [job("h", cls="high", gpus=2)],
        ),
        [("wait", "h", "no_victims")],
    ),
    # --- reclaim -----------------------------------------------------------------------
    case(
        "a-team-below-its-guarantee-reclaims-at-equal-class",
        Snapshot(
            pool(1, 8),
            fill(pool(1, 8), [job(f"a{i}", team="a", cls="normal", gpus=2) for i in range(4)]),
            [job("b1", team="b", cls="normal", gpus=2)],
        ),
        [("preempt", "a0", "b1", "reclaim"), ("wait", "b1", "awaiting_drain")],
        TEAMS,
    ),
    case(
        "reclaim-never-pushes-the-victim-team-below-its-guarantee",
        Snapshot(
            pool(1, 8),
            [
                *fill(pool(1, 8), [job(f"a{i}", team="a", cls="normal", gpus=2) for i in range(3)]),
                running(job("b0", team="b", cls="normal", gpus=2), on("n0", 6, 7)),
            ],
            [job("b1", team="b", cls="normal", gpus=2), job("b2", team="b", cls="normal", gpus=2, submit=1)],
        ),
        [("preempt", "a0", "b1", "reclaim"), ("wait", "b1", "awaiting_drain"), ("wait", "b2", "no_victims")],
        TEAMS,
    ),
    case(
        "reclaim-stops-at-the-preemptors-own-guarantee",
        Snapshot(
            pool(1, 8),
            fill(pool(1, 8), [job(f"a{i}", team="a", cls="normal", gpus=2) for i in range(4)]),
            [job("b-big", team="b", cls="normal", gpus=6)],
        ),
        [("wait", "b-big", "no_victims")],
        TEAMS,
    ),
    # --- in-flight preemptions ---------------------------------------------------------
    case(
        "no-new-victims-while-a-drain-covers-the-job",
        Snapshot(
            pool(1, 8),
            [
                running(job("v", gpus=4), on("n0", 0, 1, 2, 3), notice_for="h", deadline=NOW + 30),
                running(job("w", gpus=4), on("n0", 4, 5, 6, 7)),
            ],
            [job("h", cls="high", gpus=4)],
        ),
        [("wait", "h", "awaiting_drain")],
    ),
    case(
        "gpus-freed-by-a-partial-drain-are-held-for-the-preemptor",
        Snapshot(
            pool(1, 8),
            [
                running(job("v2", gpus=4), on("n0", 4, 5, 6, 7), notice_for="h", deadline=NOW + 30),
            ],
            [job("h", cls="high", gpus=8, submit=5), job("l", cls="low", gpus=4, submit=1)],
        ),
        [("wait", "h", "awaiting_drain"), ("wait", "l", "no_fit")],
    ),
    case(
        "a-preemptor-that-fits-on-free-gpus-starts-without-waiting-for-its-drain",
        Snapshot(
            pool(2, 4),
            [running(job("v", gpus=4), on("n0", 0, 1, 2, 3), notice_for="h", deadline=NOW + 30)],
            [job("h", cls="high", gpus=4)],
        ),
        [("start", "h", (("n1", (0, 1, 2, 3)),), "free_gpus")],
    ),
    case(
        "a-job-draining-for-another-waiting-job-is-not-chosen-again",
        Snapshot(
            pool(1, 4),
            [running(job("v", gpus=4), on("n0", 0, 1, 2, 3), notice_for="other", deadline=NOW + 30)],
            [job("h", cls="high", gpus=4), job("other", cls="normal", gpus=4)],
        ),
        [("wait", "other", "awaiting_drain"), ("wait", "h", "no_victims")],
    ),
    case(
        "a-drain-whose-preemptor-is-gone-serves-the-next-job",
        Snapshot(
            pool(1, 4),
            [running(job("v", gpus=4), on("n0", 0, 1, 2, 3), notice_for="gone", deadline=NOW + 30)],
            [job("h", cls="high", gpus=4)],
        ),
        [("wait", "h", "awaiting_drain")],
    ),
    case(
        "held-gpus-are-not-taken-by-another-preemptor",
        Snapshot(
            pool(1, 8),
            [
                running(job("l1", gpus=2), on("n0", 0, 1), notice_for="b", deadline=NOW + 30),
                running(job("l3", gpus=2), on("n0", 4, 5), notice_for="a", deadline=NOW + 30),
                running(job("la", gpus=2), on("n0", 6, 7)),
            ],
            [job("a", cls="urgent", gpus=2, submit=1), job("b", cls="high", gpus=4)],
        ),
        [("wait", "a", "awaiting_drain"), ("wait", "b", "awaiting_drain")],
    ),
    # --- budgets -----------------------------------------------------------------------
    case(
        "over-budget-team-runs-one-class-lower",
        Snapshot(pool(1, 4), [], [job("h", team="a", cls="high", gpus=4)], usage={("a", "high"): 11 * 3600}),
        [("start", "h", (("n0", (0, 1, 2, 3)),), "budget_exceeded")],
        Config(DEFAULT_CLASSES, teams={"a": Team("a", budgets=(PriorityBudget("high", 10, 86400),))}),
    ),
    case(
        "over-budget-team-cannot-preempt-its-new-class",
        Snapshot(
            pool(1, 4),
            fill(pool(1, 4), [job("n", team="b", cls="normal", gpus=4)]),
            [job("h", team="a", cls="high", gpus=4)],
            usage={("a", "high"): 11 * 3600},
        ),
        [("wait", "h", "no_victims")],
        Config(DEFAULT_CLASSES, teams={"a": Team("a", budgets=(PriorityBudget("high", 10, 86400),))}),
    ),
]


@pytest.mark.parametrize(("snapshot", "config", "expected"), CASES)
def test_scenario(snapshot: Snapshot, config: Config, expected: list[tuple[object, ...]]) -> None:
    before = copy.deepcopy(snapshot)
    plan = decide(snapshot, config, NOW)
    assert summary(plan) == expected
    assert snapshot == before, "decide modified its snapshot"


def test_preemption_message_names_both_jobs_and_the_checkpoint_age() -> None:
    victim = running(job("812", team="vision", gpus=8), on("n0", *range(8)), started=0, last_ckpt=NOW - 40)
    plan = decide(Snapshot(pool(1, 8), [victim], [job("977", team="nlp", cls="urgent", gpus=8)]), BASE, NOW)
    assert plan.preemptions[0].message == (
        "preempted job 812 (team vision, low, last checkpoint 40 s ago) for job 977 (team nlp, urgent)"
    )
    assert plan.preemptions[0].deadline == NOW + 60.0


def test_budget_demotion_is_stated_in_the_start() -> None:
    config = Config(DEFAULT_CLASSES, teams={"a": Team("a", budgets=(PriorityBudget("high", 10, 86400),))})
    snapshot = Snapshot(pool(1, 4), [], [job("h", cls="high", gpus=4)], usage={("a", "high"): 11 * 3600})
    start = decide(snapshot, config, NOW).starts[0]
    assert start.priority == "normal"
    assert "over its high budget (11.0 of 10 GPU-h per 24 h): runs as normal" in start.message


def test_minimum_runtime_protection_says_when_to_decide_again() -> None:
    victim = running(job("x", cls="low", gpus=2), on("n0", 0, 1), started=NOW - 60)
    plan = decide(Snapshot(pool(1, 2), [victim], [job("h", cls="high", gpus=2)]), BASE, NOW)
    assert plan.retry_at == NOW - 60 + 120


def test_explain_waits_off_leaves_out_ordinary_waits() -> None:
    config = replace(BASE, explain_waits=False)
    snapshot = Snapshot(pool(1, 2), fill(pool(1, 2), [job("x", gpus=2)]), [job("y", gpus=2)])
    assert decide(snapshot, config, NOW).waits == ()


def test_a_snapshot_holding_one_gpu_twice_is_rejected() -> None:
    twice: list[RunningJob] = [running(job("x"), on("n0", 0)), running(job("y"), on("n0", 0))]
    with pytest.raises(ValueError, match="GPU 0 of node n0 is held twice"):
        decide(Snapshot(pool(1, 2), twice, []), BASE, NOW)


def test_an_unknown_priority_class_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown priority class 'vip'"):
        decide(Snapshot(pool(1, 2), [], [job("x", cls="vip")]), BASE, NOW)


def test_a_preemption_by_a_demoted_job_says_so_and_keeps_the_victims_own_grace() -> None:
    config = Config(DEFAULT_CLASSES, teams={"a": Team("a", budgets=(PriorityBudget("high", 10, 86400),))})
    victim = running(job("v", team="b", cls="low", gpus=4), on("n0", 0, 1, 2, 3), started=0)
    snapshot = Snapshot(
        pool(1, 4), [victim], [job("h", team="a", cls="high", gpus=4)], usage={("a", "high"): 11 * 3600}
    )
    [notice] = decide(snapshot, config, NOW).preemptions
    assert "for job h (team a, normal); team a is over its high budget" in notice.message
    assert notice.deadline == NOW + config.priority_class("low").grace_period


def test_reclaim_blocked_by_minimum_runtime_says_when_to_decide_again() -> None:
    young = running(job("a0", team="a", cls="normal", gpus=8), on("n0", *range(8)), started=NOW - 10)
    plan = decide(Snapshot(pool(1, 8), [young], [job("b1", team="b", cls="normal", gpus=2)]), TEAMS, NOW)
    assert summary(plan) == [("wait", "b1", "no_victims")]
    assert plan.retry_at == NOW - 10 + 300


def test_only_the_first_jobs_in_line_that_wait_are_explained_up_to_the_depth() -> None:
    """`policy.explain_depth`: the first jobs in line that wait get their `Wait`; those after
    keep the reason they were last given (no `Wait`), whatever their own reason; a job that
    holds GPUs for its victims always says so (its placement is in the `Wait`)."""
    running = fill(pool(1, 4), [job("low", cls="low", gpus=4)], started=0.0)
    waiting = [job(f"w{i}", team="b", cls="low", gpus=1, submit=float(i)) for i in range(4)]
    urgent = job("u", team="c", cls="urgent", gpus=4, submit=10.0)
    snapshot = Snapshot(pool(1, 4), running, [*waiting, urgent])
    plan = decide(snapshot, replace(BASE, explain_depth=2), 1000.0)
    assert [(w.job, w.reason.value) for w in plan.waits] == [
        ("u", "awaiting_drain"),
        ("w0", "no_fit"),
        ("w1", "no_fit"),
    ]
    assert len(decide(snapshot, BASE, 1000.0).waits) == 5
    assert decide(snapshot, replace(BASE, explain_depth=0), 1000.0).waits == plan.waits[:1]


def test_past_the_explained_depth_the_pass_goes_by_jobs_alike_to_hopeless_ones(jobs_tried: list[str]) -> None:
    """The queue pass tries each job in line while it explains waits; past the depth, a job
    alike to one that could neither start nor preempt is not tried (its kind is passed)."""
    from gpupool.policy import PoolState
    from gpupool.policy import decide as decide_once

    running = fill(pool(1, 4), [job("low", cls="low", gpus=4)], started=0.0)
    waiting = [job(f"w{i}", team="b", cls="low", gpus=1, submit=float(i)) for i in range(6)]
    state = PoolState.of(Snapshot(pool(1, 4), running, waiting))
    plan = decide_once(state, replace(BASE, explain_depth=2), 1000.0)
    assert [w.job for w in plan.waits] == ["w0", "w1"]
    assert jobs_tried == ["w0"], "w1 was explained as alike to w0; the others were passed"


def test_the_reference_orders_the_jobs_whose_victims_drain_by_its_own_sort() -> None:
    """The review found the drain stage order its jobs with the product's line on both sides, so
    the reference could not see a wrong order there: a line that gives them reversed must be
    caught."""
    from gpupool.policy import PoolState
    from gpupool.policy import decide as decide_on
    from gpupool.policy.line import Line
    from tests.support.oracle import reference_state

    class Reversed(Line):
        def in_order(self, *args: Any, **kwargs: Any) -> Any:
            return iter(list(super().in_order(*args, **kwargs))[::-1])

    nodes = [Node("n0", 8)]
    first, second = job("p1", cls="high", gpus=3, submit=1.0), job("p2", cls="high", gpus=3, submit=2.0)
    running_jobs = [
        running(job("v1", cls="low", gpus=2), on("n0", 0, 1), notice_for="p1", deadline=100.0),
        running(job("v2", cls="low", gpus=2), on("n0", 2, 3), notice_for="p2", deadline=100.0),
        running(job("r", cls="urgent", gpus=3), on("n0", 4, 5, 6)),
    ]
    snapshot = Snapshot(nodes, running_jobs, [first, second])
    config = replace(BASE, preemption=False)
    bugged = PoolState(nodes, line=Reversed())
    bugged.fill(snapshot)
    assert decide_on(bugged, config, 50.0) != decide_on(reference_state(snapshot), config, 50.0)
