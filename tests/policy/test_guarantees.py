"""Properties of guarantees and fair shares, over random pools and repeated decisions."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st
from test_nomination import decisions, reclaims
from test_properties import NOW, scenarios, without_shortcuts

from gpupool.model import DEFAULT_CLASSES, Config, FairShare, Job, PriorityClass, Reason, RunningJob, Snapshot, Team
from gpupool.policy.budget import budgeted_class
from gpupool.policy.preempt.candidates import protection
from tests.support.builders import fill, job, on, pool
from tests.support.exercised import Exercised
from tests.support.oracle import decide


def team_gpus(snapshot: Snapshot) -> Counter[str]:
    """GPUs per team of running jobs that are not draining."""
    gpus: Counter[str] = Counter()
    for r in snapshot.running:
        if r.notice is None:
            gpus[r.job.team] += r.job.gpus
    return gpus


def runs_at(config: Config, snapshot: Snapshot, r: RunningJob) -> PriorityClass:
    """The class a running attempt is a victim at (fixed when it started)."""
    if r.priority is not None:
        return config.priority_class(r.priority)
    return budgeted_class(config, snapshot.usage, config.team(r.job.team), r.job.priority).cls


def test_a_team_below_its_guarantee_gets_it_while_another_team_above_its_own_holds_what_it_could_take() -> None:
    """After every decision: a job of a team that stays within its guarantee with it does not
    wait while a node it may use would hold it once one unprotected job of a class no higher
    than its own, of a team above its guarantee, left (a single-node job; the teams' GPUs
    counted without what this decision started for teams other than the claimant's, which the
    claimant could not yet have seen)."""
    exercised = Exercised()

    @given(st.one_of(scenarios(), reclaims()), st.integers(1, 5))
    def check(scenario: tuple[Snapshot, Config], rounds: int) -> None:
        snapshot, config = scenario
        reclaimed = False
        for state, plan, now in decisions(snapshot, config, rounds):
            before = team_gpus(state)
            leaving = {p.victim for p in plan.preemptions}
            reclaimed = reclaimed or any(p.reason is Reason.RECLAIM for p in plan.preemptions)
            pending = {j.id: j for j in state.pending}
            placed = {s.job: s.placement for s in plan.starts}
            placed |= {w.job: w.placement for w in plan.waits if w.reason is Reason.AWAITING_DRAIN}
            gained: Counter[str] = Counter()
            for job_id in placed:
                gained[pending[job_id].team] += pending[job_id].gpus
            kept = Counter(before)
            for r in state.running:
                if r.job.id in leaving:
                    kept[r.job.team] -= r.job.gpus
            taken = {(a.node, g) for r in state.running for a in r.placement for g in a.gpus}
            taken |= {(a.node, g) for placement in placed.values() for a in placement for g in a.gpus}
            free = {n.name: sum((n.name, g) not in taken for g in range(n.gpus)) for n in state.nodes}
            for wait in plan.waits:
                if wait.reason not in (Reason.NO_VICTIMS, Reason.NO_FIT):
                    continue
                job = pending[wait.job]
                if job.gpus_per_node is not None or before[job.team] + gained[job.team] + job.gpus > _floor(
                    config, job
                ):
                    continue
                cls = budgeted_class(config, state.usage, config.team(job.team), job.priority).cls.value
                for node in state.nodes:
                    if node.team not in (None, job.team) or job.gpu_type not in (None, node.gpu_type):
                        continue
                    for r in state.running:
                        team = r.job.team
                        if r.notice is not None or r.job.id in leaving or team == job.team:
                            continue
                        victim_class = runs_at(config, state, r)
                        if kept[team] <= config.team(team).guaranteed_gpus or victim_class.value > cls:
                            continue
                        if protection(r, victim_class, now, config) is not None:
                            continue
                        on_node = sum(len(a.gpus) for a in r.placement if a.node == node.name)
                        assert free[node.name] + on_node < job.gpus, (
                            f"{job.id} (team {job.team}) waits ({wait.reason}) while {r.job.id} of team {team}, "
                            f"above its guarantee, would make it fit on {node.name}"
                        )
        exercised.note(reclaims=reclaimed)

    check()
    exercised.assert_shown("reclaims")


def _floor(config: Config, job: Job) -> int:
    return config.team(job.team).guaranteed_gpus


@st.composite
def unfair_pools(draw: st.DrawFn) -> tuple[Snapshot, Config]:
    """A full pool held mostly by one team, at one class, no team guaranteed anything, and a
    job of another team waiting: fair share's ground (its weights decide who may take)."""
    names = "abc"
    teams = {t: Team(t, draw(st.sampled_from([1.0, 2.0, 0.5]))) for t in names}
    nodes = pool(draw(st.integers(1, 3)), draw(st.sampled_from([4, 8])))
    capacity = sum(n.gpus for n in nodes)
    owners = draw(st.lists(st.sampled_from(["a", "a", "b"]), min_size=capacity, max_size=capacity))
    cls = draw(st.sampled_from(["normal", "low", "high"]))
    started = draw(st.sampled_from([0.0, NOW - 700]))
    running = fill(nodes, [job(f"r{i}", t, cls) for i, t in enumerate(owners)], started=started)
    gpus = draw(st.sampled_from([1, 2, 4]))
    pending = [job("p0", draw(st.sampled_from(["c", "b"])), cls, gpus, submit=100.0)]
    return Snapshot(nodes, running, pending), Config(DEFAULT_CLASSES, teams, max_preemptions=None)


