"""Invariants of the core, on random pools, workloads and in-flight preemptions."""

from __future__ import annotations

import copy
import random
from collections import Counter
from dataclasses import replace

from hypothesis import given, target
from hypothesis import strategies as st

from gpupool.model import (
    DEFAULT_CLASSES,
    Allocation,
    Config,
    FairShare,
    Job,
    Node,
    Notice,
    PlacementRule,
    Plan,
    Preempt,
    PriorityBudget,
    PriorityScope,
    Reason,
    RunningJob,
    Snapshot,
    Team,
)
from gpupool.policy.budget import budgeted_class
from gpupool.policy.line import submit_key
from gpupool.policy.preempt.candidates import Shortcuts
from gpupool.shapes import POWERS_OF_TWO, elastic_problem, elastic_sizes
from tests.support.builders import BATCH_CLASSES, packed
from tests.support.exercised import Exercised
from tests.support.oracle import decide, derived_free, reference_state

NOW = 5_000.0
TEAMS = ("a", "b", "c")
CLASSES = BATCH_CLASSES


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Snapshot, Config]:
    nodes = [
        Node(
            f"n{i}",
            draw(st.sampled_from([2, 4, 8])),
            draw(st.sampled_from(["v100", "h100"])),
            draw(st.sampled_from([None, None, None, "a"])),
        )
        for i in range(draw(st.integers(1, 5)))
    ]
    free = {n.name: list(range(n.gpus)) for n in nodes}
    ids = iter(range(10_000))
    pending = [_job(draw, f"p{next(ids)}") for _ in range(draw(st.integers(1, 8)))]
    running: list[RunningJob] = []
    for _ in range(draw(st.integers(0, 12))):
        job = _running_size(draw, _job(draw, f"r{next(ids)}"))
        placement = packed(job, nodes, free)
        if placement is None:
            continue
        started = draw(st.floats(0, NOW))
        ckpt = draw(st.one_of(st.none(), st.floats(started, NOW)))
        notice = None
        if pending and draw(st.integers(0, 4)) == 0:
            keep = _kept(draw, job, placement)
            notice = Notice(draw(st.sampled_from(pending)).id, NOW + draw(st.floats(0, 100)), keep)
        running.append(RunningJob(job, placement, started, ckpt, notice))
    if draw(st.sampled_from([True, False])):
        # Full pools come first (what Hypothesis tends to): what waits must preempt, or wait
        # for its reasons, which is what most properties here are about.
        for node in nodes:
            for gpu in list(free[node.name]):
                cls = draw(st.sampled_from(["low", "low", "normal", "high"]))
                filler = Job(f"f{next(ids)}", draw(st.sampled_from(TEAMS)), cls, 1, draw(st.floats(0, NOW)))
                started = draw(st.sampled_from([0.0, NOW - 1000, NOW - 200, NOW - 30]))
                running.append(RunningJob(filler, (Allocation(node.name, (gpu,)),), started))
                free[node.name].remove(gpu)
    teams = {
        t: Team(
            t,
            weight=draw(st.sampled_from([1.0, 2.0])),
            guaranteed_gpus=draw(st.integers(0, 8)),
            budgets=(PriorityBudget("high", 1.0, 3600.0),) if draw(st.booleans()) else (),
        )
        for t in TEAMS
    }
    usage = {(t, "high"): draw(st.sampled_from([0.0, 7200.0])) for t in TEAMS}
    config = Config(
        DEFAULT_CLASSES,
        teams,
        max_preemptions=draw(st.sampled_from([None, 1, 3])),
        priority_preemption=draw(st.sampled_from(list(PriorityScope))),
        fair_share=draw(st.sampled_from(list(FairShare))),
        seniority_after=draw(st.sampled_from([None, 0.0, 1000.0])),
        placement=draw(st.sampled_from(list(PlacementRule))),
    )
    return Snapshot(nodes, running, pending, usage), config


