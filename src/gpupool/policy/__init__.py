"""The pure scheduling core: `decide(state, config, now) -> Plan`.

No clock, no I/O, no randomness: the same state, config and time give the same plan. Every
driver keeps one `PoolState` between decisions (`state`) and feeds it events; `decide` reads
it and changes nothing. The stages are plain modules: `drain` (GPUs held for jobs whose victims
drain), `queue` (the queue pass), `grow` (elastic jobs grow into GPUs nobody waits for),
`preempt` (the victim search, its rules and the words of why
nobody was given notice); beside them `line` (the jobs in line and the queue order), `free`
and `place` (free GPUs, where a job goes), `share` (GPUs per team), `budget` (priority budgets),
`messages` (the words), `decision` (one decision's working state and what it decided) and
`memo` (what it remembers). `reference` is the exhaustive victim search the greedy one is
measured against.
"""

from __future__ import annotations

from gpupool.model import Config, Plan
from gpupool.policy.decision import Decision
from gpupool.policy.drain import hold_for_drains
from gpupool.policy.grow import grow_elastic
from gpupool.policy.place import can_ever_fit
from gpupool.policy.preempt.candidates import ALL_SHORTCUTS, Shortcuts
from gpupool.policy.queue import place_queue
from gpupool.policy.state import PoolState

__all__ = ["PoolState", "Shortcuts", "can_ever_fit", "decide"]


def decide(state: PoolState, config: Config, now: float, shortcuts: Shortcuts = ALL_SHORTCUTS) -> Plan:
    """Decide which pending jobs start where and which running jobs get notice.

    1. Take a working copy of what the decision changes: free GPUs, GPUs per team.
    2. Jobs whose victims drain hold the GPUs being freed for them, in queue order; a job whose
       held GPUs are all free starts. Drains for jobs that no longer wait are left to anyone.
    3. Take the line in queue order: start each job on free GPUs, else hold the GPUs orphaned
       drains free, else give notice to the cheapest sufficient victims when the policy allows,
       else say why it waits.
    4. Elastic jobs grow into the free GPUs left, when no job that could use them waits.
    5. Return the starts, notices, growths and waits, and when to decide again.
    """
    decision = Decision(state, config, now, shortcuts)
    orphans = hold_for_drains(decision)
    place_queue(decision, orphans)
    grow_elastic(decision)
    return decision.plan()
