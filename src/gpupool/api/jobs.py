"""The routes of jobs: submit (`POST /jobs`, with an `Idempotency-Key` a retry is the same
job), list, show, cancel, a member's output (`/jobs/{job_id}/logs`), the events, and the
report of what the jobs' GPU time bought and what interruptions cost. What a submission is
checked against is `submission`'s; who sees which job is `access`'s."""

# No `from __future__ import annotations`: FastAPI reads the dependencies from the signatures.
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Response
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse

from gpupool.accounting import Totals, totals
from gpupool.api import access, limits
from gpupool.api.access import Principal
from gpupool.api.auth import Who
from gpupool.api.context import Context, Ctx
from gpupool.api.errors import responses
from gpupool.api.logs import read_part
from gpupool.api.models import (
    AccountOut,
    AttemptOut,
    EventOut,
    InterruptionOut,
    JobBriefOut,
    JobIn,
    JobInterruptionOut,
    JobListed,
    JobOut,
    ReportOut,
    TotalsOut,
)
from gpupool.api.submission import check_fits, check_key, check_paths, parsed
from gpupool.config.specs import webhook_url
from gpupool.errors import Conflict, InvalidInput, StoreUnavailable
from gpupool.settle import JobState
from gpupool.shapes import gpus_per_node_of, session_problem, sizes_problem
from gpupool.slurm import parse_after, parse_array
from gpupool.store import DEFAULT_TEAM, JobSpec
from gpupool.store.jobs import DuplicateSubmission
from gpupool.store.schema import JobRow

JobId = Annotated[int, PathParam(ge=0, le=limits.INT32, description="The job's id.")]
STATES = "|".join(s.value for s in JobState)
STATE_LIST = f"^({STATES})(,({STATES}))*$"

REPLAYED = {
    "description": "The job. A retry of a submission (same Idempotency-Key) gets the same answer again.",
    "headers": {
        "Idempotent-Replayed": {
            "description": "`true` when this answers a retry: no new job was made.",
            "schema": {"type": "string", "enum": ["true"]},
        }
    },
}
LOG_HEADERS = {
    "X-Next-Offset": {"description": "The byte offset to read from next.", "schema": {"type": "integer"}},
    "X-Log-Size": {"description": "The file's size in bytes when it was read.", "schema": {"type": "integer"}},
}

router = APIRouter()


