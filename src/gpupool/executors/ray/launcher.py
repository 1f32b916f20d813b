"""The launcher actor: one per node of the pool, in that node's reservation (`nodes.py`),
kept between attempts. It starts each member the core places on its node under gpupool's
launcher (`spawn.py`: a session of its own, the job's OS user, a clean environment), and
tells the scheduler how its members end. The launchers are forked from a fork server it
starts (`forks.py`). It is detached and named after its node, so that a restarted scheduler
finds it again with its members; its members die with it (their launchers watch the fork
server, which ends with it), as they would with their node. A fork server that dies or stops
answering takes the actor with it: its members are lost, as with their node.

A member is known by its owner (`member_owner`: store, job, attempt, rank), a gang by its
attempt's name (the owner without the rank). Ends are numbered in the order they happen:
`ended(since)` answers with those after `since`, waiting up to `timeout` seconds for one (the
caller asks again: a scheduler that died while it waited leaves no thread blocked for long);
numbers count from the start again in a new launcher (its `incarnation` tells it). A gang
forgotten (`forget`) has what is left of it killed, and can never start a member here
afterwards, whatever order Ray delivers the calls in; `status` still says it was forgotten,
and whether it had run.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpupool.executors.cgroups import Layout, root_of
from gpupool.executors.containment import unavailable
from gpupool.executors.forks import ForkServer
from gpupool.executors.proc import process_started
from gpupool.executors.ray.gang import attempt_of, member_end
from gpupool.executors.spawn import Spawn, clear, kill, signal_group, write_notice
from gpupool.executors.terminal import Link
from gpupool.executors.users import lookup

log = logging.getLogger("gpupool.ray.launcher")

FORGOTTEN = 100_000
"""How many forgotten gangs a launcher remembers, so that a late `start` of one is refused."""


def _exit_now() -> None:
    os._exit(70)


@dataclass
class Member:
    spec: Spawn
    notice_dir: Path
    pid: int = 0
    """Its launcher's, which leads its session (0 until it has one)."""
    end: dict[str, Any] | None = None
    seq: int = 0
    """Its place in the order of ends (0 while it runs)."""
    killed: bool = False
    """Killed before it had a pid: killed as soon as it has one."""
    noticed: bool = False
    """Given notice before it had a pid: SIGTERM as soon as it has one."""


