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
from types import FrameType

from gpupool.job.link import SchedulerLink

BASE = "/ui/notebooks/{job}/"
"""Where the service's proxy serves a notebook session, which its server must know."""
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""The server is this node's own: never reached through an environment's HTTP proxy."""
READY_WITHIN = 120.0
"""Seconds the server may take to answer before the session gives up (a cold start of
JupyterLab on a small machine takes a few)."""


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


def answers(host: str, port: int, base: str, token: str) -> bool:
    request = urllib.request.Request(
        f"http://{host}:{port}{base}api/status", headers={"Authorization": f"token {token}"}
    )
    try:
        with NO_PROXY.open(request, timeout=2) as response:
            return bool(json.loads(response.read()).get("started"))
    except (OSError, ValueError):
        return False


def main(env: Mapping[str, str] = os.environ) -> int:
    link = SchedulerLink(env)
    host = env.get("GPUPOOL_NODE_ADDRESS") or "127.0.0.1"
    base = BASE.format(job=env.get("GPUPOOL_JOB_ID", "0"))
    token = secrets.token_urlsafe(32)
    port = free_port(host)
    server = subprocess.Popen(command(host, port, base, os.getcwd()), env={**os.environ, "JUPYTER_TOKEN": token})

    def noticed(signum: int, _frame: FrameType | None) -> None:
        server.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, noticed)
    deadline = time.monotonic() + READY_WITHIN
    while not answers(host, port, base, token):
        if server.poll() is not None:
            print(f"gpupool: the notebook server exited with code {server.returncode}", file=sys.stderr)
            return server.returncode or 1
        if time.monotonic() > deadline:
            print(f"gpupool: the notebook server did not answer within {READY_WITHIN:g} s", file=sys.stderr)
            server.kill()
            return server.wait() or 1
        time.sleep(0.2)
    link.report("server", {"port": port, "token": token})
    print(f"gpupool: the notebook server answers at http://{host}:{port}{base} (the service proxies it)", flush=True)
    return server.wait()


if __name__ == "__main__":
    sys.exit(main())
