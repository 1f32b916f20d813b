"""Elastic jobs in the core (issue 36), first part: an elastic job starts at the largest of its
sizes that free GPUs hold, or holds and takes from others only its smallest; back in line it
asks for its largest again; and it counts for its team at the size it runs at. Each decision is
made both ways (`tests.support.oracle.decide`): the kept state and the reference agree."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.model import (
    DEFAULT_CLASSES,
    Config,
    Node,
    Notice,
    PlacementRule,
    Plan,
    Preempt,
    Reason,
    RunningJob,
    Snapshot,
    Team,
)
from gpupool.policy import PoolState
from gpupool.policy.preempt.candidates import Shortcuts, lost_work, shrink_cost
from gpupool.shapes import POWERS_OF_TWO, elastic_problem, elastic_sizes, parse_sizes
from tests.support.builders import fill, job, on, pool, running, summary
from tests.support.exercised import Exercised
from tests.support.oracle import decide

NOW = 10_000.0
BASE = Config(DEFAULT_CLASSES)
ONE = pool(1, 8)


def test_an_elastic_job_starts_at_the_largest_of_its_sizes_that_free_gpus_hold() -> None:
    busy = fill(ONE, [job("x", gpus=5)])
    by_one = Snapshot(ONE, busy, [job("e", sizes=(2, 3, 4, 5, 6, 7, 8))])
    plan = decide(by_one, BASE, NOW)
    assert summary(plan) == [("start", "e", (("n0", (5, 6, 7)),), "free_gpus")]
    assert plan.starts[0].message.endswith("3 of its 2 to 8 GPUs")
    doubling = Snapshot(ONE, busy, [job("e", sizes=(2, 4, 8))])
    assert summary(decide(doubling, BASE, NOW)) == [("start", "e", (("n0", (5, 6)),), "free_gpus")]


def test_an_elastic_job_that_free_gpus_cannot_hold_at_its_smallest_waits() -> None:
    snapshot = Snapshot(ONE, fill(ONE, [job("x", cls="high", gpus=6)]), [job("e", sizes=(4, 8))])
    assert summary(decide(snapshot, BASE, NOW)) == [("wait", "e", "no_fit")]


def test_an_elastic_job_takes_from_others_only_what_its_smallest_needs() -> None:
    lows = fill(ONE, [job(f"l{i}", cls="low", gpus=2, submit=i) for i in range(4)], started=0.0)
    snapshot = Snapshot(ONE, lows, [job("e", cls="high", sizes=(4, 8))])
    rows = summary(decide(snapshot, BASE, NOW))
    victims = [row[1] for row in rows if row[0] == "preempt"]
    assert len(victims) == 2, rows  # 4 GPUs freed for its smallest, not 8 for its largest
    assert ("wait", "e", "awaiting_drain") in rows


def test_while_its_victims_drain_it_holds_the_largest_size_their_gpus_make_not_free_ones() -> None:
    """Its victim frees 6 GPUs (its sizes are 4, 6, 8): it holds them; the 2 free GPUs are
    left to the queue (w starts on them), not grown into ahead of it."""
    e = job("e", cls="high", sizes=(4, 6, 8), submit=1.0)
    draining = running(job("l0", cls="low", gpus=6), on("n0", *range(6)), notice_for="e", deadline=NOW + 30)
    w = job("w", cls="normal", gpus=2, submit=2.0)
    plan = decide(Snapshot(ONE, [draining], [e, w]), BASE, NOW)
    assert summary(plan) == [("start", "w", (("n0", (6, 7)),), "free_gpus"), ("wait", "e", "awaiting_drain")]
    assert [(a.node, a.gpus) for a in plan.waits[0].placement] == [("n0", tuple(range(6)))]


def test_while_its_victims_drain_it_takes_free_gpus_only_as_its_smallest_size_needed() -> None:
    """Its two victims free 4 GPUs and 2 more are free; its sizes are 6 and 8: it holds 6."""
    e = job("e", cls="high", sizes=(6, 8), submit=1.0)
    draining = [
        running(job(f"l{i}", cls="low", gpus=2), on("n0", 2 * i, 2 * i + 1), notice_for="e", deadline=NOW + 30)
        for i in (0, 1)
    ]
    still = running(job("l2", cls="low", gpus=2), on("n0", 4, 5), started=NOW)
    plan = decide(Snapshot(ONE, [*draining, still], [e]), BASE, NOW)
    assert summary(plan) == [("wait", "e", "awaiting_drain")]
    assert [(a.node, a.gpus) for a in plan.waits[0].placement] == [("n0", (0, 1, 2, 3, 6, 7))]


def test_a_started_elastic_job_runs_and_counts_at_its_size_and_asks_for_its_largest_in_line() -> None:
    state = PoolState.of(Snapshot(ONE, fill(ONE, [job("x", gpus=5)]), [job("e", team="t", sizes=(2, 4, 8))]))
    plan = decide(Snapshot(ONE, fill(ONE, [job("x", gpus=5)]), [job("e", team="t", sizes=(2, 4, 8))]), BASE, NOW)
    state.apply(plan, NOW)
    started = state.running["e"]
    assert (started.job.gpus, started.job.largest, state.team_gpus["t"]) == (2, 8, 2)
    ended = state.end("e")
    assert ended is not None
    state.queue(ended.job)  # requeued: it asks for its largest again
    assert state.line.jobs["e"].gpus == 8


def test_a_noticed_elastic_job_leaves_its_team_at_its_size() -> None:
    e = RunningJob(job("e", team="t", sizes=(2, 4, 8)).at_size(4), on("n0", 0, 1, 2, 3), NOW - 10)
    state = PoolState.of(Snapshot(ONE, [e], []))
    assert state.team_gpus["t"] == 4
    state.notice("e", Notice("h", NOW + 30))
    assert state.team_gpus["t"] == 0


@pytest.mark.parametrize(
    ("smallest", "largest", "step", "gpus_per_node", "sizes"),
    [
        (4, 16, 4, None, (4, 8, 12, 16)),
        (2, 16, POWERS_OF_TWO, None, (2, 4, 8, 16)),
        (8, 32, 8, 8, (8, 16, 24, 32)),
        (4, 4, 1, None, ()),
    ],
)
def test_the_sizes_of_an_elastic_job(
    smallest: int, largest: int, step: int | str, gpus_per_node: int | None, sizes: tuple[int, ...]
) -> None:
    assert elastic_problem(smallest, largest, step, gpus_per_node) is None
    assert elastic_sizes(smallest, largest, step, gpus_per_node) == sizes


@pytest.mark.parametrize(
    ("smallest", "largest", "step", "gpus_per_node", "words"),
    [
        (0, 8, 1, None, "at least 1"),
        (8, 4, 1, None, "at most the most"),
        (3, 16, POWERS_OF_TWO, None, "16 is not 3 doubled"),
        (4, 16, 5, None, "12 GPUs between them are not steps of 5"),
        (4, 16, 2, 4, "whole members of 4 GPUs"),
        (6, 16, 2, 4, "6 GPUs do not split into members of 4"),
        (4, 16, 0, None, "a positive number of GPUs"),
    ],
)
def test_sizes_that_are_not_an_elastic_jobs_say_why(
    smallest: int, largest: int, step: int | str, gpus_per_node: int | None, words: str
) -> None:
    problem = elastic_problem(smallest, largest, step, gpus_per_node)
    assert problem is not None and words in problem


def shrinking(keep: int, for_job: str = "h") -> RunningJob:
    """Elastic job `e` of team t on all 8 GPUs of n0, under a shrink's notice that keeps its
    first `keep` GPUs."""
    e = job("e", team="t", sizes=(2, 4, 8))
    kept = on("n0", *range(keep))
    return RunningJob(e, on("n0", *range(8)), 0.0, None, Notice(for_job, NOW + 30, kept))


def test_a_shrinking_job_keeps_its_team_its_kept_gpus_and_lends_only_those_it_frees() -> None:
    h = job("h", team="u", cls="high", gpus=4, submit=1.0)
    state = PoolState.of(Snapshot(ONE, [shrinking(4)], [h]))
    assert state.team_gpus["t"] == 4
    plan = decide(Snapshot(ONE, [shrinking(4)], [h]), BASE, NOW)
    assert summary(plan) == [("wait", "h", "awaiting_drain")]
    assert [(a.node, a.gpus) for a in plan.waits[0].placement] == [("n0", (4, 5, 6, 7))]


def test_once_drained_a_shrunk_job_runs_on_at_once_on_what_it_kept() -> None:
    state = PoolState.of(Snapshot(ONE, [shrinking(2)], [job("h", team="u", cls="high", gpus=6)]))
    resumed = state.resized("e", NOW + 5)
    assert (resumed.job.gpus, resumed.placement, resumed.started_at) == (2, on("n0", 0, 1), NOW + 5)
    assert (state.team_gpus["t"], sorted(state.free.free[0])) == (2, [2, 3, 4, 5, 6, 7])
    assert "e" not in state.line.jobs and "e" not in state.draining
    with pytest.raises(ValueError, match="not being resized"):
        state.resized("e", NOW + 6)


def test_a_shrink_notice_given_by_a_plan_keeps_the_team_its_kept_gpus() -> None:
    e = RunningJob(job("e", team="t", sizes=(2, 4, 8)), on("n0", *range(8)), 0.0)
    state = PoolState.of(Snapshot(ONE, [e], [job("h", team="u", cls="high", gpus=4)]))
    plan = Plan(preemptions=(Preempt("e", "h", NOW + 30, Reason.PRIORITY, "shrank", keep=on("n0", 0, 1, 2, 3)),))
    state.apply(plan, NOW)
    assert (state.team_gpus["t"], state.draining["e"].notice) == (4, Notice("h", NOW + 30, on("n0", 0, 1, 2, 3)))
    state.end("e")
    assert state.team_gpus["t"] == 0


def test_a_preemptor_shrinks_an_elastic_job_as_far_as_it_needs_not_to_its_smallest() -> None:
    e = RunningJob(job("e", team="t", sizes=(2, 4, 8)), on("n0", *range(8)), 0.0, last_checkpoint_at=NOW - 60)
    plan = decide(Snapshot(ONE, [e], [job("h", team="u", cls="high", gpus=4)]), BASE, NOW)
    assert summary(plan) == [("preempt", "e", "h", "priority"), ("wait", "h", "awaiting_drain")]
    [shrink] = plan.preemptions
    assert shrink.keep == on("n0", 0, 1, 2, 3)
    assert shrink.message.startswith(
        "shrank job e from 8 to 4 GPUs (team t, low, last checkpoint 1.0 min ago) for job h"
    )
    assert [(a.node, a.gpus) for a in plan.waits[0].placement] == [("n0", (4, 5, 6, 7))]


def test_a_shrink_that_costs_less_than_an_eviction_is_chosen_over_it() -> None:
    """Alike but for elasticity, with equal checkpoints: the shrink loses the same work but
    restarts 2 GPUs, not 4."""
    e = RunningJob(job("e", sizes=(2, 4), restart=60.0), on("n0", 0, 1, 2, 3), 0.0, NOW - 60)
    rigid = RunningJob(job("r", gpus=4, restart=60.0), on("n0", 4, 5, 6, 7), 0.0, NOW - 60)
    plan = decide(Snapshot(ONE, [e, rigid], [job("h", cls="high", gpus=2)]), BASE, NOW)
    assert [(p.victim, p.keep) for p in plan.preemptions] == [("e", on("n0", 0, 1))]


def test_an_elastic_job_at_its_smallest_is_evicted_not_shrunk() -> None:
    e = RunningJob(job("e", sizes=(2, 4)).at_size(2), on("n0", 0, 1), 0.0)
    plan = decide(Snapshot(pool(1, 2), [e], [job("h", cls="high", gpus=2)]), BASE, NOW)
    assert [(p.victim, p.keep) for p in plan.preemptions] == [("e", ())]


@st.composite
def elastic_pools(draw: st.DrawFn) -> tuple[Snapshot, Config]:
    """Full nodes of 8 GPUs, of elastic jobs above their smallest size and rigid ones (of the
    lower classes, some checkpointed, some with a restart), and jobs of higher classes in line:
    what a shrink is for."""
    nodes = pool(draw(st.integers(1, 3)), 8)
    running: list[RunningJob] = []
    ids = iter(range(1000))
    for node in nodes:
        gpu = 0
        while gpu < 8:
            gpus = draw(st.sampled_from([g for g in (1, 2, 4, 8) if gpu + g <= 8]))
            steps = tuple(s for s in (1, 2, 4, 8) if s <= gpus)
            sizes = draw(st.sampled_from([(), steps, steps]))
            elastic = job(
                f"r{next(ids)}",
                team=draw(st.sampled_from(["a", "b"])),
                cls=draw(st.sampled_from(["low", "normal"])),
                gpus=gpus,
                restart=draw(st.sampled_from([0.0, 30.0, 300.0])),
                sizes=sizes if len(sizes) > 1 else (),
            )
            started = draw(st.sampled_from([0.0, NOW - 3000, NOW - 100]))
            ckpt = draw(st.sampled_from([None, started, NOW - 10]))
            running.append(RunningJob(elastic, on(node.name, *range(gpu, gpu + gpus)), started, ckpt))
            gpu += gpus
    pending = [
        job(f"p{i}", team=draw(st.sampled_from(["a", "b"])), cls="high", gpus=draw(st.sampled_from([1, 2, 4, 8])))
        for i in range(draw(st.integers(1, 3)))
    ]
    config = Config(DEFAULT_CLASSES, placement=draw(st.sampled_from(list(PlacementRule))))
    return Snapshot(nodes, running, pending), config


def test_a_shrink_keeps_one_of_its_jobs_sizes_and_frees_gpus_its_preemptor_holds() -> None:
    """Never below its smallest size, never to a size it does not take, and only for GPUs the
    job it is for holds (what it frees is needed); the kept state and the reference agree, with
    the search's shortcuts and without."""
    exercised = Exercised()

    @given(elastic_pools())
    def check(scenario: tuple[Snapshot, Config]) -> None:
        snapshot, config = scenario
        plan = decide(snapshot, config, NOW)
        assert decide(snapshot, config, NOW, Shortcuts(give_up=False, bounds=False, share_bounds=False)) == plan
        running = {r.job.id: r for r in snapshot.running}
        held = {w.job: {(a.node, g) for a in w.placement for g in a.gpus} for w in plan.waits}
        for p in plan.preemptions:
            if not p.keep:
                continue
            victim = running[p.victim]
            kept = sum(len(a.gpus) for a in p.keep)
            assert kept in victim.job.sizes and victim.job.smallest <= kept < victim.job.gpus
            freed = {(a.node, g) for a in Notice(p.for_job, 0.0, p.keep).frees(victim.placement) for g in a.gpus}
            assert freed & held[p.for_job], f"shrank {p.victim} for nothing {p.for_job} holds"
        exercised.note(shrinks=any(p.keep for p in plan.preemptions))

    check()
    exercised.assert_shown("shrinks", share=0.04)


