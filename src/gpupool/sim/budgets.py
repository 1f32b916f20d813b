"""Priority budgets in the simulator: GPU-seconds per (team, class) in each budget's rolling
window, metered as the store meters them (at the class each attempt ran at)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import chain

from gpupool.model import Team, budget_use


@dataclass(slots=True)
class BudgetMeter:
    windows: dict[tuple[str, str], float]
    """Per (team, class) with a budget, its window in seconds."""
    running: dict[str, tuple[tuple[str, str], float, int]] = field(default_factory=dict)
    """Per job with a running metered attempt: (team, class), start, GPUs."""
    ended: dict[tuple[str, str], deque[tuple[float, float, int]]] = field(default_factory=dict)
    """Per (team, class), ended attempts as (start, end, GPUs), in order of their end."""

    @classmethod
    def of(cls, teams: Mapping[str, Team]) -> BudgetMeter:
        return cls({(t.name, b.priority): b.window for t in teams.values() for b in t.budgets})

    def start(self, job: str, team: str, priority: str, gpus: int, now: float) -> None:
        """An attempt of `job` starts, running at class `priority`."""
        if (team, priority) in self.windows:
            self.running[job] = ((team, priority), now, gpus)

    def end(self, job: str, now: float) -> None:
        metered = self.running.pop(job, None)
        if metered is not None:
            key, started, gpus = metered
            self.ended.setdefault(key, deque()).append((started, now, gpus))

    def usage(self, now: float) -> dict[tuple[str, str], float]:
        """GPU-seconds per (team, class) inside each budget's window ending at `now`."""
        if not self.windows:
            return {}
        use = {}
        for key, window in self.windows.items():
            done = self.ended.get(key)
            while done and done[0][1] <= now - window:
                done.popleft()
            running = ((started, None, gpus) for of, started, gpus in self.running.values() if of == key)
            use[key] = budget_use(chain(done or (), running), now, window)
        return use