def _job(draw: st.DrawFn, id: str) -> Job:
    gpus = draw(st.sampled_from([1, 1, 2, 4, 8, 12, 16]))
    per_node = (
        draw(st.sampled_from([None, None, g])) if (g := draw(st.sampled_from([1, 2, 4]))) and gpus % g == 0 else None
    )
    return Job(
        id,
        draw(st.sampled_from(TEAMS)),
        draw(st.sampled_from(CLASSES)),
        gpus,
        draw(st.floats(0, NOW)),
        gpus_per_node=per_node,
        gpu_type=draw(st.sampled_from([None, None, "v100", "h100"])),
        preemptions=draw(st.integers(0, 4)),
        max_preemptions=draw(st.sampled_from([None, None, 0, 2])),
        expected_restart=draw(st.floats(0, 120)),
        queued_at=draw(st.one_of(st.none(), st.floats(0, NOW))),
        sizes=_sizes(draw, gpus, per_node),
    )


def _sizes(draw: st.DrawFn, largest: int, per_node: int | None) -> tuple[int, ...]:
    """An elastic job's sizes up to `largest` (one job in four, of those that can be); ()."""
    steps: list[int | str] = [1, 2, POWERS_OF_TWO]
    step = per_node or draw(st.sampled_from(steps))
    smallest = [m for m in range(1, largest) if elastic_problem(m, largest, step, per_node) is None]
    if not smallest or draw(st.integers(0, 3)) != 0:
        return ()
    return elastic_sizes(draw(st.sampled_from(smallest)), largest, step, per_node)


def _kept(draw: st.DrawFn, job: Job, placement: tuple[Allocation, ...]) -> tuple[Allocation, ...]:
    """What a notice keeps of a running elastic job above its smallest size, half the time (a
    shrink: the first GPUs of its placement, whole members of a gang); () for an eviction."""
    smaller = [size for size in job.sizes if size < job.gpus]
    if not smaller or draw(st.booleans()):
        return ()
    left, kept = draw(st.sampled_from(smaller)), []
    for alloc in placement:
        if left:
            kept.append(Allocation(alloc.node, alloc.gpus[:left]))
            left -= len(kept[-1].gpus)
    return tuple(kept)


def _running_size(draw: st.DrawFn, job: Job) -> Job:
    """A running job at one of its sizes (its one, if rigid)."""
    return job.at_size(draw(st.sampled_from(job.sizes))) if job.elastic else job


def held(snapshot: Snapshot) -> dict[tuple[str, int], RunningJob]:
    return {(a.node, g): r for r in snapshot.running for a in r.placement for g in a.gpus}


def layouts(plan: Plan) -> dict[str, tuple[Allocation, ...]]:
    out = {s.job: s.placement for s in plan.starts}
    out.update({w.job: w.placement for w in plan.waits if w.reason is Reason.AWAITING_DRAIN})
    return out


