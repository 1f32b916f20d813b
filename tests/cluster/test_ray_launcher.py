"""A node's launcher actor as a plain object (no Ray cluster needed): the order of its members'
ends, and a member given up before it could start never starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpupool.executors.proc import process_started
from gpupool.executors.ray_launcher import NodeLauncher
from gpupool.executors.spawn import Spawn
from gpupool.testing import wait_for


def member(tmp_path: Path, owner: str, *command: str) -> Spawn:
    return Spawn(tmp_path / owner, owner, None, tmp_path, [sys.executable, "-c", *command], {})


def test_ends_are_told_in_order_once_each_and_running_members_are_known(tmp_path: Path) -> None:
    launcher = NodeLauncher()
    launcher.start(member(tmp_path, "s:1:0:0", "raise SystemExit(3)"), str(tmp_path), 0)
    launcher.start(member(tmp_path, "s:2:0:0", "import time; time.sleep(60)"), str(tmp_path), 0)
    seq, ends = launcher.ended(0, timeout=30)
    assert (seq, [(o, e["exit_code"]) for o, e in ends]) == (1, [("s:1:0:0", 3)])
    assert launcher.ended(seq, timeout=0.2) == (1, []), "told once"
    assert launcher.status(["s:1:0:0", "s:2:0:0", "s:3:0:0"]) == {"s:1:0:0": ends[0][1], "s:2:0:0": None}
    launcher.kill("s:2:0:0")
    seq, ends = launcher.ended(seq, timeout=30)
    assert seq == 2 and [o for o, _ in ends] == ["s:2:0:0"]
    launcher.forget(["s:1:0:0", "s:2:0:0"])
    assert launcher.status(["s:1:0:0", "s:2:0:0"]) == {}


def test_a_member_forgotten_before_its_start_arrives_never_starts(tmp_path: Path) -> None:
    launcher = NodeLauncher()
    launcher.forget(["s:4:0:1"])  # the gang was given up; its start was still on its way
    with pytest.raises(RuntimeError, match="given up"):
        launcher.start(member(tmp_path, "s:4:0:1", "import time; time.sleep(60)"), str(tmp_path), 0)
    assert not (tmp_path / "s:4:0:1").exists()
    started = launcher.start(member(tmp_path, "s:5:0:0", "import time; time.sleep(60)"), str(tmp_path), 0)
    launcher.forget(["s:5:0:0"])  # forgotten while it runs: killed
    wait_for(lambda: process_started(int(started["pid"])) is None, timeout=30)
    assert launcher.ended(0, timeout=5)[1] == [], "killed, and not told: it is forgotten"
    with pytest.raises(RuntimeError, match="given up"):
        launcher.start(member(tmp_path, "s:5:0:0", "pass"), str(tmp_path), 0)
