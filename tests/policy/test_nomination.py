"""GPUs freed for a preemptor go to that preemptor (defect: a reclaim that never ends).

A victim that goes back in line may sort before the job it was preempted for (its team's
weighted share dropped when it left). Without nomination it takes its GPU back, the preemptor
preempts again, and the pool thrashes until the victims reach their preemption cap.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st
from test_properties import NOW, scenarios

from gpupool.model import DEFAULT_CLASSES, Config, Plan, Reason, Snapshot, Team
from gpupool.policy import PoolState
from gpupool.policy.budget import budgeted_class
from tests.support.builders import fill, job, pool
from tests.support.exercised import Exercised
from tests.support.oracle import decide

TEAMS = {"a": Team("a", 2.0, 3), "b": Team("b", 1.0, 3), "c": Team("c", 1.0, 2)}
CONFIG = Config(DEFAULT_CLASSES, TEAMS)


def test_the_preemptor_takes_the_gpu_freed_for_it_before_its_requeued_victim() -> None:
    nodes = pool(1, 8)
    a = [job(f"a{i}", "a", "normal") for i in range(4)]
    others = [job("b0", "b", "normal"), job("b1", "b", "normal"), job("c0", "c", "normal"), job("c1", "c", "normal")]
    running = fill(nodes, a + others, started=0.0)
    claimant = job("x", "b", "normal", submit=100.0)
    plan = decide(Snapshot(nodes, running, [claimant]), CONFIG, NOW)
    [notice] = plan.preemptions
    assert (notice.victim.startswith("a"), notice.for_job, notice.reason) == (True, "x", Reason.RECLAIM)

    # The victim has left and waits again; team a's share (3 GPUs / weight 2) is now below b's.
    victim = next(r for r in running if r.job.id == notice.victim)
    still = [r for r in running if r is not victim]
    requeued = replace(victim.job, preemptions=1)
    after = decide(Snapshot(nodes, still, [requeued, replace(claimant, nominated=True)]), CONFIG, NOW + 1)
    assert [s.job for s in after.starts] == ["x"]
    assert not after.preemptions


@st.composite
def reclaims(draw: st.DrawFn) -> tuple[Snapshot, Config]:
    """A full pool of one class, teams of unequal weights and guarantees: reclaim's ground."""
    nodes = pool(draw(st.integers(1, 2)), draw(st.sampled_from([4, 8])))
    capacity = sum(n.gpus for n in nodes)
    # Guarantees up to half the pool: a team holding its third of it is often below its own.
    teams = {
        t: Team(t, draw(st.sampled_from([1.0, 2.0, 3.0])), draw(st.integers(0, capacity // 2))) for t in ("a", "b", "c")
    }
    owners = draw(st.lists(st.sampled_from(list(teams)), min_size=capacity, max_size=capacity))
    running = fill(nodes, [job(f"r{i}", t, "normal") for i, t in enumerate(owners)])
    claims = draw(st.lists(st.sampled_from(list(teams)), min_size=1, max_size=3))
    pending = [job(f"p{i}", t, "normal", submit=100.0 + i) for i, t in enumerate(claims)]
    return Snapshot(nodes, running, pending), Config(DEFAULT_CLASSES, teams, max_preemptions=None)


def decisions(snapshot: Snapshot, config: Config, rounds: int) -> Iterator[tuple[Snapshot, Plan, float]]:
    """Repeated decisions, each plan carried out on the state before the next (`PoolState.apply`:
    starts run, victims drain, preemptors are nominated); every victim then leaves and goes back
    in line, and time moves past every minimum runtime. The jobs draining at the start drain for
    jobs nominated as their notice nominated them."""
    draining_for = {r.notice.for_job for r in snapshot.running if r.notice is not None}
    pending = [replace(j, nominated=True) if j.id in draining_for else j for j in snapshot.pending]
    state = PoolState.of(replace(snapshot, pending=pending))
    now = NOW
    for _ in range(rounds):
        shown = Snapshot(snapshot.nodes, list(state.running.values()), list(state.line), snapshot.usage)
        plan = decide(shown, config, now)
        yield shown, plan, now
        state.apply(plan, now)
        for job_id in list(state.draining):
            left = state.end(job_id)
            assert left is not None
            state.queue(replace(left.job, preemptions=left.job.preemptions + 1))
        now += 1000.0


def test_no_job_is_preempted_twice_for_one_preemptor_and_a_preemptor_whose_victims_left_starts() -> None:
    """A (victim, preemptor) pair never comes twice, and a preemptor all of whose victims have
    left starts at the next decision, unless a job of a higher class took the GPUs."""
    exercised = Exercised()

    @given(st.one_of(scenarios(), reclaims()), st.integers(2, 6))
    def check(scenario: tuple[Snapshot, Config], rounds: int) -> None:
        snapshot, config = scenario
        pairs: set[tuple[str, str]] = set()
        preempted = promised = False
        victims_of: dict[str, set[str]] = {}
        for state, plan, _ in decisions(snapshot, config, rounds):
            pending = {j.id: j for j in state.pending}
            here = {r.job.id for r in state.running}
            must_start = {p for p, victims in victims_of.items() if p in pending and not victims & here}
            started = {s.job for s in plan.starts}
            preempted, promised = preempted or bool(plan.preemptions), promised or bool(must_start)
            holds = [w.job for w in plan.waits if w.reason is Reason.AWAITING_DRAIN]
            classes = [config.priority_class(s.priority) for s in plan.starts]
            classes += [
                budgeted_class(config, state.usage, config.team(pending[j].team), pending[j].priority).cls
                for j in holds
            ]
            top = max((c.value for c in classes), default=-(2**31))
            nominated_placed = {j for j in [*started, *holds] if j in pending and pending[j].nominated}
            for job_id in must_start - started:
                # Only a job of a higher class may take what was freed for it (start on it, or
                # hold it), or another nominated job of its class: the GPUs freed for each are
                # not told apart once their victims have left (docs/limits.md).
                mine = budgeted_class(config, state.usage, config.team(pending[job_id].team), pending[job_id].priority)
                same = any(
                    budgeted_class(config, state.usage, config.team(pending[j].team), pending[j].priority).cls.value
                    == mine.cls.value
                    for j in nominated_placed - {job_id}
                )
                assert mine.cls.value < top or same, f"{job_id} did not start"
            for job_id in must_start:
                # The promise is for the decision right after its victims left: once a higher class
                # took the GPUs, it waits like any other job.
                del victims_of[job_id]
            for p in plan.preemptions:
                assert (p.victim, p.for_job) not in pairs, f"{p.victim} preempted twice for {p.for_job}"
                pairs.add((p.victim, p.for_job))
                victims_of.setdefault(p.for_job, set()).add(p.victim)
        exercised.note(preemptions=preempted, promises=promised)

    check()
    exercised.assert_shown("preemptions", "promises")
