"""How an executor contains its attempts: each member in a cgroup of its own (`cgroups.py`),
under one folder per store, with the limits its job asked for or the pool's defaults; or, where
this host cannot (not root, no cgroup filesystem, a controller missing), process groups, and
`gpupool up` says what is lost then (docs/containment.md)."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from gpupool.executors import Member, NodeState, Resources
from gpupool.executors.cgroups import Cgroup, Layout, Limits, Request, cgroup_path
from gpupool.units import human_bytes


class ContainmentUnavailable(RuntimeError):
    """`containment.mode: cgroups`, and this host cannot give them: why."""


@dataclass(frozen=True, slots=True)
class Containment:
    """What an executor needs to put each member in its cgroup: where, and the defaults."""

    store_id: str
    root: str = "gpupool"
    mem_per_gpu: int | None = None
    cpus_per_gpu: float | None = None
    cpu_quota: bool = False
    pids: int | None = 16384
    devices: str = "/dev/nvidia{index}"

    def request(self, job_id: int, attempt: int, member: Member, node_gpus: int, resources: Resources) -> Request:
        """The member's cgroup and what it may use: the job's own figures, else the defaults."""
        given_mem = resources.mem_per_gpu is not None or resources.mem is not None
        return Request(
            cgroup=cgroup_path(self.root, self.store_id, job_id, attempt, member.rank),
            gpus=member.gpus,
            node_gpus=node_gpus,
            mem=resources.mem,
            mem_per_gpu=resources.mem_per_gpu if given_mem else self.mem_per_gpu,
            cpus_per_gpu=resources.cpus_per_gpu if resources.cpus_per_gpu is not None else self.cpus_per_gpu,
            cpu_quota=self.cpu_quota,
            pids=self.pids,
            devices=self.devices,
        )


def unfit(resources: Resources, gpus_on_node: int, nodes: list[NodeState]) -> str | None:
    """Why no node could ever give a job what it asks besides GPUs (`gpus_on_node` on each of
    its nodes), naming the field and the limit it breaks; None when one could (or when no
    node's size is known)."""
    memories = [n.memory for n in nodes if n.memory is not None]
    need = resources.mem
    field = "mem"
    if need is None and resources.mem_per_gpu is not None:
        need, field = resources.mem_per_gpu * gpus_on_node, "mem_per_gpu"
    if need is not None and memories and need > max(memories):
        per = f" ({human_bytes(resources.mem_per_gpu or 0)} × {gpus_on_node} GPUs)" if field == "mem_per_gpu" else ""
        return f"{field}: {human_bytes(need)}{per} on a node, and the largest node has {human_bytes(max(memories))}"
    cpus = [n.cpus for n in nodes if n.cpus is not None]
    if resources.cpus_per_gpu is not None and cpus:
        wanted = resources.cpus_per_gpu * gpus_on_node
        if wanted > max(cpus):
            largest = max(cpus)
            return f"cpus_per_gpu: {wanted:g} CPUs on a node ({gpus_on_node} GPUs), and the largest node has {largest}"
    return None


def unavailable(layout: Layout, root: str = "gpupool") -> str | None:
    """Why this process cannot contain attempts in cgroups here, or None when it can: it makes
    and removes one under `root` to know (a container may show the controllers on a read-only
    cgroup filesystem, or in a namespace whose root holds its own processes)."""
    if os.geteuid() != 0:
        return "gpupool up does not run as root"
    if layout.unified is None and not layout.v1:
        return "no cgroup filesystem is mounted"
    missing = layout.missing()
    if missing:
        return f"no cgroup controller for {', '.join(missing)}"
    probe = Cgroup(layout, f"{root}/probe-{os.getpid()}-{threading.get_ident()}")
    try:
        probe.create(Limits(pids=16))
    except OSError as exc:
        return f"no cgroup can be made under {root} ({exc.strerror or exc})"
    finally:
        probe.remove()
    return None


def detect(mode: str, containment: Containment) -> tuple[Containment | None, str]:
    """The containment to use for `mode` (auto, cgroups, off), and what to say of it at start."""
    if mode == "off":
        return None, "attempts are process groups (containment.mode: off)"
    layout = Layout.read()
    why = unavailable(layout, containment.root)
    if why is None:
        fence = "devices controller" if layout.fences_devices() else "a mount namespace per attempt"
        return containment, f"each attempt in a cgroup: {layout.describe()}; GPUs fenced by the {fence}"
    if mode == "cgroups":
        raise ContainmentUnavailable(f"containment.mode is cgroups, but {why}")
    return None, (
        f"attempts are process groups, not cgroups ({why}): a job's leftover processes may outlive it, "
        "and no memory, CPU or GPU fence applies (docs/containment.md)"
    )
