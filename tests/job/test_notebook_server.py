"""The notebook session's command (`gpupool.job.notebook`) starting Jupyter's server: the free
port it chose may be taken before the server binds it; then it starts the server again on
another instead of failing the session, and never sends the token to the port's taker. A
server that fails for another reason is not started again, nor one after a notice."""

from __future__ import annotations

import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.job import notebook

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jupyterlab") is None, reason="gpupool[notebook] is not installed (make test installs it)"
)
BASE = "/ui/notebooks/1/"


@pytest.fixture
def other() -> Iterator[socket.socket]:
    """Another process's socket, listening on a port of loopback."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        yield listening


@pytest.fixture
def current(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[notebook.Current]:
    """What `serve` passes notices to; the server it left is stopped, and the test's own
    SIGTERM handler put back."""
    monkeypatch.chdir(tmp_path)
    before = signal.getsignal(signal.SIGTERM)
    found = notebook.Current()
    try:
        yield found
    finally:
        signal.signal(signal.SIGTERM, before)
        if found.server is not None and found.server.poll() is None:
            found.server.kill()
            found.server.wait(timeout=30)


def ports(monkeypatch: pytest.MonkeyPatch, *first: int, then: object = None) -> None:
    """`free_port` gives `first` in turn, then a real free port (calling `then` first, if given)."""
    given = iter(first)
    real = notebook.free_port

    def chosen(host: str) -> int:
        port = next(given, None)
        if port is not None:
            return port
        if callable(then):
            then()
        return real(host)

    monkeypatch.setattr(notebook, "free_port", chosen)


def test_a_port_taken_before_the_server_binds_it_makes_it_start_on_another(
    other: socket.socket, current: notebook.Current, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = int(other.getsockname()[1])
    ports(monkeypatch, taken)
    token = secrets.token_urlsafe(16)
    served = notebook.serve("127.0.0.1", BASE, token, current)
    assert not isinstance(served, int), f"the server did not start: exit code {served}"
    server, port = served
    assert port != taken and server is current.server
    assert notebook.answers("127.0.0.1", port, BASE, token)
    other.setblocking(False)
    with pytest.raises(BlockingIOError):  # never asked with the token: it is not the server
        other.accept()


def test_a_server_that_fails_with_its_port_free_is_not_started_again(
    current: notebook.Current, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[int] = []

    def failing(host: str, port: int, base: str, root: str) -> list[str]:
        started.append(port)
        return [sys.executable, "-c", "import sys; sys.exit(3)"]

    monkeypatch.setattr(notebook, "command", failing)
    assert notebook.serve("127.0.0.1", BASE, "t", current) == 3
    assert len(started) == 1


def test_a_notice_while_the_server_starts_again_ends_the_session(
    other: socket.socket, current: notebook.Current, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The notice comes after the first server exited on a taken port, as the second starts:
    that one gets it, and the session ends instead of serving."""
    ports(monkeypatch, int(other.getsockname()[1]), then=lambda: os.kill(os.getpid(), signal.SIGTERM))
    served = notebook.serve("127.0.0.1", BASE, "t", current)
    assert isinstance(served, int), "a server was left serving after the notice"
    assert current.noticed
    assert current.server is not None and current.server.poll() is not None


def test_the_service_needs_not_the_notebook_extra() -> None:
    """`gpupool up` reads the notebooks' base path from this module: it must import without
    psutil (the notebook extra's)."""
    code = "import sys; sys.modules['psutil'] = None; import gpupool.up, gpupool.api.notebooks"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
