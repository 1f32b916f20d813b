"""The scheduler's numbers in Prometheus' exposition format (`GET /metrics`).

Three feeds, one registry:

- the **store**, read by a thread of its own at most once a second (and soon after a tick that
  changed something): the event log and checkpoint commits into counters and histograms
  (`ledger`), and the pool's current state into gauges (`gauges`);
- the **control loop**, through `gpupool.service.observer.Observer`: how long each decision
  took, the size of its snapshot, when the loop last ticked;
- the **API**: requests by route and status, and their latency.

A scrape only formats what is in memory: it never reads the store. Names follow Prometheus'
conventions (base units, `_total`, `_seconds`, `_timestamp_seconds`) and labels are bounded
(class, team, node, GPU type, reason), never a job's id: jobs are in the API and the pages.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TypeVar

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as CounterMetric
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from gpupool.accounting import AttemptRecord, goodput
from gpupool.model import Plan, Reason
from gpupool.policy import PoolState
from gpupool.store import Store
from gpupool.store.tail import Tail
from gpupool.store.telemetry import Committed, Happened
from gpupool.telemetry.gauges import gauge, pool_gauges
from gpupool.telemetry.ledger import BUCKETS, INTERRUPTION_KINDS, USES, Labels, Ledger

__all__ = ["COUNTERS", "Telemetry"]

K = TypeVar("K")

log = logging.getLogger("gpupool.telemetry")

COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gpupool_jobs_submitted": ("Jobs submitted (each task of an array is one).", ("class", "team")),
    "gpupool_jobs_finished": (
        "Jobs done, by how they ended (succeeded, failed, cancelled, timeout).",
        ("class", "team", "state"),
    ),
    "gpupool_attempts_started": (
        "Attempts started: a job's first, one that resumes after an interruption, or an elastic job's next "
        "at its new size (resize).",
        ("class", "team", "kind"),
    ),
    "gpupool_preemptions": (
        "Notices given to running jobs, by the victim's class and team and the rule that chose it "
        "(priority, reclaim, fair_share, seniority); an elastic job's shrink is one, its growth is not.",
        ("class", "team", "reason"),
    ),
    "gpupool_interruptions": (
        "Attempts cut short, as gpupool report counts them: preemption, node_lost, failure (the attempt "
        "failed, retried or not), out_of_memory (it failed at its memory limit), lost (its process was lost "
        "while the scheduler was down); counted once "
        "their cost is known.",
        ("class", "team", "kind"),
    ),
    "gpupool_lost_gpu_seconds": (
        "GPU-seconds interruptions cost: work done again (wasted), notice to release (drain), and the next "
        "attempt's start up to its first productive step (restart).",
        ("class", "team", "kind", "bucket"),
    ),
    "gpupool_allocated_gpu_seconds": (
        "GPU-seconds of ended attempts by what they went to: productive, startup, checkpoint, drain, wasted, "
        "unreported (jobs that say nothing of their progress). Goodput is productive over all but unreported.",
        ("class", "team", "use"),
    ),
    "gpupool_checkpoint_commits": ("Checkpoints jobs committed and reported.", ("class", "team")),
    "gpupool_cpu_seconds": ("CPU time of ended attempts, as their cgroups counted it.", ("class", "team")),
    "gpupool_idle_session_gpu_seconds": (
        "GPU-seconds sessions (shells, notebooks) of ended attempts held with no activity, in stretches of "
        "sessions.idle_counts_after or more: capacity idle sessions kept from the pool.",
        ("class", "team"),
    ),
    "gpupool_oom_kills": (
        "Processes the kernel killed because an attempt reached its memory limit (--mem).",
        ("class", "team"),
    ),
    "gpupool_resizes": (
        "Elastic jobs resized (shrink: for a waiting job, instead of an eviction; grow: into GPUs nobody "
        "waited for); counted once the next attempt's restart is known.",
        ("class", "team", "direction"),
    ),
    "gpupool_shrink_kept_gpu_seconds": (
        "Productive GPU-seconds elastic jobs did on the GPUs a shrink let them keep: work an eviction would "
        "have left waiting in line (the GPU time shrinks saved against evictions).",
        ("class", "team"),
    ),
}
"""Counters from the store (name without `_total`) → help and labels."""

SEEDED: dict[str, list[tuple[str, ...]]] = {
    "gpupool_jobs_submitted": [()],
    "gpupool_preemptions": [(r.value,) for r in (Reason.PRIORITY, Reason.RECLAIM, Reason.FAIR_SHARE, Reason.SENIORITY)],
    "gpupool_interruptions": [(kind,) for kind in INTERRUPTION_KINDS.values()],
    "gpupool_lost_gpu_seconds": [(kind, bucket) for kind in INTERRUPTION_KINDS.values() for bucket in BUCKETS],
    "gpupool_allocated_gpu_seconds": [(use,) for use in USES],
}
"""Counters given as 0 for every class and team (and these further labels) before they move."""

DECISION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH = 20_000
"""Events read per query while catching up with the log."""


def gpupool_version() -> str:
    try:
        return version("gpupool")
    except PackageNotFoundError:
        return "unknown"


class Telemetry:
    """The observer of the loop and the reader of the store behind `/metrics`."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], float] = time.time,
        interval: float = 5.0,
        idle_interval: float = 15.0,
    ) -> None:
        self.store = store
        self.clock = clock
        self.interval = interval
        self.idle_interval = idle_interval
        self.registry = CollectorRegistry(auto_describe=False)
        """What the loop and the API feed: formatted at each scrape (a few hundred samples)."""
        self.stored = CollectorRegistry(auto_describe=False)
        """What the store feeds: formatted once per refresh, and that text served until the next."""
        self.ledger = Ledger(self.stored)
        self.poke = threading.Event()
        self._lock = threading.Lock()
        self._families: list[Metric] = []
        self._rendered = b""
        self._classes: list[str] | None = None
        self.decisions = Histogram(
            "gpupool_decision_duration_seconds",
            "Wall time of each decision of the control loop (decide, from the snapshot to the plan).",
            buckets=DECISION_BUCKETS,
            registry=self.registry,
        )
        self.snapshot_jobs = Gauge(
            "gpupool_decision_snapshot_jobs",
            "Jobs in the last decision's snapshot: pending, or running (holding GPUs).",
            ["state"],
            registry=self.registry,
        )
        self.snapshot_nodes = Gauge(
            "gpupool_decision_snapshot_nodes", "Nodes in the last decision's snapshot.", registry=self.registry
        )
        self.last_decision = Gauge(
            "gpupool_last_decision_timestamp_seconds",
            "When the control loop last decided (it decides when a job is pending).",
            registry=self.registry,
        )
        self.last_tick = Gauge(
            "gpupool_loop_last_tick_timestamp_seconds",
            "When the control loop last ran a tick that it was allowed to (at least once per interval).",
            registry=self.registry,
        )
        self.requests = CounterMetric(
            "gpupool_http_requests",
            "API requests by method, route template and status code.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gpupool_http_request_duration_seconds",
            "API request latency by method and route template, to the last byte of the answer.",
            ["method", "route"],
            buckets=HTTP_BUCKETS,
            registry=self.registry,
        )
        build = Gauge(
            "gpupool_build_info", "The running gpupool's version.", ["version", "python"], registry=self.registry
        )
        build.labels(gpupool_version(), platform.python_version()).set(1)
        self.stored.register(self)  # its collect() gives the families read from the store

    # --- the observer of the control loop -------------------------------------------------------

    def on_decision(self, now: float, state: PoolState, plan: Plan, seconds: float) -> None:
        self.decisions.observe(seconds)
        self.snapshot_jobs.labels("pending").set(len(state.line))
        self.snapshot_jobs.labels("running").set(len(state.running))
        self.snapshot_nodes.set(len(state.nodes))
        self.last_decision.set(now)

    def on_tick(self, now: float, changed: bool) -> None:
        self.last_tick.set(now)
        if changed:
            self.poke.set()

    # --- the API ------------------------------------------------------------------------------

    def on_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def exposition(self) -> bytes:
        with self._lock:
            rendered = self._rendered
        return generate_latest(self.registry) + rendered

    # --- what the store says ------------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            return list(self._families)

    def describe(self) -> Iterable[Metric]:
        return []

    def run(self, stop: threading.Event) -> None:
        """Refresh from the store until `stop`: at once (reading the whole log), then after a
        tick that changed the store, at most once per `interval`, and at least once per
        `idle_interval` (budget use moves with time alone). A quiet pool costs nothing."""
        while not stop.is_set():
            began = time.monotonic()
            try:
                self.refresh(self.clock())
            except Exception:
                log.exception("could not read the metrics from the store; trying again")
            if stop.wait(max(0.0, self.interval - (time.monotonic() - began))):
                return
            self.poke.wait(self.idle_interval)
            self.poke.clear()

    def refresh(self, now: float) -> None:
        """Read what is new in the log, count it, and read the pool's current state."""
        follow(self.store.happened, self.ledger.events, self.ledger.read_events, now)
        follow(self.store.committed, self.ledger.commits, self.ledger.read_commits, now)
        self.ledger.settle(self.records_of, now)
        if self._classes is None:
            self._classes = [c.name for c in self.store.classes()]
        teams = self.store.teams()
        known = [(c, t.name) for c in self._classes for t in teams]
        families = [*self.counter_families(known), *pool_gauges(self.store, now, teams, known)]
        families.append(gauge("gpupool_telemetry_caught_up", _CAUGHT_UP, [], [((), 1.0)]))
        families.append(gauge("gpupool_telemetry_refresh_timestamp_seconds", _REFRESHED, [], [((), now)]))
        with self._lock:
            self._families = families
        rendered = generate_latest(self.stored)
        with self._lock:
            self._rendered = rendered

    def records_of(self, job_ids: Sequence[int]) -> list[tuple[int, str, str, str, list[AttemptRecord]]]:
        return [
            (job.id, job.team, job.priority, job.state, records)
            for job, records in self.store.attempt_records(job_ids=job_ids)
        ]

    def counter_families(self, known: Sequence[tuple[str, str]]) -> list[Metric]:
        """The counters, each (class, team) pair of `known` given as 0 before it moves."""
        families: list[Metric] = []
        counts = self.ledger.counts
        for name, (doc, labels) in COUNTERS.items():
            values: dict[Labels, float] = dict(counts.get(name, {}))
            for rest in SEEDED.get(name, []):
                for c, t in known:
                    values.setdefault((c, t, *rest), 0.0)
            family = CounterMetricFamily(name, doc, labels=list(labels))
            for label_values, value in sorted(values.items()):
                family.add_metric(list(label_values), value)
            families.append(family)
        families.append(self.goodput_family(counts.get("gpupool_allocated_gpu_seconds", {})))
        return families

    def goodput_by_team(self) -> dict[str, float]:
        """Each team's goodput over all time, from the counters (ended attempts)."""
        return goodput_of(self.ledger.counts.get("gpupool_allocated_gpu_seconds", {}), lambda labels: labels[1])

    @staticmethod
    def goodput_family(allocated: Mapping[Labels, float]) -> Metric:
        family = GaugeMetricFamily(
            "gpupool_goodput_ratio",
            "Productive over allocated GPU time of ended attempts that reported their progress, by class and "
            "team, over all time (for a window: the ratio of rate()s of gpupool_allocated_gpu_seconds_total).",
            labels=["class", "team"],
        )
        for (priority, team), value in sorted(goodput_of(allocated, lambda labels: (labels[0], labels[1])).items()):
            family.add_metric([priority, team], value)
        return family


R = TypeVar("R", Happened, Committed)


def follow(
    read: Callable[[int, int, Sequence[int]], list[R]],
    tail: Tail,
    take: Callable[[Sequence[R], float], None],
    now: float,
) -> None:
    """Read a table past its tail's mark (and its gaps) in batches until what is new is read."""
    while True:
        mark = tail.mark
        rows = read(mark, BATCH, sorted(tail.gaps))
        take(rows, now)
        if sum(1 for row in rows if row.id > mark) < BATCH:
            return


def goodput_of(allocated: Mapping[Labels, float], key: Callable[[Labels], K]) -> dict[K, float]:
    """`accounting.goodput` of the GPU-seconds by (class, team, use), grouped by `key`."""
    uses: defaultdict[K, defaultdict[str, float]] = defaultdict(lambda: defaultdict(float))
    for labels, value in list(allocated.items()):
        uses[key(labels)][labels[2]] += value
    ratios = {k: goodput(u["productive"], sum(u.values()), u["unreported"]) for k, u in uses.items()}
    return {k: ratio for k, ratio in ratios.items() if ratio is not None}


_CAUGHT_UP = "1 once the counters have read the whole event log (absent before: they are still catching up)."
_REFRESHED = "When the metrics last read the store."