def test_a_preemptor_that_a_shrink_cannot_make_room_for_evicts_the_elastic_job() -> None:
    """Its shrink frees 6 of e's 8 GPUs; h needs 7: e is evicted, not left in the way."""
    e = RunningJob(job("e", sizes=(2, 4, 8)), on("n0", *range(8)), 0.0)
    plan = decide(Snapshot(ONE, [e], [job("h", cls="high", gpus=7)]), BASE, NOW)
    assert [(p.victim, p.keep) for p in plan.preemptions] == [("e", ())]
    assert summary(plan)[-1] == ("wait", "h", "awaiting_drain")


def test_a_gang_is_shrunk_by_a_member_rather_than_evicted_at_equal_lost_work() -> None:
    """No restart, no checkpoint: shrinking g and evicting it lose the same work, but only the
    eviction sends it back in line."""
    nodes = pool(4, 4)
    g = job("g", gpus=16, gpus_per_node=4, sizes=(4, 8, 12, 16))
    whole = RunningJob(g, tuple(a for i in range(4) for a in on(f"n{i}", 0, 1, 2, 3)), 0.0)
    plan = decide(Snapshot(nodes, [whole], [job("h", cls="high", gpus=4)]), BASE, NOW)
    [shrink] = plan.preemptions
    assert sum(len(a.gpus) for a in shrink.keep) == 12


