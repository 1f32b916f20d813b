"""Small inline SVG charts: no script, no download, readable without colour (values are written
out in the chart's text alternative, guides are dashed, axes are labelled)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 640, 160, 44, 22, 10


def _clock(t: float, span: float) -> str:
    return time.strftime("%H:%M" if span < 20 * 3600 else "%m-%d %H:%M", time.localtime(t))


def _frame(title: str, top: float, start: float, end: float, body: str, summary: str) -> str:
    plot_h = HEIGHT - BOTTOM - TOP
    axis = (
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH}" y2="{TOP + plot_h}" class="axis"/>'
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" class="axis"/>'
        f'<text x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end">{top:g}</text>'
        f'<text x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end">0</text>'
        f'<text x="{LEFT}" y="{HEIGHT - 4}">{_clock(start, end - start)}</text>'
        f'<text x="{WIDTH}" y="{HEIGHT - 4}" text-anchor="end">{_clock(end, end - start)}</text>'
    )
    return (
        f'<figure class="chart"><svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}" '
        f"><title>{escape(title)}</title><desc>{escape(summary)}</desc>{axis}{body}</svg>"
        f"<figcaption>{escape(title)}</figcaption></figure>"
    )


def _scale(top: float) -> tuple[float, float]:
    return (WIDTH - LEFT), (HEIGHT - BOTTOM - TOP) / (top or 1.0)


def lines(
    title: str, series: Sequence[tuple[str, Sequence[tuple[float, float]]]], start: float, end: float, guide: float = 0
) -> str:
    """One line per series of (time, value), and a dashed horizontal `guide` (a guarantee)."""
    top = max([guide, *(v for _, points in series for _, v in points)], default=1.0) or 1.0
    width, per = _scale(top)
    span = (end - start) or 1.0
    body = []
    for index, (name, points) in enumerate(series):
        path = " ".join(f"{LEFT + (t - start) / span * width:.1f},{TOP + (top - v) * per:.1f}" for t, v in points)
        body.append(f'<polyline points="{path}" class="line s{index}"><title>{escape(name)}</title></polyline>')
    if guide:
        y = TOP + (top - guide) * per
        body.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH}" y2="{y:.1f}" class="guide"/>')
    values = [v for _, points in series for _, v in points]
    summary = f"from {min(values, default=0):g} to {max(values, default=0):g}; guide at {guide:g}"
    return _frame(title, top, start, end, "".join(body), summary)


def bars(title: str, values: Sequence[float], start: float, end: float) -> str:
    """One bar per value, evenly over [start, end]."""
    top = max(values, default=0.0) or 1.0
    width, per = _scale(top)
    step = width / max(1, len(values))
    body = "".join(
        f'<rect x="{LEFT + i * step + 1:.1f}" y="{TOP + (top - v) * per:.1f}" width="{max(1.0, step - 2):.1f}" '
        f'height="{v * per:.1f}" class="bar"><title>{v:.2f}</title></rect>'
        for i, v in enumerate(values)
    )
    summary = f"{len(values)} bars, total {sum(values):.2f}, largest {max(values, default=0):.2f}"
    return _frame(title, round(top, 2), start, end, body, summary)
