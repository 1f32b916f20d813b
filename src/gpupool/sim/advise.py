"""`gpupool advise`: from a lab's trace, per class the checkpoint interval that loses least work
and the smallest priority budgets that still meet the lab's targets, each found by replays.

1. A replay of the trace as configured measures each class's mean running time M between
   interruptions (preemptions and lost nodes) and its save cost δ; Young/Daly gives √(2·δ·M).
2. Replays with every class at ½, 1 and 2 times its Young/Daly interval check it: each class
   takes, of those and its current interval, the one its replay spent least overhead with:
   GPU time allocated beyond the work, that is lost work and checkpoint saves (shorter
   intervals lose less but save more; Young/Daly balances the two). A last replay with the
   chosen intervals gives the figures shown; if its overhead over all classes is more than one
   of the replays before (the classes share the pool, so their choices interact), that replay's
   intervals are advised instead.
3. With targets (`high.wait.p95<=5m`), replays give the targets' classes budgets of a share of
   each team's demand at that class per window (`BUDGET_SHARES`), with the chosen intervals:
   the smallest share that meets every target is advised. A budget demotes a team's jobs past
   it to the next class down, so it frees the pool for the other classes at the cost of the
   budgeted class's own waits; the advice says what it changes for every class.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from gpupool.model import PriorityBudget
from gpupool.sim.metrics import young_daly
from gpupool.sim.records import JobRecord
from gpupool.sim.replay import ClusterSpec, Policy, Settings, replay
from gpupool.sim.trace import Trace
from gpupool.units import parse_duration

MEASURES = ("wait", "jct")
STATS = ("mean", "p50", "p95", "p99")
INTERVAL_FACTORS = (0.5, 1.0, 2.0)
"""Multiples of each class's Young/Daly interval that replays check."""
BUDGET_SHARES = (0.1, 0.25, 0.5, 0.75, 1.0)
"""Shares of each team's demand at a target's class per window that replays try, smallest first."""


@dataclass(frozen=True, slots=True)
class Target:
    """`CLASS.MEASURE.STAT<=DURATION`: e.g. the p95 wait of class high at most 5 minutes."""

    cls: str
    measure: str
    stat: str
    limit: float
    text: str

    def value(self, report: Mapping[str, Any]) -> float | None:
        """The measure in a replay's report; None when the class had no job."""
        group = report["by_priority"].get(self.cls)
        return None if group is None else float(group[self.measure][self.stat])

    def met(self, report: Mapping[str, Any]) -> bool:
        value = self.value(report)
        return value is None or value <= self.limit


def parse_target(text: str, classes: Sequence[str]) -> Target:
    """`high.wait.p95<=5m` into a Target; a ValueError says what is wrong."""
    left, sep, right = text.partition("<=")
    parts = left.strip().split(".")
    shape = f"--target {text!r}: expected CLASS.MEASURE.STAT<=DURATION, e.g. high.wait.p95<=5m"
    if not sep or len(parts) != 3:
        raise ValueError(shape)
    cls, measure, stat = parts
    if cls not in classes:
        raise ValueError(f"--target {text!r}: unknown class {cls!r} (classes: {', '.join(classes)})")
    if measure not in MEASURES:
        raise ValueError(f"--target {text!r}: measure {measure!r}: use {' or '.join(MEASURES)}")
    if stat not in STATS:
        raise ValueError(f"--target {text!r}: statistic {stat!r}: use {', '.join(STATS)}")
    try:
        limit = parse_duration(right.strip())
    except ValueError as exc:
        raise ValueError(f"--target {text!r}: {exc}") from None
    return Target(cls, measure, stat, limit, text.strip())


@dataclass(frozen=True, slots=True)
class IntervalAdvice:
    cls: str
    current: float
    young_daly: float | None
    """None: no job of the class was interrupted in the replay (or its saves cost nothing)."""
    chosen: float
    overhead_before: float
    overhead_after: float
    """GPU-hours the class spent beyond its work (lost work and saves) in the replay as
    configured, and with every class's choice."""


@dataclass(frozen=True, slots=True)
class BudgetAdvice:
    share: float | None
    """The smallest share that meets every target; None when none does."""
    budgets: dict[str, tuple[PriorityBudget, ...]]
    """Per team given one, all its budgets: its configured ones, and those of the targets'
    classes at that share (empty without a share)."""
    report: Mapping[str, Any] | None
    """The replay with them (None without a share)."""
    tried: dict[float, bool]
    """Each share tried, and whether it met every target."""