def test_a_gang_shrinks_off_the_node_its_preemptor_needs_keeping_the_others() -> None:
    """h may only run on n0 (its GPU type): g shrinks from 16 to 8 by leaving n0, keeping n1,
    though n0 holds its first member."""
    nodes = [Node("n0", 8, "a100"), Node("n1", 8, "v100")]
    g = job("g", gpus=16, gpus_per_node=4, sizes=(4, 8, 12, 16))
    whole = RunningJob(g, on("n0", *range(8)) + on("n1", *range(8)), 0.0)
    h = replace(job("h", cls="high", gpus=8), gpu_type="a100")
    plan = decide(Snapshot(nodes, [whole], [h]), BASE, NOW)
    [shrink] = plan.preemptions
    assert shrink.keep == on("n1", *range(8))


def test_an_elastic_jobs_wait_is_said_for_its_sizes() -> None:
    busy = fill(ONE, [job("x", cls="high", gpus=6)])
    [wait] = decide(Snapshot(ONE, busy, [job("e", sizes=(4, 8))]), BASE, NOW).waits
    assert wait.message.startswith("waits for 4 to 8 GPUs (2 free in its nodes"), wait.message
    [never] = decide(Snapshot(ONE, [], [job("big", sizes=(16, 32))]), BASE, NOW).waits
    assert never.message.startswith("can never fit: 16 GPUs,") and never.message.endswith("(its smallest size)")


