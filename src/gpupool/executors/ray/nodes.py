"""The pool's nodes on a Ray cluster: every alive Ray node with GPUs, once Ray has reserved all
of its GPUs for the pool and the node's launcher actor (`launcher.py`) is up in that
reservation.

A node's reservation is a detached placement group of one bundle holding every GPU of the
node, pinned to it by its `ray.io/node-id` label; the launcher lives in that bundle. The core
decides which of those GPUs each attempt gets, and the launcher starts the attempt's member
with exactly them: no other Ray work is given a GPU of the pool, and starting an attempt asks
nothing of Ray's scheduler (making a placement group and an actor per attempt limited starts
to a few a second). Both are named after the node's Ray id, so a restarted scheduler finds
them again; a node that comes back after dying has a new id, and a new reservation.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import ray
from ray._raylet import PlacementGroupID
from ray.util.placement_group import (
    PlacementGroup,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from gpupool.executors import NodeState
from gpupool.executors.ray.launcher import NodeLauncher
from gpupool.model import Node

log = logging.getLogger("gpupool.ray")

GPU_TYPE_LABEL = "gpupool.io/gpu-type"
"""A node label (`ray start --labels`) naming its GPU type; else Ray's `accelerator_type:`
resource (set where Ray detects NVIDIA GPUs); else `gpu`."""
VIRTUAL_LABEL = "gpupool.io/virtual"
"""`true` on nodes whose GPUs are not real ones (`ray start --num-gpus` on a test machine)."""
NODE_ID_LABEL = "ray.io/node-id"
SUSPECT_FOR = 60.0
READ_EVERY = 0.2
Launcher = ray.remote(NodeLauncher)


def fetch(ref: Any) -> tuple[Any, BaseException | None]:
    """A ready ref's value, or the error Ray raises for it."""
    try:
        return ray.get(ref, timeout=5), None
    except Exception as exc:  # Ray's errors, and the launcher's own, have no common base
        return None, exc


@dataclass
class RayNode:
    state: NodeState
    id: str
    address: str
    launcher: Any = None
    ready: Any = None
    """The launcher's `ping` while it is not up yet (its reservation may be waiting)."""
    since: float = 0.0
    up: bool = False
    incarnation: str = ""
    """Its launcher's (`NodeLauncher.incarnation`), once it is up."""


