"""`gpupool up`: the store, the control loop, the local executor and the API, in one process."""

from __future__ import annotations

import os
import secrets
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from gpupool.api import Context, create_app
from gpupool.config import ConfigSpec, build
from gpupool.executors.gpus import LocalGpus, discover
from gpupool.executors.local import LocalExecutor
from gpupool.service import ControlLoop, token_hash
from gpupool.store import Store
from gpupool.store.engine import sqlite_url

ADMIN_TOKEN = "admin.token"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (for demos and tests on loopback)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def admin_token(data_dir: Path) -> str:
    """The admin token of this data directory, made on first use (readable by its owner only)."""
    path = data_dir / ADMIN_TOKEN
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as stream:
            stream.write(secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


@dataclass
class Running:
    """A started service: what `gpupool up` prints, and what tests need to stop it."""

    store: Store
    loop: ControlLoop
    gpus: LocalGpus
    server: uvicorn.Server
    stop: threading.Event
    loop_thread: threading.Thread


def start(spec: ConfigSpec) -> Running:
    """Open the store, register this machine's GPUs, and start the control loop in a thread.
    The caller runs `server` (it blocks until interrupted), then sets `stop`."""
    data_dir = spec.service.data_path
    data_dir.mkdir(parents=True, exist_ok=True)
    config = build(spec)
    store = Store.open(spec.service.store or sqlite_url(data_dir))
    store.sync_config(config)
    gpus = discover(socket.gethostname(), spec.service.virtual_gpus)
    store.set_nodes([gpus.node], virtual=gpus.virtual)
    loop = ControlLoop(store, config, LocalExecutor(), data_dir, spec.service.url, spec.service.interval)
    loop.executor = LocalExecutor(on_exit=loop.wakeup.set)
    app = create_app(Context(store, loop, token_hash(admin_token(data_dir))))
    server = uvicorn.Server(
        uvicorn.Config(app, host=spec.service.host, port=spec.service.port, log_level="warning", lifespan="off")
    )
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), name="control-loop", daemon=True)
    thread.start()
    return Running(store, loop, gpus, server, stop, thread)


def shut_down(running: Running) -> None:
    """Stop deciding; running attempts go on and are adopted by the next `gpupool up`."""
    running.stop.set()
    running.loop.wakeup.set()
    running.loop_thread.join(timeout=10)
    running.store.close()
