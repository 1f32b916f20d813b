"""A notebook session's command (`gpupool notebook` runs `python -m gpupool.job.notebook`):
JupyterLab on this node, behind the service's proxy (docs/sessions.md, "Notebooks").

It starts Jupyter's own server on a free port of the node (loopback for the local executor, the
node's address on Ray), at the base URL the proxy serves it under (`/ui/notebooks/JOB/`), with
a token of its own that only the proxy learns; once the server answers, it tells the scheduler
where it is (the job protocol's `server` report, with the attempt's token). It passes a notice
on to the server (SIGTERM: Jupyter saves nothing of its own, and stops its kernels) and ends
with it. Needs `gpupool[notebook]` (jupyter_server and JupyterLab) where the job runs.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType

from gpupool.job.link import SchedulerLink

BASE = "/ui/notebooks/{job}/"
"""Where the service's proxy serves a notebook session, which its server must know."""
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""The server is this node's own: never reached through an environment's HTTP proxy."""
READY_WITHIN = 120.0
"""Seconds the server may take to answer before the session gives up (a cold start of
JupyterLab on a small machine takes a few)."""
STARTS = 3
"""Starts of the server before the session gives up (see `serve`)."""


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def command(host: str, port: int, base: str, root: str) -> list[str]:
    """JupyterLab with what the proxy needs: its base URL, and requests from another host (the
    proxy's, on Ray). Its token is in its environment (`JUPYTER_TOKEN`), never on its command
    line, which every user of the node may read."""
    return [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        f"--ServerApp.ip={host}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.base_url={base}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.allow_remote_access=True",
        *(["--allow-root"] if os.geteuid() == 0 else []),  # a job runs as root only where the admin lets it
    ]


def listens(server: subprocess.Popen[bytes], port: int) -> bool:
    """Whether the server itself listens on `port`: only then is it asked with its token, which
    another process that took the port would otherwise learn. (psutil comes with the notebook
    extra: imported here, so that the service, which reads `BASE`, needs it not.)"""
    import psutil

    try:
        found = psutil.Process(server.pid).net_connections(kind="inet")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in found)


def answers(host: str, port: int, base: str, token: str) -> bool:
    request = urllib.request.Request(
        f"http://{host}:{port}{base}api/status", headers={"Authorization": f"token {token}"}
    )
    try:
        with NO_PROXY.open(request, timeout=2) as response:
            return bool(json.loads(response.read()).get("started"))
    except (OSError, ValueError):
        return False


def taken(host: str, port: int) -> bool:
    """Whether another process listens on `port` now."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


@dataclass
class Current:
    """The server a notice goes to (the one started last), and whether a notice came."""

    server: subprocess.Popen[bytes] | None = None
    noticed: bool = False

    def pass_on(self, _signum: int, _frame: FrameType | None) -> None:
        """A notice: Jupyter saves nothing of its own on SIGTERM, and stops its kernels."""
        self.noticed = True
        if self.server is not None:
            self.server.send_signal(signal.SIGTERM)


def until_ready(server: subprocess.Popen[bytes], host: str, port: int, base: str, token: str) -> int | None:
    """None once the server answers on `port`; else its exit code, once it exited or was
    killed for not answering within `READY_WITHIN` seconds."""
    deadline = time.monotonic() + READY_WITHIN
    while not (listens(server, port) and answers(host, port, base, token)):
        if server.poll() is not None:
            print(f"gpupool: the notebook server exited with code {server.returncode}", file=sys.stderr)
            return server.returncode
        if time.monotonic() > deadline:
            print(f"gpupool: the notebook server did not answer within {READY_WITHIN:g} s", file=sys.stderr)
            server.kill()
            return server.wait()
        time.sleep(0.2)
    return None


def serve(host: str, base: str, token: str, current: Current) -> tuple[subprocess.Popen[bytes], int] | int:
    """The server, answering, and its port; or the exit code to end with. A free port may be
    taken by another process before the server binds it: a server that exits before it
    answers while another process has its port is started again on another, `STARTS` times in
    all; not after a notice (`current` passes it on, installed before any server starts)."""
    signal.signal(signal.SIGTERM, current.pass_on)
    for _ in range(STARTS):
        if current.noticed:
            break
        port = free_port(host)
        server = current.server = subprocess.Popen(
            command(host, port, base, os.getcwd()), env={**os.environ, "JUPYTER_TOKEN": token}
        )
        if current.noticed:  # it came as the server started: it has it too
            server.send_signal(signal.SIGTERM)
        ended = until_ready(server, host, port, base, token)
        if ended is None:
            return server, port
        if current.noticed or not taken(host, port):
            return ended or 1
        print(f"gpupool: port {port} was taken by another process; the server starts on another", file=sys.stderr)
    return 128 + signal.SIGTERM if current.noticed else 1


def main(env: Mapping[str, str] = os.environ) -> int:
    link = SchedulerLink(env)
    host = env.get("GPUPOOL_NODE_ADDRESS") or "127.0.0.1"
    base = BASE.format(job=env.get("GPUPOOL_JOB_ID", "0"))
    token = secrets.token_urlsafe(32)
    served = serve(host, base, token, Current())
    if isinstance(served, int):
        return served
    server, port = served
    link.report("server", {"port": port, "token": token})
    print(f"gpupool: the notebook server answers at http://{host}:{port}{base} (the service proxies it)", flush=True)
    return server.wait()


if __name__ == "__main__":
    sys.exit(main())
