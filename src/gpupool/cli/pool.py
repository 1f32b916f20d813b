"""The pool as a whole, from the live service: `pool` (as sinfo), `team`, `user`, `classes`.
Starting the service is `up`'s; job commands are `jobs`'s, `submit` `submit`'s."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any

import typer

from gpupool.cli.common import (
    HELP,
    ApiOption,
    ConfigOption,
    JsonOption,
    call,
    client,
    console,
    fail,
    print_json,
)
from gpupool.cli.table import Column, table
from gpupool.units import human_seconds, parse_duration, plural

POOL_COLUMNS = (
    Column("NODE", shrink=3, minimum=8),
    Column("TYPE", drop=2),
    Column("GPUS", justify="right"),
    Column("IDLE", justify="right"),
    Column("ALLOC", justify="right"),
    Column("DRAIN", justify="right"),
    Column("HELD", justify="right"),
    Column("WHO", shrink=1, minimum=12, drop=4, wrap=True),
)


def pool(as_json: JsonOption = False, config: ConfigOption = None, api: ApiOption = None) -> None:
    """The nodes and their GPUs, as sinfo, with who holds what.

    A GPU is idle, allocated, draining (its job has notice), held for a preemptor (free,
    kept while that job's victims drain), or dirty (a process of no live attempt holds it:
    no job is given it until that process ends; listed under the table)."""
    data = call(client(config, api).pool)
    if as_json:
        print_json(data)
        return
    rows = []
    for node in data["nodes"]:
        states = Counter(g["state"] for g in node["gpu_states"])
        holders: dict[str, list[int]] = {}
        for g in node["gpu_states"]:
            if g["state"] in ("allocated", "draining"):
                towards = f"→{g['for_label']}" if g["state"] == "draining" and g["for_job"] else ""
                who = f"{g['team']}/{g['job_label']}{towards}"
            elif g["state"] == "held":
                who = f"held→{g['for_label']}"
            elif g["state"] == "dirty":
                who = "dirty"
            else:
                continue
            holders.setdefault(who, []).append(g["gpu"])
        who = " ".join(f"{name}[{','.join(map(str, ids))}]" for name, ids in holders.items())
        rows.append(
            [
                node["name"],
                node["gpu_type"] + (" (virtual)" if node["virtual"] and "virtual" not in node["gpu_type"] else ""),
                str(node["gpus"]),
                str(states["idle"]),
                str(states["allocated"]),
                str(states["draining"]),
                str(states["held"]),
                who,
            ]
        )
    console.print(table(POOL_COLUMNS, rows, console.width))
    console.print(f"{data['busy']} of {plural(data['gpus'], 'GPU')} in use", highlight=False, markup=False)
    for node in data["nodes"]:
        for g in node["gpu_states"]:
            if g.get("dirty"):
                said = f"dirty: GPU {g['gpu']} of {node['name']}: {g['dirty']}, of no live attempt"
                console.print(said, highlight=False, markup=False, soft_wrap=True)


team_app = typer.Typer(
    rich_markup_mode=None,
    help="Teams: weights, guarantees, budgets, allowed classes, tokens.",
    no_args_is_help=True,
    context_settings=HELP,
)


def budgets_text(team: dict[str, Any]) -> str:
    return "; ".join(
        f"{b['priority']} {b['used_gpu_hours']:.1f}/{b['gpu_hours']:g} GPU-h per {human_seconds(b['window'])}"
        f" ({max(0.0, b['gpu_hours'] - b['used_gpu_hours']):.1f} left)"
        for b in team["budgets"]
    )


@team_app.command("list")
def team_list(as_json: JsonOption = False, config: ConfigOption = None, api: ApiOption = None) -> None:
    """Every team: GPUs in use against its guarantee, weight, budgets and their use."""
    teams = call(client(config, api).teams)
    if as_json:
        print_json(teams)
        return
    columns = (
        Column("TEAM", shrink=4, minimum=6),
        Column("USING", justify="right"),
        Column("GUARANTEED", justify="right"),
        Column("PENDING", justify="right"),
        Column("WEIGHT", justify="right"),
        Column("CLASSES", shrink=2, minimum=6, drop=3),
        Column("BUDGETS: USED/BUDGET", shrink=1, minimum=16, drop=5, wrap=True),
    )
    rows = [
        [
            t["name"],
            str(t["using_gpus"]),
            str(t["guaranteed_gpus"]),
            str(t["pending_jobs"]),
            f"{t['weight']:g}",
            ", ".join(t["classes"]) if t["classes"] is not None else "all",
            budgets_text(t),
        ]
        for t in teams
    ]
    console.print(table(columns, rows, console.width))


@team_app.command("set")
def team_set(
    name: str,
    weight: Annotated[float | None, typer.Option(help="Share of the pool relative to other teams.")] = None,
    guaranteed_gpus: Annotated[
        int | None, typer.Option(help="GPUs the team may reclaim from teams above theirs.")
    ] = None,
    classes: Annotated[str | None, typer.Option(help="Allowed priority classes, comma-separated, or 'all'.")] = None,
    new_token: Annotated[bool, typer.Option(help="Make a new token for the team (shown once).")] = False,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """Create or change a team (admin): only the options given change."""
    body: dict[str, Any] = {"new_token": new_token}
    if weight is not None:
        body["weight"] = weight
    if guaranteed_gpus is not None:
        body["guaranteed_gpus"] = guaranteed_gpus
    if classes is not None:
        names = [c.strip() for c in classes.split(",") if c.strip()]
        body["classes"] = None if names == ["all"] else names
    team = call(client(config, api).set_team, name, body)
    console.print(
        f"team {team['name']}: weight {team['weight']:g}, {plural(team['guaranteed_gpus'], 'GPU')} guaranteed",
        highlight=False,
        markup=False,
    )
    if team["token"]:
        console.print(
            f"token (shown once; give it to the team as GPUPOOL_TOKEN): {team['token']}", highlight=False, markup=False
        )


@team_app.command("remove")
def team_remove(name: str, config: ConfigOption = None, api: ApiOption = None) -> None:
    """Remove a team (admin): refused while it has jobs that wait or run, or users. Its token
    and budgets go; its ended jobs keep its name. Remove it from the configuration file too."""
    call(client(config, api).request, "DELETE", f"/teams/{name}")
    console.print(f"team {name} removed", highlight=False, markup=False)


@team_app.command("budget")
def team_budget(
    name: str,
    priority: Annotated[str, typer.Argument(metavar="CLASS", help="The priority class the budget caps.")],
    gpu_hours: Annotated[float | None, typer.Option(help="GPU-hours at CLASS per window.")] = None,
    window: Annotated[str, typer.Option(help="The sliding window: 7d, 24h, 90m.")] = "7d",
    remove: Annotated[bool, typer.Option("--remove", help="Take the budget away.")] = False,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """Give a team a budget at a class, change it or take it away (admin): beyond its GPU-hours
    in the window, the team's jobs of that class run one class lower."""
    api_client = client(config, api)
    if remove:
        call(api_client.request, "DELETE", f"/teams/{name}/budgets/{priority}")
        console.print(f"team {name}: no budget at {priority}", highlight=False, markup=False)
        return
    if gpu_hours is None:
        raise fail("give --gpu-hours (and --window), or --remove")
    try:
        seconds = parse_duration(window)
    except ValueError as exc:
        raise fail(f"--window: {exc}") from None
    body = {"gpu_hours": gpu_hours, "window": seconds}
    budget = call(lambda: api_client.request("PUT", f"/teams/{name}/budgets/{priority}", json=body))
    console.print(
        f"team {name}: {budget['gpu_hours']:g} GPU-h at {priority} per {human_seconds(budget['window'])} "
        f"({budget['used_gpu_hours']:.1f} used)",
        highlight=False,
        markup=False,
    )


