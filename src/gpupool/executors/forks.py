"""The client of the launcher's fork server (`launcher.py --serve`): members started on a node
by forking a launcher already started, rather than starting a Python process for each.

One fork server per process that uses it (a node's launcher actor on Ray); it ends with that
process, and its launchers end their members then. `spawn` returns the launcher's pid, which
leads the member's session, and calls `on_exit(code)` when that launcher ends (`code` as
`subprocess` has it: negative for a signal), from a thread of this client, or from `spawn`
itself for a launcher that ended before its pid came back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from queue import Empty, Queue

from gpupool.executors.spawn import LAUNCHER, LAUNCHER_ENV, Spawn, prepare

ANSWER_WITHIN = 30.0


class ForkServer:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-S", str(LAUNCHER), "--serve"],
            env=LAUNCHER_ENV,
            cwd="/",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.asking = threading.Lock()
        self.answers: Queue[dict[str, object]] = Queue()
        self.tracked = threading.Lock()
        self.known: dict[int, Callable[[int], None]] = {}
        self.early: dict[int, int] = {}
        """Ends told before their launcher's pid was (a launcher that ended at once)."""
        threading.Thread(target=self._read, daemon=True, name="fork-server").start()

    def spawn(self, member: Spawn, on_exit: Callable[[int], None]) -> int:
        """Start the member's launcher; its pid."""
        request = {"argv": prepare(member), "env": dict(member.env), "folder": str(member.folder)}
        with self.asking:
            stdin = self.process.stdin
            assert stdin is not None
            try:
                stdin.write((json.dumps(request) + "\n").encode())
                stdin.flush()
                answer = self.answers.get(timeout=ANSWER_WITHIN)
            except (OSError, Empty) as exc:
                raise OSError(f"the fork server of launchers does not answer ({exc or 'no answer'})") from None
        if "error" in answer:
            raise OSError(f"the fork server could not start a launcher: {answer['error']}")
        pid = int(str(answer["pid"]))
        with self.tracked:
            self.known[pid] = on_exit
            code = self.early.pop(pid, None)
        if code is not None:
            self._ended(pid, code)
        return pid

    def _read(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        for line in stdout:
            message = json.loads(line)
            if "exited" not in message:
                self.answers.put(message)
                continue
            pid, code = int(message["exited"]), int(message["code"])
            with self.tracked:
                if pid not in self.known:
                    self.early[pid] = code
                    continue
            self._ended(pid, code)

    def _ended(self, pid: int, code: int) -> None:
        with self.tracked:
            on_exit = self.known.pop(pid)
        on_exit(code)

    def close(self) -> None:
        """End the fork server (its launchers end their members)."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=10)
