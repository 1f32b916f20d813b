"""The pool in the store: the configuration's classes and teams, the nodes, the teams' and
users' policy and tokens (the one source of truth the core decides by)."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any, Final

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpupool.errors import Conflict, InvalidInput, NotFound
from gpupool.model import Config, Node, Team
from gpupool.settle import ENDED
from gpupool.store.base import StoreBase
from gpupool.store.schema import BudgetRow, EventRow, JobRow, NodeRow, PriorityClassRow, TeamRow, UserRow
from gpupool.units import plural

DEFAULT_TEAM = "default"


class Unchanged(Enum):
    """A field a partial update leaves as it is (None is a value of its own)."""

    UNCHANGED = "unchanged"


UNCHANGED: Final = Unchanged.UNCHANGED
ENDED_STATES: Final = [state.value for state in ENDED]


class PoolStore(StoreBase):
    # --- configuration -----------------------------------------------------------------

    def sync_config(self, config: Config) -> None:
        """Make the classes, teams and budgets match `config` (team tokens are kept)."""
        with self.transaction() as s:
            for cls in config.classes:
                s.merge(
                    PriorityClassRow(
                        name=cls.name,
                        value=cls.value,
                        may_preempt=cls.may_preempt,
                        preemptible=cls.preemptible,
                        min_runtime=cls.min_runtime,
                        grace_period=cls.grace_period,
                        time_limit=cls.time_limit,
                        idle_after=cls.idle_after,
                        on_idle=cls.on_idle,
                    )
                )
            teams = {DEFAULT_TEAM: config.team(DEFAULT_TEAM), **config.teams}
            for team in teams.values():
                self._seed_team(s, team)

    @staticmethod
    def _seed_team(s: Session, team: Team) -> None:
        """Seed a team from the file. The store is the source of truth: a field the file gives
        as it gave it last time keeps what the store has (the API may have changed it); a field
        the file changed since its last seeding, or any field of a new team, takes the file's."""
        row = s.get(TeamRow, team.name)
        if row is not None and row.removed_at is not None:
            return  # the admin removed it: the file does not bring it back (`team set` does)
        given: dict[str, Any] = {
            "weight": team.weight,
            "guaranteed_gpus": team.guaranteed_gpus,
            "budgets": sorted([b.priority, b.gpu_hours, b.window] for b in team.budgets),
        }
        last = (row.seeded or {}) if row is not None else {}
        changed = {key for key, value in given.items() if row is None or row.seeded is None or last.get(key) != value}
        if row is None:
            row = TeamRow(name=team.name)
        if "weight" in changed:
            row.weight = team.weight
        if "guaranteed_gpus" in changed:
            row.guaranteed_gpus = team.guaranteed_gpus
        row.seeded = given
        s.add(row)
        s.flush()
        if "budgets" in changed:
            for old in s.scalars(select(BudgetRow).where(BudgetRow.team == team.name)):
                s.delete(old)
            s.flush()
            for budget in team.budgets:
                s.add(
                    BudgetRow(
                        team=team.name, priority=budget.priority, gpu_hours=budget.gpu_hours, window=budget.window
                    )
                )

    def remove_user(self, name: str) -> None:
        """Remove a user: their token stops working; their jobs, ended or not, keep their name.
        Refused while they have jobs that wait or run (cancel them, or let them end, first)."""
        with self.transaction() as s:
            user = s.get(UserRow, name, with_for_update=True)
            if user is None:
                raise NotFound(f"no user {name}")
            live = self._live_jobs(s, JobRow.user == name)
            if live:
                raise Conflict(f"user {name} has {live} that wait or run: cancel them, or let them end, first")
            s.delete(user)

    def remove_team(self, name: str, now: float) -> None:
        """Remove a team, its token and its budgets; its ended jobs keep its name in their history.
        Refused while it has jobs that wait or run, or users (move or remove them first), and
        for the default team."""
        with self.transaction() as s:
            team = self.live_team(s, name)
            if team is None:
                raise NotFound(f"no team {name}")
            if name == DEFAULT_TEAM:
                raise Conflict(f"team {name} is where jobs without a team go: it stays")
            live = self._live_jobs(s, JobRow.team == name)
            if live:
                raise Conflict(f"team {name} has {live} that wait or run: cancel them, or let them end, first")
            users = list(s.scalars(select(UserRow.name).where(UserRow.team == name).order_by(UserRow.name)))
            if users:
                raise Conflict(f"team {name} has users ({', '.join(users)}): move them (user set) or remove them first")
            nodes = list(s.scalars(select(NodeRow.name).where(NodeRow.team == name).order_by(NodeRow.name)))
            if nodes:
                raise Conflict(f"nodes {', '.join(nodes)} are team {name}'s alone: the team stays while they are")
            for budget in s.scalars(select(BudgetRow).where(BudgetRow.team == name)):
                s.delete(budget)
            team.removed_at, team.token_hash, team.guaranteed_gpus = now, None, 0

    @staticmethod
    def live_team(s: Session, name: str) -> TeamRow | None:
        """The team `name`, locked, unless it does not exist or was removed."""
        team = s.get(TeamRow, name, with_for_update=True)
        return team if team is not None and team.removed_at is None else None

    @staticmethod
    def _live_jobs(s: Session, whose: Any) -> str:
        """How many jobs matching `whose` wait or run, in words ("" for none)."""
        count = s.scalar(select(func.count()).select_from(JobRow).where(whose, JobRow.state.not_in(ENDED_STATES)))
        return plural(count, "job") if count else ""

    def set_budget(self, team: str, priority: str, gpu_hours: float, window: float) -> BudgetRow:
        """Give `team` a budget of `gpu_hours` at class `priority` per sliding `window` seconds
        (or change it): beyond it, its jobs of that class run one class lower."""
        with self.transaction() as s:
            if self.live_team(s, team) is None:
                raise NotFound(f"no team {team}")
            if s.get(PriorityClassRow, priority) is None:
                raise NotFound(f"priority: unknown priority class {priority!r}")
            budget = s.get(BudgetRow, (team, priority)) or BudgetRow(team=team, priority=priority)
            budget.gpu_hours, budget.window = gpu_hours, window
            s.add(budget)
            return budget

    def remove_budget(self, team: str, priority: str) -> None:
        """Take `team`'s budget at class `priority` away: its jobs of that class are no longer capped."""
        with self.transaction() as s:
            budget = s.get(BudgetRow, (team, priority))
            if budget is None:
                raise NotFound(f"team {team} has no budget at class {priority}")
            s.delete(budget)

    @staticmethod
    def pool_gpus_in(s: Session) -> int:
        """The GPUs of the nodes that are up (0 before any node is known)."""
        return int(s.scalar(select(func.coalesce(func.sum(NodeRow.gpus), 0)).where(NodeRow.up)) or 0)

    @staticmethod
    def guaranteed_in(s: Session) -> int:
        """The guarantees of the teams (not removed), summed."""
        query = select(func.coalesce(func.sum(TeamRow.guaranteed_gpus), 0)).where(TeamRow.removed_at.is_(None))
        return int(s.scalar(query) or 0)

    def guarantees_over_pool(self) -> tuple[int, int] | None:
        """(the teams' guarantees summed, the GPUs of the pool) when the first is the larger."""
        with self.reading() as s:
            guaranteed = self.guaranteed_in(s)
            pool = self.pool_gpus_in(s)
        return (guaranteed, pool) if pool and guaranteed > pool else None

    def set_nodes(self, nodes: Sequence[Node], *, virtual: bool) -> None:
        """Add or change nodes, up; the others stay as they are."""
        with self.transaction() as s:
            for node in nodes:
                s.merge(
                    NodeRow(
                        name=node.name, gpus=node.gpus, gpu_type=node.gpu_type, virtual=virtual, team=node.team, up=True
                    )
                )

    def sync_nodes(self, nodes: Sequence[tuple[Node, bool]]) -> bool:
        """Make (node, virtual) the nodes that are up: new ones are added, changed ones changed,
        and the others marked down (a node keeps the team it was given). Whether anything
        changed."""
        wanted = {node.name: (node, virtual) for node, virtual in nodes}
        changed = False
        with self.transaction() as s:
            for row in s.scalars(select(NodeRow).with_for_update()):
                if row.name not in wanted:
                    changed |= row.up
                    row.up = False
                    continue
                node, virtual = wanted.pop(row.name)
                now = (node.gpus, node.gpu_type, virtual, node.team or row.team, True)
                if (row.gpus, row.gpu_type, row.virtual, row.team, row.up) != now:
                    row.gpus, row.gpu_type, row.virtual, row.team, row.up = now
                    changed = True
            for node, virtual in wanted.values():
                s.add(NodeRow(name=node.name, gpus=node.gpus, gpu_type=node.gpu_type, virtual=virtual, team=node.team))
                changed = True
        return changed

    def note(self, kind: str, notes: Sequence[tuple[int | None, int | None, str]], now: float) -> None:
        """Events of `kind` that no job's state change records: (job, attempt, message) each, a
        GPU's or a node's with no job."""
        with self.transaction() as s:
            for job_id, attempt, message in notes:
                s.add(EventRow(time=now, kind=kind, job_id=job_id, attempt=attempt, message=message[:2000]))

    def nodes_as_core(self, every: bool = False) -> list[Node]:
        return [Node(n.name, n.gpus, n.gpu_type, n.team) for n in self.nodes(every)]

    def nodes(self, every: bool = False) -> list[NodeRow]:
        """The nodes that are up (`every`: and those that were and are not now)."""
        query = select(NodeRow).order_by(NodeRow.name)
        with self.reading() as s:
            return list(s.scalars(query if every else query.where(NodeRow.up)))

    def teams(self) -> list[TeamRow]:
        with self.reading() as s:
            return list(s.scalars(select(TeamRow).where(TeamRow.removed_at.is_(None)).order_by(TeamRow.name)))

    def classes(self) -> list[PriorityClassRow]:
        with self.reading() as s:
            return list(s.scalars(select(PriorityClassRow).order_by(PriorityClassRow.value.desc())))

    def team(self, name: str) -> TeamRow | None:
        with self.reading() as s:
            team = s.get(TeamRow, name)
            return team if team is not None and team.removed_at is None else None

    def holder_of(self, token_hash: str) -> tuple[str, str | None] | None:
        """(team, user) whose token this is: a user's own, or a team's (no user); None if nobody's."""
        with self.reading() as s:
            user = s.scalars(select(UserRow).where(UserRow.token_hash == token_hash)).first()
            if user is not None:
                return user.team, user.name
            team = s.scalars(select(TeamRow).where(TeamRow.token_hash == token_hash)).first()
            return (team.name, None) if team is not None else None

    def users(self) -> list[UserRow]:
        with self.reading() as s:
            return list(s.scalars(select(UserRow).order_by(UserRow.team, UserRow.name)))

    def set_user(self, name: str, *, team: str | None, token_hash: str | None) -> UserRow:
        """Create a user in `team`, or move one to another team; a new `token_hash` replaces the
        old token. A new user needs a team."""
        with self.transaction() as s:
            user = s.get(UserRow, name)
            if team is not None and self.live_team(s, team) is None:
                raise NotFound(f"team: unknown team {team!r}")
            if user is None:
                if team is None:
                    raise InvalidInput(f"team: give the team of the new user {name!r}")
                user = UserRow(name=name, team=team)
            elif team is not None:
                user.team = team
            if token_hash is not None:
                user.token_hash = token_hash
            s.add(user)
            return user

    def set_team(
        self,
        name: str,
        *,
        weight: float | None = None,
        guaranteed_gpus: int | None = None,
        allowed_classes: list[str] | Unchanged | None = UNCHANGED,
        token_hash: str | None = None,
    ) -> TeamRow:
        """Create or change a team: only the fields given change (a new team starts from the
        defaults); `allowed_classes=None` allows every class; a new `token_hash` replaces the
        old token."""
        with self.transaction() as s:
            if not isinstance(allowed_classes, Unchanged):
                for cls in allowed_classes or []:
                    if s.get(PriorityClassRow, cls) is None:
                        raise InvalidInput(f"classes: unknown priority class {cls!r}")
            team = s.get(TeamRow, name) or TeamRow(name=name)
            if team.removed_at is not None or team.weight is None:  # new, or made anew after its removal
                team.weight, team.guaranteed_gpus, team.allowed_classes = 1.0, 0, None
                team.removed_at = team.token_hash = team.seeded = None
            if weight is not None:
                team.weight = weight
            if guaranteed_gpus is not None and guaranteed_gpus > (team.guaranteed_gpus or 0):
                others = self.guaranteed_in(s) - (team.guaranteed_gpus or 0)  # a new team's row is not read
                pool = self.pool_gpus_in(s)
                if pool and others + guaranteed_gpus > pool:
                    raise Conflict(
                        f"guaranteed_gpus: {guaranteed_gpus} for team {name} would bring the teams' guarantees to "
                        f"{others + guaranteed_gpus} GPUs, and the pool has {pool} (the other teams hold {others}): "
                        "a guarantee the pool cannot keep is none; lower another team's first"
                    )
            if guaranteed_gpus is not None:
                team.guaranteed_gpus = guaranteed_gpus
            if not isinstance(allowed_classes, Unchanged):
                team.allowed_classes = allowed_classes
            if token_hash is not None:
                team.token_hash = token_hash
            s.add(team)
            return team
