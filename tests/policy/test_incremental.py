"""The state a driver keeps between decisions, fed event by event, gives at every decision the
plan the reference makes on a state built anew from the jobs alone (tests/support/oracle.py):
over random pools (GPU types, dedicated nodes), arrivals of single jobs and gangs, exits,
checkpoints, notices and drains ending, budgets' classes left to the core, preemption caps,
minimum runtimes and clock advances."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, target
from hypothesis import strategies as st

from gpupool.model import (
    Allocation,
    Config,
    ElasticPolicy,
    FairShare,
    Job,
    Node,
    PriorityClass,
    PriorityScope,
    QueueMode,
    RunningJob,
    Snapshot,
    Team,
)
from gpupool.policy import PoolState
from gpupool.policy import decide as decide_on
from gpupool.policy.running import RunningIndex
from gpupool.shapes import elastic_sizes
from tests.support.exercised import Exercised
from tests.support.oracle import assert_index_matches, decide, reference_state

# Short minimum runtimes, so that the clock's advances open victims often.
CLASSES_FAST = (
    PriorityClass("urgent", 1000, may_preempt=True, preemptible=False, grace_period=60.0),
    PriorityClass("high", 100, may_preempt=True, preemptible=True, min_runtime=120.0, grace_period=120.0),
    PriorityClass("normal", 10, may_preempt=True, preemptible=True, grace_period=120.0),
    PriorityClass("low", 0, may_preempt=False, preemptible=True, min_runtime=60.0, grace_period=60.0),
)
CLASSES = [c.name for c in CLASSES_FAST]


@dataclass
class Driver:
    """Feeds a `PoolState` the events of a script and carries its plans out on it, as every
    driver does; at each decision, the plan must be the reference's, decided on a state built
    anew from the running and pending jobs alone."""

    nodes: list[Node]
    config: Config
    now: float = 1000.0
    eager_index: bool = True
    """Read the running index before every decision (built at the first); else only where a
    decision built it, so that it is built after any events."""
    state: PoolState = field(init=False)
    alive: set[str] = field(default_factory=set)
    """The jobs that arrived and did not leave: each must be running or in line."""
    decisions: int = 0
    notices: int = 0
    held: int = 0
    resizes: int = 0

    def __post_init__(self) -> None:
        self.state = PoolState(self.nodes)

    def decide(self) -> None:
        state = self.state
        assert state.running.keys() | state.line.jobs.keys() == self.alive, "a job was lost or made up"
        snapshot = Snapshot(self.nodes, list(state.running.values()), list(state.line), state.usage)
        if self.eager_index:
            assert_index_matches(state.index, snapshot.running)
        plan = decide_on(state, self.config, self.now)
        assert plan == decide_on(reference_state(snapshot), self.config, self.now), f"decision {self.decisions} differs"
        if state._index is not None:
            assert_index_matches(state.index, snapshot.running)
        self.decisions += 1
        self.notices += len(plan.preemptions)
        self.resizes += sum(1 for p in plan.preemptions if p.keep) + len(plan.grows)
        self.held += sum(1 for wait in plan.waits if wait.placement)
        state.apply(plan, self.now)

    def arrive(self, job: Job) -> None:
        self.state.queue(job)
        self.alive.add(job.id)

    def leave(self, job_id: str, requeue: bool) -> None:
        running = self.state.end(job_id)
        assert running is not None
        if not requeue:
            self.alive.discard(job_id)
        else:
            job = running.job
            self.state.queue(replace(job, preemptions=job.preemptions + 1, queued_at=self.now))

    def checkpoint(self, job_id: str) -> None:
        self.state.checkpoint(job_id, self.now)

    def resized(self) -> None:
        """The first resize under way (a shrink or a growth) is done: the job runs at once on
        what its notice keeps."""
        resizing = sorted(j for j, r in self.state.draining.items() if r.notice is not None and r.notice.keep)
        if resizing:
            self.state.resized(resizing[0], self.now)


pools = st.lists(
    st.tuples(st.sampled_from([2, 4, 8]), st.sampled_from(["A", "A", "B"]), st.sampled_from([None, None, "a"])),
    min_size=1,
    max_size=4,
)
arrivals = st.tuples(
    st.sampled_from("abc"),
    st.sampled_from(CLASSES),
    st.sampled_from([1, 1, 2, 3, 4, 8, 12, 16]),
    st.sampled_from([None, None, "A"]),
    st.sampled_from([None, None, 0]),
    st.booleans(),
)
events = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), arrivals),
        st.tuples(st.sampled_from(["exit", "requeue", "checkpoint"]), st.integers(0, 50)),
        st.tuples(st.just("resized"), st.none()),
        st.tuples(st.just("advance"), st.sampled_from([1.0, 30.0, 130.0, 601.0])),
        st.tuples(st.just("decide"), st.none()),
    ),
    # Long enough for a pool to fill, age and be preempted in: what makes notices.
    min_size=20,
    max_size=80,
)
_configs = [
    Config(
        CLASSES_FAST,
        {"a": Team("a", guaranteed_gpus=8), "b": Team("b", guaranteed_gpus=4)},
        elastic=ElasticPolicy(min_time_at_size=100.0),
    ),
    Config(CLASSES_FAST, fair_share=FairShare.PREEMPT, seniority_after=300.0, max_preemptions=2),
    Config(
        CLASSES_FAST,
        {"a": Team("a", guaranteed_gpus=4), "c": Team("c", weight=2.0)},
        priority_preemption=PriorityScope.ABOVE_GUARANTEE,
        fair_share=FairShare.PREEMPT,
    ),
    Config(CLASSES_FAST, queue=QueueMode.STRICT, max_preemptions=1),
]
# Unexplained waits (the simulator's) let the queue pass stop early, and so do waits past the
# explained depth (the service's): both ways.
configs = st.sampled_from(
    _configs + [replace(c, explain_waits=False) for c in _configs] + [replace(c, explain_depth=2) for c in _configs]
)


def test_the_kept_state_decides_as_the_snapshot_alone() -> None:
    exercised = Exercised()

    @given(pools, events, configs, st.booleans())
    def check(
        pool: list[tuple[int, str, str | None]],
        script: list[tuple[str, object]],
        config: Config,
        eager_index: bool,
    ) -> None:
        nodes = [Node(f"n{i}", gpus, gpu_type, team) for i, (gpus, gpu_type, team) in enumerate(pool)]
        driver = Driver(nodes, config, eager_index=eager_index)
        arrived = 0
        for kind, arg in [*script, ("decide", None)]:
            ids = sorted(driver.state.running)
            if kind == "arrive":
                assert isinstance(arg, tuple)
                team: str = arg[0]
                cls: str = arg[1]
                gpus: int = arg[2]
                gpu_type: str | None = arg[3]
                max_preemptions: int | None = arg[4]
                per_node = 4 if gpus in (12, 16) else None
                elastic = arg[5] and gpus > 1
                sizes = elastic_sizes(4 if per_node else 1, gpus, per_node or 1, per_node) if elastic else ()
                job = Job(
                    f"j{arrived}",
                    team,
                    cls,
                    gpus,
                    driver.now,
                    gpu_type=gpu_type,
                    gpus_per_node=per_node,
                    max_preemptions=max_preemptions,
                    expected_restart=float(arrived % 3) * 20.0,
                    sizes=sizes,
                )
                driver.arrive(job)
                arrived += 1
            elif kind in ("exit", "requeue", "checkpoint") and ids:
                job_id = ids[int(arg) % len(ids)]  # type: ignore[call-overload]
                if kind == "checkpoint":
                    driver.checkpoint(job_id)
                else:
                    driver.leave(job_id, requeue=kind == "requeue")
            elif kind == "resized":
                driver.resized()
            elif kind == "advance":
                driver.now += float(arg)  # type: ignore[arg-type]
            elif kind == "decide":
                driver.decide()
        assert driver.decisions >= 1
        target(float(driver.notices), label="notices")
        target(float(driver.held), label="held placements")
        exercised.note(notices=driver.notices > 0, held_placements=driver.held > 0, resizes=driver.resizes > 0)

    check()
    exercised.assert_shown("notices", "held_placements", "resizes")


def test_a_scripted_storm_gives_notice_holds_and_drains_the_same_both_ways() -> None:
    """Gangs across nodes give notice to jobs on several nodes, hold their GPUs while they
    drain, then start; a checkpoint and a preemption cap change the victims chosen."""
    nodes = [Node(f"n{i}", 4) for i in range(4)]
    config = Config(CLASSES_FAST, {"a": Team("a", guaranteed_gpus=4)}, max_preemptions=3)
    driver = Driver(nodes, config)
    for i in range(8):
        driver.arrive(Job(f"low{i}", "ab"[i % 2], "low", 2, driver.now, order=i))
    driver.decide()
    driver.now += 100.0
    driver.checkpoint("low3")
    driver.arrive(Job("gang", "a", "urgent", 8, driver.now, gpus_per_node=4, order=10))
    driver.arrive(Job("one", "b", "high", 2, driver.now, order=11))
    driver.decide()
    assert driver.notices >= 4 and driver.held >= 1
    for job_id in [j for j, r in driver.state.running.items() if r.notice is not None]:
        driver.leave(job_id, requeue=True)
    driver.now += 5.0
    driver.decide()
    assert "gang" in driver.state.running and driver.decisions == 3


def test_a_refused_add_or_checkpoint_leaves_the_index_as_it_was() -> None:
    """The review found a failed `add` half done, and a later `remove` taking another job's
    place in its key's list; a checkpoint for a job the index does not hold inserted it."""
    nodes = [Node("n0", 4)]
    index = RunningIndex(nodes)
    a = RunningJob(Job("a", "t", "low", 1, 0.0), (Allocation("n0", (0,)),), 10.0)
    index.add(a)
    elsewhere = RunningJob(Job("b", "t", "low", 1, 0.0), (Allocation("nX", (0,)),), 5.0)
    with pytest.raises(ValueError, match="unknown node 'nX'"):
        index.add(elsewhere)
    assert_index_matches(index, [a])
    with pytest.raises(KeyError):
        index.remove("b")
    assert_index_matches(index, [a])
    draining = RunningJob(Job("c", "t", "low", 1, 0.0), (Allocation("n0", (1,)),), 5.0)
    with pytest.raises(ValueError, match="job c is not running in the index"):
        index.checkpointed(draining.checkpointed(20.0))
    assert_index_matches(index, [a])
    index.checkpointed(a.checkpointed(20.0))
    assert_index_matches(index, [a.checkpointed(20.0)])


