"""A gang on Ray as the Ray executor tracks it, and how its members' ends make the attempt's:
plain data and a pure function, no Ray."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpupool.executors import Exit, Key
from gpupool.executors.proc import outcome, recorded_usage
from gpupool.settle import Usage


def member_folder(attempt_dir: Path, rank: int) -> Path:
    """Rank 0 keeps the attempt's folder (its logs are where a one-node attempt's are); every
    other rank has `rank-N` in it."""
    return attempt_dir if rank == 0 else attempt_dir / f"rank-{rank}"


def member_owner(name: str, rank: int) -> str:
    """A member's name: what its node's launcher knows it by, and the owner its launcher's
    records name."""
    return f"{name}:{rank}"


def attempt_of(owner: str) -> str:
    """The attempt's name in a member's owner (`member_owner`)."""
    return owner.rsplit(":", 1)[0]


def member_end(folder: Path, owner: str, code: int | None, cleared: Usage | None = None) -> dict[str, Any]:
    """How a member ended, as its launcher tells it (`proc.outcome` of its records and what its
    process returned), and what its cgroup counted (`cleared`: where the node's launcher actor
    emptied it, its own launcher having been killed; else as its launcher recorded it)."""
    status, why, not_started = outcome(folder, owner, code)
    usage = cleared or recorded_usage(folder, owner)
    used = asdict(usage) if usage is not None else None
    return {"exit_code": status, "why": why, "not_started": not_started, "usage": used}


@dataclass
class Gang:
    key: Key
    name: str
    """The attempt's owner name (`proc.owner`); its members are `name:rank`."""
    attempt_dir: Path
    nodes: list[str]
    node_ids: list[str]
    """Each rank's node's Ray id: its launcher is named after it."""
    launchers: list[Any]
    phase: str = "starting"
    """starting → running → ending."""
    since: float = field(default_factory=time.monotonic)
    started: set[int] = field(default_factory=set)
    ended: dict[int, dict[str, Any]] = field(default_factory=dict)
    lost: str | None = None
    failure: dict[str, Any] | None = None
    notice: float | None = None
    incarnations: list[str] = field(default_factory=list)
    """Each rank's launcher's incarnation when it was asked to start it: a launcher found
    later with another one is not the one its member ran under (that one died, with it)."""

    def owner(self, rank: int) -> str:
        return member_owner(self.name, rank)


def attempt_exit(
    key: Key,
    ended: dict[int, dict[str, Any]],
    failure: dict[str, Any] | None,
    lost: str | None,
    ended_at: float | None,
) -> Exit:
    """The attempt's end from its members' (`ended`: rank → what its launcher said): a lost
    node first (the others' failures follow from it), then a member never started (the
    scheduler's reason: tried again), then the member whose failure stopped the others (they
    were killed after it), then the first that failed, else success."""
    if lost is not None:
        return Exit(*key, None, ended_at=ended_at, node_lost=lost)
    never = next((e["not_started"] for e in ended.values() if e.get("not_started")), None)
    if never is not None:
        return Exit(*key, None, never, started=False, ended_at=ended_at)
    usage = None
    for end in ended.values():
        used = Usage.from_json(end.get("usage"))
        usage = used.joined(usage) if used is not None else usage
    failed = failure or next((e for _, e in sorted(ended.items()) if e.get("exit_code") != 0), None)
    if failed is not None:
        return Exit(*key, failed.get("exit_code"), failed.get("why"), ended_at=ended_at, usage=usage)
    return Exit(*key, 0, ended_at=ended_at, usage=usage)
