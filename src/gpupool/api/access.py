"""Who may see and do what, in one place: the principal a token stands for, the rule of every
route, and the functions that decide. docs/access.md says the same for people.

- The admin token may do everything. A team's token, or a user's (a user is in one team), acts
  for its team; a user's token cancels only the jobs that user submitted.
- A team sees the pool (every GPU, and who holds it as a team name and a job id) and its own
  jobs in full; another team's job at most as `JobBriefOut` (id, team, class, state, GPUs), in
  listings. Asking for such a job, its logs or its events is a 403 naming both teams.
- Aggregates are the whole pool's (the report's pool, teams and classes: fair share is open to
  all, as Slurm's sreport); per-user totals and interruptions are the team's own.
- Team and user policy is the admin's to change. The job protocol takes only the token of the
  live attempt it speaks for.

`ROUTES` gives each route (method, path template) its `Rule`; the API's one principal
dependency applies a route's rule before the route runs (`enforce`), and the routes that list
many things call the views here (`job_view`, `gpu_view`, `listing_team`, ...). A route missing
from the table fails at start (`check_routes`), and a test calls every route against it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from gpupool.api.models import JobBriefOut, JobOut
from gpupool.api.pool_models import GpuOut
from gpupool.errors import Forbidden
from gpupool.store.schema import JobRow
from gpupool.store.views import GpuView


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request speaks for: the admin, a team (`user` None: the team's own token), a user
    of a team, or one live attempt of a job (the job protocol)."""

    admin: bool
    team: str | None
    user: str | None = None
    attempt: tuple[int, int] | None = None

    def __str__(self) -> str:
        if self.admin:
            return "the admin token"
        if self.attempt is not None:
            return f"the token of attempt {self.attempt[1]} of job {self.attempt[0]}"
        if self.user is not None:
            return f"the token of user {self.user} (team {self.team})"
        return f"the token of team {self.team}"


class Rule(StrEnum):
    """What a route lets a token do (the admin's may do everything but the job protocol)."""

    PUBLIC = "no token"
    ANY = "any token; the same answer for all"
    POOL = "any token; another team's GPUs without their user"
    OWN_TEAM = "any token; a team's token sees its own team's"
    ADMIN = "the admin token only"
    SUBMIT = "a team's or user's token submits for its own team"
    JOBS = "any token; another team's jobs brief, filters on what is not shown find only the team's own"
    JOB = "the job's own team (403 naming both teams for another's)"
    ACT = "the job's own team; a user's token only the jobs that user submitted"
    EVENTS = "with `job`, as JOB; without, a team's token gets its own jobs' events"
    REPORT = "any token; pool, team and class totals of all, users and interruptions of its own team"
    HISTORY = "any token; the admin's every team's ended jobs, a team's or user's token its own team's"
    ATTEMPT = "only the token of that live attempt"
    SESSION = "the job's own user's token (a team's, for a session its team's token started)"


ROUTES: Final[dict[tuple[str, str], Rule]] = {
    ("GET", "/health"): Rule.PUBLIC,
    ("GET", "/classes"): Rule.ANY,
    ("GET", "/pool"): Rule.POOL,
    ("GET", "/teams"): Rule.ANY,
    ("PUT", "/teams/{name}"): Rule.ADMIN,
    ("DELETE", "/teams/{name}"): Rule.ADMIN,
    ("PUT", "/teams/{name}/budgets/{priority}"): Rule.ADMIN,
    ("DELETE", "/teams/{name}/budgets/{priority}"): Rule.ADMIN,
    ("DELETE", "/users/{name}"): Rule.ADMIN,
    ("GET", "/users"): Rule.OWN_TEAM,
    ("PUT", "/users/{name}"): Rule.ADMIN,
    ("POST", "/jobs"): Rule.SUBMIT,
    ("GET", "/jobs"): Rule.JOBS,
    ("GET", "/jobs/{job_id}"): Rule.JOB,
    ("GET", "/jobs/{job_id}/logs"): Rule.JOB,
    ("POST", "/jobs/{job_id}/cancel"): Rule.ACT,
    ("POST", "/jobs/{job_id}/hold"): Rule.ACT,
    ("POST", "/jobs/{job_id}/release"): Rule.ACT,
    ("PATCH", "/jobs/{job_id}"): Rule.ACT,
    ("POST", "/jobs/{job_id}/requeue"): Rule.ACT,
    ("WS", "/jobs/{job_id}/terminal"): Rule.SESSION,
    ("GET", "/events"): Rule.EVENTS,
    ("GET", "/report"): Rule.REPORT,
    ("GET", "/history"): Rule.HISTORY,
    ("GET", "/metrics"): Rule.ANY,
    ("POST", "/jobs/{job_id}/attempts/{attempt}/heartbeat"): Rule.ATTEMPT,
    ("POST", "/jobs/{job_id}/attempts/{attempt}/checkpoint"): Rule.ATTEMPT,
    ("POST", "/jobs/{job_id}/attempts/{attempt}/ack"): Rule.ATTEMPT,
    ("POST", "/jobs/{job_id}/attempts/{attempt}/complete"): Rule.ATTEMPT,
    ("POST", "/jobs/{job_id}/attempts/{attempt}/server"): Rule.ATTEMPT,
}
"""Every route of the API and its rule."""

