"""A node's launcher actor as a plain object (no Ray cluster needed): the order of its members'
ends, a gang given up before it could start never starts, and its fork server of launchers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.executors import forks
from gpupool.executors.forks import ForkServer
from gpupool.executors.proc import process_started
from gpupool.executors.ray.launcher import NodeLauncher
from gpupool.executors.spawn import LAUNCHER, Spawn
from tests.support.live import wait_for

SLEEPS = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"


def member(tmp_path: Path, owner: str, *command: str) -> Spawn:
    return Spawn(tmp_path / owner, owner, None, tmp_path, [sys.executable, "-c", *command], {})


def sleeper(tmp_path: Path, owner: str) -> tuple[Spawn, Path]:
    """A member whose command writes its pid to a file, then sleeps."""
    pid_file = tmp_path / f"{owner}.pid"
    return member(tmp_path, owner, SLEEPS, str(pid_file)), pid_file


def pid_in(pid_file: Path) -> int:
    wait_for(lambda: pid_file.exists() and bool(pid_file.read_text()), timeout=30)
    return int(pid_file.read_text())


def lost_flag() -> tuple[threading.Event, NodeLauncher]:
    lost = threading.Event()
    return lost, NodeLauncher(on_lost=lost.set)


def test_ends_are_told_in_order_once_each_and_running_members_are_known(tmp_path: Path) -> None:
    _, launcher = lost_flag()
    launcher.start(member(tmp_path, "s:1:0:0", "raise SystemExit(3)"), str(tmp_path), 0)
    launcher.start(member(tmp_path, "s:2:0:0", "import time; time.sleep(60)"), str(tmp_path), 0)
    me, seq, ends = launcher.ended(0, timeout=30)
    assert (seq, [(o, e["exit_code"]) for o, e in ends]) == (1, [("s:1:0:0", 3)])
    assert launcher.ended(seq, timeout=0.2, incarnation=me) == (me, 1, []), "told once"
    assert launcher.status(["s:1:0:0", "s:2:0:0", "s:3:0:0"])[1] == {"s:1:0:0": ends[0][1], "s:2:0:0": None}
    launcher.kill("s:2:0:0")
    _, seq, ends = launcher.ended(seq, timeout=30, incarnation=me)
    assert seq == 2 and [o for o, _ in ends] == ["s:2:0:0"]
    launcher.forget(["s:1:0", "s:2:0"], ran=True)
    assert launcher.status(["s:1:0:0", "s:2:0:0"])[1] == {
        "s:1:0:0": {"forgotten": True},
        "s:2:0:0": {"forgotten": True},
    }


def test_a_caller_that_knew_another_launcher_is_told_every_end_from_the_first(tmp_path: Path) -> None:
    _, launcher = lost_flag()
    launcher.start(member(tmp_path, "s:1:0:0", "pass"), str(tmp_path), 0)
    wait_for(lambda: bool(launcher.ended(0, timeout=1)[2]), timeout=30)
    # The scheduler had seen 57 ends of the launcher this one replaced, on the same node.
    _, seq, ends = launcher.ended(57, timeout=5, incarnation="the one before")
    assert (seq, [o for o, _ in ends]) == (1, ["s:1:0:0"])


def test_a_gang_forgotten_before_its_start_arrives_never_starts(tmp_path: Path) -> None:
    _, launcher = lost_flag()
    launcher.forget(["s:4:0"], ran=False)  # the gang was given up; its start was still on its way
    with pytest.raises(RuntimeError, match="given up"):
        launcher.start(member(tmp_path, "s:4:0:1", "import time; time.sleep(60)"), str(tmp_path), 0)
    assert not (tmp_path / "s:4:0:1").exists()
    assert launcher.status(["s:4:0:1"])[1] == {"s:4:0:1": {"forgotten": False}}
    spec, pid_file = sleeper(tmp_path, "s:5:0:0")
    launcher.start(spec, str(tmp_path), 0)
    command = pid_in(pid_file)
    launcher.forget(["s:5:0"], ran=True)  # forgotten while it runs: killed
    wait_for(lambda: process_started(command) is None, timeout=30)
    assert launcher.ended(0, timeout=5)[2] == [], "killed, and not told: it is forgotten"
    with pytest.raises(RuntimeError, match="given up"):
        launcher.start(member(tmp_path, "s:5:0:1", "pass"), str(tmp_path), 0)


def test_an_end_that_comes_before_its_start_returns_is_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = ForkServer.spawn

    def slowly(self: ForkServer, member: Spawn, on_exit: Callable[[int], None]) -> int:
        pid = real(self, member, on_exit)
        time.sleep(1.0)  # the actor's thread is held up (a loaded node): the member ends meanwhile
        return pid

    monkeypatch.setattr(ForkServer, "spawn", slowly)
    _, launcher = lost_flag()
    told: list[str] = []

    def watch() -> None:
        seq, me = 0, None
        while not told:
            me, seq, ends = launcher.ended(seq, timeout=30, incarnation=me)
            told.extend(owner for owner, _ in ends)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    launcher.start(Spawn(tmp_path / "m", "s:7:0:0", None, tmp_path, ["true"], {}), str(tmp_path), 0)
    watcher.join(timeout=30)
    assert told == ["s:7:0:0"]


def test_a_member_that_cannot_be_started_is_told_to_have_ended_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(self: ForkServer, member: Spawn, on_exit: Callable[[int], None]) -> int:
        time.sleep(0.5)  # a scheduler adopting the gang meanwhile sees it running
        raise OSError("no process to fork")

    monkeypatch.setattr(ForkServer, "spawn", failing)
    _, launcher = lost_flag()
    raised: list[BaseException] = []

    def start() -> None:
        try:
            launcher.start(member(tmp_path, "s:8:0:0", "pass"), str(tmp_path), 0)
        except OSError as exc:
            raised.append(exc)

    starting = threading.Thread(target=start)
    starting.start()
    wait_for(lambda: launcher.status(["s:8:0:0"])[1] == {"s:8:0:0": None}, timeout=10)
    _, _, ends = launcher.ended(0, timeout=30)
    starting.join(timeout=30)
    assert raised, "the start raises too"
    assert [o for o, _ in ends] == ["s:8:0:0"] and "no process to fork" in ends[0][1]["not_started"]


def sleeping(tmp_path: Path, owner: str) -> tuple[threading.Event, NodeLauncher, ForkServer, int]:
    """A launcher with one member running: whether it was lost, it, its fork server, and the
    member's command's pid."""
    lost, launcher = lost_flag()
    spec, pid_file = sleeper(tmp_path, owner)
    launcher.start(spec, str(tmp_path), 0)
    command = pid_in(pid_file)
    assert launcher.forks is not None
    return lost, launcher, launcher.forks, command


def test_members_end_with_the_fork_server_their_launchers_came_from(tmp_path: Path) -> None:
    _, _, fork_server, command = sleeping(tmp_path, "s:6:0:0")
    fork_server.close()  # as when its actor dies: the fork server's input closes
    wait_for(lambda: process_started(command) is None, timeout=30)


def test_a_fork_server_that_dies_takes_its_members_and_its_launcher_with_it(tmp_path: Path) -> None:
    lost, _, fork_server, command = sleeping(tmp_path, "s:9:0:0")
    os.kill(fork_server.process.pid, signal.SIGKILL)  # the OOM killer, or an operator
    assert lost.wait(timeout=10), "the launcher is told: its members' ends can no longer be"
    wait_for(lambda: process_started(command) is None, timeout=30)


def test_a_fork_server_that_does_not_answer_in_time_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lost, launcher = lost_flag()
    launcher.start(member(tmp_path, "s:10:0:0", "pass"), str(tmp_path), 0)
    assert launcher.forks is not None
    os.kill(launcher.forks.process.pid, signal.SIGSTOP)  # it hangs
    monkeypatch.setattr(forks, "ANSWER_WITHIN", 0.5)
    with pytest.raises(OSError, match="does not answer"):
        launcher.start(member(tmp_path, "s:11:0:0", "pass"), str(tmp_path), 0)
    assert lost.wait(timeout=10)


def test_a_launcher_whose_fork_server_died_before_it_looked_ends_its_session(tmp_path: Path) -> None:
    """The fork server forks a launcher and is gone at once: the launcher, orphaned before it
    could look at its parent, still ends its member."""
    pid_file = tmp_path / "pid"
    (tmp_path / "f").mkdir()
    harness = textwrap.dedent(
        f"""
        import os, runpy, sys
        launcher = runpy.run_path({str(LAUNCHER)!r})
        argv = [{str(tmp_path / "f")!r}, "s:1:0:0", "-", "/", "/dev/null", "/dev/null",
                sys.executable, "-c", {SLEEPS!r}, {str(pid_file)!r}]
        launcher["fork"](argv, {{}}, {str(tmp_path / "f")!r}, None)
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", harness], check=True, timeout=30)
    time.sleep(1)  # it may have been killed before it wrote its pid: no process may name it
    wait_for(lambda: not running_with(str(pid_file)), timeout=30)


