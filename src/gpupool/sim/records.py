"""What a replay takes in (the jobs) and gives out (what happened to each, and when GPUs were
allocated): the records the engine fills and the report reads."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SimJob:
    """A job to replay: what the trace says it asked for and how long it runs."""

    id: str
    team: str
    priority: str
    gpus: int
    submit: float
    work: float
    """Seconds of computation the job needs, without checkpoints or restarts."""
    gpu_type: str | None = None
    """The GPU type it must run on; None takes any."""
    fails: bool = False
    """The trace says it failed: it fails once it has run its `work`, and is not retried."""
    gpus_per_node: int | None = None
    save_cost: float | None = None
    restart_cost: float | None = None
    """Its own costs, where the trace gives them; None: the `JobModel`'s."""
    sizes: tuple[int, ...] = ()
    """An elastic job's sizes, smallest first, up to `gpus` (`sim.elastic`); () for a rigid one."""


@dataclass(slots=True)
class JobRecord:
    """What happened to one job; GPU-seconds for the lost-work fields."""

    job: SimJob
    first_start: float | None = None
    finish: float | None = None
    wait: float = 0.0
    """Seconds spent pending, over all its waits (requeues included)."""
    preemptions: int = 0
    node_losses: int = 0
    failed: bool = False
    """It lost more nodes than `Config.max_node_losses` and failed, as the service fails it."""
    allocated: float = 0.0
    wasted: float = 0.0
    drain: float = 0.0
    restart: float = 0.0
    """Lost GPU-seconds, as `gpupool.accounting` charges the job's interruptions."""
    lost_to_nodes: float = 0.0
    """The part of them (wasted, drain, restart) charged to the nodes it lost."""
    lost_to_failure: float = 0.0
    """The part charged to its own failure (`SimJob.fails`): its work since its last commit."""
    useful: float = 0.0
    """GPU-seconds its attempts computed work it kept (at each attempt's size and pace)."""
    resizes: int = 0
    """Times it was shrunk or grown (an elastic job)."""
    lost_to_resizes: float = 0.0
    """The part of the lost GPU-seconds charged to its resizes (their drains and restarts)."""


@dataclass(frozen=True, slots=True)
class Usage:
    """A change in allocated GPUs: the series behind utilization plots."""

    time: float
    priority: str
    gpus: int


@dataclass(slots=True)
class Outcome:
    records: list[JobRecord]
    usage: list[Usage]
    decisions: int
    capacity: int
    node_failures: int = 0
    node_down: float = 0.0
    """GPU-seconds of nodes out for repair."""
    outages: list[tuple[str, float, float]] = field(default_factory=list)
    """(node, failed at, back at) of every outage; one still open when the last job ended is
    closed there."""
