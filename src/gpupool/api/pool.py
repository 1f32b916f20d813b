"""The routes about the pool rather than one job: GPUs and who holds them, teams with their use,
users, priority classes. Who may call them: `principal` (any token), `admin` (the admin's)."""

# No `from __future__ import annotations`: FastAPI reads the dependencies from the signatures.
import re
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI

from gpupool.api.models import BudgetOut, GpuOut, NodeOut, PoolOut, TeamIn, TeamOut, UserIn, UserOut
from gpupool.errors import InvalidInput
from gpupool.service import token_hash
from gpupool.store import UNCHANGED
from gpupool.store.schema import TeamRow

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


@dataclass(frozen=True)
class Principal:
    admin: bool
    team: str | None
    user: str | None = None


Dependency = Callable[..., Coroutine[Any, Any, Principal]]


def check_name(kind: str, name: str) -> str:
    if not NAME.match(name):
        raise InvalidInput(f"{kind}: {name!r} is not a name (letters, digits, '.', '_', '-'; 200 at most)")
    return name


def add_pool_routes(app: FastAPI, ctx: Any, principal: Dependency, admin: Dependency) -> None:
    @app.get("/pool", response_model=PoolOut)
    def pool(who: Annotated[Principal, Depends(principal)]) -> PoolOut:
        """Every node and GPU: idle, allocated, draining (its job has notice) or held for a
        preemptor, with the job, team and user that hold it."""
        nodes, gpus = ctx.store.pool_view()
        out = []
        for n in nodes:
            mine = [GpuOut.model_validate(g, from_attributes=True) for g in gpus if g.node == n.name]
            out.append(NodeOut(name=n.name, gpus=n.gpus, gpu_type=n.gpu_type, virtual=n.virtual, gpu_states=mine))
        busy = sum(1 for g in gpus if g.state in ("allocated", "draining"))
        return PoolOut(nodes=out, gpus=len(gpus), busy=busy)

    @app.get("/teams", response_model=list[TeamOut])
    def teams(who: Annotated[Principal, Depends(principal)]) -> list[TeamOut]:
        """Every team's policy, its GPUs in use and pending jobs, and each budget's use."""
        using, pending = ctx.store.team_use()
        budgets, spent = ctx.store.budget_use(ctx.clock())
        return [
            team_out(
                t,
                using=using[t.name],
                pending=pending[t.name],
                budgets=[
                    BudgetOut(
                        priority=b.priority,
                        gpu_hours=b.gpu_hours,
                        window=b.window,
                        used_gpu_hours=spent.get((b.team, b.priority), 0.0) / 3600,
                    )
                    for b in budgets
                    if b.team == t.name
                ],
            )
            for t in ctx.store.teams()
        ]

    @app.put("/teams/{name}", response_model=TeamOut)
    def set_team(name: str, body: TeamIn, who: Annotated[Principal, Depends(admin)]) -> TeamOut:
        """Create or change a team: only the fields sent change."""
        token = secrets.token_urlsafe(24) if body.new_token else None
        row = ctx.store.set_team(
            check_name("team", name),
            weight=body.weight,
            guaranteed_gpus=body.guaranteed_gpus,
            allowed_classes=body.classes if "classes" in body.model_fields_set else UNCHANGED,
            token_hash=token_hash(token) if token else None,
        )
        ctx.loop.wakeup.set()  # a new guarantee or weight may change what the loop decides
        return team_out(row, token=token)

    @app.get("/users", response_model=list[UserOut])
    def users(who: Annotated[Principal, Depends(principal)]) -> list[UserOut]:
        """Users and their teams (a team's token sees its own team's)."""
        return [UserOut(name=u.name, team=u.team) for u in ctx.store.users() if who.admin or u.team == who.team]

    @app.put("/users/{name}", response_model=UserOut)
    def set_user(name: str, body: UserIn, who: Annotated[Principal, Depends(admin)]) -> UserOut:
        """Create a user in a team (or move one); `new_token` makes their token, shown once."""
        token = secrets.token_urlsafe(24) if body.new_token else None
        row = ctx.store.set_user(
            check_name("user", name), team=body.team, token_hash=token_hash(token) if token else None
        )
        return UserOut(name=row.name, team=row.team, token=token)

    @app.get("/classes")
    def classes(who: Annotated[Principal, Depends(principal)]) -> list[dict[str, object]]:
        return [
            {
                "name": c.name,
                "value": c.value,
                "may_preempt": c.may_preempt,
                "preemptible": c.preemptible,
                "min_runtime": c.min_runtime,
                "grace_period": c.grace_period,
            }
            for c in ctx.store.classes()
        ]


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
