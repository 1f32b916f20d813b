"""A shell session on the loopback Ray cluster (issue 35): its terminal is on the node that
holds its GPUs, reached through the API and that node's launcher actor (no SSH), and it does
there what it does on the local executor: the window's size, Ctrl-C, detach and attach, and
the shell's exit code as the job's; it preempts batch work within its victims' grace and a
second; idle, it is warned, then reclaimed, and its GPUs start the next job; and another
team's token cannot attach."""

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
from tests.support.sessions import Sessions, serving

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


@pytest.fixture
def lab(cluster: LoopbackCluster, tmp_path: Path) -> Iterator[Sessions]:
    """The interactive class (idle after 3 s, warned 2 s before its end) on the Ray cluster."""
    yield from serving(Sessions(tmp_path, idle="3s", ray_address=cluster.address))


def test_on_ray_a_shell_preempts_batch_work_is_reclaimed_idle_and_is_only_its_users(lab: Sessions) -> None:
    nodes = {n["name"]: n["gpus"] for n in lab.json("/pool")["nodes"]}
    gpus = max(nodes.values())  # one node's, all of them
    batch = [lab.submit("--gpus", str(g), "--", "sleep", "600") for g in nodes.values()]  # every GPU held
    wait_for(lambda: all(state(lab, b) == "running" for b in batch), timeout=60)
    for team in ("vision", "nlp"):
        lab.cli("team", "set", team)
    tokens = {}
    for user, team in (("ana", "vision"), ("eve", "nlp")):
        made = lab.cli("user", "set", user, "--team", team, "--new-token")
        assert made.returncode == 0, made.stderr
        tokens[user] = made.stdout.split()[-1]
    began = time.monotonic()
    env = {**lab.env, "GPUPOOL_TOKEN": tokens["ana"]}
    shell = pexpect.spawn(
        sys.executable, ["-m", "gpupool", "shell", "--gpus", str(gpus), "--", "/bin/sh"], env=env, encoding="utf-8"
    )
    shell.logfile_read = sys.stdout
    shell.expect(r"job (\d+) submitted", timeout=60)
    match = shell.match
    assert isinstance(match, re.Match)
    job = int(match.group(1))
    shell.expect(PROMPT, timeout=60)
    took = time.monotonic() - began
    assert took <= 2 + 1 + 3, took  # the victims' grace (2 s) and 1 s, and the client's own start
    eve = {**lab.env, "GPUPOOL_TOKEN": tokens["eve"]}
    refused = lab.run_cli(eve, "attach", str(job))
    assert refused.returncode == 5, refused.stderr
    shell.expect(r"idle for .*it ends and its GPUs go back to the pool", timeout=60)
    shell.expect("this session ends", timeout=60)
    shell.expect(pexpect.EOF, timeout=60)
    shell.close()
    assert shell.exitstatus == 125
    assert state(lab, job) == "cancelled"
    wait_for(lambda: all(state(lab, b) == "running" for b in batch), timeout=60)  # its GPUs went back
