"""A session's terminal: the pseudo-terminal (PTY) a shell runs on, kept by its launcher, and
the link through which the scheduler reaches it (standard library only: the launcher imports
it as it imports `cgroups`).

The launcher holds the PTY's master side and serves it on a Unix socket of the abstract
namespace, named after the member's owner (`address`): a client (the local executor in the
scheduler's process, or a Ray node's launcher actor on the member's node) connects there and
exchanges frames: a kind byte, a 4-byte length, the payload.

- client → launcher: `INPUT` (keystrokes, written to the PTY), `RESIZE` (`rows cols`: the
  window size, which sends the program SIGWINCH), `SAY` (a line of gpupool's own, shown to
  every client and kept, never typed into the program), `SCREEN` (send me the last `KEPT`
  bytes of output: an `attach` sees the screen it comes back to);
- launcher → client: `OUTPUT` (what the program wrote), `ENDED` (the command's exit status,
  as the launcher reports it).

Only processes of the launcher's own user (the scheduler's) are let in (`SO_PEERCRED`): a job
of another user cannot type into someone's shell. The terminal lives as long as its command:
clients come and go (a lost connection ends nothing), and the launcher keeps reading the PTY
while none is there, so that the program never blocks on a full terminal.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import select
import selectors
import signal
import socket
import struct
import subprocess
import termios
import time
from collections.abc import Callable
from pathlib import Path

HEADER = struct.Struct("!cI")
INPUT, RESIZE, SAY, SCREEN, OUTPUT, ENDED = b"i", b"r", b"s", b"v", b"o", b"x"
MAX_FRAME = 1 << 20
"""The largest payload a frame may carry; a peer that sends more is cut off."""
KEPT = 64 * 1024
"""Bytes of output kept for a client that connects later (an `attach`)."""
TYPED_AT_MOST = 1 << 20
"""Bytes typed that the program has not taken yet, at most: more is dropped (a paste too big)."""
PENDING_AT_MOST = 4 << 20
"""Bytes of output a client may leave untaken before it is cut off: a slow client never holds
the terminal, nor the other clients, back."""


def address(owner: str) -> bytes:
    """The abstract socket a member's terminal is served on (no file: nothing to clean up)."""
    return b"\0gpupool-terminal-" + hashlib.sha256(owner.encode()).hexdigest()[:40].encode()


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def resize_payload(rows: int, cols: int) -> bytes:
    return f"{rows} {cols}".encode()


class Frames:
    """Frames read from a byte stream as they come, in pieces of any size."""

    def __init__(self) -> None:
        self.pending = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """The whole frames `data` completes; `ValueError` for a frame too long."""
        self.pending += data
        found = []
        while len(self.pending) >= HEADER.size:
            kind, length = HEADER.unpack_from(self.pending)
            if length > MAX_FRAME:
                raise ValueError(f"a frame of {length} bytes is more than {MAX_FRAME}")
            end = HEADER.size + length
            if len(self.pending) < end:
                break
            found.append((kind, bytes(self.pending[HEADER.size : end])))
            del self.pending[:end]
        return found


