"""The pure scheduling core: `decide(snapshot, config, now) -> Plan`.

No clock, no I/O, no randomness: the same snapshot, config and time give the same plan.
The stages are plain modules: `order` (queue order), `place` (where), `preempt` (who could be
a victim, and what protects it), `victims` (whom: the victim search), `bounds` (what the search
could get from each node, to skip those that cannot help), `share` (GPUs per team), `drain`
(GPUs held while victims drain), `budget` (priority budgets), `explain` (why nobody was given
notice), `messages` (the words);
`cycle` holds the working state of one decision and wires the stages together, `memo` what it
remembers. `reference` is the exhaustive victim search the greedy one is measured against.
"""

from __future__ import annotations

from gpupool.model import Config, Plan, Snapshot
from gpupool.policy.cycle import Decision
from gpupool.policy.place import can_ever_fit

__all__ = ["can_ever_fit", "decide"]


def decide(snapshot: Snapshot, config: Config, now: float) -> Plan:
    """Decide which pending jobs start where and which running jobs get notice.

    1. Build a private working state (free GPUs, GPUs per team) from the snapshot.
    2. Jobs whose victims are draining hold the GPUs being freed for them; jobs whose victims
       have left (nominated) come first in their class.
    3. Take the queue in order; place each job on free GPUs, else preempt for it when the
       policy allows and a sufficient set of victims exists, else say why it waits.
    """
    decision = Decision(snapshot, config, now)
    decision.hold_for_drains()
    decision.place_queue()
    return decision.plan()
