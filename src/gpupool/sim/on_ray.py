"""Replays on a Ray cluster, the engine the Ray executor uses: each run of a sweep (or of an
advice) one Ray task, the trace put once in Ray's object store. Every node needs gpupool (the
same version) importable, as for the executor."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any

from gpupool.sim.replay import ClusterSpec, Policy, Settings, replay
from gpupool.sim.trace import Trace


def _report(trace: Trace, spec: ClusterSpec, policy: Policy, settings: Settings) -> dict[str, Any]:
    return replay(trace, spec, policy, settings).report


def replay_on_ray(
    trace: Trace,
    runs: Sequence[tuple[ClusterSpec, Policy, Settings]],
    address: str,
    on_done: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """The report of each run, in order, each replayed by a Ray task (one CPU) of the cluster
    at `address` (`auto`: this machine's). A process already connected to Ray stays connected
    to its cluster; otherwise it connects here and disconnects at the end."""
    try:
        import ray
    except ImportError:
        raise ValueError("--ray needs Ray: pip install 'gpupool[ray]'") from None
    _check_reachable(address)
    connected_here = not ray.is_initialized()
    if connected_here:
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ValueError(f"--ray {address}: cannot connect to a Ray cluster there ({exc})") from None
    try:
        task = ray.remote(num_cpus=1)(_report)
        shared = ray.put(trace)
        waiting = {task.remote(shared, *run): i for i, run in enumerate(runs)}
        reports: dict[int, dict[str, Any]] = {}
        while waiting:
            done, _ = ray.wait(list(waiting), num_returns=1)
            for ref in done:
                try:
                    reports[waiting.pop(ref)] = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    # A run refused (bad settings) says why in one line, as it does here.
                    if isinstance(exc.cause, ValueError):
                        raise ValueError(str(exc.cause)) from None
                    raise
                if on_done is not None:
                    on_done(len(reports))
        return [reports[i] for i in range(len(runs))]
    finally:
        if connected_here:
            ray.shutdown()


def _check_reachable(address: str) -> None:
    """Refuse at once a `host:port` nothing listens on (Ray itself would retry for minutes)."""
    if address == "auto":
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--ray {address!r}: expected host:port or auto")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise ValueError(f"--ray {address}: no Ray cluster answers there ({exc.strerror or exc})") from None
