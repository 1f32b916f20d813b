"""Sessions (issue 35), on the local executor, each figure beside its baseline in the same run:

1. Command to shell prompt on an idle pool: `gpupool shell -- /bin/sh` in a pseudo-terminal,
   from the command to its prompt (submit, decide, launch, the WebSocket, the PTY), against
   `/bin/sh` started in a pseudo-terminal with no scheduler at all.
2. Keystroke echo round trip: one byte typed over the API's WebSocket until its echo comes back
   (client → API → launcher → PTY → shell and back), against the same byte on a PTY directly.
3. Command to prompt when the session must preempt: both GPUs held by low jobs that take 1 s to
   leave after their notice (their class's grace is 2 s), against that grace and 1 s.
4. On a Ray cluster of three nodes on loopback: 1 and 2 again, the terminal relayed by the
   node's launcher actor.

`gpupool up` is its own process with containment as this machine allows (cgroups as root).
Run: .venv/bin/python -m benchmarks.sessions
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pexpect
from websockets.sync.client import connect

from gpupool.demo.loopback import LoopbackCluster
from tests.support.live import state, wait_for
from tests.support.sessions import PROMPT, Sessions, serving

RUNS = 10
KEYSTROKES = 300
LEAVES_IN_A_SECOND = ["/bin/sh", "-c", "trap 'sleep 1; exit 0' TERM; sleep 600 & wait; wait"]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def row(name: str, values: list[float], unit: float = 1.0, suffix: str = "s") -> str:
    scaled = [v * unit for v in values]
    return (
        f"  {name:<44} median {statistics.median(scaled):7.3f} {suffix}  p90 {percentile(scaled, 0.9):7.3f} {suffix}"
        f"  p99 {percentile(scaled, 0.99):7.3f} {suffix}  max {max(scaled):7.3f} {suffix}"
    )


def bare_prompt() -> float:
    began = time.perf_counter()
    shell = pexpect.spawn("/bin/sh", env={"PS1": "$ ", "PATH": os.environ["PATH"]}, encoding="utf-8", timeout=30)
    shell.expect(PROMPT)
    took = time.perf_counter() - began
    shell.sendline("exit")
    shell.expect(pexpect.EOF)
    return took


def echoes(send: Callable[[bytes], None], receive: Callable[[], bytes]) -> list[float]:
    """Round trips of one typed byte (cat echoes it, the terminal echoes it too)."""
    times = []
    for i in range(KEYSTROKES):
        key = bytes([ord("a") + i % 26])
        began = time.perf_counter()
        send(key)
        got = b""
        while key not in got:
            got += receive()
        times.append(time.perf_counter() - began)
    return times


def bare_echoes() -> list[float]:
    shell = pexpect.spawn("/bin/cat", timeout=30, encoding="latin-1")
    shell.delaybeforesend = None  # pexpect's own pause of 50 ms before each send

    def send(key: bytes) -> None:
        shell.send(key.decode("latin-1"))

    def receive() -> bytes:
        return shell.read_nonblocking(4096, timeout=30).encode("latin-1")

    try:
        return echoes(send, receive)
    finally:
        shell.close(force=True)


def session_echoes(lab: Sessions) -> list[float]:
    shell = lab.spawn("shell", "--", "/bin/sh")
    shell.logfile_read = None
    shell.expect(r"job (\d+) submitted")
    job = int(shell.match.group(1))  # type: ignore[union-attr]
    shell.expect(PROMPT)
    shell.send("exec cat\r")
    shell.send("~.")  # detach this client; the benchmark's own connects instead
    shell.expect(pexpect.EOF)
    token = (lab.data / "admin.token").read_text().strip()
    url = f"ws://127.0.0.1:{lab.port}/jobs/{job}/terminal"
    with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, proxy=None) as socket:

        def receive() -> bytes:
            message = socket.recv(timeout=30)
            return message if isinstance(message, bytes) else b""

        times = echoes(socket.send, receive)
    lab.cli("cancel", "--now", str(job))
    return times


def preempting_prompt(lab: Sessions) -> float:
    batch = [lab.submit("--gpus", "1", "--", *LEAVES_IN_A_SECOND) for _ in range(2)]
    wait_for(lambda: all(state(lab, b) == "running" for b in batch), timeout=60)
    time.sleep(0.5)
    took = session_prompt(lab, "--gpus", "2")
    for job in batch:
        lab.cli("cancel", "--now", str(job))
    wait_for(lambda: all(state(lab, b) == "cancelled" for b in batch), timeout=60)
    return took


def session_prompt(lab: Sessions, *options: str) -> float:
    """From the command to the shell's prompt; then the shell exits."""
    began = time.perf_counter()
    shell = lab.spawn("shell", *options, "--", "/bin/sh", timeout=60)
    shell.logfile_read = None
    shell.expect(PROMPT)
    took = time.perf_counter() - began
    shell.sendline("exit")
    shell.expect(pexpect.EOF)
    shell.close()
    return took


def main() -> None:
    head = ["git", "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(head, capture_output=True, text=True, check=False).stdout.strip()
    print(f"sessions on the local executor, {os.cpu_count()} CPUs, commit {commit}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for lab in serving(Sessions(Path(tmp))):
            print("1. command to shell prompt, idle pool", flush=True)
            print(row("/bin/sh on a PTY (baseline)", [bare_prompt() for _ in range(RUNS)]), flush=True)
            print(row("gpupool shell -- /bin/sh", [session_prompt(lab) for _ in range(RUNS)]), flush=True)
            print("2. keystroke echo round trip", flush=True)
            print(row("a PTY directly (baseline)", bare_echoes(), 1000, "ms"), flush=True)
            print(row("over the API's WebSocket", session_echoes(lab), 1000, "ms"), flush=True)
            print("3. command to prompt when the session must preempt (victims leave 1 s after notice)", flush=True)
            print(row("grace 2 s + 1 s (the target)", [3.0]), flush=True)
            print(row("gpupool shell --gpus 2, both GPUs held", [preempting_prompt(lab) for _ in range(3)]))
        os.environ["RAY_AUTH_MODE"] = "disabled"
        (Path(tmp) / "on-ray").mkdir()
        cluster = LoopbackCluster(Path(tmp) / "ray", k=3)
        cluster.start()
        try:
            for lab in serving(Sessions(Path(tmp) / "on-ray", ray_address=cluster.address)):
                print("4. on Ray (3 nodes on loopback)", flush=True)
                print(row("gpupool shell -- /bin/sh, command to prompt", [session_prompt(lab) for _ in range(RUNS)]))
                print(row("keystroke echo over the WebSocket and the actor", session_echoes(lab), 1000, "ms"))
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
