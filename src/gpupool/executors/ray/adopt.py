"""A gang on Ray after the scheduler restarted: found again through its nodes' launchers, which
outlived the scheduler, or how it ended, from its members' records on shared storage.
`RayExecutor.adopt` (executor.py) puts these together; nothing here knows the executor."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import get_placement_group, remove_placement_group

from gpupool.executors import Exit, Recorded
from gpupool.executors.proc import recorded_exit_time
from gpupool.executors.ray.gang import attempt_exit, member_end, member_folder, member_owner
from gpupool.executors.ray.nodes import RayNodes

GONE = "gone"
"""A rank whose node's launcher is gone (with its members), or does not answer."""
UNKNOWN = "unknown"
"""A rank its node's launcher never started, or has forgotten."""


def lost(recorded: Recorded, name: str, found: list[Any]) -> Exit:
    """How a gang not all there ended: from its members' records when every one has one; else
    lost with a node whose launcher is gone; else as the scheduler before this one left it
    (given back, or ended unrecorded); else given back if no member of it ever ended (it never
    ran whole)."""
    key, ranks = (recorded.job_id, recorded.attempt), len(found)
    exits = [recorded_end(recorded.attempt_dir, name, rank) for rank in range(ranks)]
    if ranks and all(e is not None for e in exits):
        return from_records(recorded, exits)
    gone = found.count(GONE)
    if gone:
        why = f"{gone} of its {ranks} members' launchers were gone when it was adopted"
        return Exit(*key, None, ended_at=recorded.since, node_lost=why)
    ran = [f["forgotten"] for f in found if forgotten(f)]
    if ran and not any(ran):
        return Exit(*key, None, "given back before the scheduler stopped", started=False)
    ends = [e for e in (*exits, *found) if isinstance(e, dict) and not forgotten(e)]
    if not any(ran) and all(e.get("not_started") for e in ends):
        return Exit(*key, None, "the scheduler stopped before all its members started", started=False)
    return Exit(*key, None, "its members ended while no scheduler watched", ended_at=recorded.since)


def forgotten(found: Any) -> bool:
    return isinstance(found, dict) and "forgotten" in found


def forget_everywhere(pool: RayNodes, name: str) -> None:
    """Every launcher of the pool forgets the attempt (kills any member of it, refuses any start
    of it still on its way), and has done so when this returns."""
    calls = [launcher.forget.remote([name], False) for launcher in pool.launchers()]
    for call in calls:
        with contextlib.suppress(Exception):  # a launcher that is gone has no member left
            ray.get(call, timeout=30)


def stop_older(namespace: str, recorded: Recorded, name: str) -> Exit:
    """A gang an older gpupool started (a placement group and a launcher actor per member, both
    named after the attempt): stopped, so that its GPUs come back to the pool, and requeued as
    a node loss (not the job's failure)."""
    handle = recorded.handle or {}
    for rank in range(int(handle.get("ranks", 0))):
        with contextlib.suppress(Exception):
            ray.kill(ray.get_actor(member_owner(name, rank), namespace=namespace), no_restart=True)
    with contextlib.suppress(Exception):
        remove_placement_group(get_placement_group(name))
    why = "started by an older gpupool, whose gangs this one cannot adopt: stopped"
    return Exit(recorded.job_id, recorded.attempt, None, ended_at=recorded.since, node_lost=why)


def members(launchers: list[Any], owners: list[str], incarnations: list[str | None]) -> list[Any]:
    """Each member as its node's launcher knows it: how it ended, None while it runs, or
    `UNKNOWN`; `GONE` where the launcher is, or is another than the one it was started by."""
    asked: dict[int, tuple[Any, list[tuple[str, str | None]]]] = {}
    for launcher, member, incarnation in zip(launchers, owners, incarnations, strict=True):
        if launcher is not None:
            asked.setdefault(id(launcher), (launcher, []))[1].append((member, incarnation))
    answers: dict[str, Any] = {}
    for launcher, mine in asked.values():
        try:
            told: tuple[str, dict[str, Any]] | None = ray.get(launcher.status.remote([m for m, _ in mine]), timeout=30)
        except Exception:  # a dead launcher or node: Ray's errors have no common base
            told = None
        for member, incarnation in mine:
            if told is None or (incarnation is not None and told[0] != incarnation):
                answers[member] = GONE
            else:
                answers[member] = told[1].get(member, UNKNOWN)
    return [answers.get(member, GONE) for member in owners]


def unrecorded(recorded: Recorded, name: str) -> Exit:
    """An attempt whose handle was never recorded, from what its members' records on shared
    storage say (rank 0's folder is the attempt's, `rank-N` the others'): ended, if every
    member that started wrote its end; else given back (what ran of it was stopped)."""
    key = (recorded.job_id, recorded.attempt)
    folder = recorded.attempt_dir
    ranks = 1 + sum(1 for p in folder.glob("rank-*") if p.is_dir()) if folder.is_dir() else 0
    started = [r for r in range(ranks) if (member_folder(folder, r) / "launcher.json").exists()]
    if not started:
        return Exit(*key, None, "the scheduler stopped before its members started", started=False)
    exits = [recorded_end(folder, name, r) for r in range(ranks)]
    if all(e is not None for e in exits):
        return from_records(recorded, exits)
    # Stopped here for the scheduler's reasons, not the job's: started again, not charged.
    return Exit(*key, None, "stopped: the scheduler died before it recorded where it ran", started=False)


def recorded_end(attempt_dir: Path, name: str, rank: int) -> dict[str, Any] | None:
    """How rank's member ended, from its records on shared storage; None without an end."""
    end = member_end(member_folder(attempt_dir, rank), member_owner(name, rank), None)
    return end if end["exit_code"] is not None or end["not_started"] is not None else None


def from_records(recorded: Recorded, exits: list[dict[str, Any] | None]) -> Exit:
    """The attempt's end from every member's recorded end, at the last of them."""
    folders = [member_folder(recorded.attempt_dir, rank) for rank in range(len(exits))]
    ended = max(recorded_exit_time(folder) or 0.0 for folder in folders)
    ends = {rank: end for rank, end in enumerate(exits) if end is not None}
    return attempt_exit((recorded.job_id, recorded.attempt), ends, None, None, ended or None)