@given(scenarios())
def test_never_over_allocates_a_gpu(scenario: tuple[Snapshot, Config]) -> None:
    snapshot, config = scenario
    plan = decide(snapshot, config, NOW)
    holders = held(snapshot)
    nodes = {n.name: n for n in snapshot.nodes}
    jobs = {j.id: j for j in snapshot.pending}
    victims_of: dict[str, set[str]] = {}
    for r in snapshot.running:
        if r.notice is not None:
            victims_of.setdefault(r.notice.for_job, set()).add(r.job.id)
    for p in plan.preemptions:
        victims_of.setdefault(p.for_job, set()).add(p.victim)
    used: Counter[tuple[str, int]] = Counter()
    started = {s.job for s in plan.starts}
    for job_id, placement in layouts(plan).items():
        job = jobs[job_id]
        assert sum(len(a.gpus) for a in placement) in (job.sizes or (job.gpus,))
        assert len({a.node for a in placement}) == len(placement), "a gang member per node"
        types = {nodes[a.node].gpu_type for a in placement}
        assert len(types) == 1
        assert job.gpu_type in (None, *types)
        for alloc in placement:
            node = nodes[alloc.node]
            assert node.team in (None, job.team)
            if job.gpus_per_node is not None:
                assert len(alloc.gpus) == job.gpus_per_node
            for gpu in alloc.gpus:
                assert 0 <= gpu < node.gpus
                used[(alloc.node, gpu)] += 1
                holder = holders.get((alloc.node, gpu))
                if job_id in started:
                    assert holder is None, f"{job_id} started on a GPU held by {holder}"
                elif holder is not None:
                    # Held while its holder drains: for this job, or for one that no longer waits.
                    mine = holder.job.id in victims_of.get(job_id, set())
                    other = holder.notice.for_job if holder.notice is not None else None
                    assert mine or (other is not None and (other not in jobs or other in started))
    running = {r.job.id: r for r in snapshot.running}
    for grow in plan.grows:
        grower = running[grow.job]
        assert grower.notice is None and sum(len(a.gpus) for a in grow.placement) in grower.job.sizes
        own = {(a.node, g) for a in grower.placement for g in a.gpus}
        for alloc in grow.placement:
            for gpu in alloc.gpus:
                if (alloc.node, gpu) not in own:
                    assert (alloc.node, gpu) not in holders, f"{grow.job} grew onto a GPU held by another"
                    used[(alloc.node, gpu)] += 1
    assert all(count == 1 for count in used.values()), "a GPU was given twice"


def test_every_notice_goes_to_an_unprotected_job_its_preemptor_needs_by_a_rule_that_allows_it() -> None:
    exercised = Exercised()

    @given(scenarios())
    def check(scenario: tuple[Snapshot, Config]) -> None:
        snapshot, config = scenario
        plan = decide(snapshot, config, NOW)
        exercised.note(preemptions=bool(plan.preemptions))
        _assert_unprotected(snapshot, config, plan)
        _assert_needed_and_allowed(snapshot, config, plan)

    check()
    exercised.assert_shown("preemptions")


def _assert_unprotected(snapshot: Snapshot, config: Config, plan: Plan) -> None:
    """No victim is draining already, of a class that is not preemptible, inside its minimum
    runtime or at its preemption cap; none is given notice twice."""
    running = {r.job.id: r for r in snapshot.running}
    for p in plan.preemptions:
        victim = running[p.victim]
        assert victim.notice is None, "already draining"
        cls = budgeted_class(config, snapshot.usage, config.team(victim.job.team), victim.job.priority).cls
        assert cls.preemptible
        assert NOW - victim.started_at >= cls.min_runtime
        cap = victim.job.max_preemptions if victim.job.max_preemptions is not None else config.max_preemptions
        assert cap is None or victim.job.preemptions < cap
    assert len({p.victim for p in plan.preemptions}) == len(plan.preemptions)


def _assert_needed_and_allowed(snapshot: Snapshot, config: Config, plan: Plan) -> None:
    """Each victim holds a GPU of the placement held for its preemptor, and the rule its notice
    names allows it."""
    jobs = {j.id: j for j in snapshot.pending}
    running = {r.job.id: r for r in snapshot.running}
    held_for = {w.job: w.placement for w in plan.waits if w.reason is Reason.AWAITING_DRAIN and w.placement}
    for p in plan.preemptions:
        assert p.for_job in held_for, f"{p.victim} preempted for {p.for_job}, which holds no placement"
        held_gpus = {(a.node, g) for a in held_for[p.for_job] for g in a.gpus}
        victim = running[p.victim]
        assert any((a.node, g) in held_gpus for a in victim.placement for g in a.gpus), f"{p.victim} is not needed"
        preemptor = jobs[p.for_job]
        mine = budgeted_class(config, snapshot.usage, config.team(preemptor.team), preemptor.priority).cls
        theirs = budgeted_class(config, snapshot.usage, config.team(victim.job.team), victim.job.priority).cls
        if p.reason is Reason.PRIORITY:
            assert mine.may_preempt
            assert theirs.value < mine.value
            if config.priority_preemption is PriorityScope.TEAM:
                assert victim.job.team == preemptor.team
        elif p.reason is Reason.SENIORITY:
            assert config.seniority_after is not None
            assert NOW - preemptor.waiting_since >= config.seniority_after
            assert theirs.value <= mine.value
            assert submit_key(victim.job) > submit_key(preemptor), "seniority took a job from before it"
            assert victim.job.gpus < preemptor.gpus, "seniority took a job as large as its preemptor"
        else:
            assert p.reason in (Reason.RECLAIM, Reason.FAIR_SHARE)
            assert p.reason is Reason.RECLAIM or config.fair_share is FairShare.PREEMPT
            assert theirs.value <= mine.value
            assert victim.job.team != preemptor.team


