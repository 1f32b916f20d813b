"""The live service's sessions: what it has seen of each running one (activity, terminals
attached, warnings), kept in memory beside the control loop. The API tells it of terminal
input and of terminals that attach and leave; the loop tells it of starts and ends, asks the
rule (`policy.idle.review`) what to do each tick, and records each session's idle time.

After a restart nothing of this is known: an adopted session counts as active, and detached,
from the moment it was adopted (it is never reclaimed for what happened while no scheduler
watched).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from gpupool.executors import Key, Terminal
from gpupool.executors.terminal import ENDED, INPUT, OUTPUT, RESIZE, SCREEN
from gpupool.model import Config, SessionKind
from gpupool.policy.idle import SessionSeen, idle_stretch


@dataclass
class Tracked:
    seen: SessionSeen
    attached: int = 0
    idle_seconds: float = 0.0
    """Idle time of stretches that ended (`idle_stretch`), not yet recorded in the store."""
    reclaimed: bool = False
    """Ended or requeued by the rule already: nothing more to decide for it."""


class Sessions:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.lock = threading.Lock()
        self.tracked: dict[Key, Tracked] = {}

    def started(self, key: Key, kind: SessionKind, priority: str, now: float) -> None:
        """A session's attempt runs (or was adopted): active now; a shell as yet unattached."""
        detached = now if kind is SessionKind.SHELL else None
        with self.lock:
            self.tracked[key] = Tracked(SessionSeen(*key, kind, priority, now, None, detached))

    def ended(self, key: Key, now: float) -> float | None:
        """The attempt ended: its idle seconds not yet recorded (None for no session)."""
        with self.lock:
            found = self.tracked.pop(key, None)
        if found is None:
            return None
        return found.idle_seconds + idle_stretch(found.seen.last_activity, now, self.config)

    def active(self, job: int, now: float) -> None:
        """The session of `job` was used (input typed, a kernel ran, its GPUs worked)."""
        with self.lock:
            for key, found in self.tracked.items():
                if key[0] == job:
                    found.idle_seconds += idle_stretch(found.seen.last_activity, now, self.config)
                    found.seen = replace(found.seen, last_activity=max(now, found.seen.last_activity), warned_at=None)

    def attach(self, job: int, now: float, change: int) -> None:
        """A terminal attached to the session of `job` (`change` 1) or left it (-1)."""
        with self.lock:
            for key, found in self.tracked.items():
                if key[0] == job:
                    found.attached = max(0, found.attached + change)
                    left = now if found.attached == 0 and found.seen.kind is SessionKind.SHELL else None
                    self.tracked[key].seen = replace(found.seen, detached_since=left)

    def warned(self, key: Key, now: float) -> None:
        with self.lock:
            found = self.tracked.get(key)
            if found is not None:
                found.seen = replace(found.seen, warned_at=now)

    def reclaimed(self, key: Key) -> None:
        with self.lock:
            found = self.tracked.get(key)
            if found is not None:
                found.reclaimed = True

    def seen(self) -> list[SessionSeen]:
        """The sessions the rule still has to look at."""
        with self.lock:
            return [found.seen for found in self.tracked.values() if not found.reclaimed]

    def take_idle(self) -> dict[Key, float]:
        """Idle seconds of stretches that ended since the last call, to record."""
        with self.lock:
            taken = {key: found.idle_seconds for key, found in self.tracked.items() if found.idle_seconds}
            for key in taken:
                self.tracked[key].idle_seconds = 0.0
        return taken


class SessionTerminal:
    """A connection to a session's terminal, in the API's words (`interface.Terminal`), over
    the executor's link and its frames (`executors/terminal.py`)."""

    def __init__(self, link: Terminal) -> None:
        self.link = link

    def screen(self) -> None:
        self.link.send(SCREEN)

    def keys(self, data: bytes) -> None:
        self.link.send(INPUT, data)

    def resize(self, rows: int, cols: int) -> None:
        self.link.send(RESIZE, f"{rows} {cols}".encode())

    def output(self, timeout: float) -> tuple[bytes, int | None] | None:
        frames = self.link.receive(timeout)
        if frames is None:
            return None
        shown = b"".join(payload for kind, payload in frames if kind == OUTPUT)
        ended = next((int(payload or b"0") for kind, payload in frames if kind == ENDED), None)
        return shown, ended

    def close(self) -> None:
        self.link.close()