def opened(user_uid: int | None) -> tuple[int, int]:
    """A new PTY (master, slave), the slave given to the job's user as a login's terminal is."""
    master, slave = os.openpty()
    if user_uid is not None and os.geteuid() == 0:
        os.fchown(slave, user_uid, -1)
        os.fchmod(slave, 0o620)
    set_size(master, 24, 80)
    return master, slave


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def take_terminal() -> None:
    """In the command's process, before it runs (a new session already): its standard input,
    the PTY's slave, becomes its controlling terminal, so that Ctrl-C and Ctrl-Z reach it."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Relay:
    """The launcher's side: the PTY's master, the clients, the output kept. A client gets the
    terminal's output once it asked for the screen (`SCREEN`): a client that only says a line
    (`SAY`) gets none."""

    def __init__(self, owner: str, master: int) -> None:
        self.master = master
        self.kept = bytearray()
        self.clients: dict[socket.socket, Frames] = {}
        self.watching: set[socket.socket] = set()
        """The clients that asked for the screen: the output goes to them."""
        self.pending: dict[socket.socket, bytearray] = {}
        """Output each client has not taken yet (sent as its socket takes it)."""
        self.typed = bytearray()
        """Keystrokes not yet taken by the program (the PTY's input queue was full)."""
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(address(owner))
        self.listener.listen(8)
        self.selector = selectors.DefaultSelector()

    def run(self, child: subprocess.Popen[bytes], notices: Callable[[], int]) -> int:
        """Relay until the command ends; its status (`Popen.wait`'s). Each notice the launcher
        got (`notices` counts them) is passed on (`_notice`)."""
        os.set_blocking(self.master, False)
        self.selector.register(self.master, selectors.EVENT_READ, "master")
        self.selector.register(self.listener, selectors.EVENT_READ, "listener")
        forwarded, hang_up = 0, False
        while child.poll() is None:
            if notices() > forwarded:
                forwarded, hang_up = notices(), True
                self._notice(child.pid)
            if hang_up and self._foreground() == child.pid and ignores_notice(child.pid):
                hang_up = False
                signal_group(child.pid, signal.SIGHUP)
            for key, events in self.selector.select(timeout=0.2):
                self._ready(key.data, key.fileobj, events)
        self._read_master()  # what it wrote last
        return child.wait()

    def _notice(self, shell: int) -> None:
        """A notice (SIGTERM) for the program in the terminal's foreground, as a batch job gets
        it, and for the command's own process group. A shell ignores it: it is hung up (SIGHUP,
        as when its terminal closes) once it is back at its prompt (`run`), so that a program
        it runs saves and leaves first; a command that takes the notice itself is left to it."""
        foreground = self._foreground()
        if foreground is not None and foreground != shell:
            signal_group(foreground, signal.SIGTERM)
        signal_group(shell, signal.SIGTERM)

    def _foreground(self) -> int | None:
        try:
            return os.tcgetpgrp(self.master)
        except OSError:
            return None

    def finish(self, code: int, within: float = 2.0) -> None:
        """Tell every client the command's exit status (as the launcher reports it), giving
        them `within` seconds to take what they have not taken yet, and close."""
        self._send_all(frame(ENDED, str(code).encode()))
        deadline = time.monotonic() + within
        for idle in (self.listener, self.master):
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(idle)
        while any(self.pending.values()) and time.monotonic() < deadline:
            for key, events in self.selector.select(timeout=0.1):
                if isinstance(key.fileobj, socket.socket) and events & selectors.EVENT_WRITE:
                    self._flush(key.fileobj)
        self.close()

    def _ready(self, what: str, fileobj: object, events: int) -> None:
        if what == "master":
            if events & selectors.EVENT_READ:
                self._read_master()
            if events & selectors.EVENT_WRITE:
                self._type()
        elif what == "listener":
            self._accept()
        elif isinstance(fileobj, socket.socket):
            if events & selectors.EVENT_WRITE:
                self._flush(fileobj)
            if events & selectors.EVENT_READ and fileobj in self.clients:
                self._from_client(fileobj)

    def _read_master(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except BlockingIOError:
                return
            except OSError:  # EIO: no process holds the terminal any more
                with contextlib.suppress(KeyError, ValueError):
                    self.selector.unregister(self.master)
                return
            if not data:
                return
            self._show(data)

    def _show(self, data: bytes) -> None:
        self.kept += data
        del self.kept[: max(0, len(self.kept) - KEPT)]
        self._send_all(frame(OUTPUT, data))

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:  # no descriptor left, or the client gave up: it may try again
            return
        if not trusted(client):
            client.close()
            return
        client.setblocking(False)
        self.clients[client] = Frames()
        self.pending[client] = bytearray()
        self.selector.register(client, selectors.EVENT_READ, "client")

    def _from_client(self, client: socket.socket) -> None:
        try:
            data = client.recv(65536)
            frames = self.clients[client].feed(data) if data else None
        except (OSError, ValueError):
            frames = None
        if frames is None:
            self._drop(client)
            return
        for kind, payload in frames:
            if kind == INPUT:
                self.typed += payload[: max(0, TYPED_AT_MOST - len(self.typed))]
                self._type()
            elif kind == RESIZE:
                with contextlib.suppress(ValueError, OSError):
                    rows, cols = (int(n) for n in payload.split())
                    set_size(self.master, max(1, min(rows, 1000)), max(1, min(cols, 1000)))
            elif kind == SAY:
                self._show(payload)
            elif kind == SCREEN:
                self.watching.add(client)
                if self.kept:
                    self._send(client, frame(OUTPUT, bytes(self.kept)))

    def _type(self) -> None:
        """Write what was typed, as much as the terminal takes now; the rest when it can."""
        try:
            while self.typed:
                written = os.write(self.master, self.typed)
                del self.typed[:written]
        except BlockingIOError:
            pass
        except OSError:
            self.typed.clear()
        wanted = selectors.EVENT_READ | (selectors.EVENT_WRITE if self.typed else 0)
        with contextlib.suppress(KeyError, ValueError):
            if self.selector.get_key(self.master).events != wanted:
                self.selector.modify(self.master, wanted, "master")

    def _send(self, client: socket.socket, data: bytes) -> None:
        pending = self.pending.get(client)
        if pending is None:
            return
        pending += data
        if len(pending) > PENDING_AT_MOST:
            self._drop(client)
            return
        self._flush(client)

    def _flush(self, client: socket.socket) -> None:
        """Send what the client's socket takes now; the rest when it can take more."""
        pending = self.pending.get(client)
        if pending is None:
            return
        try:
            while pending:
                del pending[: client.send(pending)]
        except BlockingIOError:
            pass
        except OSError:
            self._drop(client)
            return
        wanted = selectors.EVENT_READ | (selectors.EVENT_WRITE if pending else 0)
        with contextlib.suppress(KeyError, ValueError):
            if self.selector.get_key(client).events != wanted:
                self.selector.modify(client, wanted, "client")

    def _send_all(self, data: bytes) -> None:
        for client in list(self.watching):
            self._send(client, data)

    def _drop(self, client: socket.socket) -> None:
        self.watching.discard(client)
        self.pending.pop(client, None)
        if self.clients.pop(client, None) is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(client)
        client.close()

    def close(self) -> None:
        for client in list(self.clients):
            self._drop(client)
        self.listener.close()
        self.selector.close()
        with contextlib.suppress(OSError):
            os.close(self.master)


def trusted(peer: socket.socket) -> bool:
    """Whether the process at the other end runs as the scheduler's user (or root): the kernel
    says who it is (`SO_PEERCRED`), whoever connects or listens."""
    creds = peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid in (os.getuid(), 0)


def ignores_notice(pid: int) -> bool:
    """Whether the process ignores SIGTERM (an interactive shell does), as /proc says."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except (OSError, ValueError):
        pass
    return False


def kill_session(session: int) -> None:
    """SIGKILL every process of a session (a shell's on its terminal: its jobs are process
    groups of their own), as /proc lists them: what a cgroup would hold, where there is none."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[3]) == session:
                    os.kill(int(proc.name), signal.SIGKILL)


def signal_group(group: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


class Link:
    """The scheduler's side of one connection to a member's terminal (on this machine)."""

    def __init__(self, owner: str, timeout: float = 5.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(address(owner))
            if not trusted(self.sock):  # a name any process could take once its launcher let it go
                raise ConnectionRefusedError(f"the terminal of {owner} is served by another user's process")
        except OSError:
            self.sock.close()
            raise
        self.frames = Frames()

    def send(self, kind: bytes, payload: bytes = b"") -> None:
        self.sock.sendall(frame(kind, payload))

    def receive(self, timeout: float) -> list[tuple[bytes, bytes]] | None:
        """The frames that came within `timeout` seconds ([] if none); None once the terminal
        is gone (its command ended and every frame was read). One thread receives while
        another sends: the socket's own timeout is for sending."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return []
            try:
                data = self.sock.recv(65536)
            except OSError:
                return None
            if not data:
                return None
            try:
                found = self.frames.feed(data)
            except ValueError:
                return None
            if found:
                return found

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