def test_team_rules_take_a_team_below_its_guarantee_by_one_whole_reclaimed_job_at_most() -> None:
    """Reclaim, fair share, seniority and `above_guarantee` priority preemption leave a victim team at or
    above its guarantee, except that reclaim may take one whole job across it (the team was
    above its guarantee before that job left); checked on teams no job of their own preempted."""
    exercised = Exercised()

    @given(scenarios())
    def check(scenario: tuple[Snapshot, Config]) -> None:
        snapshot, config = scenario
        plan = decide(snapshot, config, NOW)
        leaving = {p.victim for p in plan.preemptions}
        running_now = {r.job.id: r for r in snapshot.running}
        pending_now = {j.id: j for j in snapshot.pending}
        from_others = [p for p in plan.preemptions if running_now[p.victim].job.team != pending_now[p.for_job].team]
        exercised.note(other_teams=bool(from_others))
        target(float(len(from_others)), label="victims of other teams")
        after: Counter[str] = Counter()
        for r in snapshot.running:
            if r.notice is None and r.job.id not in leaving:
                after[r.job.team] += r.job.gpus
        # Jobs this plan starts, or holds GPUs for, count for their team: they will hold them.
        jobs = {j.id: j for j in snapshot.pending}
        for job_id in layouts(plan):
            after[jobs[job_id].team] += jobs[job_id].gpus
        running = {r.job.id: r for r in snapshot.running}
        by_own_team = {
            running[p.victim].job.team for p in plan.preemptions if jobs[p.for_job].team == running[p.victim].job.team
        }
        guarded = config.priority_preemption is PriorityScope.ABOVE_GUARANTEE
        victims_of_team: dict[str, list[Preempt]] = {}
        for p in plan.preemptions:
            victims_of_team.setdefault(running[p.victim].job.team, []).append(p)
        for team, preempts in victims_of_team.items():
            floor = config.team(team).guaranteed_gpus
            if team in by_own_team or after[team] >= floor:
                continue
            reasons = {p.reason for p in preempts}
            assert Reason.FAIR_SHARE not in reasons, f"fair share took team {team} below its guarantee"
            assert Reason.SENIORITY not in reasons, f"seniority took team {team} below its guarantee"
            if guarded:
                # Reclaim may then take one whole job across the guarantee (below): without what
                # reclaim took, priority's victims left the team at or above it.
                reclaimed = sum(running[p.victim].job.gpus for p in preempts if p.reason is Reason.RECLAIM)
                priority_alone = after[team] + reclaimed
                assert Reason.PRIORITY not in reasons or priority_alone >= floor, f"priority took team {team} below it"
            if Reason.PRIORITY not in reasons:
                crossing = [p for p in preempts if p.reason is Reason.RECLAIM]
                assert after[team] + max(running[p.victim].job.gpus for p in crossing) > floor

    check()
    exercised.assert_shown("other_teams")


