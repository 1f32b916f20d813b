"""The HTTP API: jobs, teams, classes, the pool, and the job protocol (OpenAPI at /docs).

Every request but `/health` and the documentation carries `Authorization: Bearer TOKEN`: the
admin token (written by `gpupool up` to the data directory), a team's or a user's token, or, for
the job protocol, the token of one attempt (`GPUPOOL_TOKEN`).

Who may see and do what is decided in one place, `access` (docs/access.md): the admin token
everything; a team's or user's token acts for its team, sees the pool and its own jobs in full,
other teams' jobs only as id, team, class, state and GPUs in listings (asking for one, its logs
or its events is a 403), the report's totals of the whole pool but only its own users' and
interruptions; only the admin changes teams and users; a user's token cancels only its own
jobs; the job protocol takes only the token of the attempt it speaks for.

Every error is JSON `{"error": kind, "message": what was wrong}` (`errors`); inputs are strict
and bounded (`models`, `limits`); no store call runs on the event loop (routes that reach the
store are plain `def`, run in worker threads; submissions are committed in groups from one).
A submission may carry an `Idempotency-Key`: retried with it, it is the same job.
"""

# No `from __future__ import annotations` here: FastAPI must see the dependencies, which are
# local functions, as real objects in the signatures, not as names to resolve later.
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from pydantic import Field, TypeAdapter, ValidationError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from gpupool.accounting import Totals, totals
from gpupool.api import access, limits
from gpupool.api.access import JOB_RULES, Principal, Rule
from gpupool.api.batching import SubmissionWriter
from gpupool.api.dashboard import PAGE_ROUTES, add_dashboard
from gpupool.api.errors import install, responses
from gpupool.api.history import add_history_routes
from gpupool.api.logs import read_part
from gpupool.api.metering import RequestMetrics
from gpupool.api.models import (
    AccountOut,
    AttemptOut,
    CheckpointIn,
    EventOut,
    HealthOut,
    HeartbeatIn,
    HeartbeatOut,
    InterruptionOut,
    JobBriefOut,
    JobIn,
    JobInterruptionOut,
    JobListed,
    JobOut,
    NoticeOut,
    ReportOut,
    TotalsOut,
)
from gpupool.api.pool import add_pool_routes
from gpupool.api.submission import check_fits, check_key, check_paths, parsed
from gpupool.errors import Conflict, InvalidInput, NotFound, StoreUnavailable, Unauthorized
from gpupool.model import JobState, Node
from gpupool.service.loop import ControlLoop
from gpupool.service.observer import Lineup
from gpupool.service.workspace import token_hash
from gpupool.slurm import parse_after, parse_array
from gpupool.store import DEFAULT_TEAM, JobSpec, Store
from gpupool.store.jobs import DuplicateSubmission
from gpupool.store.schema import JobRow
from gpupool.telemetry import Telemetry

__all__ = ["Context", "Principal", "create_app"]

EXPOSITION = "text/plain; version=0.0.4; charset=utf-8"
"""Prometheus' text format as every Prometheus server reads it (names are plain ASCII here)."""
DOCS_ASSETS = "/docs-assets"
"""Where Swagger UI's and ReDoc's files are served from (bundled with fastapi-offline)."""

Id = Annotated[int, Field(ge=0, le=limits.INT32)]
JobId = Annotated[int, PathParam(ge=0, le=limits.INT32, description="The job's id.")]
AttemptNo = Annotated[int, PathParam(ge=0, le=limits.INT32, description="The attempt's number, from 0.")]
STATES = "|".join(s.value for s in JobState)
STATE_LIST = f"^({STATES})(,({STATES}))*$"

DESCRIPTION = f"""One shared GPU pool, priority as a job attribute.

Who may see and do what: docs/access.md. Every error is `{{"error": kind, "message": text}}`.

**Limits**: a request body at most {limits.BODY_BYTES // (1024 * 1024)} MiB; a job's command
{limits.COMMAND_BYTES:,} bytes in all (at most {limits.ARGUMENTS:,} arguments, {limits.ARG_BYTES:,}
bytes each), its variables {limits.ENV_BYTES:,} bytes in all ({limits.VARIABLES:,}, {limits.ARG_BYTES:,}
bytes each `NAME=value`), its script {limits.SCRIPT_CHARS:,} characters; names in paths
{limits.NAME_MAX} bytes, whole paths {limits.PATH_MAX}; ids, attempts and steps 0 to 2^31-1; a log
answer at most {limits.LOG_BYTES // (1024 * 1024)} MiB (follow `X-Next-Offset`).
"""


