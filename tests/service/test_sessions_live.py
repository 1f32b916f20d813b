"""Sessions (issue 35) against `gpupool up`, driven as a person drives them: `gpupool shell`
and `gpupool attach` in a real pseudo-terminal (pexpect), `gpupool run` as a foreground
command. The shell runs on the launcher's own PTY and reaches the client over the API's
WebSocket."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pexpect
import pytest

from gpupool.executors.proc import process_started
from tests.support.live import state, wait_for
from tests.support.sessions import FAKE_NVML, PROMPT, Sessions, serving


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Sessions]:
    yield from serving(Sessions(tmp_path))


@pytest.fixture
def idle_lab(tmp_path: Path) -> Iterator[Sessions]:
    """Sessions idle for 3 s are warned, and ended 2 s later."""
    yield from serving(Sessions(tmp_path, idle="3s"))


@pytest.fixture
def nvml_lab(tmp_path: Path) -> Iterator[Sessions]:
    """Two GPUs as NVML shows them (tests/support/fake_nvml, which the test writes), sessions
    idle for 3 s warned."""
    lab = Sessions(tmp_path, idle="3s")
    lab.nvml = tmp_path / "nvml.json"
    lab.gpus([], 0)
    lab.env.update(PYTHONPATH=str(FAKE_NVML), GPUPOOL_FAKE_NVML=str(lab.nvml))
    yield from serving(lab)


@pytest.fixture
def uncontained_lab(tmp_path: Path) -> Iterator[Sessions]:
    """Attempts as process groups, not cgroups (`containment: off`, or a host without them)."""
    yield from serving(Sessions(tmp_path, contain="off"))


@pytest.fixture
def short_grace_lab(tmp_path: Path) -> Iterator[Sessions]:
    """A shell left detached for 2 s ends."""
    yield from serving(Sessions(tmp_path, detach="2s"))


def submitted(child: pexpect.spawn[str]) -> int:
    return number(child, r"job (\d+) submitted")


def number(child: pexpect.spawn[str], pattern: str) -> int:
    """The number the first group of `pattern` finds in what `child` prints next."""
    child.expect(pattern)
    match = child.match
    assert isinstance(match, re.Match)
    return int(match.group(1))


def test_a_shell_has_its_gpus_a_terminal_that_follows_the_window_and_ends_with_its_exit_code(lab: Sessions) -> None:
    began = time.monotonic()
    shell = lab.spawn("shell", "--gpus", "2", "--", "/bin/sh")
    job = submitted(shell)
    shell.expect(PROMPT)
    assert time.monotonic() - began < 30  # a generous ceiling; the benchmark measures it
    shell.sendline("echo GPUS=$CUDA_VISIBLE_DEVICES SESSION=$GPUPOOL_SESSION")
    shell.expect("GPUS=0,1 SESSION=shell")
    shell.sendline("stty size")
    shell.expect("24 80")
    shell.setwinsize(40, 120)
    time.sleep(0.5)  # SIGWINCH reaches the client, which sends the new size
    shell.sendline("stty size")
    shell.expect("40 120")
    shell.sendline("sleep 30; echo slept")
    time.sleep(0.5)
    shell.sendintr()  # Ctrl-C reaches sleep, not the client
    shell.expect(PROMPT, timeout=5)
    assert "slept" not in (shell.before or "")
    shell.sendline("exit 3")
    assert lab.ended(shell) == 3
    record = lab.job(job)
    assert (record["state"], record["exit_code"], record["session"]) == ("failed", 3, "shell")


def test_detach_attach_and_a_kill_9_of_the_service_leave_the_session_running(lab: Sessions) -> None:
    shell = lab.spawn("shell", "--", "/bin/sh")
    job = submitted(shell)
    shell.expect(PROMPT)
    shell.sendline("echo MARK-ONE")
    shell.expect("MARK-ONE\r\n")
    shell.expect(PROMPT)
    shell.send("~.")  # ssh's escape, at the start of a line
    shell.expect("detached from job")
    assert lab.ended(shell) == 0
    assert state(lab, job) == "running"

    again = lab.spawn("attach", str(job))
    again.expect("MARK-ONE")  # the screen it left
    again.sendline("echo MARK-TWO")
    again.expect("MARK-TWO\r\n")
    lab.kill()  # kill -9 of gpupool up: the client loses its link, the shell runs on
    again.expect("runs on")
    assert lab.ended(again) == 4
    lab.up()
    assert state(lab, job) == "running"
    third = lab.spawn("attach", str(job))
    third.expect("MARK-TWO")
    third.sendline("exit")
    assert lab.ended(third) == 0
    wait_for(lambda: state(lab, job) == "succeeded", timeout=30)


def test_a_session_preempts_low_batch_work_within_its_grace_and_one_second(lab: Sessions) -> None:
    batch = [lab.submit("--gpus", "1", "--", "sleep", "600") for _ in range(2)]
    wait_for(lambda: all(state(lab, b) == "running" for b in batch), timeout=30)
    began = time.monotonic()
    shell = lab.spawn("shell", "--gpus", "2", "--", "/bin/sh")
    shell.expect(PROMPT)
    took = time.monotonic() - began
    assert took <= 2 + 1 + 2, took  # grace 2 s, 1 s, and the start of the client itself
    assert [state(lab, b) for b in batch] == ["pending", "pending"]
    shell.sendline("exit")
    assert lab.ended(shell) == 0


def test_an_idle_session_is_warned_then_reclaimed_and_its_gpus_start_the_next_job(idle_lab: Sessions) -> None:
    lab = idle_lab
    shell = lab.spawn("shell", "--gpus", "2", "--", "/bin/sh")
    job = submitted(shell)
    shell.expect(PROMPT)
    waiting = lab.submit("--gpus", "2", "--", "sleep", "600")
    shell.sendline("echo still here")  # activity: the idle clock starts again
    shell.expect("still here\r\n")
    began = time.monotonic()
    shell.expect(r"idle for .*it ends and its GPUs go back to the pool in 2 s")
    warned = time.monotonic() - began
    shell.expect("this session ends")
    assert lab.ended(shell) == 125  # cancelled
    assert 3 - 0.5 <= warned <= 3 + 5, warned
    record = lab.job(job)
    assert record["state"] == "cancelled"
    assert record["history"][0]["idle_seconds"] >= 3
    wait_for(lambda: state(lab, waiting) == "running", timeout=30)
    kinds = [e["kind"] for e in lab.json(f"/events?job={job}")]
    assert kinds.index("session_idle") < kinds.index("cancel_requested")
    assert lab.json("/report")["pool"]["idle"] >= 2 * 3  # its 2 GPUs, idle 3 s at least
    shown = lab.cli("show", str(job))
    assert "a shell session: idle for" in shown.stdout
    idle_metric = "gpupool_idle_session_gpu_seconds_total{"

    def counted() -> bool:
        metrics = httpx.get(f"http://127.0.0.1:{lab.port}/metrics", headers=lab.admin).text
        return any(line.startswith(idle_metric) and float(line.split()[-1]) >= 6 for line in metrics.splitlines())

    wait_for(counted, timeout=30)


def test_a_session_whose_gpu_works_is_not_idle_and_is_once_it_stops(nvml_lab: Sessions) -> None:
    lab = nvml_lab
    shell = lab.spawn("shell", "--", "/bin/sh")
    job = submitted(shell)
    shell.expect(PROMPT)
    shell.sendline("echo PID=$$")
    pid = number(shell, r"PID=(\d+)\r\n")
    lab.gpus([pid], utilization=80)  # the shell's process computes on GPU 0
    time.sleep(3 + 2 + 4)  # past idle_after and its notice, with no keystroke
    kinds = [e["kind"] for e in lab.json(f"/events?job={job}")]
    assert "session_idle" not in kinds, kinds
    assert state(lab, job) == "running"
    lab.gpus([pid], utilization=0)
    shell.expect("this session has been idle", timeout=30)
    shell.expect("this session ends", timeout=30)
    assert lab.ended(shell) == 125


def test_a_detached_shell_ends_after_the_detach_grace(short_grace_lab: Sessions) -> None:
    lab = short_grace_lab
    shell = lab.spawn("shell", "--", "/bin/sh")
    job = submitted(shell)
    shell.expect(PROMPT)
    shell.send("~.")
    assert lab.ended(shell) == 0
    wait_for(lambda: state(lab, job) == "cancelled", timeout=30)
    messages = [e["message"] for e in lab.json(f"/events?job={job}")]
    assert any("no terminal attached" in m for m in messages), messages


def test_another_teams_token_and_a_teammates_cannot_attach(lab: Sessions) -> None:
    for team in ("vision", "nlp"):
        assert lab.cli("team", "set", team).returncode == 0
    tokens = {}
    for user, team in (("ana", "vision"), ("ben", "vision"), ("eve", "nlp")):
        done = lab.cli("user", "set", user, "--team", team, "--new-token")
        assert done.returncode == 0, done.stderr
        tokens[user] = done.stdout.split()[-1]
    ana = {**lab.env, "GPUPOOL_TOKEN": tokens["ana"]}
    shell = pexpect.spawn(
        sys.executable, ["-m", "gpupool", "shell", "--", "/bin/sh"], env=ana, encoding="utf-8", timeout=30
    )
    job = submitted(shell)
    shell.expect(PROMPT)
    for intruder in ("ben", "eve"):
        env = {**lab.env, "GPUPOOL_TOKEN": tokens[intruder]}
        attempt = subprocess.run(
            [sys.executable, "-m", "gpupool", "attach", str(job)],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        assert attempt.returncode == 5, attempt.stderr  # refused
        assert "may not" in attempt.stderr
    shell.sendline("exit")
    assert lab.ended(shell) == 0


def test_run_streams_the_output_and_exits_with_the_jobs_code(lab: Sessions) -> None:
    done = lab.run_cli(lab.env, "run", "--", "/bin/sh", "-c", "echo out; echo err >&2; exit 4")
    assert done.returncode == 4
    assert done.stdout == "out\n"
    assert "err\n" in done.stderr
    assert "submitted" in done.stderr  # gpupool's own words go to standard error


def test_run_ctrl_c_cancels_with_grace_and_a_second_kills(lab: Sessions) -> None:
    script = "trap 'echo got-notice' TERM; echo ready; while true; do sleep 0.1; done"
    run = lab.spawn("run", "--", "/bin/sh", "-c", script)
    job = submitted(run)
    run.expect("ready")
    run.sendintr()
    run.expect("got-notice")  # the notice: SIGTERM, with the class's grace
    assert state(lab, job) == "running"
    run.sendintr()
    run.expect("killed")
    assert lab.ended(run) == 125
    assert state(lab, job) == "cancelled"
    kinds = [e["kind"] for e in lab.get(f"/events?job={job}").json()]  # type: ignore[union-attr]
    assert kinds.index("cancel_requested") < kinds.index("kill_requested") < kinds.index("cancelled")


def test_a_shell_session_is_one_job_on_one_node(lab: Sessions) -> None:
    done = lab.run_cli(lab.env, "shell", "--array", "0-3")
    assert done.returncode == 2
    assert "--array: gpupool shell runs one job" in done.stderr
    token = (lab.data / "admin.token").read_text().strip()
    answer = httpx.post(
        f"http://127.0.0.1:{lab.port}/jobs",
        json={"command": ["/bin/sh"], "session": "notebook!"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 422
    assert "session" in json.dumps(answer.json())


def test_a_cancelled_shell_gives_its_program_notice_then_hangs_up_at_its_prompt(lab: Sessions) -> None:
    shell = lab.spawn("shell", "--", "/bin/sh")
    job = submitted(shell)
    shell.expect(PROMPT)
    # A program in the foreground that saves and leaves on notice, as a batch job does; the
    # interactive shell itself ignores SIGTERM, and ends once it is back at its prompt.
    # (What it prints is made by printf, so that the terminal's echo of the line matches not.)
    shell.sendline(
        """sh -c 'trap "printf program-%s. noticed; exit 0" TERM; printf program-%s. ready; sleep 60 & wait'"""
    )
    shell.expect("program-ready.")
    assert lab.cli("cancel", str(job)).returncode == 0
    shell.expect("program-noticed.")
    assert lab.ended(shell) == 125
    assert state(lab, job) == "cancelled"
    # Hung up (SIGHUP: 128 + 1), not killed at the end of its grace (SIGKILL: 128 + 9).
    history = lab.job(job)["history"]
    if history[-1]["exit_code"] != 129:
        kept = [p for p in lab.data.rglob("*") if p.name in ("exit.json", "launcher.log")]
        records = {str(p.relative_to(lab.data)): p.read_text(errors="replace") for p in kept if p.is_file()}
        pytest.fail(f"not hung up at its prompt: {history}, {records}")


def test_a_command_that_takes_its_notice_itself_saves_before_it_leaves(lab: Sessions, tmp_path: Path) -> None:
    saver = tmp_path / "saver.py"
    saver.write_text(
        "import signal, sys, time\n"
        "def leave(*_):\n"
        "    time.sleep(1)  # a save that takes a while\n"
        "    print('saved', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, leave)\n"
        "print('training', flush=True)\n"
        "while True:\n"
        "    time.sleep(0.1)\n"
    )
    shell = lab.spawn("shell", "--", sys.executable, str(saver))
    job = submitted(shell)
    shell.expect("training")
    assert lab.cli("cancel", str(job)).returncode == 0
    shell.expect("saved")  # not hung up before its save: it ignores no SIGTERM, it takes it
    assert lab.ended(shell) == 125
    assert state(lab, job) == "cancelled"


def test_without_cgroups_a_killed_shell_takes_its_background_jobs_with_it(uncontained_lab: Sessions) -> None:
    lab = uncontained_lab
    shell = lab.spawn("shell", "--", "/bin/sh")
    job = submitted(shell)
    shell.expect(PROMPT)
    shell.sendline("sleep 4646 & echo started-$!")
    left = number(shell, r"started-(\d+)")
    assert lab.cli("cancel", "--now", str(job)).returncode == 0
    assert lab.ended(shell) == 125
    wait_for(lambda: process_started(left) is None, timeout=10)  # its own process group, killed too
