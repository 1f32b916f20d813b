"""The launcher actor: one per node of the pool, in that node's reservation (`ray_nodes.py`),
kept between attempts. It starts each member the core places on its node under gpupool's
launcher (`spawn.py`: a session of its own, the job's OS user, a clean environment), and
tells the scheduler how its members end. The launchers are forked from a fork server it
starts (`forks.py`). It is detached and named after its node, so that a restarted scheduler
finds it again with its members; its members die with it (their launchers watch the fork
server, which ends with it), as they would with their node.

A member is known by its owner (`member_owner`: store, job, attempt, rank). Ends are
numbered in the order they happen: `ended(since)` answers with those after `since`, waiting
up to `timeout` seconds for one (the caller asks again: a scheduler that died while it waited
leaves no thread blocked for long). A member forgotten (`forget`) is killed if it still runs,
and can never be started afterwards, whatever order Ray delivers the calls in.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpupool.executors.forks import ForkServer
from gpupool.executors.proc import outcome, process_started
from gpupool.executors.spawn import Spawn, signal_group, write_notice
from gpupool.executors.users import lookup

FORGOTTEN = 100_000
"""How many forgotten owners a launcher remembers, so that a late `start` of one is refused."""


@dataclass
class Member:
    spec: Spawn
    notice_dir: Path
    pid: int = 0
    """Its launcher's, which leads its session (0 until it has one)."""
    end: dict[str, Any] | None = None
    seq: int = 0
    """Its place in the order of ends (0 while it runs)."""
    info: dict[str, Any] = field(default_factory=dict)


class NodeLauncher:
    def __init__(self) -> None:
        self.members: dict[str, Member] = {}
        self.forgotten: OrderedDict[str, None] = OrderedDict()
        self.seq = 0
        self.changed = threading.Condition()
        self.forks: ForkServer | None = None

    def ping(self) -> dict[str, Any]:
        """This launcher's process and node: it is up."""
        import ray

        return {"pid": os.getpid(), "address": ray.util.get_node_ip_address()}  # type: ignore[no-untyped-call]

    def free_port(self) -> int:
        """A TCP port free on this node's address now: the gang's rendezvous (`MASTER_PORT`)."""
        import ray

        with socket.socket() as probe:
            probe.bind((ray.util.get_node_ip_address(), 0))  # type: ignore[no-untyped-call]
            return int(probe.getsockname()[1])

    def start(self, spec: Spawn, notice_dir: str, port: int) -> dict[str, Any]:
        """Start a member, with the rendezvous port its rank 0 chose (0: one chosen here). The
        job's OS user is looked up on this node (its uid is this node's)."""
        import ray

        port = port or self.free_port()
        user = lookup(spec.user.name) if spec.user is not None else None
        here = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        spec = replace(spec, user=user, env={**spec.env, "MASTER_PORT": str(port), "GPUPOOL_NODE_ADDRESS": here})
        with self.changed:
            if spec.owner in self.forgotten:
                raise RuntimeError(f"{spec.owner} was given up before it could start")
            if spec.owner in self.members:
                raise RuntimeError(f"{spec.owner} was started already")
            # Known before it runs: its end, which may come before its pid does, is told.
            member = self.members[spec.owner] = Member(spec, Path(notice_dir))
            if self.forks is None:
                self.forks = ForkServer()
            forks = self.forks
        try:
            # Not under the lock: the fork server's thread takes it to tell an end.
            pid = forks.spawn(spec, lambda code: self._reap(member, code))
        except BaseException:
            with self.changed:
                if self.members.get(spec.owner) is member:
                    del self.members[spec.owner]
            raise
        with self.changed:
            member.pid = pid
            if spec.owner in self.forgotten:  # given up while it started
                signal_group(pid, signal.SIGKILL)
                raise RuntimeError(f"{spec.owner} was given up while it started")
            member.info = {"pid": pid, "started": process_started(pid) or "", "node": os.uname().nodename}
            return member.info

    def _reap(self, member: Member, code: int) -> None:
        status, why, not_started = outcome(member.spec.folder, member.spec.owner, code)
        with self.changed:
            self.seq += 1
            member.end, member.seq = {"exit_code": status, "why": why, "not_started": not_started}, self.seq
            self.changed.notify_all()

    def ended(self, since: int, timeout: float = 30.0) -> tuple[int, list[tuple[str, dict[str, Any]]]]:
        """The members that ended after `since` in the order of ends, with how each ended
        (`proc.outcome`), and the last end's number; waits up to `timeout` s for one."""
        with self.changed:
            self.changed.wait_for(lambda: self.seq > since, timeout)
            found = sorted((m.seq, owner, m.end) for owner, m in self.members.items() if m.seq > since)
            return self.seq, [(owner, end) for _, owner, end in found if end is not None]

    def status(self, owners: list[str]) -> dict[str, dict[str, Any] | None]:
        """For each of `owners` this launcher started: how it ended, or None while it runs."""
        with self.changed:
            return {o: self.members[o].end for o in owners if o in self.members}

    def notify(self, owner: str, deadline: float, write: bool = True) -> None:
        """Give notice: the notice file first (by one member of the gang: `write`), then
        SIGTERM to the member's session, even if the file could not be written."""
        member = self.members.get(owner)
        if member is None:
            return
        try:
            if write:
                write_notice(member.notice_dir, deadline)
        finally:
            self._signal(member, signal.SIGTERM)

    def kill(self, owner: str) -> None:
        member = self.members.get(owner)
        if member is not None:
            self._signal(member, signal.SIGKILL)

    def forget(self, owners: list[str]) -> None:
        """Drop these members' records, killing any that still runs; none of them can be
        started here afterwards."""
        with self.changed:
            for owner in owners:
                member = self.members.pop(owner, None)
                if member is not None:
                    self._signal(member, signal.SIGKILL)
                self.forgotten[owner] = None
            while len(self.forgotten) > FORGOTTEN:
                self.forgotten.popitem(last=False)

    def _signal(self, member: Member, sig: signal.Signals) -> None:
        if member.end is None and member.pid:
            signal_group(member.pid, sig)