@dataclass
class Context:
    store: Store
    loop: ControlLoop
    admin_hash: str
    clock: Callable[[], float] = time.time
    telemetry: Telemetry | None = None
    lineup: Lineup | None = None
    scrapers: dict[str, tuple[float, Principal]] = field(default_factory=dict)
    """Tokens that scraped /metrics: when the store last confirmed them, and whose they are."""
    _classes: list[str] | None = None
    _nodes: tuple[float, list[Node]] | None = None

    # Classes are set when the service starts and do not change while it runs.
    def class_names(self) -> list[str]:
        if self._classes is None:
            self._classes = [c.name for c in self.store.classes()]
        return self._classes

    def nodes(self) -> list[Node]:
        """Every node the pool has known, up or not, read at most once a second: a job that fits
        a node that is away for now (rebooting, set aside after losing a member) is accepted."""
        now = time.monotonic()
        if self._nodes is None or now - self._nodes[0] > 1.0:
            self._nodes = (now, self.store.nodes_as_core(every=True))
        return self._nodes[1]


def create_app(ctx: Context) -> FastAPI:
    # The documentation pages load Swagger UI and ReDoc from the package, not from a CDN.
    app = FastAPIOffline(
        title="gpupool",
        summary="One shared GPU pool, priority as a job attribute.",
        description=DESCRIPTION,
        static_url=DOCS_ASSETS,
    )
    install(app)
    if ctx.telemetry is not None:
        app.add_middleware(RequestMetrics, telemetry=ctx.telemetry, routes=app.router.routes)
    writer = SubmissionWriter(ctx.store, ctx.clock, ctx.loop.wakeup.set)
    bearer = HTTPBearer(auto_error=False, description="The admin's, a team's, a user's or an attempt's token.")

    @app.get("/health", response_model=HealthOut, responses={503: {"model": HealthOut}})
    def health() -> Any:
        """No token needed: 200 when the API and the store answer, 503 when the store does not
        or the scheduler has stopped deciding (its data directory or store is not the one it
        started with)."""
        try:
            if ctx.loop.halted is not None:
                raise StoreUnavailable(f"the scheduler has stopped deciding: {ctx.loop.halted}")
            ctx.store.classes()
        except Exception as exc:
            problem = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            return Response(
                HealthOut(status="unavailable", store=problem).model_dump_json(), 503, media_type="application/json"
            )
        return HealthOut(status="ok", store="ok")

    def identify(token: str | None) -> Principal:
        if not token:
            raise Unauthorized("send the token as 'Authorization: Bearer TOKEN'")
        digest = token_hash(token)
        if hmac.compare_digest(digest, ctx.admin_hash):
            return Principal(admin=True, team=None)
        holder = ctx.store.holder_of(digest)
        if holder is None:
            raise Unauthorized("this token is not the admin's, a team's nor a user's")
        return Principal(admin=False, team=holder[0], user=holder[1])

    def authorize(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
    ) -> Principal:
        """The principal of the request, once the rule of its route (`access.ROUTES`) allows it."""
        rule = access.rule_of(request.method, request.scope["route"].path)
        token = credentials.credentials if credentials is not None else None
        if rule is Rule.ATTEMPT:
            job_id, attempt = number(request, "path", "job_id"), number(request, "path", "attempt")
            if not token:
                raise Unauthorized("send the attempt's token (GPUPOOL_TOKEN) as 'Authorization: Bearer TOKEN'")
            ctx.store.check_attempt_token(job_id, attempt, token_hash(token))
            return Principal(admin=False, team=None, attempt=(job_id, attempt))
        who = identify(token)
        job: JobRow | None = None
        if rule in JOB_RULES:
            job = ctx.store.job(number(request, "path", "job_id"))
        elif rule is Rule.EVENTS and request.query_params.get("job") is not None:
            job = ctx.store.job(number(request, "query", "job"))
        access.enforce(who, rule, job)
        return who

    Who = Annotated[Principal, Depends(authorize)]

    # --- jobs -------------------------------------------------------------------------------

    def prepare(body: JobIn, who: Principal, key: str | None) -> JobSpec:
        """The job `body` asks for, checked against the pool and this machine."""
        check_key(key)
        if ctx.loop.halted is not None:
            # What would be written now could be lost, or scheduled by a scheduler that is blind.
            raise StoreUnavailable(f"the scheduler has stopped deciding ({ctx.loop.halted}): no job is accepted now")
        team = body.team or who.team or DEFAULT_TEAM
        access.require_may_submit(who, team)
        user = who.user if not who.admin else body.user
        ctx.loop.check_runnable(user, team)
        known = ctx.class_names()
        if body.priority not in known:
            raise InvalidInput(f"priority: unknown priority class {body.priority!r} (known: {', '.join(known)})")
        check_fits(ctx.nodes(), body, team)
        check_paths(body, ctx.loop.data_dir)
        dependencies = parsed("after", parse_after, body.after) or []
        indexes, limit = parsed("array", parse_array, body.array) or ([], None)
        return JobSpec(
            body.command,
            team,
            body.priority,
            body.gpus,
            body.name,
            body.gpus_per_node,
            body.gpu_type,
            body.workdir,
            body.env,
            body.max_failures,
            body.max_preemptions,
            body.time_limit,
            user=user,
            dependencies=dependencies,
            script=body.script,
            output=body.output,
            error=body.error,
            array=indexes,
            array_limit=limit,
            idempotency_key=key,
        )

    async def write(spec: JobSpec) -> JobRow:
        if spec.array:
            tasks = await run_in_threadpool(ctx.store.submit_array, spec, ctx.clock())
            ctx.loop.wakeup.set()
            return tasks[0]
        return await writer.submit(spec)

    replayed = {
        "description": "The job. A retry of a submission (same Idempotency-Key) gets the same answer again.",
        "headers": {
            "Idempotent-Replayed": {
                "description": "`true` when this answers a retry: no new job was made.",
                "schema": {"type": "string", "enum": ["true"]},
            }
        },
    }

    @app.post(
        "/jobs",
        status_code=201,
        response_model=JobOut,
        responses={201: replayed, **responses(400, 401, 403, 409, 413, 422, 503)},
    )
    async def submit(
        body: JobIn,
        who: Who,
        response: Response,
        idempotency_key: Annotated[
            str | None,
            Header(
                alias="Idempotency-Key",
                description="1 to 200 printable ASCII characters (a UUID): a retry with the same key and the "
                "same request gets the same job; with another request, a 409.",
            ),
        ] = None,
    ) -> JobOut:
        """Submit a job (or a job array: the answer is its first task)."""
        spec = await run_in_threadpool(prepare, body, who, idempotency_key)
        earlier = await run_in_threadpool(ctx.store.earlier_submission, spec)
        if earlier is None:
            try:
                return JobOut.as_submitted(await write(spec))
            except DuplicateSubmission:
                # Another request with this key was written first: this one is its retry.
                earlier = await run_in_threadpool(ctx.store.earlier_submission, spec)
                if earlier is None:
                    raise
        response.headers["Idempotent-Replayed"] = "true"
        return JobOut.as_submitted(earlier)

    @app.get("/jobs", response_model=list[JobListed], responses=responses(400, 401, 422, 503))
    def list_jobs(
        who: Who,
        state: Annotated[
            str | None,
            Query(pattern=STATE_LIST, max_length=200, description=f"Comma-separated: {STATES.replace('|', ', ')}."),
        ] = None,
        team: Annotated[str | None, Query(max_length=200)] = None,
        user: Annotated[str | None, Query(max_length=200)] = None,
        array: Annotated[int | None, Query(ge=0, le=limits.INT32)] = None,
        name: Annotated[str | None, Query(max_length=200)] = None,
        limit: Annotated[int | None, Query(ge=0, le=limits.INT32)] = None,
    ) -> list[JobOut | JobBriefOut]:
        """Jobs, filtered by state (comma-separated), team, user, array (its tasks) and name;
        all of them unless `limit` says how many at most. Another team's jobs are brief, and
        `user`, `name` and `array` find only the token's own team's."""
        hidden = any(f is not None for f in (user, name, array))
        found, narrowed = access.listing_team(who, team, hidden_filters=hidden)
        if not found:
            return []
        states = [JobState(s) for s in state.split(",")] if state else []
        held = placements(ctx)
        since = {a.job_id: a.started_at for a in ctx.store.live_attempts()}
        jobs = ctx.store.jobs(
            states=states,
            team=narrowed,
            user=user,
            array=array,
            name=name,
            limit=limit,
        )
        return [access.job_view(who, j, placement=held.get(j.id, {}), running_since=since.get(j.id)) for j in jobs]

    @app.get("/jobs/{job_id}", response_model=JobOut, responses=responses(401, 403, 404, 422, 503))
    def show(job_id: JobId, who: Who) -> JobOut:
        """A job of the token's team, with its attempts and its account."""
        job = ctx.store.job(job_id)
        history = [AttemptOut.of(a) for a in ctx.store.attempts(job_id)]
        accounts = ctx.store.accounts(ctx.clock(), job_ids=[job_id])
        account = AccountOut.of(accounts[0]) if accounts else None
        return JobOut.of(job, placement=placements(ctx).get(job_id, {}), history=history, account=account)

    @app.get("/report", response_model=ReportOut, responses=responses(401, 422, 503))
    def report(
        who: Who,
        since: Annotated[
            float | None, Query(allow_inf_nan=False, description="Unix time; all time when omitted.")
        ] = None,
    ) -> ReportOut:
        """GPU-seconds, goodput and interruptions of the jobs that held GPUs since `since`, for
        the pool, per team and per class; per user and each interruption, of the token's team."""
        now = ctx.clock()
        accounts = ctx.store.accounts(now, since=since)
        team = access.own_team(who)
        own = [a for a in accounts if team is None or a.team == team]
        pool = totals(accounts, lambda _: "pool").get("pool") or Totals()
        return ReportOut(
            since=since,
            until=now,
            pool=TotalsOut.of(pool),
            teams={k: TotalsOut.of(v) for k, v in totals(accounts, lambda a: a.team).items()},
            users={k: TotalsOut.of(v) for k, v in totals(own, lambda a: a.user or "(none)").items()},
            classes={k: TotalsOut.of(v) for k, v in totals(accounts, lambda a: a.priority).items()},
            interruptions=[
                JobInterruptionOut.model_validate(
                    {**InterruptionOut.of(i).model_dump(), "job": a.job_id, "team": a.team, "priority": a.priority}
                )
                for a in own
                for i in a.interruptions
            ],
        )

    @app.post("/jobs/{job_id}/cancel", response_model=JobOut, responses=responses(401, 403, 404, 409, 422, 503))
    def cancel(job_id: JobId, who: Who) -> JobOut:
        """Cancel a job: a team's token any of its team's, a user's token those it submitted."""
        job = ctx.store.cancel(job_id, ctx.clock())
        ctx.loop.wakeup.set()
        return JobOut.of(job)

    log_headers = {
        "X-Next-Offset": {"description": "The byte offset to read from next.", "schema": {"type": "integer"}},
        "X-Log-Size": {"description": "The file's size in bytes when it was read.", "schema": {"type": "integer"}},
    }

    @app.get(
        "/jobs/{job_id}/logs",
        response_class=PlainTextResponse,
        responses={
            200: {"headers": log_headers},
            **responses(401, 403, 404, 409, 422, 503, plain=True),
        },
    )
    def logs(
        job_id: JobId,
        who: Who,
        attempt: Annotated[int | None, Query(ge=0, le=limits.INT32, description="Default: the latest.")] = None,
        stream: Literal["stdout", "stderr"] = "stdout",
        offset: Annotated[int, Query(ge=0, le=limits.INT64)] = 0,
        rank: Annotated[int, Query(ge=0, le=limits.INT32, description="The member of the gang (0: the first).")] = 0,
    ) -> PlainTextResponse:
        """A member's output from byte `offset` on (at most 4 MiB); the header `X-Next-Offset`
        says where to read next (a character cut at the end of the file is left for the next
        read)."""
        job = ctx.store.job(job_id)
        number = attempt if attempt is not None else job.attempts - 1
        # The service opens it: a file a job of another OS user chose is never opened (a 409).
        reader = ctx.loop.open_log(job, number, stream, rank) if number >= 0 else None
        if reader is None:
            return PlainTextResponse("", headers={"X-Next-Offset": str(offset), "X-Log-Size": "0"})
        try:
            with reader:
                text, following, size = read_part(reader, offset)
        except OSError as exc:
            raise Conflict(f"the {stream} of job {job_id} cannot be read now ({exc.strerror})") from None
        return PlainTextResponse(text, headers={"X-Next-Offset": str(following), "X-Log-Size": str(size)})

    @app.get("/events", response_model=list[EventOut], responses=responses(401, 403, 404, 422, 503))
    def events(
        who: Who,
        job: Annotated[int | None, Query(ge=0, le=limits.INT32, description="Only this job's.")] = None,
        after: Annotated[int, Query(ge=0, le=limits.INT32, description="Only events after this id.")] = 0,
        limit: Annotated[int, Query(ge=0, le=limits.INT32)] = 1000,
    ) -> list[EventOut]:
        """Decisions and state changes, oldest first: of one job, or of the token's team's jobs."""
        team = access.own_team(who) if job is None else None
        return [
            EventOut.model_validate(e, from_attributes=True)
            for e in ctx.store.events(job_id=job, after=after, limit=limit, team=team)
        ]

    add_pool_routes(app, ctx, authorize)
    add_history_routes(app, ctx, authorize)

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"content": {EXPOSITION: {}}}, **responses(401, 404, 503, plain=True)},
    )
    def metrics(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Response:
        """The pool, the queue, teams, interruptions and the scheduler itself in Prometheus'
        exposition format, as of the last read of the store (at most a few seconds old). Any
        token but a job's; a token is checked against the store at most once a minute, so a
        scrape still answers while the store does not."""
        scraper(credentials.credentials if credentials is not None else None)
        if ctx.telemetry is None:
            raise NotFound("this service keeps no metrics")
        return Response(ctx.telemetry.exposition(), media_type=EXPOSITION)

    def scraper(token: str | None) -> Principal:
        digest = token_hash(token or "")
        now = time.monotonic()
        known = ctx.scrapers.get(digest)
        if known is not None and now - known[0] < 60:
            return known[1]
        try:
            who = identify(token)
        except (StoreUnavailable, DBAPIError, PoolTimeout):
            if known is not None and now - known[0] < 600:
                return known[1]
            raise
        ctx.scrapers[digest] = (now, who)
        return who

    # --- the job protocol ------------------------------------------------------------------------

    protocol = "/jobs/{job_id}/attempts/{attempt}"
    with_body = responses(400, 401, 403, 404, 409, 413, 422, 503)
    without_body = responses(401, 403, 404, 409, 422, 503)

    @app.post(f"{protocol}/heartbeat", response_model=HeartbeatOut, responses=with_body)
    def heartbeat(job_id: JobId, attempt: AttemptNo, body: HeartbeatIn, who: Who) -> HeartbeatOut:
        now = ctx.clock()
        row = ctx.store.heartbeat(
            job_id,
            attempt,
            now,
            body.step,
            body.phase,
            restored_step=body.restored_step,
            restore_seconds=body.restore_seconds,
            restore_skipped=body.restore_skipped,
            since_commit=body.since_commit,
            restart=body.restart(),
        )
        if row.notice_deadline is None:
            return HeartbeatOut(notice=None)
        return HeartbeatOut(
            notice=NoticeOut(deadline=row.notice_deadline, seconds_left=max(0.0, row.notice_deadline - now))
        )

    @app.post(f"{protocol}/checkpoint", status_code=204, responses=with_body)
    def checkpoint(job_id: JobId, attempt: AttemptNo, body: CheckpointIn, who: Who) -> None:
        ctx.store.commit_checkpoint(
            job_id, attempt, ctx.clock(), body.step, body.path, body.seconds, body.background_seconds
        )

    @app.post(f"{protocol}/ack", status_code=204, responses=without_body)
    def ack(job_id: JobId, attempt: AttemptNo, who: Who) -> None:
        ctx.store.acknowledge(job_id, attempt, ctx.clock())

    @app.post(f"{protocol}/complete", status_code=204, responses=without_body)
    def complete(job_id: JobId, attempt: AttemptNo, who: Who) -> None:
        ctx.store.report_completed(job_id, attempt, ctx.clock())

    add_dashboard(app, ctx, identify)
    access.check_routes(
        (
            (method, getattr(route, "path", ""))
            for route in app.routes
            for method in getattr(route, "methods", None) or ()
        ),
        pages=PAGE_ROUTES,
    )
    return app


NUMBER = TypeAdapter(Id)


def number(request: Request, where: Literal["path", "query"], name: str) -> int:
    """A path or query parameter as the route itself reads it: an id, or a 422 saying why not."""
    raw = (request.path_params if where == "path" else request.query_params).get(name, "")
    try:
        return NUMBER.validate_strings(str(raw))
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": (where, name)} for e in exc.errors()]) from None


def placements(ctx: Context) -> dict[int, dict[str, list[int]]]:
    """The GPUs each job holds now, by node: one read for a whole listing."""
    held: dict[int, dict[str, list[int]]] = {}
    for p in sorted(ctx.store.held(), key=lambda p: (p.node, p.gpu)):
        held.setdefault(p.job_id, {}).setdefault(p.node, []).append(p.gpu)
    return held