@given(scenarios(), st.randoms(use_true_random=False))
def test_decisions_are_identical_for_identical_input(scenario: tuple[Snapshot, Config], rnd: random.Random) -> None:
    snapshot, config = scenario
    before = copy.deepcopy(snapshot)
    plan = decide(snapshot, config, NOW)
    assert snapshot == before, "decide modified its snapshot"
    assert decide(copy.deepcopy(snapshot), config, NOW) == plan
    running, pending = list(snapshot.running), list(snapshot.pending)
    rnd.shuffle(running)
    rnd.shuffle(pending)
    assert decide(replace(snapshot, running=running, pending=pending), config, NOW) == plan


@given(scenarios(), st.randoms(use_true_random=False))
def test_the_kept_free_gpus_are_those_outside_the_placements_in_buckets_in_node_order(
    scenario: tuple[Snapshot, Config], rnd: random.Random
) -> None:
    """Attempts that start and end in any order leave the free GPUs, and each bucket of nodes
    by free count in node order (what best fit's ties read), as the placements alone give."""
    from gpupool.policy import PoolState

    snapshot, _ = scenario
    state = PoolState(snapshot.nodes)
    extra = [r for r in snapshot.running if rnd.random() < 0.5]
    for running in rnd.sample(list(snapshot.running), len(snapshot.running)):
        state.start(running)
    for running in extra:
        state.end(running.job.id)
    for running in extra:
        state.start(running)
    assert dict(state.free) == derived_free(snapshot)
    for group, buckets in state.free.buckets.items():
        for count, nodes in enumerate(buckets):
            expected = [i for i, n in enumerate(snapshot.nodes) if (n.gpu_type, n.team) == group]
            assert nodes == [i for i in expected if len(state.free.free[i]) == count]


@given(st.data())
def test_the_rule_the_api_and_the_simulator_use_is_the_cores(data: st.DataObject) -> None:
    """`can_ever_fit` (what the API refuses and the simulator leaves out) says no exactly when
    the core, on an empty pool, makes the job wait `never_fits`."""
    from gpupool.policy import can_ever_fit

    snapshot, config = data.draw(scenarios())
    pending = data.draw(st.composite(lambda draw: _job(draw, "x"))())
    alone = Snapshot(snapshot.nodes, [], [pending], teams=snapshot.teams)
    plan = decide(alone, config, NOW)
    never = [w for w in plan.waits if w.job == "x" and w.reason is Reason.NEVER_FITS]
    assert can_ever_fit(pending, snapshot.nodes) is not bool(never)


@st.composite
def busy_pools(draw: st.DrawFn) -> tuple[Snapshot, Config]:
    """Full pools of small jobs of every class and many lost-work costs, and a few waiting jobs
    that must preempt: where nodes tie on their worst victim's rank and differ in cost."""
    nodes = [Node(f"n{i}", 8) for i in range(draw(st.integers(2, 10)))]
    running = []
    for node in nodes:
        gpu = 0
        while gpu < 8:
            gpus = min(draw(st.sampled_from([1, 2, 4])), 8 - gpu)
            job = replace(_job(draw, f"r{node.name}-{gpu}"), gpus=gpus, gpus_per_node=None, gpu_type=None, sizes=())
            started = draw(st.sampled_from([0.0, 1000.0, 2000.0, 4000.0]))
            placement = (Allocation(node.name, tuple(range(gpu, gpu + gpus))),)
            running.append(RunningJob(job, placement, started, draw(st.sampled_from([None, started, NOW]))))
            gpu += gpus
    pending = []
    for i in range(draw(st.integers(1, 4))):
        gpus = draw(st.sampled_from([1, 2, 4, 8, 16]))
        job = replace(_job(draw, f"p{i}"), gpus=gpus, gpus_per_node=8 if gpus > 8 else None, gpu_type=None, sizes=())
        pending.append(job)
    snapshot, config = draw(scenarios())
    return Snapshot(nodes, running, pending, snapshot.usage), config


