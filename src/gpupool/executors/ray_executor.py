"""Attempts on a Ray cluster: every alive Ray node with GPUs is a node of the pool, and each
attempt is a gang of launcher actors (`ray_launcher.py`), one per member, in a placement group
whose bundles are pinned to the nodes the core chose.

How a gang goes: its placement group is made at `start` (the handle is recorded then); once
Ray has reserved it, a detached, named launcher actor goes into each bundle and starts its
member; when every member has started the attempt runs. A gang not running within
`start_timeout` is given back whole (`Exit(started=False)`), as is one whose node left before
it ran. The attempt ends when every member has ended, or as soon as one fails or its node is
lost: the others are killed first, and only then are the actors and the placement group
removed (removing them first would SIGKILL the members without their SIGTERM).

A thread waits on Ray for all of this and wakes the control loop (`on_change`); `poll` hands
over what it found. Ray is imported here only: `gpupool[ray]` is an extra.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError
from ray.util.placement_group import PlacementGroup, get_placement_group, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from gpupool.executors import Exit, Handle, Key, Launch, NodeState, Progress, Recorded, Started
from gpupool.executors.proc import outcome, owner, recorded_exit_time
from gpupool.executors.ray_gang import Gang, attempt_exit, member_folder, member_owner
from gpupool.executors.ray_launcher import RankLauncher
from gpupool.executors.spawn import Spawn
from gpupool.model import Node

log = logging.getLogger("gpupool.ray")

GPU_TYPE_LABEL = "gpupool.io/gpu-type"
"""A node label (`ray start --labels`) naming its GPU type; else Ray's `accelerator_type:`
resource (set where Ray detects NVIDIA GPUs); else `gpu`."""
VIRTUAL_LABEL = "gpupool.io/virtual"
"""`true` on nodes whose GPUs are not real ones (`ray start --num-gpus` on a test machine)."""
NODE_ID_LABEL = "ray.io/node-id"
SUSPECT_FOR = 60.0
Launcher = ray.remote(RankLauncher)


def fetch(ref: Any) -> tuple[Any, BaseException | None]:
    """A ready ref's value, or the error Ray raises for it."""
    try:
        return ray.get(ref, timeout=5), None
    except Exception as exc:  # Ray's errors, and the launcher's own, have no common base
        return None, exc


