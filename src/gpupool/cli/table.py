"""Tables for a terminal that stay readable at any width, and when piped.

No word is ever broken across lines: a cell is one line, or, in a column made to wrap (prose
such as a reason), wraps between words. When the table is wider than the console, the flexible
columns shrink first, in the order given (text is cut with an ellipsis, or wraps), down to their
minimum; then whole columns are left out, least important first. A word longer than its column
is cut with an ellipsis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.table import Table
from rich.text import Text

GAP = 2
"""Blank columns between two table columns (rich's padding of one on each side)."""


@dataclass(frozen=True, slots=True)
class Column:
    header: str
    justify: Literal["left", "right"] = "left"
    shrink: int = 0
    """0: never cut; else its step in the sequence that makes a table fit (see `fit`)."""
    minimum: int = 8
    """The narrowest a shrinking column gets."""
    drop: int = 0
    """0: always shown; else its step in the sequence that makes a table fit (see `fit`)."""
    wrap: bool = False
    """Prose: wraps between words instead of being cut."""
    keep: bool = False
    """Never cut, whatever else has to give (an identifier people type back)."""


def fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> list[int | None]:
    """The width of each column (None: left out) so that the table fits `width`.

    Shrinking and leaving out are one sequence of steps, in the order of their numbers (at one
    number, shrinking comes first): so a table may cut names only after it has left out a
    column that matters less, or the other way round, as each table chooses."""
    natural = [max([len(c.header)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    widths: list[int | None] = list(natural)

    def total() -> int:
        shown = [w for w in widths if w is not None]
        return sum(shown) + GAP * max(0, len(shown) - 1)

    steps = sorted(
        [(c.shrink, 0, i) for i, c in enumerate(columns) if c.shrink]
        + [(c.drop, 1, i) for i, c in enumerate(columns) if c.drop]
    )
    for _, leave_out, i in steps:
        excess = total() - width
        if excess <= 0:
            break
        current = widths[i]
        if current is None:
            continue
        if leave_out:
            widths[i] = None
            continue
        # A header is never cut (one that wraps may wrap between its words).
        longest = max(len(w) for w in columns[i].header.split()) if columns[i].wrap else len(columns[i].header)
        floor = min(current, max(columns[i].minimum, longest, 1))
        widths[i] = max(floor, current - excess)

    # Last, should cells be longer than anyone expected: shrinking columns give way below their
    # minimum, in their order, then the widest other columns; never below a header, never one
    # that must be kept whole.
    def give(candidates: list[int]) -> None:
        for i in candidates:
            excess = total() - width
            current = widths[i]
            if excess <= 0 or current is None:
                return
            widths[i] = max(len(columns[i].header), current - excess)

    give(sorted((i for i, c in enumerate(columns) if c.shrink), key=lambda i: columns[i].shrink))
    while total() > width:
        movable = [
            i for i, w in enumerate(widths) if w is not None and not columns[i].keep and w > len(columns[i].header)
        ]
        if not movable:
            break
        give([max(movable, key=lambda i: (widths[i] or 0, -i))])
    return widths


def table(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int, title: str | None = None) -> Table:
    """A rich table of `rows` (cells as text) that fits `width` columns of a console."""
    widths = fit(columns, rows, width)
    out = Table(box=None, header_style="bold", title=title, pad_edge=False, collapse_padding=False)
    shown = [i for i, w in enumerate(widths) if w is not None]
    for i in shown:
        c = columns[i]
        w = widths[i]
        out.add_column(c.header, justify=c.justify, no_wrap=not c.wrap, overflow="ellipsis", width=w)
    for row in rows:
        out.add_row(*(Text(row[i]) for i in shown))  # plain text: a name like "run[/]" is no markup
    return out
