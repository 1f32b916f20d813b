"""This terminal, joined to a shell session's over the API's WebSocket (`api/sessions.py`):
`gpupool shell` and `gpupool attach`.

While attached, this terminal is in raw mode: every key goes to the session (Ctrl-C and Ctrl-Z
reach the program there), and its size follows this window's. As ssh does, `Enter ~ .` detaches
(the session runs on) and `Enter ~ ~` types one `~`.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import sys
import termios
import threading
import tty
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from gpupool.client import Client, Unreachable
from gpupool.errors import HTTP_STATUS, GpupoolError

ERRORS = {4000 + status: kind for kind, status in HTTP_STATUS.items()}
"""The close codes the service ends a refused connection with: 4000 + the HTTP status."""


@dataclass
class Attached:
    """How an attachment ended: the shell's exit code, a detach, or the link lost."""

    exit_code: int | None = None
    detached: bool = False
    error: GpupoolError | None = None


@dataclass
class Escape:
    """ssh's escapes, read from what is typed: `~.` and `~~` at the start of a line."""

    at_line_start: bool = True
    tilde: bool = False

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """What to send of `data`, and whether to detach."""
        out = bytearray()
        for byte in data:
            char = bytes([byte])
            if self.tilde:
                self.tilde = False
                if char == b".":
                    return bytes(out), True
                out += b"~" if char == b"~" else b"~" + char
            elif self.at_line_start and char == b"~":
                self.tilde = True
                continue
            else:
                out += char
            self.at_line_start = char in (b"\r", b"\n")
        return bytes(out), False


def terminal_url(api: Client, job_id: int) -> str:
    scheme, rest = api.url.split("://", 1)
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest.rstrip('/')}/jobs/{job_id}/terminal"


def window() -> str:
    """This window's size, as the terminal has it now (not $COLUMNS and $LINES, often stale)."""
    try:
        size = os.get_terminal_size(sys.stdin.fileno())
    except (OSError, ValueError):
        size = shutil.get_terminal_size()
    return json.dumps({"resize": [size.lines, size.columns]})


@dataclass
class Session:
    """One attachment: the connection, and what the receiving thread found."""

    connection: ClientConnection
    ended: Attached = field(default_factory=Attached)
    done: threading.Event = field(default_factory=threading.Event)

    def receive(self) -> None:
        """The session's screen to this one, until it ends or the link is lost."""
        out = sys.stdout.buffer
        try:
            for message in self.connection:
                if isinstance(message, bytes):
                    out.write(message)
                    out.flush()
                    continue
                told: dict[str, Any] = json.loads(message)
                if "exit_code" in told:
                    self.ended.exit_code = int(told["exit_code"])
                elif "error" in told:
                    kind = next((k for k in HTTP_STATUS if k.__name__ == told["error"]), GpupoolError)
                    self.ended.error = kind(str(told.get("message", "")))
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd is not None else None
            if self.ended.error is None and self.ended.exit_code is None and code not in ERRORS:
                self.ended.error = Unreachable(f"the connection to the session was lost ({closed})")
        finally:
            self.done.set()


def attach(api: Client, job_id: int) -> Attached:
    """Join this terminal to the job's until its shell ends, this side detaches (`~.`) or the
    link is lost."""
    url, session = terminal_url(api, job_id), None
    headers = {"Authorization": f"Bearer {api.token}"}
    try:
        with connect(url, additional_headers=headers, proxy=None, max_size=None, compression=None) as connection:
            session = Session(connection)
            threading.Thread(target=session.receive, daemon=True, name="terminal").start()
            try:
                session.ended.detached = relay(session)
            finally:
                connection.close()
                session.done.wait(5)
    except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as exc:
        if session is None:
            return Attached(error=Unreachable(f"cannot reach the session at {api.url} ({exc})"))
        raise
    return session.ended


def relay(session: Session) -> bool:
    """This terminal's keys and size to the session (raw mode while attached); whether it
    detached (`~.`)."""
    stdin = sys.stdin.fileno()
    interactive = os.isatty(stdin)
    saved = termios.tcgetattr(stdin) if interactive else None
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)

    def resized(_signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            os.write(wake_w, b"w")

    previous = signal.signal(signal.SIGWINCH, resized)
    escape = Escape()
    try:
        if interactive:
            tty.setraw(stdin)
        session.connection.send(window())
        while not session.done.is_set():
            ready = select.select([stdin, wake_r], [], [], 0.2)[0]
            if wake_r in ready:
                os.read(wake_r, 64)
                session.connection.send(window())
            if stdin in ready:
                data = os.read(stdin, 65536)
                if not data:  # end of input (not a terminal): as Ctrl-D, then the session's end
                    session.connection.send(b"\x04")
                    session.done.wait()
                    break
                typed, detach = escape.feed(data)
                if typed:
                    session.connection.send(typed)
                if detach:
                    return True
    except ConnectionClosed:
        pass
    finally:
        signal.signal(signal.SIGWINCH, previous)
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        os.close(wake_r)
        os.close(wake_w)
    return False
