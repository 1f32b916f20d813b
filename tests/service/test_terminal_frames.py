"""The terminal's pieces that need no process: frames read in any pieces, and ssh's escapes
read from what is typed (`executors/terminal.py`, `cli/terminal.py`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.cli.terminal import Escape
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
