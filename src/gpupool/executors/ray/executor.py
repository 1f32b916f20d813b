"""Attempts on a Ray cluster: every alive Ray node with GPUs is a node of the pool
(`nodes.py`), and each attempt is a gang of members, one per node the core chose, each
started by its node's launcher actor (`launcher.py`) with the GPUs the core chose there.

How a gang goes: at `start` each member's launcher is asked to start it (rank 0's launcher
picks the rendezvous port first when there are several); when every member has started the
attempt runs. A gang not running within `start_timeout` is given back whole
(`Exit(started=False)`), as is one whose node left before it ran. The attempt ends when every
member has ended, or as soon as one fails or its node is lost: the others are killed first
(SIGKILL to their sessions), and only then does each launcher forget the gang.

A thread waits on Ray for all of this (one `ended` call at a time per node, and the `start`
calls) and wakes the control loop (`on_change`); `poll` hands over what it found. Ray is
imported in this package only (`executors/ray/`): `gpupool[ray]` is an extra.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

from gpupool.executors import Exit, Handle, Key, Launch, NodeState, Progress, Recorded, Started
from gpupool.executors.containment import Containment
from gpupool.executors.proc import owner
from gpupool.executors.ray.adopt import (
    GONE,
    UNKNOWN,
    forget_everywhere,
    forgotten,
    lost,
    members,
    stop_older,
    unrecorded,
)
from gpupool.executors.ray.gang import Gang, attempt_exit, member_folder, member_owner
from gpupool.executors.ray.nodes import RayNodes, fetch
from gpupool.executors.ray.terminal import RayTerminal
from gpupool.executors.spawn import Spawn

log = logging.getLogger("gpupool.ray")

STRAYS = 10_000
"""How many ends of members no gang here knows are kept: a gang being adopted may be told of
its member's end before it is registered."""