class NodeLauncher:
    """`on_lost` is called when the fork server is gone: by default this process ends (an
    actor does not outlive the launchers of its members)."""

    def __init__(self, on_lost: Callable[[], None] = _exit_now) -> None:
        self.on_lost = on_lost
        self.incarnation = uuid.uuid4().hex
        self.members: dict[str, Member] = {}
        self.forgotten: OrderedDict[str, bool] = OrderedDict()
        """Forgotten gangs' names, with whether each had run."""
        self.seq = 0
        self.changed = threading.Condition()
        self.forks: ForkServer | None = None
        self.links: dict[str, Link] = {}
        """Connections to members' terminals, relayed for the scheduler (`terminal_open`)."""
        self.uncontained: dict[str, str | None] = {}
        """Per cgroup root: why this node cannot put members in cgroups there (they run as
        sessions), or None when it can (found out at the first member under it)."""

    def ping(self) -> dict[str, Any]:
        """This launcher's process and node: it is up."""
        import ray

        address = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return {"pid": os.getpid(), "address": address, "incarnation": self.incarnation}

    def free_port(self) -> int:
        """A TCP port free on this node's address now: the gang's rendezvous (`MASTER_PORT`)."""
        import ray

        with socket.socket() as probe:
            probe.bind((ray.util.get_node_ip_address(), 0))  # type: ignore[no-untyped-call]
            return int(probe.getsockname()[1])

    def start(self, spec: Spawn, notice_dir: str, port: int) -> dict[str, Any]:
        """Start a member, with the rendezvous port its rank 0 chose (0: one chosen here). The
        job's OS user is looked up on this node (its uid is this node's). A member that could
        not be started is told to have ended so (`not_started`), as well as raised."""
        import ray

        with self.changed:
            if attempt_of(spec.owner) in self.forgotten:
                raise RuntimeError(f"{spec.owner} was given up before it could start")
            if spec.owner in self.members:
                raise RuntimeError(f"{spec.owner} was started already")
            # Known before it runs: its end, which may come before its pid does, is told.
            member = self.members[spec.owner] = Member(spec, Path(notice_dir))
        try:
            port = port or self.free_port()
            user = lookup(spec.user.name) if spec.user is not None else None
            here = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
            env = {**spec.env, "MASTER_PORT": str(port), "GPUPOOL_NODE_ADDRESS": here}
            if spec.contain is not None:
                root = root_of(spec.contain.cgroup)
                if root not in self.uncontained:
                    self.uncontained[root] = unavailable(Layout.read(), root)
                if self.uncontained[root] is not None:
                    log.warning("%s runs as a session, not a cgroup: %s", spec.owner, self.uncontained[root])
                    spec = member.spec = replace(spec, contain=None)
            with self.changed:
                if self.forks is None:
                    self.forks = ForkServer(self.on_lost)
                forks = self.forks
            # Not under the lock: the fork server's thread takes it to tell an end.
            pid = forks.spawn(replace(spec, user=user, env=env), lambda code: self._reap(member, code))
        except Exception as exc:
            why = f"the launcher could not start it: {exc}"
            self._tell(member, {"exit_code": None, "why": None, "not_started": why})
            raise
        with self.changed:
            member.pid = pid
            if member.killed or attempt_of(spec.owner) in self.forgotten:  # while it started
                kill(pid, spec.contain, spec.folder)
            elif member.noticed:
                signal_group(pid, signal.SIGTERM)
            return {"pid": pid, "started": process_started(pid) or "", "node": os.uname().nodename}

    def _reap(self, member: Member, code: int) -> None:
        """Its end, once its cgroup is empty (what its launcher, killed, left is killed here):
        told at once, in the order of ends, when it empties within a second; else from a
        thread of its own once it has, as a process the kernel holds may keep one cgroup for
        long, and the other members' ends must not wait behind it."""
        spec = member.spec
        empty, usage = clear(spec.contain, within=1.0)
        if empty:
            self._tell(member, member_end(spec.folder, spec.owner, code, usage))
            return

        def end() -> None:
            _, cleared = clear(spec.contain, within=None)
            self._tell(member, member_end(spec.folder, spec.owner, code, cleared))

        threading.Thread(target=end, daemon=True, name=f"end-{spec.owner}").start()

    def _tell(self, member: Member, end: dict[str, Any]) -> None:
        with self.changed:
            if member.end is not None:
                return
            self.seq += 1
            member.end, member.seq = end, self.seq
            self.changed.notify_all()

    def ended(
        self, since: int, timeout: float = 30.0, incarnation: str | None = None
    ) -> tuple[str, int, list[tuple[str, dict[str, Any]]]]:
        """This launcher's incarnation, the last end's number, and the members that ended after
        `since` (counted from the start if `incarnation` is another launcher's) in the order
        of ends, with how each ended (`proc.outcome`); waits up to `timeout` s for one."""
        if incarnation != self.incarnation:
            since = 0
        with self.changed:
            self.changed.wait_for(lambda: self.seq > since, timeout)
            found = sorted((m.seq, owner, m.end) for owner, m in self.members.items() if m.seq > since)
            return self.incarnation, self.seq, [(owner, end) for _, owner, end in found if end is not None]

    def status(self, owners: list[str]) -> tuple[str, dict[str, dict[str, Any] | None]]:
        """This launcher's incarnation, and for each of `owners` it knows: how it ended, None
        while it runs, or `{"forgotten": RAN}` for a member of a forgotten gang."""
        with self.changed:
            found: dict[str, dict[str, Any] | None] = {}
            for owner in owners:
                if owner in self.members:
                    found[owner] = self.members[owner].end
                elif attempt_of(owner) in self.forgotten:
                    found[owner] = {"forgotten": self.forgotten[attempt_of(owner)]}
            return self.incarnation, found

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
            with self.changed:
                member.noticed = True
                self._signal(member, signal.SIGTERM)

    def kill(self, owner: str) -> None:
        with self.changed:
            member = self.members.get(owner)
            if member is not None:
                member.killed = True
                self._signal(member, signal.SIGKILL)

    def forget(self, names: list[str], ran: bool) -> None:
        """Forget these gangs (attempts' names), killing what is left of them; none of them
        can start a member here afterwards. `ran`: whether they had run, as reported."""
        gone = set(names)
        with self.changed:
            for name in names:
                self.forgotten[name] = ran
            for owner in [o for o in self.members if attempt_of(o) in gone]:
                member = self.members.pop(owner)
                member.killed = True
                self._signal(member, signal.SIGKILL)
            while len(self.forgotten) > FORGOTTEN:
                self.forgotten.popitem(last=False)

    # --- a session's terminal, relayed for the scheduler on another machine --------------------

    def terminal_open(self, owner: str) -> str:
        """Connect to the terminal of a member here (its launcher serves it); a name for the link."""
        link = uuid.uuid4().hex
        found = Link(owner)
        with self.changed:
            self.links[link] = found
        return link

    def terminal_send(self, link: str, kind: bytes, payload: bytes) -> None:
        self._link(link).send(kind, payload)

    def terminal_receive(self, link: str, timeout: float) -> list[tuple[bytes, bytes]] | None:
        """As `Link.receive`; None as well for a link closed or unknown."""
        found = self.links.get(link)
        return found.receive(timeout) if found is not None else None

    def terminal_close(self, link: str) -> None:
        with self.changed:
            found = self.links.pop(link, None)
        if found is not None:
            found.close()

    def _link(self, link: str) -> Link:
        found = self.links.get(link)
        if found is None:
            raise OSError(f"no terminal link {link}: closed, or this launcher started again")
        return found

    def _signal(self, member: Member, sig: signal.Signals) -> None:
        if member.end is None and member.pid:
            if sig == signal.SIGKILL:
                kill(member.pid, member.spec.contain, member.spec.folder)
            else:
                signal_group(member.pid, sig)