@dataclass(frozen=True, slots=True)
class Advice:
    before: Mapping[str, Any]
    """The replay as configured."""
    intervals: list[IntervalAdvice]
    after: Mapping[str, Any]
    """The replay with the chosen intervals."""
    targets: list[Target]
    budget: BudgetAdvice | None
    """None without targets."""
    window: float


Runner = Callable[[Sequence[tuple[ClusterSpec, Policy, Settings]]], list[dict[str, Any]]]
"""Replays some runs of the trace and returns their reports in order (`sweep.replay_all`)."""


def advise(
    trace: Trace,
    spec: ClusterSpec,
    policy: Policy,
    settings: Settings,
    targets: Sequence[Target],
    window: float,
    run: Runner,
) -> Advice:
    """The advice for `trace` on the cluster of `spec` under `policy` (see the module's text)."""
    measured = replay(trace, spec, policy, settings)
    by_class = _records_by_class(measured.outcome.records)
    classes = [c.name for c in settings.classes if c.name in by_class]
    intervals = {c: _positive(young_daly(_save_cost(by_class[c], settings), by_class[c])) for c in classes}
    checked = [c for c in classes if intervals[c] is not None]
    candidates = [
        _with_intervals(settings, {c: k * (intervals[c] or 0.0) for c in checked}) for k in INTERVAL_FACTORS if checked
    ]
    reports = run([(spec, policy, s) for s in candidates]) if checked else []
    chosen_intervals = {}
    for c in checked:
        options = [(settings.model.interval_of(c), measured.report)]
        options += [(k * (intervals[c] or 0.0), r) for k, r in zip(INTERVAL_FACTORS, reports, strict=True)]
        chosen_intervals[c] = min(options, key=lambda option: _overhead(option[1], c))[0]
    tuned = _with_intervals(settings, chosen_intervals)
    after = run([(spec, policy, tuned)])[0] if chosen_intervals else measured.report
    # Classes share the pool: choices made one class at a time may lose more together than one
    # of the candidates did for all. Then the best of those (or the intervals as they are) wins.
    joint = [(settings.model.interval, measured.report)]
    joint += [(candidate.model.interval, r) for candidate, r in zip(candidates, reports, strict=True)]
    best_interval, best = min(joint, key=lambda option: _total_overhead(option[1]))
    if chosen_intervals and _total_overhead(after) > _total_overhead(best):
        chosen_intervals = {c: best_interval.get(c, settings.model.default_interval) for c in checked}
        tuned, after = _with_intervals(settings, chosen_intervals), best
    advice = [
        IntervalAdvice(
            c,
            settings.model.interval_of(c),
            intervals[c],
            chosen_intervals.get(c, settings.model.interval_of(c)),
            _overhead(measured.report, c),
            _overhead(after, c),
        )
        for c in classes
    ]
    budget = _budgets(trace, spec, policy, tuned, targets, window, run, by_class) if targets else None
    return Advice(measured.report, advice, after, list(targets), budget, window)


def _records_by_class(records: Sequence[JobRecord]) -> dict[str, list[JobRecord]]:
    grouped: dict[str, list[JobRecord]] = defaultdict(list)
    for r in records:
        if r.finish is not None or r.failed:
            grouped[r.job.priority].append(r)
    return grouped


def _save_cost(records: Sequence[JobRecord], settings: Settings) -> float:
    """The class's save cost: its jobs' own, where the trace gives them, else the model's."""
    own = [r.job.save_cost for r in records if r.job.save_cost is not None]
    return sum(own) / len(own) if own else settings.model.save_cost


def _with_intervals(settings: Settings, intervals: Mapping[str, float]) -> Settings:
    model = settings.model
    return replace(settings, model=replace(model, interval={**model.interval, **intervals}))


def _positive(interval: float | None) -> float | None:
    """A Young/Daly interval to check; None for none, or for 0 (saves that cost nothing)."""
    return interval if interval is not None and interval > 0 else None


def _overhead(report: Mapping[str, Any], cls: str) -> float:
    """GPU-hours the class was allocated beyond its work (lost work, saves, start-ups)."""
    group = report["by_priority"].get(cls)
    if group is None:
        return 0.0
    useful, goodput = float(group["gpu_hours"]), float(group["goodput"])
    return useful / goodput - useful if goodput > 0 else math.inf