def lost(plan: Plan, snapshot: Snapshot) -> float:
    """GPU-seconds the plan's notices lose, as the search counts them: each victim's work since
    its last checkpoint and the restart of its next attempt (a shrink's at its smallest size)."""
    running = {r.job.id: r for r in snapshot.running}
    total = 0.0
    for p in plan.preemptions:
        victim = running[p.victim]
        total += shrink_cost(victim, NOW) if p.keep else lost_work(victim, NOW)
    return total


def rigid(snapshot: Snapshot) -> Snapshot:
    """The same pool with every running job rigid at its size."""
    return replace(snapshot, running=[replace(r, job=replace(r.job, sizes=())) for r in snapshot.running])


def test_a_plan_with_shrinks_loses_no_more_work_for_one_job_than_the_plan_without_them() -> None:
    exercised = Exercised()

    @given(elastic_pools(), st.sampled_from([1, 2, 4, 8]))
    def check(scenario: tuple[Snapshot, Config], gpus: int) -> None:
        snapshot, config = scenario
        one = replace(snapshot, pending=[job("h", team="a", cls="high", gpus=gpus)])
        with_shrinks, without = decide(one, config, NOW), decide(rigid(one), config, NOW)
        assert lost(with_shrinks, one) <= lost(without, one) + 1e-6
        exercised.note(shrinks=any(p.keep for p in with_shrinks.preemptions))

    check()
    exercised.assert_shown("shrinks", share=0.04)