def without_shortcuts(snapshot: Snapshot, config: Config) -> Plan:
    """The plan with the victim search's shortcuts off: no search given up for want of GPUs to
    free, every node looked at (bounded by nothing), no bounds shared between searches."""
    return decide(snapshot, config, NOW, Shortcuts(give_up=False, bounds=False, share_bounds=False))


def test_the_victim_search_shortcuts_change_no_choice() -> None:
    """The search skips nodes by a lower bound of their score, and whole searches when no rule
    could free enough GPUs: with both shortcuts off, the plan is the same."""
    exercised = Exercised()

    @given(st.one_of(scenarios(), busy_pools()))
    def check(scenario: tuple[Snapshot, Config]) -> None:
        snapshot, config = scenario
        plan = decide(snapshot, config, NOW)
        assert without_shortcuts(snapshot, config) == plan
        exercised.note(preemptions=bool(plan.preemptions))

    check()
    exercised.assert_shown("preemptions")


@given(scenarios())
def test_a_decision_leaves_no_garbage_for_the_cycle_collector(scenario: tuple[Snapshot, Config]) -> None:
    """Its working state is freed as soon as it returns: reference cycles would leave it to the
    cyclic collector, whose full passes over a large pool's state show in the decision time."""
    import gc

    snapshot, config = scenario
    gc.collect()
    gc.disable()
    try:
        decide(snapshot, config, NOW)
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_the_candidates_supply_is_what_is_left_after_the_choices() -> None:
    """The GPUs per (team, class) the searches read stay those of the unprotected candidates
    not chosen yet, however many preemptions the decision made."""
    from gpupool.policy import PoolState
    from gpupool.policy.decision import Decision
    from gpupool.policy.drain import hold_for_drains
    from gpupool.policy.queue import place_queue

    exercised = Exercised()

    @given(scenarios())
    def check(scenario: tuple[Snapshot, Config]) -> None:
        snapshot, config = scenario
        for shown in (PoolState.of(snapshot), reference_state(snapshot)):
            decision = Decision(shown, config, NOW)
            place_queue(decision, hold_for_drains(decision))
            candidates = decision.candidates
            left: Counter[tuple[str, int]] = Counter()
            # Whole jobs: a shrink's GPUs are its job's.
            every = {c.id: c for i in range(len(candidates.on_node)) for c in candidates.at(i) if not c.keep}
            for c in every.values():
                if c.protection is None and c.id not in candidates.chosen:
                    left[c.team, c.cls.value] += sum(len(gpus) for _, gpus in c.slots)
            assert +candidates.supply == +left
            chosen = {p.victim for p in decision.preemptions}
            assert candidates.chosen == chosen
        exercised.note(preemptions=bool(chosen))

    check()
    exercised.assert_shown("preemptions")


def test_waits_explained_by_crowds_say_what_every_candidate_read_alone_says() -> None:
    """A wait's explanation reads the candidates by crowds (alike for every rule but their
    place in line): read member by member, every wait says the same."""
    from functools import partial
    from unittest import mock

    from gpupool.policy import queue
    from gpupool.policy.preempt import explain

    exercised = Exercised()

    @given(st.one_of(scenarios(), busy_pools()))
    def check(scenario: tuple[Snapshot, Config]) -> None:
        snapshot, config = scenario
        config = replace(config, explain_waits=True)
        plan = decide(snapshot, config, NOW)
        with mock.patch.object(queue, "kept_from", partial(explain.kept_from, one_by_one=True)):
            other = decide(snapshot, config, NOW)
        assert [w.message for w in other.waits] == [w.message for w in plan.waits]
        assert other == plan
        named = any(
            w.reason is Reason.NO_VICTIMS and ("protected:" in w.message or "team rules" in w.message)
            for w in plan.waits
        )
        exercised.note(waits_naming_jobs=named)

    check()
    exercised.assert_shown("waits_naming_jobs")
