"""The notebook session's command (`gpupool.job.notebook`) starting Jupyter's server: the free
port it chose may be taken before the server binds it; then it starts the server again on
another instead of failing the session, and never sends the token to the port's taker."""

from __future__ import annotations

import importlib.util
import secrets
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.job import notebook

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jupyterlab") is None, reason="gpupool[notebook] is not installed (make test installs it)"
)


@pytest.fixture
def other() -> Iterator[socket.socket]:
    """Another process's socket, listening on a port of loopback."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        yield listening


def test_a_port_taken_before_the_server_binds_it_makes_it_start_on_another(
    other: socket.socket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = int(other.getsockname()[1])
    ports = iter([taken])
    real = notebook.free_port
    monkeypatch.setattr(notebook, "free_port", lambda host: next(ports, None) or real(host))
    monkeypatch.chdir(tmp_path)
    token = secrets.token_urlsafe(16)
    before = signal.getsignal(signal.SIGTERM)
    try:
        served = notebook.serve("127.0.0.1", "/ui/notebooks/1/", token)
        assert not isinstance(served, int), f"the server did not start: exit code {served}"
        server, port = served
        assert port != taken
        assert notebook.answers("127.0.0.1", port, "/ui/notebooks/1/", token)
        server.terminate()
        server.wait(timeout=30)
    finally:
        signal.signal(signal.SIGTERM, before)
    other.setblocking(False)
    with pytest.raises(BlockingIOError):  # never asked with the token: it is not the server
        other.accept()