DOCUMENTS: Final = frozenset({"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
"""The API's own description, open to all (not routes of the OpenAPI document)."""

JOB_RULES: Final = frozenset({Rule.JOB, Rule.ACT, Rule.SESSION})
"""Rules about the job in the path: the principal dependency reads it to apply them."""


def rule_of(method: str, path: str) -> Rule:
    try:
        return ROUTES[(method, path)]
    except KeyError:
        raise RuntimeError(f"{method} {path} has no rule in gpupool.api.access.ROUTES") from None


def check_routes(routes: Iterable[tuple[str, str]], pages: Iterable[tuple[str, str]] = ()) -> None:
    """Refuse to serve a route with no rule: a new route cannot forget who may call it. The
    dashboard's `pages` check their token themselves (the signed-in cookie, never a bearer)."""
    known = set(pages)
    missing = sorted(r for r in routes if r not in ROUTES and r not in known and r[1] not in DOCUMENTS)
    if missing:
        raise RuntimeError(f"routes without a rule in gpupool.api.access.ROUTES: {missing}")


# --- deciding -------------------------------------------------------------------------------


def sees_in_full(who: Principal, team: str) -> bool:
    """Whether `who` sees the jobs of `team` in full (logs, commands, events, accounts)."""
    return who.admin or (who.attempt is None and who.team == team)


def enforce(who: Principal, rule: Rule, job: JobRow | None = None) -> None:
    """Raise `Forbidden` unless `who` may call a route of `rule` (about `job`, for JOB_RULES and
    EVENTS with a job)."""
    if rule is Rule.ADMIN and not who.admin:
        raise Forbidden(f"only the admin token may do this, not {who}")
    if job is None:
        return
    if not sees_in_full(who, job.team):
        raise Forbidden(f"{who} may not see nor act on job {job.label} of team {job.team}")
    if rule is Rule.ACT and not who.admin and who.user is not None and job.user != who.user:
        by = f"user {job.user}" if job.user else f"team {job.team}'s token"
        raise Forbidden(f"{who} may act only on the jobs {who.user} submitted; job {job.label} was submitted by {by}")
    if rule is Rule.SESSION and not who.admin and job.user != who.user:
        # A terminal types as the session's user: its own token, not a teammate's or the team's.
        by = f"user {job.user}" if job.user else f"team {job.team}'s token"
        raise Forbidden(f"{who} may not use job {job.label}'s session: it was started by {by}")


def require_may_submit(who: Principal, team: str) -> None:
    if not who.admin and who.team != team:
        raise Forbidden(f"{who} may not act on jobs of team {team}")


# --- views ----------------------------------------------------------------------------------


def job_view(who: Principal, row: JobRow, **extra: Any) -> JobOut | JobBriefOut:
    """A job in a listing: in full for its own team, else brief."""
    return JobOut.of(row, **extra) if sees_in_full(who, row.team) else JobBriefOut.of(row)


def gpu_view(who: Principal, gpu: GpuView) -> GpuOut:
    """A GPU of the pool: another team's holder by team and job, not by user."""
    shown = GpuOut.model_validate(gpu, from_attributes=True)
    if gpu.team is not None and not sees_in_full(who, gpu.team):
        shown.user = None
    return shown


def listing_team(who: Principal, team: str | None, *, hidden_filters: bool) -> tuple[bool, str | None]:
    """Whether a listing of jobs can find any, and the team it is narrowed to: filters on what
    the brief view does not show (user, name, array) find only jobs the token sees in full, so
    that they tell nothing of other teams' jobs."""
    if who.admin or not hidden_filters:
        return True, team
    if team is not None and team != who.team:
        return False, team
    return True, who.team


def own_team(who: Principal) -> str | None:
    """The team whose jobs' events, users' totals, interruptions and history `who` gets; None for all."""
    return None if who.admin else who.team
