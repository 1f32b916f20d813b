"""A gang on Ray after the scheduler restarted: found again through its nodes' launchers, which
outlived the scheduler, or how it ended, from its members' records on shared storage."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray.util.placement_group import get_placement_group, remove_placement_group

from gpupool.executors import Exit, Recorded, Started
from gpupool.executors.proc import owner, recorded_exit_time
from gpupool.executors.ray_gang import Gang, attempt_exit, member_end, member_folder, member_owner

if TYPE_CHECKING:
    from gpupool.executors.ray_executor import RayExecutor

GONE = "gone"
"""A rank whose node's launcher is gone (with its members), or does not answer."""
UNKNOWN = "unknown"
"""A rank its node's launcher never started, or has forgotten."""


def adopt(executor: RayExecutor, recorded: Recorded) -> Started | Exit:
    """Watched again if every member is still known to its node's launcher, having started;
    else how it ended (`lost`), and no member of it runs on. An attempt this executor tracks
    already (adopted again after a halt) is left as it is."""
    key = (recorded.job_id, recorded.attempt)
    with executor.lock:
        known = executor.gangs.get(key)
        if known is not None:
            return Started(executor.handle(known), known.phase in ("running", "ending"), "adopted")
        queued = next((e for e in executor.ended if (e.job_id, e.attempt) == key), None)
        if queued is not None:
            executor.ended.remove(queued)
            return queued
    name = owner(executor.store_id, *key)
    if recorded.handle is None:
        # The scheduler died between its start calls and recording the handle: wherever they
        # went, nothing of it may run; what its members' records say is how it ended.
        forget_everywhere(executor, name)
        return unrecorded(recorded, name)
    handle = recorded.handle
    if "node_ids" not in handle:
        return stop_older(executor, recorded, name)
    nodes, ids = list(handle.get("nodes", [])), list(handle.get("node_ids", []))
    if len(nodes) != len(ids):
        nodes = ids = []
    ranks = len(ids)
    launchers = [executor.pool.existing_launcher(node_id) for node_id in ids]
    incarnations = list(handle.get("incarnations", [])) or [None] * ranks
    found = members(launchers, [member_owner(name, r) for r in range(ranks)], incarnations)
    gang = Gang(key, name, recorded.attempt_dir, nodes, ids, launchers, "running")
    if ranks and all(f not in (GONE, UNKNOWN) and not forgotten(f) for f in found):
        with executor.lock:
            executor.register(gang)
            for rank, end in enumerate(found):
                if end is not None:
                    executor._member_ended(gang, rank, end)
            if recorded.notice_deadline is not None and not (recorded.attempt_dir / "notice").exists():
                executor.notify(*key, recorded.notice_deadline)  # recorded, but the scheduler died before giving it
            gang.notice = recorded.notice_deadline
        return Started(executor.handle(gang), True, "adopted")
    ended = lost(recorded, name, found)
    executor.forget(gang, ran=ended.started)  # not all there: what is left of it is killed, and never starts
    return ended


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


def forget_everywhere(executor: RayExecutor, name: str) -> None:
    """Every launcher of the pool forgets the attempt (kills any member of it, refuses any start
    of it still on its way), and has done so when this returns."""
    calls = [launcher.forget.remote([name], False) for launcher in executor.pool.launchers()]
    for call in calls:
        with contextlib.suppress(Exception):  # a launcher that is gone has no member left
            ray.get(call, timeout=30)


def stop_older(executor: RayExecutor, recorded: Recorded, name: str) -> Exit:
    """A gang an older gpupool started (a placement group and a launcher actor per member, both
    named after the attempt): stopped, so that its GPUs come back to the pool, and requeued as
    a node loss (not the job's failure)."""
    handle = recorded.handle or {}
    for rank in range(int(handle.get("ranks", 0))):
        with contextlib.suppress(Exception):
            ray.kill(ray.get_actor(member_owner(name, rank), namespace=executor.namespace), no_restart=True)
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
