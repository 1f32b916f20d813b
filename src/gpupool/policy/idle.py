"""Sessions that hold GPUs for nobody: the rule that warns an idle session, reclaims it after
its notice, and ends a shell whose terminal was left (pure: the live loop gives it what it saw
of each session and the time, and carries out what it answers).

- **Detached**: a shell with no terminal attached for `SessionPolicy.detach_grace` ends (its
  person left without `exit`; `gpupool attach` within the grace takes it back).
- **Idle**: a shell or a notebook (not `gpupool run`: a command has no input to be idle of)
  whose class has `idle_after`, with no activity for that long (no terminal
  input, no notebook kernel activity, no GPU utilization, as its driver sees them), is warned,
  then, `idle_notice` later and still idle, reclaimed as its class says (`on_idle`): ended, or
  requeued (a preemption: notice, then back in line).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpupool.model import Config, SessionKind
from gpupool.units import human_seconds


@dataclass(frozen=True, slots=True)
class SessionSeen:
    """What the driver knows of one running session."""

    job: int
    attempt: int
    kind: SessionKind
    priority: str
    last_activity: float
    warned_at: float | None = None
    """When it was warned of its reclaim, if it has been since its last activity."""
    detached_since: float | None = None
    """A shell's: since when no terminal has been attached (None while one is)."""


@dataclass(frozen=True, slots=True)
class SessionAction:
    job: int
    attempt: int
    action: Literal["warn", "end", "requeue"]
    message: str


def review(sessions: list[SessionSeen], config: Config, now: float) -> list[SessionAction]:
    """What to do now with each session, in the order given: at most one action each."""
    policy = config.sessions
    actions = []
    for seen in sessions:
        if seen.kind is SessionKind.RUN:
            continue  # a command with no input: only its time limit bounds it
        if seen.detached_since is not None and now - seen.detached_since >= policy.detach_grace:
            left = human_seconds(now - seen.detached_since)
            why = f"no terminal attached for {left} (sessions.detach_grace: {human_seconds(policy.detach_grace)})"
            actions.append(SessionAction(seen.job, seen.attempt, "end", why))
            continue
        try:
            cls = config.priority_class(seen.priority)
        except ValueError:  # a class the configuration no longer has: no idle rule for it
            continue
        if cls.idle_after is None:
            continue
        idle = now - seen.last_activity
        if seen.warned_at is None:
            if idle >= cls.idle_after:
                notice = human_seconds(policy.idle_notice)
                what = "ends" if cls.on_idle == "end" else "is requeued"
                message = (
                    f"this session has been idle for {human_seconds(idle)}: it {what} and its GPUs go back "
                    f"to the pool in {notice}, unless it is used before then"
                )
                actions.append(SessionAction(seen.job, seen.attempt, "warn", message))
        elif now - seen.warned_at >= policy.idle_notice:
            why = f"idle for {human_seconds(idle)} (class {cls.name}: idle_after {human_seconds(cls.idle_after)})"
            actions.append(SessionAction(seen.job, seen.attempt, cls.on_idle, why))
    return actions


def idle_stretch(last_activity: float, until: float, config: Config) -> float:
    """The seconds of a stretch with no activity that count as idle GPU-time: the whole stretch
    once it is `idle_counts_after` long or more, else none."""
    stretch = until - last_activity
    return stretch if stretch >= config.sessions.idle_counts_after else 0.0
