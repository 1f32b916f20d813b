"""The greedy victim search against the exhaustive one (`policy.reference`) on small pools.

The greedy search is not exact in lost work (benchmarks/victim_choice.py measures how often it
differs), but it never misses a sufficient set, never takes a victim it does not need, and
never reaches a higher class than the cheapest set needs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from test_properties import NOW

from gpupool.model import DEFAULT_CLASSES, Config, Job, Node, RunningJob, Snapshot
from gpupool.policy.reference import cheapest_victims, set_cost
from tests.support.builders import BATCH_CLASSES, packed
from tests.support.exercised import Exercised
from tests.support.oracle import decide

CONFIG = Config(DEFAULT_CLASSES, max_preemptions=None)
CLASSES = list(BATCH_CLASSES)


@st.composite
def small_pools(draw: st.DrawFn) -> tuple[Snapshot, Job]:
    nodes = [Node(f"n{i}", draw(st.sampled_from([2, 4, 8]))) for i in range(draw(st.integers(1, 4)))]
    free = {n.name: list(range(n.gpus)) for n in nodes}
    running: list[RunningJob] = []
    for i in range(draw(st.integers(1, 8))):
        job = Job(f"r{i}", "a", draw(st.sampled_from(CLASSES)), draw(st.sampled_from([1, 1, 2, 3, 4, 8])), 0.0)
        placement = packed(job, nodes, free)
        if placement is not None:
            started = draw(st.floats(0, NOW - 700))
            checkpoint = draw(st.one_of(st.none(), st.floats(started, NOW)))
            running.append(RunningJob(job, placement, started, checkpoint))
    gpus = draw(st.integers(1, max(n.gpus for n in nodes)))
    pending = Job("p", "b", draw(st.sampled_from(["urgent", "high", "normal"])), gpus, NOW)
    return Snapshot(nodes, running, [pending]), pending


def test_greedy_finds_a_minimal_set_at_the_lowest_class_the_cheapest_needs() -> None:
    exercised = Exercised()

    @given(small_pools())
    def check(case: tuple[Snapshot, Job]) -> None:
        snapshot, job = case
        plan = decide(snapshot, CONFIG, NOW)
        chosen = [p.victim for p in plan.preemptions]
        exercised.note(preemptions=bool(chosen))
        best = cheapest_victims(job, snapshot, CONFIG, NOW)
        assert (best is None) == (not chosen), f"greedy chose {chosen}, the exhaustive search {best}"
        if best is None:
            return
        running = {r.job.id: r for r in snapshot.running}
        greedy = set_cost([running[v] for v in chosen], CONFIG, NOW)
        assert greedy >= best[0]
        assert greedy[0][0] == best[0][0][0], "greedy reached a higher class than the cheapest set"
        [held] = [w.placement for w in plan.waits if w.job == job.id]
        [node] = held
        taken = {(a.node, g) for r in snapshot.running for a in r.placement for g in a.gpus}
        size = next(n.gpus for n in snapshot.nodes if n.name == node.node)
        free = sum((node.node, g) not in taken for g in range(size))
        on_node = {v: sum(len(a.gpus) for a in running[v].placement if a.node == node.node) for v in chosen}
        for victim in chosen:
            assert free + sum(on_node.values()) - on_node[victim] < job.gpus, f"{victim} is not needed"

    check()
    exercised.assert_shown("preemptions")


def test_the_cheapest_victim_is_found_on_a_node_whose_other_jobs_cost_most() -> None:
    """The search looks at nodes in the order of the cheapest victim each could give: a node
    that also holds the most expensive job must not be passed over for it."""
    from gpupool.model import Allocation

    def low(id: str, team: str, node: str, gpu: int, checkpoint: float | None) -> RunningJob:
        return RunningJob(Job(id, team, "low", 1, 0.0), (Allocation(node, (gpu,)),), 0.0, checkpoint)

    running = [
        low("costly-1", "c", "n0", 0, None),
        low("cheap", "a", "n0", 1, NOW - 10),
        low("costly-2", "a", "n0", 2, None),
        low("middle-1", "a", "n1", 0, NOW - 3000),
        low("middle-2", "c", "n1", 1, NOW - 3000),
        low("middle-3", "a", "n1", 2, NOW - 3000),
    ]
    urgent = Job("p", "b", "high", 1, NOW)
    plan = decide(Snapshot([Node("n0", 3), Node("n1", 3)], running, [urgent]), CONFIG, NOW)
    assert [p.victim for p in plan.preemptions] == ["cheap"]


def test_a_job_that_holds_more_gpus_than_it_asked_for_frees_all_it_holds() -> None:
    """What a victim frees is its placement: the search's bounds count held GPUs, not the
    job's request (a driver's snapshot may disagree with it)."""
    from gpupool.model import Allocation

    running = [RunningJob(Job("r", "a", "low", 1, 0.0), (Allocation("n0", (0, 1)),), 0.0, None)]
    urgent = Job("p", "b", "high", 2, NOW)
    plan = decide(Snapshot([Node("n0", 2)], running, [urgent]), CONFIG, NOW)
    assert [p.victim for p in plan.preemptions] == ["r"]


def _reclaims_with_bounds_built(b_jobs: int, c_jobs: int) -> tuple[list[str], int]:
    """Team a (guaranteed 4 GPUs, none held) claims two GPUs of a pool that teams b and c fill
    with 1-GPU jobs: the victims, and how many bounds the decision built."""
    from unittest import mock

    from gpupool.model import Team
    from gpupool.policy import PoolState
    from gpupool.policy import decide as decide_once
    from gpupool.policy.preempt.bounds import bounds_of
    from tests.support.builders import fill, job, pool

    teams = {"a": Team("a", guaranteed_gpus=4), "b": Team("b"), "c": Team("c")}
    owners = ["b"] * b_jobs + ["c"] * c_jobs
    running = fill(pool(2, 4), [job(f"{t}{i}", t, "normal") for i, t in enumerate(owners)])
    claims = [job(f"p{i}", "a", "normal", submit=100.0 + i) for i in range(2)]
    built = mock.Mock(wraps=bounds_of)
    with mock.patch("gpupool.policy.preempt.candidates.bounds_of", built):
        plan = decide_once(PoolState.of(Snapshot(pool(2, 4), running, claims)), Config(DEFAULT_CLASSES, teams), NOW)
    return [p.victim for p in plan.preemptions], built.call_count


def test_reclaims_that_rank_the_teams_in_the_same_order_share_their_bounds() -> None:
    """Each reclaim ranks the teams by how far above their guarantees they are, which the
    decision's every preemption moves: while their order holds, the arrays are built once."""
    victims, built = _reclaims_with_bounds_built(b_jobs=6, c_jobs=2)
    assert [v[0] for v in victims] == ["b", "b"] and built == 1


