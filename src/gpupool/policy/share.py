"""GPUs per team during one decision: the only place that changes them.

A team's GPUs are those of its running jobs that are not draining, plus the GPUs of the jobs
this decision starts or holds for; a victim's GPUs leave its team when it is given notice.
The queue order, reclaim and fair-share preemption all read them from here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpupool.model import Team


@dataclass(slots=True)
class TeamShares:
    """GPUs per team, with the teams' weights and guarantees."""

    teams: Mapping[str, Team]
    gpus: Counter[str] = field(default_factory=Counter)
    """GPUs per team, as the decision has changed them so far."""
    changes: int = 0
    """How often the decision has changed them: what its memos of team rules are valid for."""
    _weights: dict[str, float] = field(default_factory=dict)
    _defaults: dict[str, Team] = field(default_factory=dict)

    def team(self, name: str) -> Team:
        """The team named `name` (one not configured has the defaults)."""
        found = self.teams.get(name) or self._defaults.get(name)
        if found is None:
            found = self._defaults[name] = Team(name)
        return found

    def guarantee(self, team: str) -> int:
        """Its `guaranteed_gpus`."""
        return self.team(team).guaranteed_gpus

    def share(self, team: str, change: int = 0) -> float:
        """The team's weighted share: its GPUs (plus `change`) over its weight."""
        weight = self._weights.get(team)
        if weight is None:
            weight = self._weights[team] = max(self.team(team).weight, 1e-9)
        return (self.gpus[team] + change) / weight

    def above_guarantee(self, team: str) -> bool:
        """Whether it holds more GPUs than its guarantee."""
        return self.gpus[team] > self.guarantee(team)

    def above(self, share: float, other_than: str) -> bool:
        """Whether a team other than `other_than` is above its guarantee with a weighted share
        above `share`: one fair-share preemption could take from (without it, fair share has
        nobody to take from, and the victims need not even be looked at)."""
        return any(
            team != other_than and gpus > self.guarantee(team) and self.share(team) > share
            for team, gpus in self.gpus.items()
        )

    def add(self, team: str, gpus: int) -> None:
        """`gpus` more for `team` (a job it starts or holds GPUs for)."""
        self.gpus[team] += gpus
        self.changes += 1

    def remove(self, team: str, gpus: int) -> None:
        """`gpus` fewer for `team` (a victim given notice)."""
        self.gpus[team] -= gpus
        self.changes += 1
