"""The routes about the pool rather than one job: GPUs and who holds them, teams with their use,
users, priority classes. Who may call them is the rule of each in `access.ROUTES`, applied by
the `auth.authorize` dependency; another team's GPUs are shown by `access.gpu_view`."""

# No `from __future__ import annotations`: FastAPI reads the dependencies from the signatures.
import re
import secrets
from typing import Annotated

from fastapi import APIRouter
from fastapi import Path as PathParam

from gpupool.api import access
from gpupool.api.auth import Who
from gpupool.api.context import Ctx
from gpupool.api.errors import responses
from gpupool.api.pool_models import BudgetIn, BudgetOut, ClassOut, NodeOut, PoolOut, TeamIn, TeamOut, UserIn, UserOut
from gpupool.errors import InvalidInput
from gpupool.service.workspace import token_hash
from gpupool.store import UNCHANGED
from gpupool.store.schema import TeamRow

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")

Name = Annotated[str, PathParam(max_length=200, description="Letters, digits, '.', '_', '-'; 200 at most.")]


def check_name(kind: str, name: str) -> str:
    if not NAME.match(name):
        raise InvalidInput(f"{kind}: {name!r} is not a name (letters, digits, '.', '_', '-'; 200 at most)")
    return name


router = APIRouter()


@router.get("/pool", response_model=PoolOut, responses=responses(401, 503))
def pool(who: Who, ctx: Ctx) -> PoolOut:
    """Every node and GPU: idle, allocated, draining (its job has notice) or held for a
    preemptor, with the job, team and user that hold it (another team's without its user)."""
    nodes, gpus = ctx.store.pool_view()
    dirty = ctx.service.dirty
    out = []
    for n in nodes:
        mine = [access.gpu_view(who, g) for g in gpus if g.node == n.name]
        for shown in mine:
            shown.dirty = dirty.get(n.name, {}).get(shown.gpu)
            if shown.dirty is not None and shown.state == "idle":
                shown.state = "dirty"
        out.append(NodeOut(name=n.name, gpus=n.gpus, gpu_type=n.gpu_type, virtual=n.virtual, gpu_states=mine))
    busy = sum(1 for g in gpus if g.state in ("allocated", "draining"))
    return PoolOut(nodes=out, gpus=len(gpus), busy=busy)


@router.get("/teams", response_model=list[TeamOut], responses=responses(401, 503))
def teams(who: Who, ctx: Ctx) -> list[TeamOut]:
    """Every team's policy, its GPUs in use and pending jobs, and each budget's use."""
    using, pending = ctx.store.team_use()
    budgets, spent = ctx.store.budget_use(ctx.clock())
    return [
        team_out(
            t,
            using=using[t.name],
            pending=pending[t.name],
            budgets=[BudgetOut.of(b, spent) for b in budgets if b.team == t.name],
        )
        for t in ctx.store.teams()
    ]


@router.put("/teams/{name}", response_model=TeamOut, responses=responses(400, 401, 403, 409, 413, 422, 503))
def set_team(name: Name, body: TeamIn, who: Who, ctx: Ctx) -> TeamOut:
    """Create or change a team: only the fields sent change."""
    token = secrets.token_urlsafe(24) if body.new_token else None
    row = ctx.store.set_team(
        check_name("team", name),
        weight=body.weight,
        guaranteed_gpus=body.guaranteed_gpus,
        allowed_classes=body.classes if "classes" in body.model_fields_set else UNCHANGED,
        token_hash=token_hash(token) if token else None,
    )
    ctx.service.wake()  # a new guarantee or weight may change what the loop decides
    return team_out(row, token=token)


REMOVES = responses(400, 401, 403, 404, 409, 422, 503)


@router.delete("/teams/{name}", status_code=204, responses=REMOVES)
def remove_team(name: Name, who: Who, ctx: Ctx) -> None:
    """Remove a team with no job that waits or runs and no user: its token and budgets go, its
    ended jobs keep its name in their history."""
    ctx.store.remove_team(name, ctx.clock())
    ctx.service.wake()


@router.put("/teams/{name}/budgets/{priority}", response_model=BudgetOut, responses=REMOVES)
def set_budget(name: Name, priority: Name, body: BudgetIn, who: Who, ctx: Ctx) -> BudgetOut:
    """Give a team a budget of GPU-hours at a class per sliding window, or change it: beyond
    it, the team's jobs of that class run one class lower (docs/policy.md, "Budgets")."""
    row = ctx.store.set_budget(name, priority, body.gpu_hours, body.window)
    ctx.service.wake()
    return BudgetOut.of(row, ctx.store.budget_use(ctx.clock())[1])


@router.delete("/teams/{name}/budgets/{priority}", status_code=204, responses=REMOVES)
def remove_budget(name: Name, priority: Name, who: Who, ctx: Ctx) -> None:
    """Take a team's budget at a class away."""
    ctx.store.remove_budget(name, priority)
    ctx.service.wake()


@router.delete("/users/{name}", status_code=204, responses=REMOVES)
def remove_user(name: Name, who: Who, ctx: Ctx) -> None:
    """Remove a user with no job that waits or runs: their token stops working; their jobs keep
    their name."""
    ctx.store.remove_user(name)


@router.get("/users", response_model=list[UserOut], responses=responses(401, 503))
def users(who: Who, ctx: Ctx) -> list[UserOut]:
    """Users and their teams (a team's token sees its own team's)."""
    team = access.own_team(who)
    return [UserOut(name=u.name, team=u.team) for u in ctx.store.users() if team is None or u.team == team]


@router.put("/users/{name}", response_model=UserOut, responses=responses(400, 401, 403, 404, 413, 422, 503))
def set_user(name: Name, body: UserIn, who: Who, ctx: Ctx) -> UserOut:
    """Create a user in a team (or move one); `new_token` makes their token, shown once."""
    token = secrets.token_urlsafe(24) if body.new_token else None
    if body.team is not None:
        # A user whose jobs no OS user could run is refused now, not at their first submit.
        ctx.service.check_runnable(check_name("user", name), body.team)
    row = ctx.store.set_user(check_name("user", name), team=body.team, token_hash=token_hash(token) if token else None)
    return UserOut(name=row.name, team=row.team, token=token)


@router.get("/classes", response_model=list[ClassOut], responses=responses(401, 503))
def classes(who: Who, ctx: Ctx) -> list[ClassOut]:
    """The priority classes, most important first."""
    return [ClassOut.model_validate(c, from_attributes=True) for c in ctx.store.classes()]


def team_out(
    row: TeamRow,
    *,
    token: str | None = None,
    using: int = 0,
    pending: int = 0,
    budgets: list[BudgetOut] | None = None,
) -> TeamOut:
    return TeamOut(
        name=row.name,
        weight=row.weight,
        guaranteed_gpus=row.guaranteed_gpus,
        classes=row.allowed_classes,
        using_gpus=using,
        pending_jobs=pending,
        budgets=budgets or [],
        token=token,
    )
