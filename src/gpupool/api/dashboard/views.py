"""What each page shows, read from the store and cut to what the token may see (`access`): plain
values for the templates. Another team's jobs appear by id, team, class, state and GPUs only, as
in the API's listings; its users, names, commands, reasons and logs never."""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from gpupool.accounting import Interruption
from gpupool.api import access
from gpupool.api.access import Principal
from gpupool.api.context import Context
from gpupool.api.dashboard import svg
from gpupool.api.logs import read_part
from gpupool.errors import Forbidden, GpupoolError
from gpupool.model import SessionKind, job_label
from gpupool.settle import JobState
from gpupool.units import gpu_time, gpu_unit, human_seconds

GPU_STATES = ("idle", "allocated", "draining", "held", "down")
LIVE = (JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING)
LOG_LINES, LOG_BYTES, EVENTS = 40, 16384, 500
"""How much of a job's output and events its page shows (`gpupool logs`, `events` have all)."""


def when(timestamp: float | None, now: float) -> str:
    """`14:03:07 (42 s ago)`, in the server's local time."""
    if timestamp is None:
        return "—"
    clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))
    ago = now - timestamp
    return f"{clock} ({human_seconds(ago)} ago)" if ago >= 0 else f"{clock} (in {human_seconds(-ago)})"


@dataclass
class Cell:
    gpu: int
    state: str
    job: int | None = None
    team: str | None = None
    user: str | None = None
    for_job: int | None = None
    job_label: str | None = None
    for_label: str | None = None
    visible: bool = False
    """Whether the token sees the holder's job in full (a link to its page)."""


@dataclass
class NodeView:
    name: str
    gpu_type: str
    up: bool
    cells: list[Cell] = field(default_factory=list)


NODES_SHOWN = 64
"""Nodes per page of the pool (its counts are of every node)."""