class RayExecutor:
    """`address` is the Ray cluster's (`auto` for the one this machine is in). Launchers and
    reservations live in the namespace of the store (`gpupool-<store id>`), so two pools on one
    cluster never take each other's. `on_change` is called from the watcher thread when an
    attempt starts running or ends."""

    def __init__(
        self,
        address: str,
        store_id: str,
        on_change: Callable[[], None] = lambda: None,
        start_timeout: float = 60.0,
        end_timeout: float = 60.0,
        wait_timeout: float = 30.0,
        containment: Containment | None = None,
    ) -> None:
        self.store_id = store_id
        self.containment = containment
        """Each member in a cgroup on its node, where that node can (its launcher says)."""
        self.namespace = f"gpupool-{store_id[:12]}"
        self.on_change = on_change
        self.start_timeout = start_timeout
        self.end_timeout = end_timeout
        self.wait_timeout = wait_timeout
        """How long one `ended` call holds one of a launcher's threads before it is made again."""
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            ray.init(address=address, namespace=self.namespace, log_to_driver=False, logging_level=logging.WARNING)
        self.lock = threading.RLock()
        self.gangs: dict[Key, Gang] = {}
        self.members: dict[str, tuple[Key, int]] = {}
        """Owner of a member → its gang and rank."""
        self.waiting: dict[Any, tuple[str, Any, int]] = {}
        """Refs Ray will resolve, with what each is: ('started', gang key, rank), or ('ended',
        node id, 0): a launcher's ends."""
        self.told: dict[str, tuple[str | None, int]] = {}
        """Node id → its launcher's incarnation, and the number of the last end it told."""
        self.watching: set[str] = set()
        """Node ids whose launcher has an `ended` call outstanding."""
        self.strays: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.forgetting: dict[Any, tuple[Any, str, bool, str, int]] = {}
        """`forget` calls not yet answered: (launcher, gang name, ran, node id, tries); one that
        fails while its launcher lives is made again (a member given up may still run)."""
        self.quiet: dict[str, float] = {}
        """Node ids whose launcher is not asked again before then (it was unavailable)."""
        self.running: dict[Key, str] = {}
        self.ended: list[Exit] = []
        self.pool = RayNodes(self.namespace, start_timeout)
        self.pool.wait_up(start_timeout)
        self.closed = threading.Event()
        self.watcher = threading.Thread(target=self._watch, daemon=True, name="ray-watcher")
        self.watcher.start()

    def close(self) -> None:
        """Stop watching; the gangs run on, for the next scheduler to adopt."""
        self.closed.set()
        self.watcher.join(timeout=5)
        if self.owns_ray:
            ray.shutdown()

    def nodes(self) -> list[NodeState]:
        return self.pool.pool()

    # --- starting, telling, stopping ------------------------------------------------------

    def start(self, launch: Launch) -> Started:
        key = (launch.job_id, launch.attempt)
        name = owner(self.store_id, *key)
        found = [self.pool.by_name(m.node) for m in launch.members]
        missing = [m.node for m, n in zip(launch.members, found, strict=True) if n is None]
        if missing or not launch.members:
            # The scheduler's reason, not the job's: it is placed again after a back-off.
            raise OSError(f"Ray has no alive node {', '.join(missing)}" if missing else "a gang needs members")
        nodes = [n for n in found if n is not None]
        gang = Gang(
            key,
            name,
            launch.attempt_dir,
            [m.node for m in launch.members],
            [n.id for n in nodes],
            [n.launcher for n in nodes],
            incarnations=[n.incarnation for n in nodes],
        )
        with self.lock:
            self.gangs[key] = gang
            port: Any = nodes[0].launcher.free_port.remote() if len(nodes) > 1 else 0
            for member, node in zip(launch.members, nodes, strict=True):
                first = member.rank == 0
                contain = None
                if self.containment is not None:
                    contain = self.containment.request(*key, member, node.state.node.gpus, launch.resources)
                spec = Spawn(
                    member_folder(launch.attempt_dir, member.rank),
                    gang.owner(member.rank),
                    launch.user,
                    launch.workdir,
                    launch.command,
                    launch.member_env(member, nodes[0].address, 0),
                    launch.stdout if first else None,
                    launch.stderr if first else None,
                    contain,
                    launch.tty and first,
                )
                self.members[spec.owner] = (key, member.rank)
                ref = node.launcher.start.remote(spec, str(launch.attempt_dir), port)
                self.waiting[ref] = ("started", key, member.rank)
        return Started(self.handle(gang), False, "")

    def notify(self, job_id: int, attempt: int, deadline: float) -> None:
        with self.lock:
            gang = self.gangs.get((job_id, attempt))
            if gang is None or gang.phase == "ending":
                return
            gang.notice = deadline
            if gang.phase != "running":
                # Asked to leave before it ran: it has nothing to save.
                self._end(gang, "stopped before it ran")
                return
            for rank, launcher in enumerate(gang.launchers):
                launcher.notify.remote(gang.owner(rank), deadline, rank == 0)

    def kill(self, job_id: int, attempt: int) -> None:
        with self.lock:
            gang = self.gangs.get((job_id, attempt))
            if gang is not None:
                self._end(gang, "killed")

    def poll(self) -> Progress:
        with self.lock:
            progress = Progress(self.running, self.ended)
            self.running, self.ended = {}, []
        return progress

    def address(self, node: str) -> str:
        if (found := self.pool.by_name(node)) is None:
            raise OSError(f"Ray has no alive node {node}")
        return found.address

    def terminal(self, job_id: int, attempt: int) -> RayTerminal:
        """The terminal of the attempt's rank 0, relayed by its node's launcher actor."""
        gang = self.gangs.get((job_id, attempt))
        if gang is None or gang.phase != "running":
            raise OSError(f"job {job_id} attempt {attempt} does not run here now")
        return RayTerminal(gang.launchers[0], gang.owner(0))

    def logs(self, job_id: int, attempt: int, rank: int, stream: str, attempt_dir: Path) -> BinaryIO | None:
        """From the attempt's folder, which every node writes (it is on shared storage)."""
        try:
            return (member_folder(attempt_dir, rank) / f"{stream}.log").open("rb")
        except OSError:
            return None

    def adopt(self, recorded: Recorded) -> Started | Exit:
        """Watched again if every member is still known to its node's launcher, having started;
        else how it ended (`lost`), and no member of it runs on. An attempt this executor tracks
        already (adopted again after a halt) is left as it is."""
        key = (recorded.job_id, recorded.attempt)
        with self.lock:
            known = self.gangs.get(key)
            if known is not None:
                return Started(self.handle(known), known.phase in ("running", "ending"), "adopted")
            queued = next((e for e in self.ended if (e.job_id, e.attempt) == key), None)
            if queued is not None:
                self.ended.remove(queued)
                return queued
        name = owner(self.store_id, *key)
        if recorded.handle is None:
            # The scheduler died between its start calls and recording the handle: wherever they
            # went, nothing of it may run; what its members' records say is how it ended.
            forget_everywhere(self.pool, name)
            return unrecorded(recorded, name)
        handle = recorded.handle
        if "node_ids" not in handle:
            return stop_older(self.namespace, recorded, name)
        nodes, ids = list(handle.get("nodes", [])), list(handle.get("node_ids", []))
        if len(nodes) != len(ids):
            nodes = ids = []
        ranks = len(ids)
        launchers = [self.pool.existing_launcher(node_id) for node_id in ids]
        incarnations = list(handle.get("incarnations", [])) or [None] * ranks
        found = members(launchers, [member_owner(name, r) for r in range(ranks)], incarnations)
        gang = Gang(key, name, recorded.attempt_dir, nodes, ids, launchers, "running")
        if ranks and all(f not in (GONE, UNKNOWN) and not forgotten(f) for f in found):
            with self.lock:
                self.register(gang)
                for rank, end in enumerate(found):
                    if end is not None:
                        self._member_ended(gang, rank, end)
                if recorded.notice_deadline is not None and not (recorded.attempt_dir / "notice").exists():
                    self.notify(*key, recorded.notice_deadline)  # recorded, but the scheduler died before giving it
                gang.notice = recorded.notice_deadline
            return Started(self.handle(gang), True, "adopted")
        ended = lost(recorded, name, found)
        self.forget(gang, ran=ended.started)  # not all there: what is left of it is killed, and never starts
        return ended

    def handle(self, gang: Gang) -> Handle:
        return {
            "executor": "ray",
            "namespace": self.namespace,
            "name": gang.name,
            "ranks": len(gang.nodes),
            "nodes": gang.nodes,
            "node_ids": gang.node_ids,
            "incarnations": gang.incarnations,
        }

    def register(self, gang: Gang) -> None:
        """Watch an adopted gang (under the lock): ends told before it was known count."""
        self.gangs[gang.key] = gang
        for rank in range(len(gang.nodes)):
            self.members[gang.owner(rank)] = (gang.key, rank)
            stray = self.strays.pop(gang.owner(rank), None)
            if stray is not None:
                self._member_ended(gang, rank, stray)

    # --- the watcher ----------------------------------------------------------------------

    def _watch(self) -> None:
        while not self.closed.is_set():
            with self.lock:
                self._watch_launchers()
                refs = [*self.waiting, *self.forgetting]
            ready: list[Any] = []
            if not refs:
                self.closed.wait(0.05)
            else:
                try:
                    ray.wait(refs, num_returns=1, timeout=0.1)
                    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                except Exception:  # Ray itself failing: said, and tried again after the deadlines
                    log.exception("waiting on Ray failed")
                    self.closed.wait(1.0)
            # Fetched without the lock: the control loop's calls never wait on Ray's answers.
            values = [(ref, *fetch(ref)) for ref in ready]
            changed = False
            with self.lock:
                for ref, value, error in values:
                    changed |= self._safely(ref, value, error)
                try:
                    changed |= self._check_time()
                except Exception:
                    log.exception("checking the gangs' deadlines failed")
            if changed:
                self.on_change()

    def _watch_launchers(self) -> None:
        """One `ended` call outstanding on each launcher with a member some gang waits for."""
        wanted = {
            node_id: gang.launchers[rank]
            for gang in self.gangs.values()
            for rank, node_id in enumerate(gang.node_ids)
            if rank not in gang.ended and gang.launchers[rank] is not None
        }
        now = time.monotonic()
        for node_id, launcher in wanted.items():
            if node_id not in self.watching and self.quiet.get(node_id, 0.0) <= now:
                self.watching.add(node_id)
                incarnation, since = self.told.get(node_id, (None, 0))
                call = launcher.ended.remote(since, self.wait_timeout, incarnation)
                self.waiting[call] = ("ended", node_id, 0)

    def _safely(self, ref: Any, value: Any, error: BaseException | None) -> bool:
        """`_advance`, and for a gang it fails on (Ray refusing a call): given back if it was
        not running, else ended, so that no gang is left with nobody watching it."""
        if ref in self.forgetting:
            self._forgot(ref, error)
            return False
        what = self.waiting.pop(ref, None)
        if what is None:
            return False
        kind, subject, rank = what
        if isinstance(error, GetTimeoutError):  # ready, but not here yet: looked at again
            self.waiting[ref] = what
            return False
        if kind == "ended":
            return self._launcher_told(subject, value, error)
        gang = self.gangs.get(subject)
        if gang is None:
            return False
        try:
            return self._started(gang, rank, error)
        except Exception as exc:
            log.exception("a step of job %s attempt %s failed", *gang.key)
            if gang.phase == "starting":
                return self._give_back(gang, f"Ray refused a step: {str(exc).splitlines()[0][:300]}")
            self._end(gang, "Ray refused a step")
            return False

    def _started(self, gang: Gang, rank: int, error: BaseException | None) -> bool:
        if rank in gang.ended:  # its end came first: what its start's answer says is past
            return False
        if isinstance(error, RayActorError | ActorUnavailableError):
            self.pool.forget_launcher(gang.node_ids[rank])
            return self._member_lost(gang, rank, error)
        if error is not None:  # the launcher raised: it could not start the member there
            if gang.phase == "starting":
                return self._give_back(gang, f"rank {rank} could not start: {str(error).splitlines()[0][:300]}")
            return self._member_lost(gang, rank, error)
        gang.started.add(rank)
        if gang.phase == "starting" and len(gang.started) == len(gang.nodes):
            gang.phase = "running"
            self.running[gang.key] = f"on nodes {', '.join(gang.nodes)}"
            return True
        return False

    def _launcher_told(self, node_id: str, value: Any, error: BaseException | None) -> bool:
        """A launcher's ends since the last it told (asked again), or its loss: every member
        on its node is lost with it."""
        self.watching.discard(node_id)
        if isinstance(error, ActorUnavailableError) and self.pool.by_id(node_id) is not None:
            self.quiet[node_id] = time.monotonic() + 0.5  # often a passing fault: asked again soon
            return False
        if error is not None:
            self.pool.forget_launcher(node_id)
            changed = False
            for gang in [g for g in self.gangs.values() if node_id in g.node_ids]:
                for rank in [r for r, n in enumerate(gang.node_ids) if n == node_id and r not in gang.ended]:
                    changed |= self._member_lost(gang, rank, error)
            return changed
        incarnation, since, ends = value
        self.told[node_id] = (incarnation, since)
        changed = False
        for member, end in ends:
            found = self.members.get(member)
            target = self.gangs.get(found[0]) if found is not None else None
            if target is None or found is None:
                self.strays[member] = end
                while len(self.strays) > STRAYS:
                    self.strays.popitem(last=False)
                continue
            changed |= self._member_ended(target, found[1], end)
        return changed

    def _member_ended(self, gang: Gang, rank: int, end: dict[str, Any]) -> bool:
        if rank in gang.ended:
            return False
        changed = False
        if gang.phase == "starting" and not end.get("not_started"):
            # Its end was told before its start's answer was looked at: it ran.
            changed = self._started(gang, rank, None)
        gang.ended[rank] = end
        # A member that fails stops the others at once; after a notice they all have until
        # the deadline (the one that saves the checkpoint may still be at it).
        if end.get("exit_code") != 0 and gang.notice is None and gang.phase != "ending":
            gang.failure = end
            if gang.phase == "starting":  # before the others ran: they never will
                return self._report(gang, attempt_exit(gang.key, {rank: end}, end, None, None)) or changed
            self._end(gang, f"rank {rank} ended with {end.get('exit_code')}")
        return self._finish_if_done(gang) or changed

    def _member_lost(self, gang: Gang, rank: int, exc: BaseException) -> bool:
        node = gang.nodes[rank]
        if gang.phase == "starting":
            return self._give_back(gang, f"node {node} was lost before it ran ({type(exc).__name__})")
        what = f"node {node} (rank {rank}) was lost: {type(exc).__name__}"
        self.pool.set_aside(gang.node_ids[rank])
        if gang.lost is None:
            # Even after a member failed: the others fail fast when a peer's node dies (their
            # collectives break), often before Ray says the node is gone.
            gang.lost = what
        gang.ended[rank] = {"exit_code": None, "why": what, "not_started": None}
        if gang.phase != "ending":
            self._end(gang, what)
        return self._finish_if_done(gang)

    def _end(self, gang: Gang, why: str) -> None:
        """Stop every member still running (SIGKILL); a gang not running yet is taken down."""
        if gang.phase == "starting":
            self._give_back(gang, why, started=True)
            return
        gang.phase = "ending"
        gang.since = time.monotonic()
        for rank, launcher in enumerate(gang.launchers):
            if rank not in gang.ended:
                launcher.kill.remote(gang.owner(rank))

    def _give_back(self, gang: Gang, why: str, started: bool = False) -> bool:
        """Take down a gang that did not run (no member of it runs afterwards)."""
        return self._report(gang, Exit(*gang.key, None, why, started=started))

    def _finish_if_done(self, gang: Gang) -> bool:
        if len(gang.ended) < len(gang.nodes):
            return False
        return self._report(gang, attempt_exit(gang.key, gang.ended, gang.failure, gang.lost, None))

    def _report(self, gang: Gang, exit: Exit) -> bool:
        """The gang's end, once: a gang already taken down reports nothing more."""
        if self.gangs.get(gang.key) is not gang:
            return False
        self.forget(gang, ran=exit.started)
        self.ended.append(exit)
        return True

    def forget(self, gang: Gang, ran: bool) -> None:
        """No member of the gang runs, or will: its launchers kill what is left of it and
        forget it (a `start` still on its way is refused), asked until they answer. `ran`:
        whether it was reported to have run (said to a scheduler that adopts it before its end
        is recorded)."""
        self.gangs.pop(gang.key, None)
        for rank in range(len(gang.nodes)):
            self.members.pop(gang.owner(rank), None)
        launchers = {n: x for n, x in zip(gang.node_ids, gang.launchers, strict=True) if x is not None}
        for node_id, launcher in launchers.items():
            self._ask_to_forget(launcher, gang.name, ran, node_id, 0)

    def _ask_to_forget(self, launcher: Any, name: str, ran: bool, node_id: str, tries: int) -> None:
        try:
            self.forgetting[launcher.forget.remote([name], ran)] = (launcher, name, ran, node_id, tries)
        except Exception:  # Ray refused the call itself: said; the node is set aside
            log.exception("asking node %s's launcher to forget %s failed", node_id, name)
            self.pool.set_aside(node_id)

    def _forgot(self, ref: Any, error: BaseException | None) -> None:
        """A `forget` answered: done, or its launcher is dead (its members with it), or asked
        again; a launcher that does not answer ten times has its node set aside."""
        launcher, name, ran, node_id, tries = self.forgetting.pop(ref)
        if error is None or (isinstance(error, RayActorError) and not isinstance(error, ActorUnavailableError)):
            return
        if tries < 10 and self.pool.by_id(node_id) is not None:
            self._ask_to_forget(launcher, name, ran, node_id, tries + 1)
            return
        log.error("node %s's launcher did not forget %s (%s): the node is set aside", node_id, name, error)
        self.pool.set_aside(node_id)

    def _check_time(self) -> bool:
        """Gangs not running within `start_timeout`, or whose node left before they ran, are
        given back whole; a gang whose members do not all end within `end_timeout` of being
        killed is taken as ended (its node is gone with them)."""
        changed = False
        now = time.monotonic()
        for gang in list(self.gangs.values()):
            if gang.phase == "starting":
                gone = [n for n, i in zip(gang.nodes, gang.node_ids, strict=True) if self.pool.by_id(i) is None]
                if gone:
                    changed |= self._give_back(gang, f"node {', '.join(gone)} left before it ran")
                elif now - gang.since > self.start_timeout:
                    changed |= self._give_back(gang, f"Ray did not start it within {self.start_timeout:.0f} s")
            elif gang.phase == "ending" and now - gang.since > self.end_timeout:
                # A member that does not end when killed is on a node that hangs: lost with it.
                for rank in [r for r in range(len(gang.nodes)) if r not in gang.ended]:
                    timeout = TimeoutError(f"did not end {self.end_timeout:.0f} s after SIGKILL")
                    changed |= self._member_lost(gang, rank, timeout)
                changed |= self._finish_if_done(gang)
        return changed
