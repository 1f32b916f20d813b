"""The live service's sessions: what it has seen of each running one (activity, terminals
attached, warnings), kept in memory beside the control loop, and what it does with them. The
API tells it of terminal input and of terminals that attach and leave, and opens terminals
through it; the loop tells it of starts and ends, and has it carry out, at each tick, what the
rule (`policy.idle.review`) says: warn (on the session's terminal, and in its events), end or
requeue. It records each session's idle time in the store.

After a restart nothing of this is known: an adopted session counts as active, and detached,
from the moment it was adopted (it is never reclaimed for what happened while no scheduler
watched).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from gpupool.errors import Conflict
from gpupool.executors import Executor, Key, Terminal
from gpupool.executors.terminal import ENDED, INPUT, OUTPUT, RESIZE, SAY, SCREEN, resize_payload
from gpupool.job.notebook import BASE as NOTEBOOK_BASE
from gpupool.job.notebook import NO_PROXY
from gpupool.model import Config, SessionKind
from gpupool.policy.idle import SessionSeen, idle_stretch, review
from gpupool.store import Store
from gpupool.store.holds import LIVE
from gpupool.store.schema import JobRow

log = logging.getLogger("gpupool.service")

NOTEBOOK_LOOK = 2.0
"""Seconds between two looks at each notebook server's kernels (their last activity)."""
TERMINAL_WAIT = 5.0
"""Seconds a terminal is tried for: its launcher serves it once it has started the shell."""


@dataclass
class Tracked:
    seen: SessionSeen
    warning: str | None = None
    """What it was warned of (its reclaim), until it is used again."""
    server: tuple[str, str] | None = None
    """A notebook's server, once it answered: its URL and its token."""
    attached: int = 0
    idle_seconds: float = 0.0
    """Idle time of stretches that ended (`idle_stretch`), not yet recorded in the store."""
    reclaimed: bool = False
    """Ended or requeued by the rule already: nothing more to decide for it."""


