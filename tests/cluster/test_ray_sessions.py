"""A shell session on the loopback Ray cluster (issue 35): its terminal is on the node that
holds its GPUs, reached through the API and that node's launcher actor (no SSH), and it does
there what it does on the local executor: the window's size, Ctrl-C, detach and attach, and
the shell's exit code as the job's."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from gpupool.demo.loopback import LoopbackCluster
from tests.support.live import running, state, wait_for
from tests.support.ray import RayService

PROMPT = r"[#$] "


@pytest.fixture
def service(cluster: LoopbackCluster, tmp_path: Path) -> Iterator[RayService]:
    yield from running(RayService(tmp_path, cluster.address))  # type: ignore[misc]


def shell(service: RayService, *args: str) -> pexpect.spawn[str]:
    env = {**service.env, "TERM": "xterm", "PS1": "$ ", "GPUPOOL_CONFIG": str(service.config)}
    child = pexpect.spawn(
        sys.executable, ["-m", "gpupool", *args], env=env, encoding="utf-8", timeout=60, dimensions=(24, 80)
    )
    child.logfile_read = sys.stdout
    return child


def ended(child: pexpect.spawn[str]) -> int:
    child.expect(pexpect.EOF, timeout=60)
    child.close()
    assert child.exitstatus is not None
    return int(child.exitstatus)


def test_a_shell_on_a_ray_node_has_its_gpus_its_window_detach_attach_and_its_exit_code(service: RayService) -> None:
    began = time.monotonic()
    first = shell(service, "shell", "-p", "high", "--gpus", "2", "--", "/bin/sh")
    first.expect(r"job (\d+) submitted")
    match = first.match
    assert isinstance(match, re.Match)
    job = int(match.group(1))
    first.expect(PROMPT)
    assert time.monotonic() - began < 60  # a generous ceiling; the benchmark measures it
    first.sendline("echo GPUS=$CUDA_VISIBLE_DEVICES NODE=$GPUPOOL_NODE")
    first.expect(r"GPUS=\d,\d NODE=\S+")
    first.sendline("stty size")
    first.expect("24 80")
    first.setwinsize(40, 120)
    time.sleep(0.5)
    first.sendline("stty size")
    first.expect("40 120")
    first.sendline("sleep 30; echo slept")
    time.sleep(0.5)
    first.sendintr()
    first.expect(PROMPT, timeout=10)
    first.sendline("echo MARK-ONE")
    first.expect("MARK-ONE\r\n")
    first.send("~.")
    assert ended(first) == 0
    assert state(service, job) == "running"
    again = shell(service, "attach", str(job))
    again.expect("MARK-ONE")
    again.sendline("exit 3")
    assert ended(again) == 3
    wait_for(lambda: state(service, job) == "failed", timeout=30)