def served(plan: Plan) -> set[str]:
    """The jobs a plan starts, or gives GPUs to drain for."""
    return {s.job for s in plan.starts} | {w.job for w in plan.waits if w.reason is Reason.AWAITING_DRAIN}


def test_a_plan_with_shrinks_for_several_jobs_loses_no_more_work_when_it_serves_the_same_ones() -> None:
    """With several preemptors the search is greedy, job after job; where shrinks let it serve
    a job more, it may lose more work for it, so the plans are compared when they serve the
    same jobs."""
    exercised = Exercised()

    @given(elastic_pools())
    def check(scenario: tuple[Snapshot, Config]) -> None:
        snapshot, config = scenario
        with_shrinks, without = decide(snapshot, config, NOW), decide(rigid(snapshot), config, NOW)
        same = served(with_shrinks) == served(without)
        if same:
            assert lost(with_shrinks, snapshot) <= lost(without, snapshot) + 1e-6
        exercised.note(shrinks=same and any(p.keep for p in with_shrinks.preemptions))

    check()
    exercised.assert_shown("shrinks", share=0.04)


LATER = NOW + BASE.elastic.min_time_at_size


def elastic_on(first: int, gpus: int, cls: str = "low", started: float = NOW) -> RunningJob:
    """Elastic job e of team t (sizes 2, 4, 8) at `gpus` GPUs of n0 from `first`, started at `started`."""
    return RunningJob(
        job("e", team="t", cls=cls, sizes=(2, 4, 8)).at_size(gpus), on("n0", *range(first, first + gpus)), started
    )


