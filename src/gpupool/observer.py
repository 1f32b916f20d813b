"""What the control loop tells those who watch it (the telemetry): each decision with the
snapshot it was made from and how long it took, and each tick. Observers must be quick: they
run on the loop's thread, between a decision and the next."""

from __future__ import annotations

from typing import Protocol

from gpupool.model import Plan, Snapshot


class Observer(Protocol):
    def on_decision(self, now: float, snapshot: Snapshot, plan: Plan, seconds: float) -> None:
        """`decide` returned `plan` for `snapshot` at `now`, after `seconds` of wall time; it is
        recorded and carried out next."""

    def on_tick(self, now: float, changed: bool) -> None:
        """The loop ticked at `now` (it was allowed to decide); `changed`: the tick changed the
        store (an attempt ended or started, a notice, a reason to wait)."""
