"""Priority budgets: past its budget, a team's jobs run one class lower."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpupool.model import Config, PriorityClass, Team


@dataclass(frozen=True, slots=True)
class BudgetedClass:
    """The class a team's job is treated as, and why it differs from the asked one."""

    cls: PriorityClass
    demoted_from: PriorityClass | None = None
    note: str = ""


def next_lower(config: Config, cls: PriorityClass) -> PriorityClass | None:
    """The class just below `cls`, or None for the lowest."""
    lower = [c for c in config.classes if c.value < cls.value]
    return max(lower, key=lambda c: c.value) if lower else None


def budgeted_class(config: Config, usage: Mapping[tuple[str, str], float], team: Team, priority: str) -> BudgetedClass:
    """The class `team` gets for `priority` given its metered use inside the budget window
    (use is metered at the class each attempt ran at)."""
    cls = config.priority_class(priority)
    for budget in team.budgets:
        if budget.priority != priority:
            continue
        spent_hours = usage.get((team.name, priority), 0.0) / 3600.0
        if spent_hours < budget.gpu_hours:
            continue
        lower = next_lower(config, cls)
        if lower is None:
            continue
        window_hours = budget.window / 3600.0
        note = (
            f"team {team.name} is over its {priority} budget "
            f"({spent_hours:.1f} of {budget.gpu_hours:g} GPU-h per {window_hours:g} h): runs as {lower.name}"
        )
        return BudgetedClass(lower, cls, note)
    return BudgetedClass(cls)