def test_an_elastic_job_grows_into_free_gpus_nobody_waits_for_once_it_ran_its_time_at_its_size() -> None:
    e = elastic_on(0, 2)
    early = decide(Snapshot(ONE, [e], []), BASE, NOW + 10)
    assert (early.grows, early.retry_at) == ((), LATER)
    plan = decide(Snapshot(ONE, [e], []), BASE, LATER)
    [grow] = plan.grows
    assert (grow.job, grow.placement, grow.deadline) == ("e", on("n0", *range(8)), LATER + 60)
    assert grow.message == (
        "grows job e (team t) from 2 to 8 of its 2 to 8 GPUs, onto free GPUs n0[2,3,4,5,6,7] "
        "that no job in line could use"
    )


def test_a_growing_job_holds_the_gpus_it_grows_into_and_runs_on_them_all_once_drained() -> None:
    state = PoolState.of(Snapshot(ONE, [elastic_on(0, 2)], []))
    state.apply(decide(Snapshot(ONE, [elastic_on(0, 2)], []), BASE, LATER), LATER)
    assert (state.team_gpus["t"], state.free["n0"], "e" in state.draining) == (8, (), True)
    assert decide(Snapshot(ONE, list(state.running.values()), [job("w", cls="high")]), BASE, LATER).starts == ()
    resumed = state.resized("e", LATER + 5)
    assert (resumed.job.gpus, resumed.placement, state.team_gpus["t"]) == (8, on("n0", *range(8)), 8)
    assert "e" not in state.growable


def test_an_elastic_job_grows_to_the_largest_size_free_gpus_make() -> None:
    others = RunningJob(job("x", gpus=3), on("n0", 5, 6, 7), 0.0)
    [grow] = decide(Snapshot(ONE, [elastic_on(0, 2, started=0.0), others], []), BASE, LATER).grows
    assert grow.placement == on("n0", 0, 1, 2, 3)


def test_no_elastic_job_grows_while_a_job_of_its_class_or_higher_waits_for_gpus() -> None:
    """w (8 GPUs, low, which may not preempt) cannot start; e would grow into GPUs that are
    part of its placement once e ends."""
    e = elastic_on(0, 2, started=0.0)
    for cls, grows in (("low", False), ("normal", True)):
        plan = decide(Snapshot(ONE, [replace(e, job=replace(e.job, priority=cls))], [job("w", gpus=8)]), BASE, LATER)
        assert bool(plan.grows) is grows, cls
        assert [w.reason for w in plan.waits] == [Reason.NO_FIT]


def test_a_gang_grows_by_whole_members_on_nodes_of_its_type() -> None:
    nodes = [*pool(3, 4), Node("v0", 4, "v100")]
    g = job("g", gpus_per_node=4, sizes=(4, 8, 12, 16)).at_size(4)
    plan = decide(Snapshot(nodes, [RunningJob(g, on("n0", 0, 1, 2, 3), 0.0)], []), BASE, LATER)
    [grow] = plan.grows
    assert grow.placement == on("n0", 0, 1, 2, 3) + on("n1", 0, 1, 2, 3) + on("n2", 0, 1, 2, 3)