def test_a_class_no_running_job_holds_any_more_is_not_looked_up() -> None:
    """The review found every key ever seen looked up at each decision: after a job of class
    `batch` left and the class was taken out of the configuration, the kept state refused to
    decide while the snapshot alone decided."""
    batch = PriorityClass("batch", 5, may_preempt=False, preemptible=True)
    nodes = [Node("n0", 2)]
    with_batch = Config((*CLASSES_FAST, batch))
    driver = Driver(nodes, with_batch)
    driver.arrive(Job("b", "t", "batch", 1, driver.now))
    driver.arrive(Job("r0", "t", "low", 1, driver.now, order=1))
    driver.decide()
    driver.leave("b", requeue=False)
    for job_id in list(driver.state.line.jobs):
        driver.state.unqueue(job_id)
    driver.config = Config(CLASSES_FAST)
    driver.now += 601.0
    driver.arrive(Job("u", "u", "urgent", 2, driver.now, order=2))
    driver.decide()
    assert driver.notices == 1


def test_a_victim_whose_lost_work_is_infinite_leaves_the_search_in_bound_order() -> None:
    """The review found the bound's margin turn an infinite cost into NaN (inf - inf), which
    sorted out of order and stopped the search before the cheapest victim (VC)."""
    now = 5000.0
    nodes = [Node(f"n{i}", 4) for i in range(4)]

    def low(job_id: str, node: str, gpus: int, checkpoint: float, restart: float = 0.0) -> RunningJob:
        job = Job(job_id, "v", "low", gpus, 0.0, expected_restart=restart)
        return RunningJob(job, (Allocation(node, tuple(range(gpus))),), 0.0, checkpoint)

    running = [
        low("VA", "n0", 3, now - 250),
        low("VB", "n1", 3, now - 100, float("inf")),
        low("VC", "n2", 3, now - 100),
        low("VD", "n3", 2, now - 200),
    ]
    pending = [Job(f"s{i}", "u", "urgent", 1, float(i), order=i) for i in range(3)]
    pending.append(Job("big", "u", "urgent", 3, 10.0, gpus_per_node=3, order=5))
    snapshot = Snapshot(nodes, running, pending)
    config = Config(CLASSES_FAST, explain_waits=False)
    assert [p.victim for p in decide(snapshot, config, now).preemptions] == ["VC"]


