"""A node's launcher actor as a plain object (no Ray cluster needed): the order of its members'
ends, and a member given up before it could start never starts."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.executors.forks import ForkServer
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


def test_members_end_with_the_fork_server_their_launchers_came_from(tmp_path: Path) -> None:
    launcher = NodeLauncher()
    pid_file = tmp_path / "pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    launcher.start(member(tmp_path, "s:6:0:0", script), str(tmp_path), 0)
    wait_for(lambda: pid_file.exists() and bool(pid_file.read_text()), timeout=30)
    command = int(pid_file.read_text())
    assert process_started(command) is not None
    assert launcher.forks is not None
    launcher.forks.close()  # as when its actor dies: the fork server's input closes
    wait_for(lambda: process_started(command) is None, timeout=30)


def test_an_end_that_comes_before_its_start_returns_is_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = ForkServer.spawn

    def slowly(self: ForkServer, member: Spawn, on_exit: Callable[[int], None]) -> int:
        pid = real(self, member, on_exit)
        time.sleep(1.0)  # the actor's thread is held up (a loaded node): the member ends meanwhile
        return pid

    monkeypatch.setattr(ForkServer, "spawn", slowly)
    launcher = NodeLauncher()
    told: list[str] = []

    def watch() -> None:
        seq = 0
        while not told:
            seq, ends = launcher.ended(seq, timeout=30)
            told.extend(owner for owner, _ in ends)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    launcher.start(Spawn(tmp_path / "m", "s:7:0:0", None, tmp_path, ["true"], {}), str(tmp_path), 0)
    watcher.join(timeout=30)
    assert told == ["s:7:0:0"]