@st.composite
def growing_pools(draw: st.DrawFn) -> tuple[Snapshot, Config]:
    """Nodes of 8 GPUs with elastic jobs below their largest size (some may grow, some ran too
    short at their size), rigid ones, free GPUs, and jobs in line of every class and size; one
    of them, low, waits for a whole node, which none is."""
    nodes = pool(draw(st.integers(1, 3)), 8)
    running: list[RunningJob] = []
    ids = iter(range(1000))
    for node in nodes:
        # First an elastic job below its largest size, then others up to a drawn number of GPUs.
        gpu, up_to = 0, draw(st.integers(2, 8))  # most nodes keep free GPUs, none all
        while gpu < up_to:
            gpus = draw(st.sampled_from([g for g in (1, 2, 4) if gpu + g <= 8]))
            sizes: tuple[int, ...] = ()
            if not gpu:
                sizes = draw(st.sampled_from([(1, 2, 4, 8), (2, 4, 8)]))
                gpus = sizes[0]
            started = draw(st.sampled_from([0.0, 0.0, NOW - 100]))
            cls = draw(st.sampled_from(["low", "normal", "normal"]))
            r = replace(job(f"r{next(ids)}", team=draw(st.sampled_from(["a", "b"])), cls=cls), gpus=gpus, sizes=sizes)
            running.append(RunningJob(r, on(node.name, *range(gpu, gpu + gpus)), started))
            gpu += gpus
    pending = [
        job(
            f"p{i}",
            team=draw(st.sampled_from(["a", "b"])),
            cls=draw(st.sampled_from(["low", "low", "normal", "high"])),
            gpus=draw(st.sampled_from([1, 2, 4, 8, 16])),
        )
        for i in range(draw(st.integers(0, 2)))
    ]
    pending.append(job("w", cls="low", gpus=8))
    config = Config(DEFAULT_CLASSES, placement=draw(st.sampled_from(list(PlacementRule))))
    return Snapshot(nodes, running, pending), config


def test_growth_takes_only_gpus_left_free_and_never_while_a_job_that_could_use_them_waits() -> None:
    """The plan is the one made without growth, but for its growths; what a job grows into was
    free and is nobody else's; and no job of the grower's class or higher is left waiting for
    GPUs."""
    exercised = Exercised()
    never = replace(BASE, elastic=replace(BASE.elastic, min_time_at_size=math.inf))

    @given(growing_pools())
    def check(scenario: tuple[Snapshot, Config]) -> None:
        snapshot, config = scenario
        plan = decide(snapshot, config, NOW)
        without = decide(snapshot, replace(config, elastic=never.elastic), NOW)
        assert (plan.starts, plan.preemptions, plan.waits) == (without.starts, without.preemptions, without.waits)
        taken = {(a.node, g) for r in snapshot.running for a in r.placement for g in a.gpus}
        taken |= {(a.node, g) for s in plan.starts for a in s.placement for g in a.gpus}
        taken |= {(a.node, g) for w in plan.waits for a in w.placement for g in a.gpus}
        running = {r.job.id: r for r in snapshot.running}
        classes = {j.id: config.priority_class(j.priority).value for j in snapshot.pending}
        waiting = [classes[w.job] for w in plan.waits if w.reason in (Reason.NO_FIT, Reason.NO_VICTIMS)]
        for grow in plan.grows:
            grower = running[grow.job]
            added = {(a.node, g) for a in grow.placement for g in a.gpus} - {
                (a.node, g) for a in grower.placement for g in a.gpus
            }
            assert added and not added & taken, f"{grow.job} grew into GPUs held or taken"
            taken |= added
            assert sum(len(a.gpus) for a in grow.placement) in grower.job.sizes
            value = config.priority_class(grower.job.priority).value
            assert all(v < value for v in waiting), f"{grow.job} grew while a job of its class or higher waits"
        exercised.note(grows=bool(plan.grows), grows_beside_waits=bool(plan.grows and waiting))

    check()
    exercised.assert_shown("grows", "grows_beside_waits", share=0.05)