def test_a_team_named_with_nothing_is_in_line() -> None:
    """The review found the jobs of a team named "" left out of the queue (a falsy name read
    as the nominated jobs' line)."""
    snapshot = Snapshot([Node("n0", 4)], [], [Job("j", "", "normal", 1, 0.0)])
    for explain in (True, False):
        config = Config(CLASSES_FAST, explain_waits=explain)
        assert [s.job for s in decide(snapshot, config, 0.0).starts] == ["j"]


# Review of issue 32's kept state.


def test_a_placement_naming_one_node_twice_takes_both_and_gives_both_back() -> None:
    """The review found the second allocation of one node overwrite the first in the free
    GPUs (GPU 0 listed free while held), a GPU named twice accepted, and its end listing a GPU
    twice."""
    state = PoolState([Node("n0", 4)])
    twice = RunningJob(Job("j", "t", "low", 2, 0.0), (Allocation("n0", (0,)), Allocation("n0", (1,))), 0.0)
    state.start(twice)
    assert list(state.free["n0"]) == [2, 3]
    same = RunningJob(Job("k", "t", "low", 2, 0.0), (Allocation("n0", (2,)), Allocation("n0", (2,))), 0.0)
    with pytest.raises(ValueError, match="GPU 2 of node n0 is held twice"):
        state.start(same)
    assert list(state.free["n0"]) == [2, 3] and "k" not in state.running
    state.end("j")
    assert list(state.free["n0"]) == [0, 1, 2, 3]