user_app = typer.Typer(
    rich_markup_mode=None,
    help="Users: who submits, in which team, with a token each.",
    no_args_is_help=True,
    context_settings=HELP,
)


@user_app.command("add")
def user_add(
    name: str,
    team: Annotated[str, typer.Option(help="The user's team.")],
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """Add a user to a team (admin), with a token of their own (shown once)."""
    user = call(client(config, api).set_user, name, {"team": team, "new_token": True})
    console.print(f"user {user['name']} of team {user['team']}", highlight=False, markup=False)
    console.print(
        f"token (shown once; they keep it with gpupool login): {user['token']}", highlight=False, markup=False
    )


@user_app.command("set")
def user_set(
    name: str,
    team: Annotated[str | None, typer.Option(help="Move the user to this team.")] = None,
    new_token: Annotated[bool, typer.Option(help="Make a new token (the old one stops working).")] = False,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """Move a user to another team, or give them a new token (admin)."""
    user = call(client(config, api).set_user, name, {"team": team, "new_token": new_token})
    console.print(f"user {user['name']} of team {user['team']}", highlight=False, markup=False)
    if user["token"]:
        console.print(
            f"token (shown once; they keep it with gpupool login): {user['token']}", highlight=False, markup=False
        )


@user_app.command("remove")
def user_remove(name: str, config: ConfigOption = None, api: ApiOption = None) -> None:
    """Remove a user (admin): refused while they have jobs that wait or run. Their token stops
    working; their jobs keep their name."""
    call(client(config, api).request, "DELETE", f"/users/{name}")
    console.print(f"user {name} removed", highlight=False, markup=False)


@user_app.command("list")
def user_list(as_json: JsonOption = False, config: ConfigOption = None, api: ApiOption = None) -> None:
    """The users and their teams."""
    users = call(client(config, api).users)
    if as_json:
        print_json(users)
        return
    console.print(
        table(
            (Column("USER", shrink=1), Column("TEAM", shrink=2)), [[u["name"], u["team"]] for u in users], console.width
        )
    )


def classes(as_json: JsonOption = False, config: ConfigOption = None, api: ApiOption = None) -> None:
    """The priority classes, most important first."""
    found = call(client(config, api).classes)
    if as_json:
        print_json(found)
        return
    columns = (
        Column("CLASS"),
        Column("VALUE", justify="right"),
        Column("PREEMPTS"),
        Column("PREEMPTIBLE"),
        Column("MIN RUN", justify="right"),
        Column("GRACE", justify="right"),
        Column("LIMIT", justify="right", drop=1),
        Column("IDLE", justify="right", drop=2),
    )
    rows = [
        [
            c["name"],
            str(c["value"]),
            "yes" if c["may_preempt"] else "no",
            "yes" if c["preemptible"] else "no",
            human_seconds(c["min_runtime"]),
            human_seconds(c["grace_period"]),
            human_seconds(c["time_limit"]) if c["time_limit"] else "",
            f"{human_seconds(c['idle_after'])} {c['on_idle']}" if c["idle_after"] else "",
        ]
        for c in found
    ]
    console.print(table(columns, rows, console.width))
