"""The launcher actor: one per member of an attempt on Ray, in the placement group's bundle on
the node the core chose. It starts the member under gpupool's launcher (`spawn.py`: its own
session, the job's OS user, a clean environment), and outlives the scheduler (it is detached
and named after its attempt), so that a restarted scheduler finds it again.

Methods run in threads of their own (`max_concurrency`): `wait` blocks until the member ends
or for `timeout` seconds (the caller asks again: a scheduler that died while waiting leaves no
thread blocked for long), while `notify` and `kill` reach it meanwhile.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpupool.executors.proc import outcome, process_started
from gpupool.executors.spawn import Spawn, signal_group, spawn, write_notice
from gpupool.executors.users import lookup


class RankLauncher:
    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.spec: Spawn | None = None
        self.notice_dir: Path | None = None
        self.ended = threading.Event()
        self.code: int | None = None

    def free_port(self) -> int:
        """A TCP port free on this node's address now: the gang's rendezvous (`MASTER_PORT`)."""
        import ray

        with socket.socket() as probe:
            probe.bind((ray.util.get_node_ip_address(), 0))  # type: ignore[no-untyped-call]
            return int(probe.getsockname()[1])

    def start(self, spec: Spawn, notice_dir: str, port: int) -> dict[str, Any]:
        """Start the member, with the rendezvous port rank 0 chose. The job's OS user is looked
        up on this node (its uid is this node's). Returns its pid and start time."""
        if self.child is not None:
            raise RuntimeError("this launcher has started its member already")
        import ray

        user = lookup(spec.user.name) if spec.user is not None else None
        here = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        spec = replace(spec, user=user, env={**spec.env, "MASTER_PORT": str(port), "GPUPOOL_NODE_ADDRESS": here})
        self.spec, self.notice_dir = spec, Path(notice_dir)
        child = self.child = spawn(spec)
        threading.Thread(target=self._reap, daemon=True, name="member").start()
        return {"pid": child.pid, "started": process_started(child.pid) or "", "node": os.uname().nodename}

    def _reap(self) -> None:
        assert self.child is not None
        self.code = self.child.wait()
        self.ended.set()

    def status(self) -> dict[str, Any]:
        """Whether the member was started, and whether it has ended."""
        return {"started": self.child is not None, "ended": self.ended.is_set()}

    def wait(self, timeout: float = 30.0) -> dict[str, Any] | None:
        """How the member ended (`proc.outcome`), once it has; None if it runs on after
        `timeout` seconds. A launcher whose member was never started says so at once."""
        if self.child is None:
            return {"exit_code": None, "why": None, "not_started": "its member was never started"}
        if not self.ended.wait(timeout):
            return None
        assert self.spec is not None
        status, why, not_started = outcome(self.spec.folder, self.spec.owner, self.code)
        return {"exit_code": status, "why": why, "not_started": not_started}

    def notify(self, deadline: float, write: bool = True) -> None:
        """Give notice: the notice file first (by one member of the gang: `write`), then
        SIGTERM to the member's session, even if the file could not be written."""
        try:
            if write and self.notice_dir is not None:
                write_notice(self.notice_dir, deadline)
        finally:
            self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> None:
        if self.child is not None and not self.ended.is_set():
            signal_group(self.child.pid, sig)
