"""What the control loop tells those who watch it (the telemetry): each decision with the
state it was made on and how long it took, and each tick. Observers must be quick: they
run on the loop's thread, between a decision and the next."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpupool.model import HELD_BACK, Plan
from gpupool.policy import PoolState


class Observer(Protocol):
    def on_decision(self, now: float, state: PoolState, plan: Plan, seconds: float) -> None:
        """`decide` returned `plan` on `state` at `now`, after `seconds` of wall time; it is
        recorded and carried out next."""

    def on_tick(self, now: float, changed: bool) -> None:
        """The loop ticked at `now` (it was allowed to decide); `changed`: the tick changed the
        store (an attempt ended or started, a notice, a reason to wait)."""


@dataclass
class Lineup:
    """Each pending job's place in line at the last decision (1: next), from the order the core
    went through the queue: what the queue page shows. Jobs held by the driver (dependencies,
    array limits, launch back-offs) are in no line."""

    places: dict[int, int] = field(default_factory=dict)
    decided: bool = False
    """Whether the tick under way decided: a tick that did not (nothing was pending in line)
    leaves no place."""

    def on_decision(self, now: float, state: PoolState, plan: Plan, seconds: float) -> None:
        waiting = [int(w.job) for w in plan.waits if w.reason not in HELD_BACK]
        self.places = {job: place for place, job in enumerate(dict.fromkeys(waiting), start=1)}
        self.decided = True

    def on_tick(self, now: float, changed: bool) -> None:
        if not self.decided:
            self.places = {}
        self.decided = False


@dataclass
class Observers:
    """Several observers as one, told in order."""

    each: Sequence[Observer]

    def on_decision(self, now: float, state: PoolState, plan: Plan, seconds: float) -> None:
        for observer in self.each:
            observer.on_decision(now, state, plan, seconds)

    def on_tick(self, now: float, changed: bool) -> None:
        for observer in self.each:
            observer.on_tick(now, changed)