def test_fair_share_never_leaves_the_victim_team_below_the_claimant() -> None:
    """One waiting job, fair-share preemption on: every team it takes from keeps a weighted
    share at or above the claimant team's, both counted after the move."""
    exercised = Exercised()

    @given(st.one_of(scenarios(), unfair_pools()), st.data())
    def check(scenario: tuple[Snapshot, Config], data: st.DataObject) -> None:
        snapshot, config = scenario
        if not snapshot.pending:
            return
        claimant = data.draw(st.sampled_from(snapshot.pending))
        config = Config(
            config.classes,
            config.teams,
            max_preemptions=config.max_preemptions,
            priority_preemption=config.priority_preemption,
            fair_share=FairShare.PREEMPT,
        )
        alone = Snapshot(snapshot.nodes, snapshot.running, [claimant], snapshot.usage)
        plan = decide(alone, config, NOW)
        exercised.note(fair_share=any(p.reason is Reason.FAIR_SHARE for p in plan.preemptions))
        running = {r.job.id: r for r in snapshot.running}
        after = team_gpus(alone)
        for p in plan.preemptions:
            after[running[p.victim].job.team] -= running[p.victim].job.gpus
        if plan.preemptions:
            after[claimant.team] += claimant.gpus

        def share(team: str) -> float:
            return after[team] / config.team(team).weight

        for p in plan.preemptions:
            if p.reason is Reason.FAIR_SHARE:
                victim_team = running[p.victim].job.team
                assert share(victim_team) >= share(claimant.team) - 1e-9, (victim_team, dict(after))

    check()
    exercised.assert_shown("fair_share")


@st.composite
def crowded_reclaims(draw: st.DrawFn) -> tuple[Snapshot, Config]:
    """Teams of unequal weights and guarantees fill a pool with jobs of every class, size and
    age, and several claim GPUs at once: every reclaim moves the teams' ranks for the next."""
    names = "abcd"[: draw(st.integers(2, 4))]
    weights, guarantees = st.sampled_from([0.5, 1.0, 2.0, 3.0]), st.sampled_from([0, 1, 2, 4, 8])
    teams = {t: Team(t, draw(weights), draw(guarantees)) for t in names}
    classes = st.sampled_from(["low", "normal", "high"])
    nodes = pool(draw(st.integers(1, 6)), draw(st.sampled_from([2, 4, 8])))
    running: list[RunningJob] = []
    for node in nodes:
        used = 0
        while used < node.gpus:
            gpus = min(draw(st.sampled_from([1, 1, 2, 3, 4])), node.gpus - used)
            started = draw(st.sampled_from([0.0, 1000.0, NOW - 700, NOW - 100]))
            checkpoint = draw(st.sampled_from([None, NOW - 50]))
            team = draw(st.sampled_from(names))
            placed = on(node.name, *range(used, used + gpus))
            running.append(RunningJob(job(f"r{len(running)}", team, draw(classes), gpus), placed, started, checkpoint))
            used += gpus
    sizes = st.sampled_from([1, 1, 2, 3, 4, 8])
    claims = draw(st.integers(1, 10))
    pending = [job(f"p{i}", draw(st.sampled_from(names)), draw(classes), draw(sizes), float(i)) for i in range(claims)]
    return Snapshot(nodes, running, pending), Config(DEFAULT_CLASSES, teams, max_preemptions=None)


def test_reclaims_whose_ranks_move_within_a_decision_leave_the_search_shortcuts_without_effect() -> None:
    """A reclaim ranks the teams by how far above their guarantees they are, which every
    preemption of the decision moves: searches that rank them in the same order share their
    bounds, each with its own ranks' values."""
    exercised = Exercised()

    @given(st.one_of(reclaims(), crowded_reclaims()))
    def check(
        scenario: tuple[Snapshot, Config],
    ) -> None:
        snapshot, config = scenario
        plan = decide(snapshot, config, NOW)
        assert without_shortcuts(snapshot, config) == plan
        exercised.note(reclaims=any(p.reason is Reason.RECLAIM for p in plan.preemptions))

    check()
    exercised.assert_shown("reclaims")