def test_a_refused_start_leaves_the_plan_and_the_put_undone() -> None:
    """The review found `apply` take a started job out of line before its GPUs were checked (the
    job then neither ran nor waited), and `put` end the old attempt before checking the new."""
    from gpupool.model import Plan, Reason, Start

    state = PoolState([Node("n0", 2)])
    a = RunningJob(Job("a", "t", "low", 1, 0.0), (Allocation("n0", (0,)),), 0.0)
    state.start(a)
    state.queue(Job("b", "t", "low", 1, 1.0))
    state.queue(Job("c", "t", "low", 1, 2.0, order=1))
    start = [
        Start("c", (Allocation("n0", (1,)),), "low", Reason.FREE_GPUS, ""),
        Start("b", (Allocation("n0", (0,)),), "low", Reason.FREE_GPUS, ""),
    ]
    with pytest.raises(ValueError, match="GPU 0 of node n0 is held twice"):
        state.apply(Plan(tuple(start)), 5.0)
    assert list(state.running) == ["a"] and sorted(state.line.jobs) == ["b", "c"] and state.free["n0"] == (1,)
    moved = RunningJob(a.job, (Allocation("n0", (3,)),), 0.0)
    with pytest.raises(ValueError, match="node n0 has no GPU 3"):
        state.put("a", moved)
    assert state.running == {"a": a} and state.free["n0"] == (1,) and dict(state.team_gpus) == {"t": 1}