def _total_overhead(report: Mapping[str, Any]) -> float:
    return sum(_overhead(report, cls) for cls in report["by_priority"])


def _budgets(
    trace: Trace,
    spec: ClusterSpec,
    policy: Policy,
    settings: Settings,
    targets: Sequence[Target],
    window: float,
    run: Runner,
    by_class: Mapping[str, Sequence[JobRecord]],
) -> BudgetAdvice:
    """The smallest share of demand per window, as budgets of the targets' classes, that meets
    every target (tried on every share, in one batch of replays)."""
    submits = [job.submit_time for job in trace.jobs]
    span = max(submits) - min(submits) if submits else 0.0
    per_window = min(1.0, window / span) if span > 0 else 1.0
    demand: dict[tuple[str, str], float] = defaultdict(float)
    for cls in {t.cls for t in targets}:
        for r in by_class.get(cls, ()):
            demand[(r.job.team, cls)] += r.job.gpus * r.job.work / 3600 * per_window
    plans = [_budget_plan(settings, demand, share, window) for share in BUDGET_SHARES]
    reports = run([(spec, policy, replace(settings, budgets=plan)) for plan in plans])
    tried = {share: all(t.met(r) for t in targets) for share, r in zip(BUDGET_SHARES, reports, strict=True)}
    for share, plan, report in zip(BUDGET_SHARES, plans, reports, strict=True):
        if tried[share]:
            # Every budget of the teams given one: the snippet replaces their `budgets`.
            given = {team for team, _ in demand}
            return BudgetAdvice(share, {team: b for team, b in plan.items() if team in given}, report, tried)
    return BudgetAdvice(None, {}, None, tried)


def _budget_plan(
    settings: Settings, demand: Mapping[tuple[str, str], float], share: float, window: float
) -> dict[str, tuple[PriorityBudget, ...]]:
    """The settings' budgets with those of `demand`'s (team, class) at `share` of it."""
    plan = {team: tuple(budgets) for team, budgets in settings.budgets.items()}
    for (team, cls), hours in sorted(demand.items()):
        kept = tuple(b for b in plan.get(team, ()) if b.priority != cls)
        # A tenth of a GPU-hour at least: a budget of nothing would demote every job of the class.
        plan[team] = (*kept, PriorityBudget(cls, max(0.1, math.ceil(hours * share * 10) / 10), window))
    return plan


def exact_duration(seconds: float) -> str:
    """A duration `parse_duration` reads back exactly: `7d`, `36h`, `25m`, `90s` (or `never`)."""
    if math.isinf(seconds):
        return "never"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and float(seconds / size).is_integer():
            return f"{int(seconds // size)}{unit}"
    return f"{round(seconds)}s" if float(seconds).is_integer() else f"{seconds:.3f}s"


def advice_yaml(advice: Advice, source: str) -> str:
    """The configuration to paste: the budgets under `teams:`, and the checkpoint intervals as
    comments (a job sets its own, `Job(save_every=…)`; `save_every="auto"` tracks Young/Daly
    as the service measures it)."""
    lines = [f"# gpupool advise: {source}"]
    budget = advice.budget
    if budget is not None and budget.share is not None and budget.budgets:
        lines.append(f"# budgets: {budget.share:.0%} of each team's demand per {exact_duration(advice.window)}")
        lines.append("# (each team's whole `budgets`, its configured ones kept: it replaces them)")
        teams = {
            team: {
                "budgets": {b.priority: {"gpu_hours": b.gpu_hours, "window": exact_duration(b.window)} for b in budgets}
            }
            for team, budgets in sorted(budget.budgets.items())
        }
        # YAML's own writer: it quotes team names that would read as numbers (Philly's 103959).
        lines.extend(yaml.safe_dump({"teams": teams}, default_flow_style=None, sort_keys=False).splitlines())
    elif budget is not None:
        lines.append("# no budget meets the targets: see the advice's output")
    lines.append("# checkpoint intervals, per class (set in the jobs: Job(save_every=...)):")
    for i in advice.intervals:
        if i.young_daly is None:
            lines.append(f"#   {i.cls}: no interruption in the replay; keep {exact_duration(_whole(i.current))}")
        else:
            lines.append(
                f"#   {i.cls}: {exact_duration(_whole(i.chosen))} (Young/Daly {exact_duration(_whole(i.young_daly))})"
            )
    return "\n".join(lines) + "\n"


def _whole(seconds: float) -> float:
    return seconds if math.isinf(seconds) else float(round(seconds))
