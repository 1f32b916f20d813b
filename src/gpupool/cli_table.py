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
    # Last, should cells of the fixed columns be longer than anyone expected: the widest of them
    # give way too, never below their header, so that no header is ever cut.
    while total() > width:
        shown = [i for i, w in enumerate(widths) if w is not None and w > len(columns[i].header)]
        if not shown:
            break
        widest = max(shown, key=lambda i: (widths[i] or 0, -i))
        current = widths[widest] or 0
        widths[widest] = max(len(columns[widest].header), current - (total() - width))
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
