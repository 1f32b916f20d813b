"""Tables at any width: one line per row, never wider than the console, headers whole."""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from gpupool.cli.table import Column, table

COLUMNS = (
    Column("JOBID"),
    Column("NAME", shrink=1, minimum=6),
    Column("TEAM", shrink=2, minimum=6),
    Column("USER", shrink=3, minimum=6, drop=1),
    Column("STATE"),
    Column("NODES(REASON)", shrink=4, minimum=16),
)
WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_-[],0123456789", min_size=1, max_size=40)


def render(rows: list[list[str]], width: int) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(table(COLUMNS, rows, width))
    return out.getvalue().splitlines()


@given(st.lists(st.lists(WORD, min_size=6, max_size=6), min_size=1, max_size=8), st.integers(80, 200))
def test_every_row_is_one_line_that_fits(rows: list[list[str]], width: int) -> None:
    lines = render(rows, width)
    assert len(lines) == len(rows) + 1, "a cell wrapped"
    assert all(len(line) <= width for line in lines)
    assert lines[0].split() == [c.header for c in COLUMNS if c.header in lines[0].split()]
    assert "NODES(REASON)" in lines[0] and "JOBID" in lines[0], "the columns that matter are kept whole"


def test_prose_wraps_between_words_and_a_too_long_word_is_cut_not_broken() -> None:
    columns = (Column("KIND"), Column("WHAT", shrink=1, minimum=20, wrap=True))
    out = io.StringIO()
    text = "preempted job 812 (team vision, low, last checkpoint 40 s ago) /a/path/" + "x" * 60
    Console(file=out, width=40, color_system=None).print(table(columns, [["preempting", text]], 40))
    words = text.split()
    for line in out.getvalue().splitlines()[1:]:
        for word in line.split()[1:] if line.startswith("preempting") else line.split():
            assert word in words or word.endswith("…"), f"{word!r} is a broken word"


@given(st.lists(st.lists(WORD, min_size=6, max_size=6), min_size=1, max_size=8), st.integers(72, 200))
def test_a_job_id_is_never_cut(rows: list[list[str]], width: int) -> None:
    rows = [[f"{i}_{n}" for n in (123456,)][0:1] + r[1:] for i, r in enumerate(rows)]
    out = io.StringIO()
    columns = (Column("JOBID", keep=True), *COLUMNS[1:])
    Console(file=out, width=width, color_system=None).print(table(columns, rows, width))
    ids = [line.split()[0] for line in out.getvalue().splitlines()[1:]]
    assert ids == [r[0] for r in rows]