class RayNodes:
    """Ray's alive GPU nodes, read at most every `READ_EVERY` s (a round trip to Ray's GCS),
    and their launchers. Thread-safe: the control loop reads the pool, the watcher sets
    nodes aside."""

    def __init__(self, namespace: str, reserve_timeout: float) -> None:
        self.namespace = namespace
        self.reserve_timeout = reserve_timeout
        self.lock = threading.RLock()
        self.known: dict[str, RayNode] = {}
        """Ray node id → the node, as of the last look: alive ones, whether up or not yet."""
        self.suspects: dict[str, float] = {}
        """Ray node ids of nodes that lost a member, with when: out of the pool until Ray marks
        them dead (a few seconds more), so that no gang is placed there meanwhile, or for a
        minute at most (the member's launcher alone may have died)."""
        self.read_at = 0.0
        self.refreshing = threading.Lock()

    def pool(self) -> list[NodeState]:
        """The nodes whose launcher is up, not set aside."""
        self.refresh()
        with self.lock:
            nodes = [n.state for n in self.known.values() if n.up and n.id not in self.suspects]
        return sorted(nodes, key=lambda s: s.node.name)

    def addresses(self) -> list[str]:
        """The IP addresses of the pool's nodes."""
        with self.lock:
            return sorted(n.address for n in self.known.values() if n.up)

    def launchers(self) -> list[Any]:
        """The launchers of the pool's nodes that are up."""
        with self.lock:
            return [n.launcher for n in self.known.values() if n.up and n.launcher is not None]

    def by_name(self, name: str) -> RayNode | None:
        """The node of that name if its launcher is up, as it is now (a copy)."""
        with self.lock:
            found = next(
                (n for n in self.known.values() if n.state.node.name == name and n.up and n.launcher is not None), None
            )
            return replace(found) if found is not None else None

    def by_id(self, node_id: str) -> RayNode | None:
        with self.lock:
            return self.known.get(node_id)

    def set_aside(self, node_id: str) -> None:
        with self.lock:
            self.suspects[node_id] = time.monotonic()
            self.read_at = 0.0  # the pool is read again at the next look

    def forget_launcher(self, node_id: str) -> None:
        """Its launcher died: a new one is made at the next look, while the node is alive."""
        with self.lock:
            node = self.known.get(node_id)
            if node is not None:
                node.launcher, node.ready, node.up = None, None, False

    def wait_up(self, timeout: float) -> None:
        """Until every alive GPU node's launcher is up, or `timeout` s (a node whose GPUs
        Ray cannot reserve joins later)."""
        deadline = time.monotonic() + timeout
        self.refresh(force=True)
        self._sweep()
        while time.monotonic() < deadline:
            self.refresh(force=True)
            with self.lock:
                if all(n.up for n in self.known.values()):
                    return
            time.sleep(0.05)

    def refresh(self, force: bool = False) -> None:
        """Read Ray's nodes again (one thread at a time; the others go on with the last look).
        Ray is called outside the lock: readers never wait on Ray's answers."""
        now = time.monotonic()
        with self.lock:
            if not force and now - self.read_at < READ_EVERY:
                return
            self.read_at = now
        if not self.refreshing.acquire(blocking=False):
            return
        try:
            seen = self._alive()
            with self.lock:
                self.suspects = {n: at for n, at in self.suspects.items() if n in seen and now - at < SUSPECT_FOR}
                gone = [self.known.pop(node_id) for node_id in set(self.known) - set(seen)]
                for node_id, (state, address) in seen.items():
                    self.known.setdefault(node_id, RayNode(state, node_id, address))
                coming = [n for n in self.known.values() if not n.up]
            for node in gone:
                self._gone(node)
            for node in coming:
                self._bring_up(node, now)
        finally:
            self.refreshing.release()

    @staticmethod
    def _alive() -> dict[str, tuple[NodeState, str]]:
        """Ray's alive nodes with GPUs: Ray node id → the node, and its IP address."""
        seen = {}
        for entry in ray.nodes():  # type: ignore[no-untyped-call]
            gpus = int(entry.get("Resources", {}).get("GPU", 0))
            if not entry.get("Alive") or gpus < 1:
                continue
            labels = entry.get("Labels") or {}
            types = [k.split(":", 1)[1] for k in entry["Resources"] if k.startswith("accelerator_type:")]
            gpu_type = labels.get(GPU_TYPE_LABEL) or (types[0] if types else None) or "gpu"
            state = NodeState(Node(str(entry["NodeName"]), gpus, gpu_type), labels.get(VIRTUAL_LABEL) == "true")
            seen[str(entry["NodeID"])] = (state, str(entry["NodeManagerAddress"]))
        return seen

    def _bring_up(self, node: RayNode, now: float) -> None:
        """A launcher for a node without one (its reservation first), or whether it is up."""
        with self.lock:
            ready = node.ready if node.launcher is not None else None
        if ready is None:
            launcher = self._launcher(node)
            ready = launcher.ping.remote()
            with self.lock:
                node.launcher, node.ready, node.since = launcher, ready, now
            return
        done, _ = ray.wait([ready], timeout=0)
        if done:
            try:
                incarnation = str(ray.get(ready, timeout=5)["incarnation"])
            except Exception as exc:  # Ray's errors have no common base
                log.warning("node %s: its launcher did not start (%s); trying again", node.state.node.name, exc)
                incarnation = ""
            with self.lock:
                if node.ready is not ready:  # its launcher was given up meanwhile: made again
                    return
                if incarnation:
                    node.up, node.incarnation = True, incarnation
                else:
                    node.launcher = node.ready = None
        elif now - node.since > self.reserve_timeout:
            log.warning(
                "node %s: Ray has not reserved its %d GPUs for the pool within %.0f s (does other Ray work hold "
                "them?); it joins the pool once Ray does",
                node.state.node.name,
                node.state.node.gpus,
                self.reserve_timeout,
            )
            node.since = now

    def _launcher(self, node: RayNode) -> Any:
        name = f"{self.namespace}:node:{node.id}"
        try:
            group: PlacementGroup = get_placement_group(name)
        except ValueError:
            group = placement_group(
                [{"GPU": float(node.state.node.gpus)}],
                name=name,
                lifetime="detached",
                bundle_label_selector=[{NODE_ID_LABEL: node.id}],
            )
        return Launcher.options(
            name=f"node:{node.id}",
            namespace=self.namespace,
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,
            num_gpus=0,
            max_restarts=0,
            max_concurrency=64,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
        ).remote()

    def existing_launcher(self, node_id: str) -> Any:
        """The launcher a scheduler before this one left on that node, or None."""
        try:
            return ray.get_actor(f"node:{node_id}", namespace=self.namespace)
        except ValueError:
            return None

    def _sweep(self) -> None:
        """Reservations of nodes that died while no scheduler of this store watched."""
        prefix = f"{self.namespace}:node:"
        with self.lock:
            alive = set(self.known)
        for group_id, entry in placement_group_table().items():
            name = str(entry.get("name") or "")
            if name.startswith(prefix) and name[len(prefix) :] not in alive and entry.get("state") != "REMOVED":
                with contextlib.suppress(Exception):
                    remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(group_id)))

    def _gone(self, node: RayNode) -> None:
        """A node Ray has marked dead: its reservation is removed (else Ray would keep it
        pending, for a node id that never comes back)."""
        with contextlib.suppress(Exception):
            remove_placement_group(get_placement_group(f"{self.namespace}:node:{node.id}"))