def pool(ctx: Context, who: Principal, page: int = 1, state: str | None = None) -> dict[str, Any]:
    """Every GPU's state counted (grouped in the store), and a page of nodes in full (those
    with a GPU in `state`, if given)."""
    every = ctx.store.node_gpus()
    counts: Counter[str] = Counter()
    states: dict[str, Counter[str]] = {}
    for n in every:
        mine = Counter({"down": n.gpus}) if not n.up else Counter(n.states)
        if n.up:
            mine["idle"] = max(0, n.gpus - sum(n.states.values()))
        states[n.name] = mine
        counts.update(mine)
    chosen = [n for n in every if state is None or states[n.name][state] > 0]
    pages = max(1, -(-len(chosen) // NODES_SHOWN))
    page = min(max(1, page), pages)
    shown = chosen[(page - 1) * NODES_SHOWN : page * NODES_SHOWN]
    _, gpus = ctx.store.pool_view([n.name for n in shown if n.up])
    by_node: dict[str, list[Cell]] = defaultdict(list)
    for g in gpus:
        # As access.gpu_view: another team's holder by team and job, never by user.
        visible = g.team is not None and access.sees_in_full(who, g.team)
        by_node[g.node].append(
            Cell(
                g.gpu, g.state, g.job, g.team, g.user if visible else None, g.for_job, g.job_label, g.for_label, visible
            )
        )
    views = [
        NodeView(n.name, n.gpu_type, True, by_node[n.name])
        if n.up
        else NodeView(n.name, n.gpu_type, False, [Cell(i, "down") for i in range(n.gpus)])
        for n in shown
    ]
    return {
        "nodes": views,
        "counts": [(s, counts.get(s, 0)) for s in GPU_STATES],
        "total": sum(counts.values()),
        "page": page,
        "pages": pages,
        "state": state,
        "matching": len(chosen),
    }


@dataclass
class JobLine:
    id: int
    label: str
    team: str
    priority: str
    state: str
    gpus: int
    visible: bool
    name: str = ""
    user: str = ""
    reason: str | None = None
    message: str | None = None
    place: int | None = None
    waited: str = ""
    where: str = ""
    since: str = ""
    session: str = ""
    """`run`, `shell` or `notebook` for a session."""
    opens: bool = False
    """The viewer's own notebook: the page links to it."""
    warning: str = ""
    """What the session was warned of (it is idle, to be reclaimed)."""


SHOWN = 200
"""Rows of each table of the queue page at most (filters narrow it; the API lists all)."""


def queue(ctx: Context, who: Principal, now: float, team: str | None, cls: str | None) -> dict[str, Any]:
    places: dict[int, int] = ctx.lineup.places if ctx.lineup is not None else {}
    live = [s.value for s in LIVE]
    running = ctx.store.listing(live, team, cls)
    pending = ctx.store.listing([JobState.PENDING.value], team, cls)
    pending.sort(key=lambda j: (places.get(j.id) is None, places.get(j.id, 0), j.id))
    shown_running = running[-SHOWN:]  # the newest
    held = ctx.store.holding([j.id for j in shown_running])

    def line(row: Any) -> JobLine:
        visible = access.sees_in_full(who, row.team)
        label = job_label(row.id, row.array_id, row.array_index)
        shown = JobLine(row.id, label, row.team, row.priority, row.state, row.gpus, visible, place=places.get(row.id))
        if not visible:
            return shown  # as JobBriefOut: id, team, class, state, GPUs (and its place in line)
        shown.name, shown.user = row.name, row.user or ""
        shown.reason, shown.message = row.wait_reason, row.wait_message
        if row.session is not None:
            shown.session = row.session
            # Its own user's only: a notebook's page runs its user's code (`api.notebooks`).
            shown.opens = row.session == SessionKind.NOTEBOOK.value and not who.admin and who.user == row.user
            shown.warning = ctx.service.sessions.warning(row.id) or ""
        if row.state == JobState.PENDING.value:
            shown.waited = human_seconds(now - row.submit_time)
        elif row.id in held:
            started, gpus = held[row.id]
            shown.where = " ".join(f"{n}[{','.join(map(str, g))}]" for n, g in sorted(gpus.items()))
            shown.since = human_seconds(now - started)
        return shown

    running_lines = [line(r) for r in reversed(shown_running)]
    return {
        "sessions": [j for j in running_lines if j.session and j.visible],
        "running": running_lines,
        "pending": [line(r) for r in pending[:SHOWN]],
        "running_total": len(running),
        "pending_total": len(pending),
        "team": team,
        "cls": cls,
    }


def teams(ctx: Context, now: float, window: float = 86400.0) -> dict[str, Any]:
    """Every team's policy, use and budgets, and its GPUs held over the last `window` (pool
    aggregates: open to every token, as `/teams` and the report's team totals are)."""
    using, pending = ctx.store.team_use()
    budgets, spent = ctx.store.budget_use(now)
    goodput = ctx.telemetry.goodput_by_team() if ctx.telemetry is not None else {}
    rows: list[dict[str, Any]] = []
    for t in ctx.store.teams():
        mine = [b for b in budgets if b.team == t.name]
        rows.append(
            {
                "name": t.name,
                "weight": t.weight,
                "guaranteed": t.guaranteed_gpus,
                "using": using[t.name],
                "pending": pending[t.name],
                "goodput": goodput.get(t.name),
                "budgets": [
                    {
                        "priority": b.priority,
                        "limit": b.gpu_hours,
                        "used": spent.get((b.team, b.priority), 0.0) / 3600,
                        "window": human_seconds(b.window),
                    }
                    for b in mine
                ],
            }
        )
    series = ctx.store.team_gpus_over_time(now - window, now, points=48)
    guarantees = {t["name"]: t["guaranteed"] for t in rows}
    charts = [
        svg.lines(
            f"GPUs held by team {name} over the last {human_seconds(window)} (dashed: its guarantee)",
            [("held", values)],
            start=now - window,
            end=now,
            guide=guarantees.get(name, 0),
        )
        for name, values in sorted(series.items())
    ]
    return {"teams": rows, "charts": charts}


@dataclass
class Cut:
    job: int
    label: str
    team: str
    priority: str
    cut: Interruption
    at: str
    lost: str
    next_attempt: str


def interruptions(ctx: Context, who: Principal, now: float, since: float, shown: int = 200) -> dict[str, Any]:
    """The interruptions since `since` of the jobs most recently interrupted (the token's own
    team's, as in the report), each with its cost, newest first; totals by kind, and lost
    GPU-hours over time, of those."""
    team = access.own_team(who)
    job_ids, count = ctx.store.interrupted(since, team, shown + 1)
    partial = len(job_ids) > shown
    job_ids = job_ids[:shown]
    accounts = ctx.store.accounts(now, job_ids=job_ids) if job_ids else []
    labels = ctx.store.labels(job_ids)
    cuts = sorted(
        (
            Cut(
                a.job_id,
                labels.get(a.job_id, str(a.job_id)),
                a.team,
                a.priority,
                i,
                when(i.at, now),
                gpu_time(i.lost),
                ("never, it ended" if a.ended else "waiting")
                if i.delay is None
                else f"after {human_seconds(i.delay)} in line",
            )
            for a in accounts
            for i in a.interruptions
            if i.at >= since
        ),
        key=lambda c: -c.cut.at,
    )
    by_kind: Counter[str] = Counter()
    lost_by_kind: defaultdict[str, float] = defaultdict(float)
    for c in cuts:
        by_kind[c.cut.cause] += 1
        lost_by_kind[c.cut.cause] += c.cut.lost
    bins = [0.0] * max(1, min(48, round((now - since) / 3600)))
    step = (now - since) / len(bins)
    for c in cuts:
        bins[min(len(bins) - 1, max(0, int((c.cut.at - since) / step)))] += c.cut.lost
    # One unit, scaled for people, for the chart, its axis and the totals above it.
    unit, size = gpu_unit(max(bins))
    bins = [b / size for b in bins]
    chart = svg.bars(f"{unit} lost to interruptions, per {human_seconds(step)}", bins, start=since, end=now)
    return {
        "cuts": cuts,
        "count": count,
        "partial": partial,
        "kinds": [(k, by_kind[k], f"{lost_by_kind[k] / size:.1f} {unit}") for k in sorted(by_kind)],
        "chart": chart,
        "lost": f"{sum(c.cut.lost for c in cuts) / size:.1f} {unit}",
        "since": human_seconds(now - since),
        "scope": "every team" if team is None else f"team {team}",
    }


def job(ctx: Context, who: Principal, job_id: int, now: float) -> dict[str, Any]:
    row = ctx.store.job(job_id)
    if not access.sees_in_full(who, row.team):
        raise Forbidden(f"{who} may not see job {row.label} of team {row.team}")
    attempts = ctx.store.attempts(job_id)
    accounts = ctx.store.accounts(now, job_ids=[job_id])
    account = accounts[0] if accounts else None
    commits = ctx.store.checkpoints(job_id)
    events = ctx.store.events(job_id=job_id, limit=EVENTS, newest=True)
    log = ""
    if row.attempts:
        try:
            reader = ctx.service.open_log(row, row.attempts - 1, "stdout")
            if reader is not None:
                with reader:
                    size = os.fstat(reader.fileno()).st_size  # not read to its end: it may have none
                    text, _, _ = read_part(reader, max(0, size - LOG_BYTES), LOG_BYTES)
                log = "\n".join(text.splitlines()[-LOG_LINES:])
        except GpupoolError as exc:  # another user's -o file: said, not opened
            log = str(exc)
        except OSError as exc:
            log = f"its output cannot be read now ({exc.strerror})"
    return {
        "job": row,
        "label": row.label,
        "attempts": [
            {
                "row": a,
                "started": when(a.started_at, now),
                "ended": when(a.ended_at, now) if a.ended_at else "running",
                "cost": account.attempts[i] if account and i < len(account.attempts) else None,
                "commits": [c for c in commits if c.attempt == a.attempt],
            }
            for i, a in enumerate(attempts)
        ],
        "account": account,
        "goodput": None if account is None else account.goodput,
        "events": [{"at": when(e.time, now), "kind": e.kind, "message": e.message} for e in events],
        "placement": ctx.store.holding([job_id]).get(job_id, (0.0, {}))[1],
        "log": log,
        "gpu_time": gpu_time,
    }