def running_with(argument: str) -> bool:
    """Whether a live process has `argument` on its command line."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and argument.encode() in (entry / "cmdline").read_bytes():
                return process_started(int(entry.name)) is not None
        except OSError:
            continue
    return False


def test_an_end_slow_to_read_does_not_hold_up_the_next_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.executors.proc import outcome as real

    def slowly(*args: object) -> tuple[int | None, str | None, str | None]:
        time.sleep(1.5)  # its records are on shared storage that stalls
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr("gpupool.executors.ray.gang.outcome", slowly)
    monkeypatch.setattr(forks, "ANSWER_WITHIN", 1.0)
    lost, launcher = lost_flag()
    launcher.start(member(tmp_path, "s:12:0:0", "pass"), str(tmp_path), 0)
    time.sleep(0.5)  # it has ended: its end is being read
    launcher.start(member(tmp_path, "s:13:0:0", "pass"), str(tmp_path), 0)
    assert not lost.is_set()
    wait_for(lambda: len(launcher.ended(0, timeout=1)[2]) == 2, timeout=30)


def test_notice_given_while_a_member_starts_reaches_it_once_it_has_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ForkServer.spawn

    def slowly(self: ForkServer, member: Spawn, on_exit: Callable[[int], None]) -> int:
        time.sleep(1.0)
        return real(self, member, on_exit)

    monkeypatch.setattr(ForkServer, "spawn", slowly)
    _, launcher = lost_flag()
    starting = threading.Thread(
        target=launcher.start, args=(member(tmp_path, "s:14:0:0", "import time; time.sleep(60)"), str(tmp_path), 0)
    )
    starting.start()
    wait_for(lambda: launcher.status(["s:14:0:0"])[1] == {"s:14:0:0": None}, timeout=10)
    launcher.notify("s:14:0:0", time.time() + 30)  # an adopted gang, preempted while it starts
    starting.join(timeout=30)
    _, _, ends = launcher.ended(0, timeout=30)
    assert [o for o, _ in ends] == ["s:14:0:0"], "it got SIGTERM, and left"
    assert (tmp_path / "notice").exists()


def test_a_member_whose_cgroup_will_not_empty_holds_back_no_other_members_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fork server's ends are told from one thread: a member whose cgroup a process the
    kernel holds keeps full (its launcher killed) is told once it empties, and the members
    that end meanwhile are told at once."""
    from dataclasses import replace

    from gpupool.executors import cgroups
    from gpupool.executors.ray import launcher as ray_launcher

    stuck_path, freed = "gpupool/s/1.0.0", threading.Event()

    def clear(contain: cgroups.Request | None, within: float | None = 0.1) -> tuple[bool, None]:
        if contain is not None and contain.cgroup == stuck_path:
            if within is not None:
                return False, None
            freed.wait(30)
        return True, None

    monkeypatch.setattr(ray_launcher, "clear", clear)
    node = NodeLauncher(on_lost=lambda: None)
    stuck = ray_launcher.Member(
        replace(member(tmp_path, "s:1:0:0", "true"), contain=cgroups.Request(stuck_path)), tmp_path
    )
    other = ray_launcher.Member(member(tmp_path, "s:2:0:0", "true"), tmp_path)
    node.members = {"s:1:0:0": stuck, "s:2:0:0": other}
    began = time.monotonic()
    node._reap(stuck, -9)
    node._reap(other, 0)
    assert time.monotonic() - began < 5
    assert other.end is not None and stuck.end is None
    freed.set()
    wait_for(lambda: stuck.end is not None, timeout=10)