class Sessions:
    def __init__(self, store: Store, executor: Executor, config: Config) -> None:
        self.store = store
        self.executor = executor
        self.config = config
        self.lock = threading.Lock()
        self.tracked: dict[Key, Tracked] = {}
        self.watching: threading.Thread | None = None

    def started(self, key: Key, kind: SessionKind, priority: str, now: float) -> None:
        """A session's attempt runs (or was adopted): active now; a shell as yet unattached."""
        detached = now if kind is SessionKind.SHELL else None
        with self.lock:
            self.tracked[key] = Tracked(SessionSeen(*key, kind, priority, now, None, detached))
            if kind is SessionKind.NOTEBOOK and self.watching is None:
                self.watching = threading.Thread(target=self.watch_notebooks, daemon=True, name="notebooks")
                self.watching.start()

    def watch_notebooks(self) -> None:
        """Every `NOTEBOOK_LOOK` seconds, each notebook's kernels: the latest activity of one
        (code it ran, output it sent) is the session's, and a busy kernel is active now. In a
        thread of its own: a server that is slow to answer never holds the control loop."""
        while True:
            time.sleep(NOTEBOOK_LOOK)
            with self.lock:
                notebooks = [key for key, found in self.tracked.items() if found.seen.kind is SessionKind.NOTEBOOK]
            for key in notebooks:
                job_id = key[0]
                try:
                    last = kernels_last_active(self.notebook(self.store.job(job_id)), job_id, time.time())
                except Starting:  # not idle: it has not been up to be used (JupyterLab may take a while)
                    self.active(key, time.time())
                    continue
                except Exception as exc:  # a server that answers nonsense, a busy store: next time
                    log.debug("job %s: its notebook's kernels could not be read (%s)", job_id, exc)
                    continue
                if last is not None:
                    self.active(key, last)

    def idle_at_end(self, keys: Sequence[Key], now: float) -> dict[Key, float]:
        """The idle seconds not yet recorded of these attempts, ending now (those that were
        sessions): recorded with their ends, then `forget` them."""
        with self.lock:
            found = {key: self.tracked[key] for key in keys if key in self.tracked}
            return {
                key: tracked.idle_seconds + idle_stretch(tracked.seen.last_activity, now, self.config)
                for key, tracked in found.items()
            }

    def forget(self, keys: Sequence[Key]) -> None:
        """These attempts ended (or never started): nothing of them to track any more."""
        with self.lock:
            for key in keys:
                self.tracked.pop(key, None)

    def active(self, key: Key, now: float) -> None:
        """The session's attempt `key` was used (input typed, a kernel ran, its GPUs worked)."""
        with self.lock:
            found = self.tracked.get(key)
            if found is not None and now > found.seen.last_activity:  # news: not a time seen already
                found.idle_seconds += idle_stretch(found.seen.last_activity, now, self.config)
                found.seen = replace(found.seen, last_activity=now, warned_at=None)
                found.warning = None

    def attach(self, key: Key, now: float, change: int) -> None:
        """A terminal attached to the session's attempt `key` (`change` 1) or left it (-1). Per
        attempt: a terminal of an attempt that ended leaves nothing of a later one's count."""
        with self.lock:
            found = self.tracked.get(key)
            if found is not None:
                found.attached = max(0, found.attached + change)
                left = now if found.attached == 0 and found.seen.kind is SessionKind.SHELL else None
                found.seen = replace(found.seen, detached_since=left)

    def warned(self, key: Key, now: float, message: str) -> None:
        with self.lock:
            found = self.tracked.get(key)
            if found is not None:
                found.seen = replace(found.seen, warned_at=now)
                found.warning = message

    def warning(self, job: int) -> str | None:
        """What the session of `job` was warned of, while it stays idle (a notebook shows it)."""
        with self.lock:
            return next((found.warning for key, found in self.tracked.items() if key[0] == job), None)

    def reclaimed(self, key: Key) -> None:
        with self.lock:
            found = self.tracked.get(key)
            if found is not None:
                found.reclaimed = True

    def seen(self) -> list[SessionSeen]:
        """The sessions the rule still has to look at."""
        with self.lock:
            return [found.seen for found in self.tracked.values() if not found.reclaimed]

    def review(self, now: float) -> bool:
        """Record the idle stretches that ended, and warn, end or requeue the sessions the
        rule says (`policy.idle`); whether any was ended or requeued."""
        idle = self.take_idle()
        if idle:
            self.store.add_idle_seconds(idle)
        changed = False
        for action in review(self.seen(), self.config, now):
            key = (action.job, action.attempt)
            log.info("job %s session: %s", action.job, action.message)
            if action.action == "warn":
                self.warned(key, now, action.message)
                self.store.note("session_idle", [(action.job, action.attempt, action.message)], now)
                self.say(key, action.message)
                continue
            with contextlib.suppress(Conflict):  # it ended, or is ending, meanwhile
                if action.action == "end":
                    self.say(key, f"this session ends: {action.message}")
                    self.store.cancel(action.job, now, why=action.message)
                else:
                    self.say(key, f"this session is requeued: {action.message}")
                    self.store.requeue_job(action.job, now, why=f"({action.message})")
            self.reclaimed(key)  # once recorded: a store that failed is tried again next tick
            changed = True
        return changed

    def say(self, key: Key, message: str) -> None:
        """A line of gpupool's on a session's terminal, where it has one (its person sees it
        there, now or when they attach)."""
        try:
            link = self.executor.terminal(*key)
        except OSError:
            return
        try:
            link.send(SAY, f"\r\n[gpupool] {message}\r\n".encode())
        except OSError:
            pass
        finally:
            link.close()

    def open_terminal(self, job: JobRow) -> SessionTerminal:
        """A connection to the running shell session's terminal; `Conflict` when it has none.
        Its launcher serves it once the shell is started: tried for `TERMINAL_WAIT` seconds."""
        if job.session != SessionKind.SHELL.value:
            what = f"a {job.session} session" if job.session else "a batch job"
            raise Conflict(f"job {job.label} is {what}, with no terminal: `gpupool logs -f {job.label}` follows it")
        if job.state not in LIVE:
            raise Conflict(f"job {job.label} is {job.state}: its terminal is there only while it runs")
        deadline = time.monotonic() + TERMINAL_WAIT
        while True:
            try:
                attempt = job.attempts - 1
                return SessionTerminal(self.executor.terminal(job.id, attempt), (job.id, attempt))
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise Conflict(f"job {job.label}'s terminal cannot be reached now ({exc})") from None
            time.sleep(0.05)

    def notebook(self, job: JobRow) -> tuple[str, str]:
        """Where a running notebook session's server answers (its node's address and the port
        it reported) and its token; `Conflict` while there is none."""
        if job.session != SessionKind.NOTEBOOK.value:
            what = f"a {job.session} session" if job.session else "a batch job"
            raise Conflict(f"job {job.label} is {what}, not a notebook")
        if job.state not in LIVE:
            raise Conflict(f"job {job.label} is {job.state}: its notebook is there only while it runs")
        key = (job.id, job.attempts - 1)
        with self.lock:
            found = self.tracked.get(key)
            if found is not None and found.server is not None:
                return found.server
        attempt = next((a for a in self.store.attempts(job.id) if a.attempt == key[1]), None)
        nodes = [p.node for p in self.store.held() if p.job_id == job.id]
        if attempt is None or attempt.server is None or not nodes:
            raise Starting(f"job {job.label}'s notebook server does not answer yet: it is starting")
        try:
            url = f"http://{self.executor.address(nodes[0])}:{int(attempt.server['port'])}"
        except OSError as exc:
            raise Conflict(f"job {job.label}'s notebook cannot be reached ({exc})") from None
        server = (url, str(attempt.server["token"]))
        with self.lock:
            if key in self.tracked:
                self.tracked[key].server = server
        return server

    def take_idle(self) -> dict[Key, float]:
        """Idle seconds of stretches that ended since the last call, to record."""
        with self.lock:
            taken = {key: found.idle_seconds for key, found in self.tracked.items() if found.idle_seconds}
            for key in taken:
                self.tracked[key].idle_seconds = 0.0
        return taken


