"""The terminal's pieces (`executors/terminal.py`, `cli/terminal.py`): frames read in any
pieces, ssh's escapes read from what is typed, and the relay with a real PTY and a program on
it, whose slow client holds nobody back."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.cli.terminal import Escape
from gpupool.executors import terminal
from gpupool.executors.terminal import INPUT, MAX_FRAME, OUTPUT, Frames, frame


@given(
    frames=st.lists(st.tuples(st.sampled_from([INPUT, OUTPUT]), st.binary(max_size=300)), max_size=8),
    cuts=st.lists(st.integers(1, 50), max_size=30),
)
def test_frames_come_out_whole_however_the_stream_is_cut(frames: list[tuple[bytes, bytes]], cuts: list[int]) -> None:
    stream = b"".join(frame(kind, payload) for kind, payload in frames)
    reader, found, at = Frames(), [], 0
    for cut in [*cuts, len(stream)]:
        found += reader.feed(stream[at : at + cut])
        at += cut
    found += reader.feed(stream[at:])
    assert found == frames


def test_a_frame_too_long_is_refused() -> None:
    with pytest.raises(ValueError, match="more than"):
        Frames().feed(frame(INPUT, b"")[:1] + (MAX_FRAME + 1).to_bytes(4, "big"))


@pytest.mark.parametrize(
    ("typed", "sent", "detached"),
    [
        (b"ls\r", b"ls\r", False),
        (b"~.", b"", True),
        (b"echo\r~.", b"echo\r", True),
        (b"a~.", b"a~.", False),  # not at the start of a line
        (b"~~x", b"~x", False),
        (b"~x", b"~x", False),
    ],
)
def test_ssh_escapes_at_the_start_of_a_line(typed: bytes, sent: bytes, detached: bool) -> None:
    assert Escape().feed(typed) == (sent, detached)


def test_an_escape_split_over_two_reads_still_detaches() -> None:
    escape = Escape()
    assert escape.feed(b"\r~") == (b"\r", False)
    assert escape.feed(b".") == (b"", True)


def test_a_client_that_takes_no_output_holds_back_neither_the_terminal_nor_the_others() -> None:
    """A program prints 8 MB; one client asked for the screen and never reads: it is cut off
    once 4 MiB wait for it, and the other client gets everything, then the exit status."""
    owner = f"test:{uuid.uuid4().hex}"
    master, slave = terminal.opened(None)
    relay = terminal.Relay(owner, master)
    printer = "import sys\nfor _ in range(8192): sys.stdout.write('x' * 1023 + '\\n')"
    child = subprocess.Popen(
        [sys.executable, "-c", printer], stdin=slave, stdout=slave, stderr=slave, start_new_session=True
    )
    os.close(slave)
    slow, fast = terminal.Link(owner), terminal.Link(owner)
    slow.send(terminal.SCREEN)
    fast.send(terminal.SCREEN)
    ended: list[int] = []

    def relaying() -> None:
        code = relay.run(child, lambda: 0)
        ended.append(code)
        relay.finish(code)

    thread = threading.Thread(target=relaying)
    thread.start()
    received, status = 0, None
    while status is None:
        frames = fast.receive(30)
        assert frames is not None, f"the fast client was cut off after {received} bytes"
        for kind, payload in frames:
            if kind == terminal.OUTPUT:
                received += len(payload)
            elif kind == terminal.ENDED:
                status = int(payload)
    thread.join(timeout=30)
    assert (status, ended) == (0, [0])
    assert received >= 8192 * 1024  # every line, with the terminal's \r\n
    slow.close()
    fast.close()
