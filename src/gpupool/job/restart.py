"""Where an attempt's restart goes: its phases, from the process's start to the first step.

    from gpupool.job import mark
    import torch, transformers ...
    mark("imports")                 # optional: each mark ends the phase it names
    model = build_model()
    mark("model build")
    job = Job(model=model, ...)     # "restore": the checkpoint is found and loaded
    loader = iter(DataLoader(...))  # "data position": from Job() to the first step
    for step in job.steps(total): ...

The time from the process's start to the first mark (or to `Job()`, without marks) is the first
phase; without marks it is "set-up" (imports and model build together). The phases go to
gpupool with the first step's heartbeat, with the process's start (gpupool knows the
allocation, so it adds "launch": allocation to process start); together they are the attempt's
start-up, which the accounting charges as restart cost. The first step is timed too, against
the steps after it ("first step": compilation, caches, the allocator warming), and reported
apart: it trains, so it is productive time.
"""

from __future__ import annotations

import os
import sys
import time

MAX_PHASES = 12
"""Marks beyond these are merged into the last phase (gpupool takes at most this many)."""

RESERVED = ("launch", "other")
"""Phases gpupool names itself (from its own records)."""
_marks: list[tuple[str, float]] = []


def process_started_at() -> float | None:
    """Unix time this process started (Linux: /proc, to 1/100 s); None where unknown."""
    if sys.platform != "linux":
        return None
    try:
        with open("/proc/self/stat", "rb") as stat:
            # The command name (field 2) may hold spaces and parentheses: fields after its last ')'.
            fields = stat.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime: clock ticks after boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - max(0.0, age)


def mark(phase: str) -> None:
    """End the phase named `phase` now (it began at the previous mark, or at the process's start)."""
    if not phase or len(phase) > 40 or not phase.isprintable():
        raise ValueError(f"phase {phase!r}: give a name of 1 to 40 printable characters")
    if phase in RESERVED:
        raise ValueError(f"phase {phase!r} is gpupool's: give your phase another name")
    _marks.append((phase, time.time()))


def phases(started: float | None, *ends: tuple[str, float]) -> dict[str, float]:
    """Seconds of each phase, from `started` (the process's start; else the first point) on:
    every mark, and `ends` (the phases `Job` times itself), in the order of time, each ends the
    phase it names. A phase named twice adds up; one shorter than a millisecond is left out."""
    points = sorted([*_marks, *ends], key=lambda point: point[1])
    out: dict[str, float] = {}
    previous = started if started is not None else points[0][1]
    for name, at in points:
        seconds = at - previous
        previous = max(previous, at)
        if seconds < 0.001:
            continue
        key = name if name in out or len(out) < MAX_PHASES else next(reversed(out))
        out[key] = out.get(key, 0.0) + seconds
    return out


def startup(entered: float, restored: float, restoring: str = "restore") -> dict[str, object]:
    """The start-up's phases, for the first step's heartbeat: from the process's start (or the
    first mark) to `entered` ("set-up"), to `restored` (`restoring`), to now ("data position")."""
    ends = (("set-up", entered), (restoring, restored), ("data position", time.time()))
    started = process_started_at()
    said: dict[str, object] = {"restart_phases": phases(started, *ends)}
    if started is not None:
        said["process_started_at"] = started
    return said


class FirstSteps:
    """Times the first step, then the steps after it (STEADY of them, or STEADY_SECONDS)."""

    STEADY = 10
    STEADY_SECONDS = 5.0

    def __init__(self, began: float) -> None:
        self.began = began
        self.first: float | None = None
        self._since, self._count, self._done = began, 0, False

    def step_done(self, now: float) -> dict[str, float] | None:
        """At the end of a step (`time.monotonic()`): what to tell gpupool, once it is known."""
        if self._done:
            return None
        if self.first is None:
            self.first, self._since = now - self.began, now
            return None
        self._count += 1
        if self._count < self.STEADY and now - self._since < self.STEADY_SECONDS:
            return None
        self._done = True
        return {"first_step_seconds": self.first, "steady_step_seconds": (now - self._since) / self._count}