class Starting(Conflict):
    """A notebook session's server has not reported that it answers yet."""


def kernels_last_active(server: tuple[str, str], job_id: int, now: float) -> float | None:
    """When a kernel of the notebook server was last active, as Jupyter's own `/api/kernels`
    says (`now` for one that is busy); None when it has no kernel."""
    url, token = server
    request = urllib.request.Request(
        f"{url}{NOTEBOOK_BASE.format(job=job_id)}api/kernels", headers={"Authorization": f"token {token}"}
    )
    with NO_PROXY.open(request, timeout=5) as answer:
        kernels = json.loads(answer.read())
    if not isinstance(kernels, list):
        raise ValueError("/api/kernels is not a list")
    times = [
        now if kernel.get("execution_state") == "busy" else parse_time(str(kernel["last_activity"]))
        for kernel in kernels
        if isinstance(kernel, dict) and (kernel.get("execution_state") == "busy" or kernel.get("last_activity"))
    ]
    return max(times, default=None)


def parse_time(text: str) -> float:
    """Jupyter's times: ISO 8601 in UTC, `Z` at the end."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class SessionTerminal:
    """A connection to a session's terminal, in the API's words (`interface.Terminal`), over
    the executor's link and its frames (`executors/terminal.py`)."""

    def __init__(self, link: Terminal, key: Key) -> None:
        self.link = link
        self.key = key
        """The attempt whose terminal it is."""

    def screen(self) -> None:
        self.link.send(SCREEN)

    def keys(self, data: bytes) -> None:
        self.link.send(INPUT, data)

    def resize(self, rows: int, cols: int) -> None:
        self.link.send(RESIZE, resize_payload(rows, cols))

    def output(self, timeout: float) -> tuple[bytes, int | None] | None:
        frames = self.link.receive(timeout)
        if frames is None:
            return None
        shown = b"".join(payload for kind, payload in frames if kind == OUTPUT)
        ended = next((int(payload or b"0") for kind, payload in frames if kind == ENDED), None)
        return shown, ended

    def close(self) -> None:
        self.link.close()
