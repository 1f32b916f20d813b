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

import functools
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping
from types import FrameType

import psutil

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
NOTICED = threading.Event()
"""The session got its notice: a server that exits then is not started again."""


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
    another process that took the port would otherwise learn."""
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


def pass_on(server: subprocess.Popen[bytes], _signum: int, _frame: FrameType | None) -> None:
    """A notice: Jupyter saves nothing of its own on SIGTERM, and stops its kernels."""
    NOTICED.set()
    server.send_signal(signal.SIGTERM)


def serve(host: str, base: str, token: str) -> tuple[subprocess.Popen[bytes], int] | int:
    """The server, answering, and its port; or the exit code to end with. A free port may be
    taken by another process before the server binds it: a server that exits before it
    answers is started again on another, `STARTS` times in all."""
    for start in range(1, STARTS + 1):
        port = free_port(host)
        server = subprocess.Popen(command(host, port, base, os.getcwd()), env={**os.environ, "JUPYTER_TOKEN": token})
        signal.signal(signal.SIGTERM, functools.partial(pass_on, server))
        deadline = time.monotonic() + READY_WITHIN
        while not (listens(server, port) and answers(host, port, base, token)):
            if server.poll() is not None:
                print(f"gpupool: the notebook server exited with code {server.returncode}", file=sys.stderr)
                if start == STARTS or NOTICED.is_set():
                    return server.returncode or 1
                break
            if time.monotonic() > deadline:
                print(f"gpupool: the notebook server did not answer within {READY_WITHIN:g} s", file=sys.stderr)
                server.kill()
                return server.wait() or 1
            time.sleep(0.2)
        else:
            return server, port
    return 1


def main(env: Mapping[str, str] = os.environ) -> int:
    link = SchedulerLink(env)
    host = env.get("GPUPOOL_NODE_ADDRESS") or "127.0.0.1"
    base = BASE.format(job=env.get("GPUPOOL_JOB_ID", "0"))
    token = secrets.token_urlsafe(32)
    served = serve(host, base, token)
    if isinstance(served, int):
        return served
    server, port = served
    link.report("server", {"port": port, "token": token})
    print(f"gpupool: the notebook server answers at http://{host}:{port}{base} (the service proxies it)", flush=True)
    return server.wait()


if __name__ == "__main__":
    sys.exit(main())