class RayExecutor:
    """`address` is the Ray cluster's (`auto` for the one this machine is in). Actors live in
    the namespace of the store (`gpupool-<store id>`), so two pools on one cluster never take
    each other's. `on_change` is called from the watcher thread when an attempt starts
    running or ends."""

    def __init__(
        self,
        address: str,
        store_id: str,
        on_change: Callable[[], None] = lambda: None,
        start_timeout: float = 60.0,
        end_timeout: float = 60.0,
        wait_timeout: float = 30.0,
    ) -> None:
        self.store_id = store_id
        self.namespace = f"gpupool-{store_id[:12]}"
        self.on_change = on_change
        self.start_timeout = start_timeout
        self.end_timeout = end_timeout
        self.wait_timeout = wait_timeout
        """How long one `wait` on a launcher holds one of its threads before it is asked again."""
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            ray.init(address=address, namespace=self.namespace, log_to_driver=False, logging_level=logging.WARNING)
        self.lock = threading.RLock()
        self.gangs: dict[Key, Gang] = {}
        self.running: dict[Key, str] = {}
        self.ended: list[Exit] = []
        self.addresses: dict[str, tuple[str, str]] = {}
        """Node name → (Ray node id, IP address), as of the last look."""
        self.suspects: dict[str, float] = {}
        """Ray node ids of nodes that lost a member, with when: out of the pool until Ray marks
        them dead (a few seconds more), so that no gang is placed there meanwhile, or for a
        minute at most (the member's actor alone may have died). A node that comes back has a
        new id."""
        self._nodes: tuple[float, list[NodeState]] = (0.0, [])
        self.closed = threading.Event()
        self.watcher = threading.Thread(target=self._watch, daemon=True, name="ray-watcher")
        self.watcher.start()

    def close(self) -> None:
        """Stop watching; the gangs run on, for the next scheduler to adopt."""
        self.closed.set()
        self.watcher.join(timeout=5)
        if self.owns_ray:
            ray.shutdown()

    # --- the pool -------------------------------------------------------------------------

    def nodes(self) -> list[NodeState]:
        """Ray's alive nodes with GPUs, read at most every 0.2 s (a round trip to Ray's GCS)."""
        now = time.monotonic()
        if now - self._nodes[0] < 0.2:
            return self._nodes[1]
        states, addresses = [], {}
        entries = ray.nodes()  # type: ignore[no-untyped-call]
        with self.lock:
            alive = {str(e["NodeID"]) for e in entries if e.get("Alive")}
            self.suspects = {n: at for n, at in self.suspects.items() if n in alive and now - at < SUSPECT_FOR}
            suspects = set(self.suspects)
        for entry in entries:
            gpus = int(entry.get("Resources", {}).get("GPU", 0))
            if not entry.get("Alive") or gpus < 1 or str(entry["NodeID"]) in suspects:
                continue
            labels = entry.get("Labels") or {}
            types = [k.split(":", 1)[1] for k in entry["Resources"] if k.startswith("accelerator_type:")]
            accelerator = types[0] if types else None
            gpu_type = labels.get(GPU_TYPE_LABEL) or accelerator or "gpu"
            name = str(entry["NodeName"])
            addresses[name] = (str(entry["NodeID"]), str(entry["NodeManagerAddress"]))
            states.append(NodeState(Node(name, gpus, gpu_type), labels.get(VIRTUAL_LABEL) == "true"))
        states.sort(key=lambda s: s.node.name)
        with self.lock:
            self.addresses = addresses
        self._nodes = (now, states)
        return states

    # --- starting, telling, stopping ------------------------------------------------------

    def start(self, launch: Launch) -> Started:
        key = (launch.job_id, launch.attempt)
        name = owner(self.store_id, *key)
        self.nodes()
        with self.lock:
            missing = [m.node for m in launch.members if m.node not in self.addresses]
            if missing or not launch.members:
                # The scheduler's reason, not the job's: it is placed again after a back-off.
                raise OSError(f"Ray has no alive node {', '.join(missing)}" if missing else "a gang needs members")
            ids = [self.addresses[m.node][0] for m in launch.members]
            master = self.addresses[launch.members[0].node][1]
        specs = []
        for member in launch.members:
            first = member.rank == 0
            specs.append(
                Spawn(
                    member_folder(launch.attempt_dir, member.rank),
                    member_owner(name, member.rank),
                    launch.user,
                    launch.workdir,
                    launch.command,
                    launch.member_env(member, master, 0),
                    launch.stdout if first else None,
                    launch.stderr if first else None,
                    die_with_parent=True,
                )
            )
        bundles = [{"GPU": float(len(m.gpus))} if m.gpus else {"CPU": 0.01} for m in launch.members]
        group = placement_group(
            bundles,
            strategy="STRICT_SPREAD",
            name=name,
            lifetime="detached",
            bundle_label_selector=[{NODE_ID_LABEL: node_id} for node_id in ids],
        )
        gang = Gang(key, name, launch.attempt_dir, [m.node for m in launch.members], specs, group=group)
        gang.waiting[group.ready()] = ("placed", 0)
        with self.lock:
            self.gangs[key] = gang
        return Started(self._handle(gang), False, "")

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
            for rank, actor in enumerate(gang.actors):
                actor.notify.remote(deadline, rank == 0)

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

    def logs(self, job_id: int, attempt: int, rank: int, stream: str, attempt_dir: Path) -> BinaryIO | None:
        """From the attempt's folder, which every node writes (it is on shared storage)."""
        try:
            return (member_folder(attempt_dir, rank) / f"{stream}.log").open("rb")
        except OSError:
            return None

    # --- after a restart ------------------------------------------------------------------

    def adopt(self, recorded: Recorded) -> Started | Exit:
        """Its launcher actors by name, if every one of them is there and started its member;
        else how it ended, from its members' records (written on shared storage) when every
        member has one. A gang that never started any member is given back (`started=False`);
        one whose members ended unrecorded while no scheduler watched is `lost`. An attempt
        this executor tracks already (adopted again after a halt) is left as it is."""
        key = (recorded.job_id, recorded.attempt)
        with self.lock:
            known = self.gangs.get(key)
            if known is not None:
                return Started(self._handle(known), known.phase in ("running", "ending"), "adopted")
            queued = next((e for e in self.ended if (e.job_id, e.attempt) == key), None)
            if queued is not None:
                self.ended.remove(queued)
                return queued
        name = owner(self.store_id, *key)
        try:
            group: PlacementGroup | None = get_placement_group(name)
        except ValueError:
            group = None
        handle = recorded.handle or {}
        ranks = int(handle.get("ranks", 0)) or (group.bundle_count if group is not None else 0)
        actors = []
        for rank in range(ranks):
            with contextlib.suppress(ValueError):
                actors.append(ray.get_actor(member_owner(name, rank), namespace=self.namespace))
        statuses = self._statuses(actors)
        nodes = list(handle.get("nodes", []))
        gang = Gang(key, name, recorded.attempt_dir, nodes, None, "running", group=group, actors=actors)
        if ranks and len(actors) == ranks and all(s is not None and s["started"] for s in statuses):
            gang.started = set(range(ranks))
            for rank, actor in enumerate(actors):
                gang.waiting[actor.wait.remote(self.wait_timeout)] = ("ended", rank)
            with self.lock:
                self.gangs[key] = gang
                if recorded.notice_deadline is not None and not (recorded.attempt_dir / "notice").exists():
                    self.notify(*key, recorded.notice_deadline)  # recorded, but the scheduler died before giving it
                gang.notice = recorded.notice_deadline
            return Started(self._handle(gang), True, "adopted")
        # Not all there: no member of it may run on.
        for actor in actors:
            with contextlib.suppress(Exception):
                actor.kill.remote()
        exits = [self._recorded(recorded.attempt_dir, name, rank) for rank in range(ranks)]
        self._remove(gang)
        if ranks and all(e is not None for e in exits):
            ended = max(recorded_exit_time(member_folder(recorded.attempt_dir, r)) or 0.0 for r in range(ranks))
            return attempt_exit(key, {r: e for r, e in enumerate(exits) if e is not None}, None, None, ended or None)
        never = not any(s is not None and s["started"] for s in statuses) and not any(exits)
        if never and (group is not None or recorded.handle is None):
            return Exit(*key, None, "the scheduler stopped before its members started", started=False)
        if 0 < len(actors) < ranks:
            # Some launchers are there and others gone: their nodes died while no one watched.
            gone = f"{ranks - len(actors)} of its {ranks} members' launchers were gone when it was adopted"
            return Exit(*key, None, ended_at=recorded.since, node_lost=gone)
        return Exit(*key, None, "its members ended while no scheduler watched", ended_at=recorded.since)

    def _statuses(self, actors: list[Any]) -> list[dict[str, Any] | None]:
        """Each actor's `status`, None for one that does not answer (its node is gone)."""
        found: list[dict[str, Any] | None] = []
        for actor in actors:
            try:
                found.append(ray.get(actor.status.remote(), timeout=30))
            except Exception:  # a dead actor or node: Ray's errors have no common base
                found.append(None)
        return found

    def _handle(self, gang: Gang) -> Handle:
        return {
            "executor": "ray",
            "namespace": self.namespace,
            "group": gang.name,
            "ranks": len(gang.actors) or len(gang.specs or ()),
            "nodes": gang.nodes,
        }

    def _recorded(self, attempt_dir: Path, name: str, rank: int) -> dict[str, Any] | None:
        folder = member_folder(attempt_dir, rank)
        status, why, not_started = outcome(folder, member_owner(name, rank), None)
        if status is None and not_started is None:
            return None
        return {"exit_code": status, "why": why, "not_started": not_started}

    # --- the watcher ----------------------------------------------------------------------

    def _watch(self) -> None:
        while not self.closed.is_set():
            with self.lock:
                refs = [ref for gang in self.gangs.values() for ref in gang.waiting]
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

    def _safely(self, ref: Any, value: Any, error: BaseException | None) -> bool:
        """`_advance`, and for a gang it fails on (Ray refusing a call): given back if it was
        not running, else ended, so that no gang is left with nobody watching it."""
        found = self._gang_of(ref)
        if found is None:
            return False
        gang, kind, rank = found
        try:
            return self._advance(gang, kind, rank, ref, value, error)
        except Exception as exc:
            log.exception("a step of job %s attempt %s failed", *gang.key)
            if gang.phase in ("placing", "starting"):
                return self._give_back(gang, f"Ray refused a step: {str(exc).splitlines()[0][:300]}")
            self._end(gang, "Ray refused a step")
            return False

    def _gang_of(self, ref: Any) -> tuple[Gang, str, int] | None:
        for gang in self.gangs.values():
            if ref in gang.waiting:
                kind, rank = gang.waiting.pop(ref)
                return gang, kind, rank
        return None

    def _advance(self, gang: Gang, kind: str, rank: int, ref: Any, value: Any, error: BaseException | None) -> bool:
        if isinstance(error, GetTimeoutError):  # ready, but not here yet: looked at again
            gang.waiting[ref] = (kind, rank)
            return False
        if isinstance(error, ActorUnavailableError):
            # Often a passing fault: waited on again while its node is in the pool.
            node = gang.nodes[rank] if rank < len(gang.nodes) else None
            if kind == "ended" and node in self.addresses:
                gang.waiting[gang.actors[rank].wait.remote(self.wait_timeout)] = (kind, rank)
                return False
            return self._member_lost(gang, rank, error)
        if isinstance(error, RayActorError):
            return self._member_lost(gang, rank, error)
        if error is not None:  # the launcher raised: it could not start the member here
            if gang.phase in ("placing", "starting"):
                return self._give_back(gang, f"rank {rank} could not start: {str(error).splitlines()[0][:300]}")
            return self._member_lost(gang, rank, error)
        if kind == "placed":
            self._place(gang)
        elif kind == "started":
            gang.started.add(rank)
            if gang.phase == "starting" and len(gang.started) == len(gang.actors):
                gang.phase = "running"
                for rank_, actor in enumerate(gang.actors):
                    gang.waiting[actor.wait.remote(self.wait_timeout)] = ("ended", rank_)
                self.running[gang.key] = f"on nodes {', '.join(gang.nodes)}"
                return True
        elif kind == "ended":
            if value is None:  # still running: asked again (a wait holds a thread of the actor)
                gang.waiting[gang.actors[rank].wait.remote(self.wait_timeout)] = (kind, rank)
                return False
            gang.ended[rank] = value
            # A member that fails stops the others at once; after a notice they all have until
            # the deadline (the one that saves the checkpoint may still be at it).
            if value.get("exit_code") != 0 and gang.notice is None and gang.phase != "ending":
                gang.failure = value
                self._end(gang, f"rank {rank} ended with {value.get('exit_code')}")
            return self._finish_if_done(gang)
        return False

    def _place(self, gang: Gang) -> None:
        """The placement group is reserved: a launcher actor in each bundle starts its member."""
        assert gang.specs is not None and gang.group is not None
        gang.phase = "starting"
        for rank in range(len(gang.specs)):
            strategy = PlacementGroupSchedulingStrategy(gang.group, placement_group_bundle_index=rank)
            gang.actors.append(
                Launcher.options(
                    name=member_owner(gang.name, rank),
                    namespace=self.namespace,
                    lifetime="detached",
                    num_cpus=0,
                    num_gpus=0,
                    max_restarts=0,
                    max_concurrency=8,
                    scheduling_strategy=strategy,
                ).remote()
            )
        port = gang.actors[0].free_port.remote()
        for rank, (actor, spec) in enumerate(zip(gang.actors, gang.specs, strict=True)):
            gang.waiting[actor.start.remote(spec, str(gang.attempt_dir), port)] = ("started", rank)

    def _member_lost(self, gang: Gang, rank: int, exc: BaseException) -> bool:
        node = gang.nodes[rank] if rank < len(gang.nodes) else "?"
        if gang.phase in ("placing", "starting"):
            return self._give_back(gang, f"node {node} was lost before it ran ({type(exc).__name__})")
        what = f"node {node} (rank {rank}) was lost: {type(exc).__name__}"
        if node in self.addresses:
            self.suspects[self.addresses[node][0]] = time.monotonic()
            self._nodes = (0.0, [])  # the pool is read again at the next look
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
        if gang.phase in ("placing", "starting"):
            self._give_back(gang, why, started=True)
            return
        gang.phase = "ending"
        gang.since = time.monotonic()
        for rank, actor in enumerate(gang.actors):
            if rank not in gang.ended:
                actor.kill.remote()

    def _give_back(self, gang: Gang, why: str, started: bool = False) -> bool:
        """Take down a gang that did not run (no member of it runs afterwards)."""
        return self._report(gang, Exit(*gang.key, None, why, started=started))

    def _finish_if_done(self, gang: Gang) -> bool:
        if len(gang.ended) < len(gang.actors):
            return False
        return self._report(gang, attempt_exit(gang.key, gang.ended, gang.failure, gang.lost, None))

    def _report(self, gang: Gang, exit: Exit) -> bool:
        """The gang's end, once: a gang already taken down reports nothing more."""
        if self.gangs.get(gang.key) is not gang:
            return False
        self._remove(gang)
        self.ended.append(exit)
        return True

    def _remove(self, gang: Gang) -> None:
        """The gang's actors and placement group, once no member of it runs."""
        self.gangs.pop(gang.key, None)
        for actor in gang.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        if gang.group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(gang.group)

    def _check_time(self) -> bool:
        """Gangs not running within `start_timeout`, or whose node left before they ran, are
        given back whole; a gang whose members do not all end within `end_timeout` of being
        killed is taken as ended (its node is gone with them)."""
        changed = False
        now = time.monotonic()
        alive = set(self.addresses)
        for gang in list(self.gangs.values()):
            if gang.phase in ("placing", "starting"):
                gone = [n for n in gang.nodes if n not in alive]
                if gone:
                    changed |= self._give_back(gang, f"node {', '.join(gone)} left before it ran")
                elif now - gang.since > self.start_timeout:
                    changed |= self._give_back(gang, f"Ray did not start it within {self.start_timeout:.0f} s")
            elif gang.phase == "ending" and now - gang.since > self.end_timeout:
                # A member that does not end when killed is on a node that hangs: lost with it.
                for rank in [r for r in range(len(gang.actors)) if r not in gang.ended]:
                    self._member_lost(gang, rank, TimeoutError(f"did not end {self.end_timeout:.0f} s after SIGKILL"))
                changed |= self._finish_if_done(gang)
        return changed