@router.post(
    "/jobs",
    status_code=201,
    response_model=JobOut,
    responses={201: REPLAYED, **responses(400, 401, 403, 404, 409, 413, 422, 503)},
)
async def submit(
    body: JobIn,
    who: Who,
    ctx: Ctx,
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
    spec = await run_in_threadpool(prepare, ctx, body, who, idempotency_key)
    earlier = await run_in_threadpool(ctx.store.earlier_submission, spec)
    if earlier is None:
        try:
            return JobOut.as_submitted(await write(ctx, spec))
        except DuplicateSubmission:
            # Another request with this key was written first: this one is its retry.
            earlier = await run_in_threadpool(ctx.store.earlier_submission, spec)
            if earlier is None:
                raise
    response.headers["Idempotent-Replayed"] = "true"
    return JobOut.as_submitted(earlier)


def prepare(ctx: Context, body: JobIn, who: Principal, key: str | None) -> JobSpec:
    """The job `body` asks for, checked against the pool and this machine."""
    check_key(key)
    if ctx.service.halted is not None:
        # What would be written now could be lost, or scheduled by a scheduler that is blind.
        raise StoreUnavailable(f"the scheduler has stopped deciding ({ctx.service.halted}): no job is accepted now")
    team = body.team or who.team or DEFAULT_TEAM
    priority, time_limit = ctx.service.job_defaults(body.priority, body.session)
    problem = session_problem(body.session, body.gpus, body.gpus_per_node, bool(body.array))
    if problem is not None:
        raise InvalidInput(problem)
    body = body.model_copy(update={"gpus_per_node": gpus_per_node_of(body.session, body.gpus, body.gpus_per_node)})
    problem = sizes_problem(body.gpus, body.sizes or (), body.gpus_per_node, body.session)
    if problem is not None:
        raise InvalidInput(problem)
    access.require_may_submit(who, team)
    user = who.user if not who.admin else body.user
    ctx.service.check_runnable(user, team)
    check_fits(ctx.nodes(), body, team, priority)
    ctx.service.check_resources(body.gpus, body.gpus_per_node, body.mem, body.mem_per_gpu, body.cpus_per_gpu)
    check_paths(body, ctx.service.workspace.data_dir)
    dependencies = parsed("after", parse_after, body.after) or []
    indexes, limit = parsed("array", parse_array, body.array) or ([], None)
    return JobSpec(
        body.command,
        team,
        priority,
        body.gpus,
        body.name,
        body.gpus_per_node,
        body.gpu_type,
        body.workdir,
        body.env,
        body.max_failures,
        body.max_preemptions,
        body.time_limit if body.time_limit is not None else time_limit,
        user=user,
        dependencies=dependencies,
        script=body.script,
        output=body.output,
        error=body.error,
        array=indexes,
        array_limit=limit,
        idempotency_key=key,
        notify=parsed("notify", webhook_url, body.notify),
        mem=body.mem,
        mem_per_gpu=body.mem_per_gpu,
        cpus_per_gpu=body.cpus_per_gpu,
        session=body.session,
        sizes=tuple(body.sizes or ()),
    )


async def write(ctx: Context, spec: JobSpec) -> JobRow:
    if spec.array:
        tasks = await run_in_threadpool(ctx.store.submit_array, spec, ctx.clock())
        ctx.service.wake()
        return tasks[0]
    return await ctx.writer.submit(spec)


@router.get("/jobs", response_model=list[JobListed], responses=responses(400, 401, 422, 503))
def list_jobs(
    who: Who,
    ctx: Ctx,
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


@router.get("/jobs/{job_id}", response_model=JobOut, responses=responses(401, 403, 404, 422, 503))
def show(job_id: JobId, who: Who, ctx: Ctx) -> JobOut:
    """A job of the token's team, with its attempts and its account."""
    job = ctx.store.job(job_id)
    history = [AttemptOut.of(a) for a in ctx.store.attempts(job_id)]
    accounts = ctx.store.accounts(ctx.clock(), job_ids=[job_id])
    account = AccountOut.of(accounts[0]) if accounts else None
    return JobOut.of(job, placement=placements(ctx).get(job_id, {}), history=history, account=account)


@router.get("/report", response_model=ReportOut, responses=responses(401, 422, 503))
def report(
    who: Who,
    ctx: Ctx,
    since: Annotated[float | None, Query(allow_inf_nan=False, description="Unix time; all time when omitted.")] = None,
) -> ReportOut:
    """GPU-seconds, goodput and interruptions of the jobs that held GPUs since `since`, for
    the pool, per team and per class; per user and each interruption, of the token's team."""
    now = ctx.clock()
    accounts = ctx.store.accounts(now, since=since)
    team = access.own_team(who)
    own = [a for a in accounts if team is None or a.team == team]
    pool = totals(accounts, lambda _: "pool").get("pool") or Totals()
    labels = ctx.store.labels(a.job_id for a in own if a.interruptions)
    return ReportOut(
        since=since,
        until=now,
        pool=TotalsOut.of(pool),
        teams={k: TotalsOut.of(v) for k, v in totals(accounts, lambda a: a.team).items()},
        users={k: TotalsOut.of(v) for k, v in totals(own, lambda a: a.user or "(none)").items()},
        classes={k: TotalsOut.of(v) for k, v in totals(accounts, lambda a: a.priority).items()},
        interruptions=[
            JobInterruptionOut.model_validate(
                {
                    **InterruptionOut.of(i).model_dump(),
                    "job": a.job_id,
                    "job_label": labels.get(a.job_id, str(a.job_id)),
                    "team": a.team,
                    "priority": a.priority,
                    "job_ended": a.ended,
                }
            )
            for a in own
            for i in a.interruptions
        ],
    )


@router.post("/jobs/{job_id}/cancel", response_model=JobOut, responses=responses(401, 403, 404, 409, 422, 503))
def cancel(
    job_id: JobId,
    who: Who,
    ctx: Ctx,
    now: Annotated[
        bool, Query(description="Kill a running attempt at once, without its class's grace (also during it).")
    ] = False,
) -> JobOut:
    """Cancel a job: a team's token any of its team's, a user's token those it submitted. A
    running attempt gets notice and its class's grace, or is killed at once with `now`."""
    job = ctx.store.cancel(job_id, ctx.clock(), kill=now)
    ctx.service.wake()
    return JobOut.of(job)


@router.get(
    "/jobs/{job_id}/logs",
    response_class=PlainTextResponse,
    responses={
        200: {"headers": LOG_HEADERS},
        **responses(401, 403, 404, 409, 422, 503, plain=True),
    },
)
def logs(
    job_id: JobId,
    who: Who,
    ctx: Ctx,
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
    # The service opens it: a file a job of another OS user chose is opened with that user's rights.
    reader = ctx.service.open_log(job, number, stream, rank) if number >= 0 else None
    if reader is None:
        return PlainTextResponse("", headers={"X-Next-Offset": str(offset), "X-Log-Size": "0"})
    try:
        with reader:
            text, following, size = read_part(reader, offset)
    except OSError as exc:
        raise Conflict(f"the {stream} of job {job_id} cannot be read now ({exc.strerror})") from None
    return PlainTextResponse(text, headers={"X-Next-Offset": str(following), "X-Log-Size": str(size)})


@router.get("/events", response_model=list[EventOut], responses=responses(401, 403, 404, 422, 503))
def events(
    who: Who,
    ctx: Ctx,
    job: Annotated[int | None, Query(ge=0, le=limits.INT32, description="Only this job's.")] = None,
    after: Annotated[int, Query(ge=0, le=limits.INT32, description="Only events after this id.")] = 0,
    limit: Annotated[int, Query(ge=0, le=limits.INT32)] = 1000,
    newest: Annotated[bool, Query(description="The last `limit` events (still oldest first), not the first.")] = False,
    since: Annotated[
        float | None, Query(allow_inf_nan=False, description="Only events at or after this Unix time.")
    ] = None,
    kind: Annotated[str | None, Query(max_length=1000, description="Only these kinds, comma-separated.")] = None,
    hide: Annotated[str | None, Query(max_length=1000, description="None of these kinds, comma-separated.")] = None,
) -> list[EventOut]:
    """Decisions and state changes, oldest first: of one job, or of the token's team's jobs."""
    team = access.own_team(who) if job is None else None
    kinds, hidden = (tuple(k for k in (text or "").split(",") if k) for text in (kind, hide))
    found = ctx.store.events(
        job_id=job, after=after, limit=limit, team=team, newest=newest, since=since, kinds=kinds, hidden=hidden
    )
    labels = ctx.store.labels(e.job_id for e in found if e.job_id is not None)
    return [EventOut.of(e, labels) for e in found]


def placements(ctx: Context) -> dict[int, dict[str, list[int]]]:
    """The GPUs each job holds now, by node: one read for a whole listing."""
    held: dict[int, dict[str, list[int]]] = {}
    for p in sorted(ctx.store.held(), key=lambda p: (p.node, p.gpu)):
        held.setdefault(p.job_id, {}).setdefault(p.node, []).append(p.gpu)
    return held
