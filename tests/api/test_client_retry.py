"""The command line's submissions survive a lost answer: each sends a fresh Idempotency-Key and
retries with it on connection errors, for about 30 s, then gives up with exit code 4."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from typer.testing import CliRunner

from gpupool import client as client_module
from gpupool.cli import app as cli
from gpupool.cli.common import EXIT_UNREACHABLE
from gpupool.client import Client, Unreachable
from gpupool.up import free_port
from tests.support.apiworld import ADMIN, Api, opened


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    yield from opened(tmp_path)


class DroppingProxy:
    """A TCP proxy in front of the API that forwards the first connection's request, waits for
    the answer (so the job is committed), and resets the connection instead of passing it on."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.first_answer = b""
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self.relay, args=(client, self.connections == 1), daemon=True).start()

    def relay(self, client: socket.socket, drop: bool) -> None:
        with client, socket.create_connection(("127.0.0.1", self.upstream)) as server:
            if drop:
                client.settimeout(30)
                server.settimeout(30)
                server.sendall(read_request(client))
                self.first_answer = server.recv(1 << 20)  # the answer: the job is committed
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                return  # closed with linger 0: a reset
            pipes = [
                threading.Thread(target=pipe, args=pair, daemon=True) for pair in ((client, server), (server, client))
            ]
            for p in pipes:
                p.start()
            for p in pipes:
                p.join()

    def close(self) -> None:
        self.listener.close()


def read_request(client: socket.socket) -> bytes:
    """One whole HTTP request: its head, then as many bytes as its Content-Length says."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += client.recv(1 << 16)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    while len(body) < length:
        body += client.recv(1 << 16)
    return head + b"\r\n\r\n" + body


def pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(1 << 16):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


@pytest.fixture
def served(api: Api) -> Iterator[tuple[Api, int]]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(api.app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the API did not start"
        time.sleep(0.02)
    yield api, port
    server.should_exit = True
    thread.join(timeout=10)


def test_a_submission_whose_connection_drops_after_its_commit_is_retried_and_is_one_job(
    served: tuple[Api, int],
) -> None:
    api, port = served
    proxy = DroppingProxy(port)
    try:
        client = Client(f"http://127.0.0.1:{proxy.port}", ADMIN)
        job = client.submit_body({"command": ["true"], "workdir": str(api.workdir)})
    finally:
        proxy.close()
    assert proxy.first_answer.startswith(b"HTTP/1.1 201"), "the first try was committed, then its answer lost"
    assert proxy.connections >= 2
    assert [j.id for j in api.store.jobs()] == [job["id"]]


def test_each_submission_sends_a_fresh_key_and_a_retry_the_same_one() -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["Idempotency-Key"])
        if len(seen) == 1:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        if len(seen) == 2:
            return httpx.Response(503, headers={"Retry-After": "0"}, json={"error": "Unavailable", "message": "busy"})
        return httpx.Response(201, json={"id": len(seen)})

    client = Client("http://gpupool", ADMIN)
    client.http = httpx.Client(base_url="http://gpupool", transport=httpx.MockTransport(answer))
    client.pause = lambda _seconds: None
    assert client.submit_body({"command": ["true"]}) == {"id": 3}
    assert client.submit_body({"command": ["true"]}) == {"id": 4}
    assert seen[0] == seen[1] == seen[2] != seen[3]
    assert all(uuid.UUID(key).version == 4 for key in seen)


def test_a_submission_gives_up_after_its_retry_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "SUBMIT_RETRY_SECONDS", 0.5)
    client = Client(f"http://127.0.0.1:{free_port()}", ADMIN)
    began = time.monotonic()
    with pytest.raises(Unreachable, match=r"retried for 0\.5 s"):
        client.submit_body({"command": ["true"]})
    assert 0.4 < time.monotonic() - began < 5


def test_the_command_line_exits_4_when_the_service_stays_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "SUBMIT_RETRY_SECONDS", 0.3)
    url = f"http://127.0.0.1:{free_port()}"
    done = CliRunner().invoke(cli, ["submit", "--api", url, "--", "true"], env={"GPUPOOL_TOKEN": "t"})
    assert done.exit_code == EXIT_UNREACHABLE, done.output
    assert "cannot reach gpupool" in done.output
