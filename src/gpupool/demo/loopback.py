"""A Ray cluster of several nodes on one machine, for the cluster demo, the tests and the
benchmarks: each node on its own loopback address (127.0.0.2, .3, …; Ray rewrites 127.0.0.1 to
the machine's address; cluster `k` of several on one machine uses 127.0.k.2, …, its own ports
and its own range of worker ports), with virtual GPUs, its own temp folder, and node-death detection tuned
to seconds (as `docs/cluster.md` advises for a real head). Stopped by pid, in the order
`ray stop` uses, so that no other Ray on the machine is touched.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

HEALTH_CHECKS = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
"""A crashed node is seen dead in about 3-4 s (2.6 s in `benchmarks/ray_cluster.py`), a hung one
in about 5 s (Ray's defaults: 13 s and 65 s)."""


@dataclass
class LoopbackCluster:
    root: Path
    nodes: int = 3
    gpus: int = 4
    k: int = 0
    """Which of several clusters on this machine (at most 8)."""
    names: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return 6390 + 100 * self.k

    @property
    def address(self) -> str:
        return f"{self.ip(0)}:{self.port}"

    def ip(self, index: int) -> str:
        return f"127.0.{self.k}.{index + 2}"

    def env(self) -> dict[str, str]:
        return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", **HEALTH_CHECKS}

    def _ray(self, index: int, *extra: str) -> subprocess.Popen[bytes]:
        ray = Path(sys.executable).with_name("ray")
        folder = self.root / f"node{index}"
        folder.mkdir(parents=True, exist_ok=True)
        command = [
            str(ray),
            "start",
            f"--node-ip-address={self.ip(index)}",
            f"--temp-dir={folder}",
            "--num-cpus=1",
            f"--num-gpus={self.gpus}",
            "--object-store-memory=80000000",
            "--disable-usage-stats",
            f"--min-worker-port={20000 + 1000 * self.k}",
            f"--max-worker-port={20999 + 1000 * self.k}",
            '--labels={"gpupool.io/gpu-type": "virtual", "gpupool.io/virtual": "true"}',
            *extra,
        ]
        log = (self.root / f"node{index}.log").open("ab")
        with log:
            return subprocess.Popen(command, env=self.env(), stdout=log, stderr=subprocess.STDOUT)

    def start(self, timeout: float = 120.0) -> None:
        """The head, then every other node at once; raises if one did not come up."""
        self.root.mkdir(parents=True, exist_ok=True)
        head = self._ray(0, "--head", f"--port={self.port}", "--include-dashboard=false")
        self._wait([head], timeout)
        self._wait([self._ray(i, f"--address={self.address}") for i in range(1, self.nodes)], timeout)
        self.names = [self.ip(i) for i in range(self.nodes)]

    def add_node(self, index: int, timeout: float = 120.0) -> None:
        """Start node `index` (again, after `kill_node`): it joins with a new Ray node id."""
        self._wait([self._ray(index, f"--address={self.address}")], timeout)

    def _wait(self, starting: list[subprocess.Popen[bytes]], timeout: float) -> None:
        for process in starting:
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                raise RuntimeError(f"ray start did not finish within {timeout:.0f} s: see {self.root}") from None
            if code != 0:
                raise RuntimeError(f"ray start failed ({code}): see {self.root}")

    def pids(self, index: int | None = None) -> list[tuple[int, str]]:
        """(pid, program) of this cluster's processes (of one node), found by their temp folder."""
        marker = str(self.root / f"node{index}") if index is not None else str(self.root)
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                args = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(marker.encode() in arg for arg in args) and int(proc.name) != os.getpid():
                found.append((int(proc.name), args[0].decode(errors="replace")))
        return found

    def kill_node(self, index: int) -> None:
        """SIGKILL the node's raylet: the node crashes (its workers die with it)."""
        for pid, program in self.pids(index):
            if program.endswith("raylet"):
                _signal(pid, signal.SIGKILL)

    def stop(self) -> None:
        """Raylets first, then the agents and monitors, the GCS last."""
        for chosen in (
            lambda p: p.endswith("raylet"),
            lambda p: not p.endswith(("raylet", "gcs_server")),
            lambda p: p.endswith("gcs_server"),
        ):
            group = [pid for pid, program in self.pids() if chosen(program)]
            for pid in group:
                _signal(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(_alive(pid) for pid in group):
                time.sleep(0.1)
            for pid in group:
                if _alive(pid):
                    _signal(pid, signal.SIGKILL)
        # Workers left by a killed raylet belong to no node any more: none may outlive the cluster.
        for pid, _ in self.pids():
            if _alive(pid):
                _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):  # gone already
        os.kill(pid, sig)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def unused_k() -> int:
    """The number of a loopback cluster no other on this machine uses now, from the top (the
    tests' clusters take the lowest ones)."""
    for k in range(7, -1, -1):
        with socket.socket() as probe:
            try:
                probe.bind((f"127.0.{k}.2", 6390 + 100 * k))
            except OSError:
                continue
        return k
    raise RuntimeError("eight loopback Ray clusters run on this machine already")


@contextmanager
def loopback_cluster(root: Path, nodes: int = 3, gpus: int = 4, k: int = 0) -> Iterator[LoopbackCluster]:
    cluster = LoopbackCluster(root, nodes, gpus, k)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