def test_a_gang_that_a_shrink_of_a_two_node_job_cannot_make_room_for_evicts_it() -> None:
    """The review found the first member take e's shrink, and the second then refused e
    altogether: h waited, though evicting e frees both nodes."""
    e = RunningJob(job("e", gpus_per_node=4, sizes=(4, 8)), on("n0", 0, 1, 2, 3) + on("n1", 0, 1, 2, 3), 0.0)
    for h in (job("h", cls="high", gpus=8, gpus_per_node=4), job("h", cls="high", gpus=8)):
        plan = decide(Snapshot(pool(2, 4), [e], [h]), BASE, NOW)
        assert [(p.victim, p.keep) for p in plan.preemptions] == [("e", ())], h
        assert summary(plan)[-1] == ("wait", "h", "awaiting_drain")


def test_a_job_given_notice_in_a_decision_does_not_also_grow_in_it() -> None:
    """The review found one plan shrink e for h and grow e onto free GPUs."""
    nodes = pool(3, 4)
    e = RunningJob(job("e", gpus_per_node=2, sizes=(2, 4, 6)).at_size(4), on("n0", 0, 1) + on("n1", 0, 1), 0.0)
    r1 = RunningJob(job("r1", gpus=2), on("n1", 2, 3), 0.0)
    r2 = RunningJob(job("r2", cls="high", gpus=2), on("n2", 2, 3), 0.0)
    plan = decide(Snapshot(nodes, [e, r1, r2], [job("h", cls="high", gpus=4, gpus_per_node=4)]), BASE, LATER)
    assert "e" in {p.victim for p in plan.preemptions}
    assert plan.grows == ()


def test_while_teams_under_their_guarantee_wait_only_their_own_jobs_grow_and_only_alone() -> None:
    teams = {t: Team(t, guaranteed_gpus=8) for t in ("t", "u", "v")}
    config = replace(BASE, teams=teams)
    e = RunningJob(job("e", team="t", cls="normal", sizes=(2, 4, 8)).at_size(2), on("n0", 0, 1), 0.0)
    wants = [job("wu", team="u", cls="low", gpus=8), job("wv", team="v", cls="low", gpus=8)]
    assert decide(Snapshot(ONE, [e], wants[:1]), config, LATER).grows == ()  # u waits, under
    own = [job("wt", team="t", cls="low", gpus=8)]
    assert len(decide(Snapshot(ONE, [e], own), config, LATER).grows) == 1
    assert decide(Snapshot(ONE, [e], own + wants[1:]), config, LATER).grows == ()


@pytest.mark.parametrize(
    ("text", "step", "per_node", "parsed"),
    [
        ("4", None, None, (4, ())),
        ("4-16", None, None, (16, tuple(range(4, 17)))),
        ("4-16", "4", None, (16, (4, 8, 12, 16))),
        ("4-16", "pow2", None, (16, (4, 8, 16))),
        ("8-32", None, 8, (32, (8, 16, 24, 32))),
        ("8-8", None, None, (8, ())),
    ],
)
def test_gpus_given_as_the_fewest_and_the_most_are_an_elastic_jobs_sizes(
    text: str, step: str | None, per_node: int | None, parsed: tuple[int, tuple[int, ...]]
) -> None:
    assert parse_sizes(text, step, per_node) == parsed


@pytest.mark.parametrize(
    ("text", "step", "per_node", "words"),
    [
        ("four", None, None, "a number of GPUs, or the fewest and the most"),
        ("4", "2", None, "goes with --gpus MIN-MAX"),
        ("4-16", "x", None, "--resize-step 'x'"),
        ("4-16", "5", None, "not steps of 5"),
        ("16-4", None, None, "at most the most"),
        ("8-32", "4", 8, "whole members of 8"),
    ],
)
def test_gpus_that_are_no_sizes_say_why(text: str, step: str | None, per_node: int | None, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_sizes(text, step, per_node)