def test_a_reclaim_whose_order_of_teams_changed_builds_its_own_bounds() -> None:
    victims, built = _reclaims_with_bounds_built(b_jobs=4, c_jobs=4)
    assert len(victims) == 2 and built == 2, "b and c tied above their guarantees, then one ahead"


def test_a_search_that_shares_another_ones_bounds_ranks_the_nodes_by_its_own_ranks() -> None:
    """Found by fuzzing a review: p6's search and p9's rank the groups in the same order but
    not alike, so p9's shares p6's bounds; with p6's ranks it passed n3 by, where r9
    (checkpointed 50 s ago) costs less to take than r0 on n0 (a stale bound is no bound)."""
    from dataclasses import replace

    from gpupool.model import PriorityScope, Team
    from tests.support.builders import job, on, running

    now = 10_000.0
    teams = {"a": Team("a", 3.0, 3), "b": Team("b", 1.0, 10), "c": Team("c", 0.5, 6), "d": Team("d", 0.5, 16)}
    config = Config(DEFAULT_CLASSES, teams, max_preemptions=None, priority_preemption=PriorityScope.TEAM)
    nodes = [Node("n0", 4), Node("n1", 2, team="a"), Node("n2", 4), Node("n3", 8), Node("n4", 2)]
    jobs = [
        ("r0", "a", "normal", on("n0", 0, 1, 2), 100.0, None),
        ("r1", "a", "low", on("n0", 3), 0.0, None),
        ("r2", "a", "normal", on("n1", 0), 9900.0, None),
        ("r3", "a", "low", on("n1", 1), 9300.0, None),
        ("r4", "c", "low", on("n2", 0), 9000.0, 9950.0),
        ("r5", "a", "normal", on("n2", 1), 9000.0, None),
        ("r6", "a", "high", on("n2", 2), 100.0, None),
        ("r7", "d", "high", on("n2", 3), 9600.0, 9950.0),
        ("r8", "c", "low", on("n3", 0, 1, 2, 3), 9900.0, None),
        ("r9", "a", "normal", on("n3", 4, 5, 6), 9300.0, 9950.0),
        ("r10", "a", "high", on("n4", 0), 100.0, None),
        ("r11", "a", "high", on("n4", 1), 5000.0, None),
    ]
    busy = [
        running(job(id, team, cls, len(placed[0].gpus)), placed, started, checkpoint)
        for id, team, cls, placed, started, checkpoint in jobs
    ]
    pending = [
        job("p6", "a", "high", 1, 18.0),
        replace(job("p7", "d", "high", 1, 4.0), preemptions=2),
        job("p9", "b", "normal", 2, 5.0),
    ]
    snapshot = Snapshot(nodes, busy, pending)
    plan = decide(snapshot, config, now)
    assert [(p.victim, p.for_job) for p in plan.preemptions] == [("r3", "p6"), ("r9", "p9")]
