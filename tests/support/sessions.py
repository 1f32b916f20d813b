"""A live service for sessions (issue 35): `gpupool up` with the interactive class and short
idle and detach settings, and `gpupool shell`/`attach`/`run` in a real pseudo-terminal
(pexpect). For the live tests and the benchmark of sessions."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect

from tests.support.live import Service, running

PROMPT = r"[#$] "
FAKE_NVML = Path(__file__).resolve().parent / "fake_nvml"
H100 = {"name": "NVIDIA H100 80GB HBM3", "memory": 85520809984}

LAB = """
service: {{data_dir: {data}, port: {port}, virtual_gpus: 2, interval: 0.2, run_as: service{executor}}}
sessions: {{detach_grace: {detach}, idle_notice: 2s, idle_counts_after: 1s}}
classes:
  interactive: {{value: 500, may_preempt: true, preemptible: false, grace_period: 10s, time_limit: 1h,
                idle_after: {idle}}}
  low: {{value: 0, may_preempt: false, preemptible: true, min_runtime: 0s, grace_period: 2s}}
"""


class Sessions(Service):
    def __init__(
        self, tmp: Path, idle: str = "1h", detach: str = "10m", ray_address: str | None = None, contain: str = "auto"
    ) -> None:
        super().__init__(tmp)
        executor = f", executor: ray, ray_address: '{ray_address}', start_timeout: 20s" if ray_address else ""
        executor += f", containment: {{mode: {contain}}}"
        self.config.write_text(LAB.format(data=self.data, port=self.port, idle=idle, detach=detach, executor=executor))
        if ray_address:
            self.env["RAY_AUTH_MODE"] = "disabled"
        self.env = {**self.env, "TERM": "xterm", "GPUPOOL_CONFIG": str(self.config), "PS1": "$ "}

    def spawn(self, *args: str, timeout: float = 30) -> pexpect.spawn[str]:
        """`gpupool ARGS` in a terminal of 24 rows and 80 columns."""
        child = pexpect.spawn(
            sys.executable,
            ["-m", "gpupool", *args],
            env=self.env,
            encoding="utf-8",
            timeout=timeout,
            dimensions=(24, 80),
        )
        child.logfile_read = sys.stdout
        return child

    nvml: Path | None = None

    def gpus(self, pids: list[int], utilization: int) -> None:
        """What the fake NVML shows: `pids` on GPU 0, which is this busy (percent)."""
        assert self.nvml is not None
        processes = [{"pid": pid, "memory": 1 << 30} for pid in pids]
        gpus = [{**H100, "processes": processes, "utilization": utilization}, {**H100, "processes": []}]
        partial = self.nvml.with_suffix(".tmp")
        partial.write_text(json.dumps({"gpus": gpus}))
        partial.replace(self.nvml)

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {(self.data / 'admin.token').read_text().strip()}"}

    def json(self, path: str) -> Any:
        response = self.get(path)
        assert response is not None and response.is_success
        return response.json()

    def job(self, job: int) -> dict[str, Any]:
        return dict(self.json(f"/jobs/{job}"))

    def ended(self, child: pexpect.spawn[str], timeout: float = 30) -> int:
        child.expect(pexpect.EOF, timeout=timeout)
        child.close()
        assert child.exitstatus is not None, child.signalstatus
        return int(child.exitstatus)


def serving(lab: Sessions) -> Iterator[Sessions]:
    """A fixture's body: `gpupool up` for these sessions, then stop it and what it left."""
    for _ in running(lab):
        yield lab
