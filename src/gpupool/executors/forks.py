"""The client of the launcher's fork server (`launcher.py --serve`): members started on a node
by forking a launcher already started, rather than starting a Python process for each.

One fork server per process that uses it (a node's launcher actor on Ray); it ends with that
process, and its launchers end their members then. `spawn` returns the launcher's pid, which
leads the member's session, and calls `on_exit(code)` when that launcher ends (`code` as
`subprocess` has it: negative for a signal), from a thread of this client that does nothing
else (it may read shared storage for long: the fork server's answers never wait on it).

A fork server that does not answer a request within `ANSWER_WITHIN` seconds is killed; one that
is gone (killed, or failing) ends its launchers' members, and `on_lost` is called: their ends
cannot be told any more.
"""

from __future__ import annotations

import itertools
import json
import logging
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from queue import Empty, Queue

from gpupool.executors.proc import recorded_launcher
from gpupool.executors.spawn import LAUNCHER, LAUNCHER_ENV, Spawn, kill, prepare, signal_group

log = logging.getLogger("gpupool.forks")

ANSWER_WITHIN = 30.0


def _ignore(_code: int) -> None:
    return None


def abandon(member: Spawn) -> None:
    """Kill a member whose start was given up on: its launcher, if it got as far as recording
    itself (a detached one outlives the fork server), and its cgroup."""
    found = recorded_launcher(member.folder, member.owner)
    kill(found[0] if found is not None else 0, member.contain)


class ForkServer:
    def __init__(self, on_lost: Callable[[], None]) -> None:
        self.on_lost = on_lost
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-S", str(LAUNCHER), "--serve"],
            env=LAUNCHER_ENV,
            cwd="/",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.ids = itertools.count(1)
        self.asking = threading.Lock()
        self.tracked = threading.Lock()
        self.waiting: dict[int, Queue[dict[str, object]]] = {}
        """Request id → where its answer goes, while its `spawn` waits for it."""
        self.known: dict[int, Callable[[int], None]] = {}
        self.early: dict[int, int] = {}
        """Ends told before their launcher's pid was (a launcher that ended at once)."""
        self.closing = False
        self.exits: Queue[tuple[Callable[[int], None], int]] = Queue()
        threading.Thread(target=self._read, daemon=True, name="fork-server").start()
        threading.Thread(target=self._tell_exits, daemon=True, name="fork-server-exits").start()

    def spawn(self, member: Spawn, on_exit: Callable[[int], None], detach: bool = False) -> int:
        """Start the member's launcher; its pid. A detached launcher (`launcher.detached`)
        outlives this fork server, and its end is not told (`on_exit` is not called)."""
        request_id = next(self.ids)
        answers: Queue[dict[str, object]] = Queue(maxsize=1)
        request = {
            "id": request_id,
            "argv": prepare(member),
            "folder": str(member.folder),
            "detach": detach,
            **member.payload(),
        }
        with self.tracked:
            self.waiting[request_id] = answers
        try:
            with self.asking:
                stdin = self.process.stdin
                assert stdin is not None
                stdin.write((json.dumps(request) + "\n").encode())
                stdin.flush()
            answer = answers.get(timeout=ANSWER_WITHIN)
        except (OSError, ValueError, Empty) as exc:
            with self.tracked:
                self.waiting.pop(request_id, None)
            if isinstance(exc, Empty):
                log.error("the fork server of launchers did not answer within %.0f s: it is killed", ANSWER_WITHIN)
                self.process.kill()
                abandon(member)
            raise OSError(f"the fork server of launchers does not answer ({exc or 'no answer'})") from None
        if "error" in answer:
            raise OSError(f"the fork server could not start a launcher: {answer['error']}")
        pid = int(str(answer["pid"]))
        if detach:
            return pid
        with self.tracked:
            self.known[pid] = on_exit
            code = self.early.pop(pid, None)
        if code is not None:
            self._ended(pid, code)
        return pid

    def _read(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        try:
            for line in stdout:
                self._take(json.loads(line))
        except Exception:  # what it said could not be read: it is not trusted further
            log.exception("the fork server of launchers said something unreadable")
            self.process.kill()
        if not self.closing:
            log.error("the fork server of launchers is gone (exit status %s)", self.process.wait())
            self.on_lost()

    def _take(self, message: dict[str, object]) -> None:
        if "exited" not in message:
            with self.tracked:
                answers = self.waiting.pop(int(str(message["id"])), None)
                if answers is None and "pid" in message:  # its `spawn` gave up on it
                    self.known[int(str(message["pid"]))] = _ignore
            if answers is not None:
                answers.put(message)
            elif "pid" in message:
                signal_group(int(str(message["pid"])), signal.SIGKILL)  # its cgroup: `abandon`
            return
        pid, code = int(str(message["exited"])), int(str(message["code"]))
        with self.tracked:
            if pid not in self.known:
                self.early[pid] = code
                return
        self._ended(pid, code)

    def _ended(self, pid: int, code: int) -> None:
        with self.tracked:
            on_exit = self.known.pop(pid)
        self.exits.put((on_exit, code))

    def _tell_exits(self) -> None:
        while True:
            on_exit, code = self.exits.get()
            try:
                on_exit(code)
            except Exception:  # one end that could not be told must not stop the others
                log.exception("telling a launcher's end failed")

    def close(self) -> None:
        """End the fork server (its launchers end their members)."""
        self.closing = True
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=10)
