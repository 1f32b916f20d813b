"""The HTTP API: jobs, teams, classes, the pool, and the job protocol (OpenAPI at /docs).

Every request carries `Authorization: Bearer TOKEN`: the admin token (written by `gpupool up`
to the data directory), a team's token (its jobs and its allowed classes only), or, for the job
protocol, the token of one attempt (`GPUPOOL_TOKEN`). Domain errors become JSON
`{"error": kind, "message": what was wrong}` with the status of one table.
"""

# No `from __future__ import annotations` here: FastAPI must see the dependencies, which are
# local functions, as real objects in the signatures, not as names to resolve later.
#
# The dependencies and the short writes (cancel, the job protocol) are `async def`: they run on
# the event loop and pay no hand-off to a worker thread, which costs more than their one small
# transaction. Submissions go through a group commit (`batching`). Reads that may return many
# rows, and logs, stay `def` and run in FastAPI's thread pool.
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, TypeVar

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlalchemy.exc import DataError

from gpupool.accounting import Totals, totals
from gpupool.api.batching import SubmissionWriter
from gpupool.api.models import (
    AccountOut,
    AttemptOut,
    CheckpointIn,
    EventOut,
    HeartbeatIn,
    HeartbeatOut,
    InterruptionOut,
    JobIn,
    JobInterruptionOut,
    JobOut,
    NoticeOut,
    ReportOut,
    TotalsOut,
)
from gpupool.api.pool import Principal, add_pool_routes
from gpupool.errors import HTTP_STATUS, Forbidden, GpupoolError, InvalidInput, Unauthorized
from gpupool.model import Job, JobState, Node
from gpupool.policy import messages
from gpupool.policy.place import FreeGpus, can_ever_fit, job_shapes
from gpupool.service import ControlLoop, expand_log_path, inside, token_hash
from gpupool.slurm import parse_after, parse_array
from gpupool.store import DEFAULT_TEAM, JobSpec, Store
from gpupool.store.jobs import job_name

T = TypeVar("T")


@dataclass
class Context:
    store: Store
    loop: ControlLoop
    admin_hash: str
    clock: Callable[[], float] = time.time
    _classes: list[str] | None = None
    _nodes: list[Node] | None = None

    # Classes and nodes are set when the service starts and do not change while it runs.
    def class_names(self) -> list[str]:
        if self._classes is None:
            self._classes = [c.name for c in self.store.classes()]
        return self._classes

    def nodes(self) -> list[Node]:
        if self._nodes is None:
            self._nodes = self.store.nodes_as_core()
        return self._nodes


def create_app(ctx: Context) -> FastAPI:
    app = FastAPI(title="gpupool", summary="One shared GPU pool, priority as a job attribute.")
    writer = SubmissionWriter(ctx.store, ctx.clock, ctx.loop.wakeup.set)

    @app.get("/health")
    def health() -> JSONResponse:
        """No token needed: 200 when the API and the store answer, 503 when the store does not."""
        try:
            ctx.store.classes()
        except Exception as exc:
            return JSONResponse({"status": "unavailable", "store": str(exc)[:200]}, status_code=503)
        return JSONResponse({"status": "ok", "store": "ok"})

    @app.exception_handler(GpupoolError)
    def domain_error(_request: Request, exc: GpupoolError) -> JSONResponse:
        status = HTTP_STATUS.get(type(exc), 400)
        return JSONResponse({"error": type(exc).__name__, "message": str(exc)}, status_code=status)

    @app.exception_handler(DataError)
    def out_of_range(_request: Request, exc: DataError) -> JSONResponse:
        # PostgreSQL refuses a number its column cannot hold (SQLite takes any): that is the
        # request's fault, not the server's.
        first = (str(exc.orig).splitlines() or [""])[0][:200]
        message = f"a value is out of range for the store ({first})"
        return JSONResponse({"error": "InvalidInput", "message": message}, status_code=400)

    @app.exception_handler(RequestValidationError)
    def bad_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body')}: {str(e['msg']).removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        return JSONResponse({"error": "InvalidInput", "message": problems}, status_code=422)

    async def principal(authorization: Annotated[str | None, Header()] = None) -> Principal:
        token = bearer(authorization)
        digest = token_hash(token)
        if digest == ctx.admin_hash:
            return Principal(admin=True, team=None)
        holder = ctx.store.holder_of(digest)
        if holder is None:
            raise Unauthorized("this token is not the admin's, a team's nor a user's")
        return Principal(admin=False, team=holder[0], user=holder[1])

    async def admin(who: Annotated[Principal, Depends(principal)]) -> Principal:
        if not who.admin:
            raise Forbidden("only the admin token may do this")
        return who

    def may_touch(who: Principal, team: str) -> None:
        if not who.admin and who.team != team:
            raise Forbidden(f"the token of team {who.team} may not act on jobs of team {team}")

    # --- jobs -------------------------------------------------------------------------------

    @app.post("/jobs", status_code=201, response_model=JobOut)
    async def submit(body: JobIn, who: Annotated[Principal, Depends(principal)]) -> JobOut:
        team = body.team or who.team or DEFAULT_TEAM
        may_touch(who, team)
        known = ctx.class_names()
        if body.priority not in known:
            raise InvalidInput(f"priority: unknown priority class {body.priority!r} (known: {', '.join(known)})")
        check_fits(ctx.nodes(), body, team)
        check_paths(body, ctx.loop.data_dir)
        dependencies = parsed("after", parse_after, body.after) or []
        indexes, limit = parsed("array", parse_array, body.array) or ([], None)
        spec = JobSpec(
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
            user=who.user if not who.admin else body.user,
            dependencies=dependencies,
            script=body.script,
            output=body.output,
            error=body.error,
            array=indexes,
            array_limit=limit,
        )
        if spec.array:
            tasks = ctx.store.submit_array(spec, ctx.clock())
            ctx.loop.wakeup.set()
            return JobOut.of(tasks[0])
        return JobOut.of(await writer.submit(spec))

    @app.get("/jobs", response_model=list[JobOut])
    def list_jobs(
        who: Annotated[Principal, Depends(principal)],
        state: str | None = None,
        team: str | None = None,
        user: str | None = None,
        array: int | None = None,
        name: str | None = None,
        limit: int | None = None,
    ) -> list[JobOut]:
        """Jobs, filtered by state (comma-separated), team, user, array (its tasks) and name;
        all of them unless `limit` says how many at most."""
        states = [parse_state(s) for s in state.split(",")] if state else []
        held = placements(ctx)
        since = {a.job_id: a.started_at for a in ctx.store.live_attempts()}
        jobs = ctx.store.jobs(states=states, team=team, user=user, array=array, name=name, limit=limit)
        return [JobOut.of(j, placement=held.get(j.id, {}), running_since=since.get(j.id)) for j in jobs]

    @app.get("/jobs/{job_id}", response_model=JobOut)
    def show(job_id: int, who: Annotated[Principal, Depends(principal)]) -> JobOut:
        job = ctx.store.job(job_id)
        history = [AttemptOut.of(a) for a in ctx.store.attempts(job_id)]
        accounts = ctx.store.accounts(ctx.clock(), job_ids=[job_id])
        account = AccountOut.of(accounts[0]) if accounts else None
        return JobOut.of(job, placement=placements(ctx).get(job_id, {}), history=history, account=account)

    @app.get("/report", response_model=ReportOut)
    def report(who: Annotated[Principal, Depends(principal)], since: float | None = None) -> ReportOut:
        """GPU-seconds, goodput and interruptions of the jobs that held GPUs since `since`
        (unix time; all time when omitted), for the pool, per team and per class."""
        now = ctx.clock()
        accounts = ctx.store.accounts(now, since=since)
        pool = totals(accounts, lambda _: "pool").get("pool") or Totals()
        return ReportOut(
            since=since,
            until=now,
            pool=TotalsOut.of(pool),
            teams={k: TotalsOut.of(v) for k, v in totals(accounts, lambda a: a.team).items()},
            users={k: TotalsOut.of(v) for k, v in totals(accounts, lambda a: a.user or "(none)").items()},
            classes={k: TotalsOut.of(v) for k, v in totals(accounts, lambda a: a.priority).items()},
            interruptions=[
                JobInterruptionOut.model_validate(
                    {**InterruptionOut.of(i).model_dump(), "job": a.job_id, "team": a.team, "priority": a.priority}
                )
                for a in accounts
                for i in a.interruptions
            ],
        )

    @app.post("/jobs/{job_id}/cancel", response_model=JobOut)
    async def cancel(job_id: int, who: Annotated[Principal, Depends(principal)]) -> JobOut:
        may_touch(who, ctx.store.job(job_id).team)
        job = ctx.store.cancel(job_id, ctx.clock())
        ctx.loop.wakeup.set()
        return JobOut.of(job)

    @app.get("/jobs/{job_id}/logs", response_class=PlainTextResponse)
    def logs(
        job_id: int,
        who: Annotated[Principal, Depends(principal)],
        attempt: int | None = None,
        stream: str = "stdout",
        offset: int = 0,
    ) -> PlainTextResponse:
        """The output from byte `offset` on; the header `X-Next-Offset` says where to read
        next (a character cut at the end of the file is left for the next read)."""
        if offset < 0:
            raise InvalidInput(f"offset: {offset} is negative")
        if stream not in ("stdout", "stderr"):
            raise InvalidInput(f"stream: {stream!r} is neither stdout nor stderr")
        job = ctx.store.job(job_id)
        number = attempt if attempt is not None else job.attempts - 1
        text, following = read_from(ctx.loop.log_file(job, number, stream), offset) if number >= 0 else ("", offset)
        return PlainTextResponse(text, headers={"X-Next-Offset": str(following)})

    @app.get("/events", response_model=list[EventOut])
    def events(
        who: Annotated[Principal, Depends(principal)], job: int | None = None, after: int = 0, limit: int = 1000
    ) -> list[EventOut]:
        return [
            EventOut.model_validate(e, from_attributes=True)
            for e in ctx.store.events(job_id=job, after=after, limit=limit)
        ]

    add_pool_routes(app, ctx, principal, admin)

    # --- the job protocol ------------------------------------------------------------------------

    async def attempt_token(job_id: int, attempt: int, authorization: Annotated[str | None, Header()] = None) -> None:
        ctx.store.check_attempt_token(job_id, attempt, token_hash(bearer(authorization)))

    protocol = "/jobs/{job_id}/attempts/{attempt}"

    @app.post(f"{protocol}/heartbeat", response_model=HeartbeatOut, dependencies=[Depends(attempt_token)])
    async def heartbeat(job_id: int, attempt: int, body: HeartbeatIn) -> HeartbeatOut:
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
        )
        if row.notice_deadline is None:
            return HeartbeatOut(notice=None)
        return HeartbeatOut(
            notice=NoticeOut(deadline=row.notice_deadline, seconds_left=max(0.0, row.notice_deadline - now))
        )

    @app.post(f"{protocol}/checkpoint", status_code=204, dependencies=[Depends(attempt_token)])
    async def checkpoint(job_id: int, attempt: int, body: CheckpointIn) -> None:
        ctx.store.commit_checkpoint(job_id, attempt, ctx.clock(), body.step, body.path, body.seconds)

    @app.post(f"{protocol}/ack", status_code=204, dependencies=[Depends(attempt_token)])
    async def ack(job_id: int, attempt: int) -> None:
        ctx.store.acknowledge(job_id, attempt, ctx.clock())

    @app.post(f"{protocol}/complete", status_code=204, dependencies=[Depends(attempt_token)])
    async def complete(job_id: int, attempt: int) -> None:
        ctx.store.report_completed(job_id, attempt, ctx.clock())

    return app


def parsed(field: str, parse: Callable[[str], T], text: str | None) -> T | None:
    """`parse(text)`, its error named after the field; None when the field was not given."""
    if not text:
        return None
    try:
        return parse(text)
    except ValueError as exc:
        raise InvalidInput(f"{field}: {exc}") from None


def bearer(authorization: str | None) -> str:
    if not authorization or not authorization.lower().startswith("bearer "):
        raise Unauthorized("send the token as 'Authorization: Bearer TOKEN'")
    return authorization[7:].strip()


def parse_state(text: str) -> JobState:
    try:
        return JobState(text.strip().lower())
    except ValueError:
        known = ", ".join(s.value for s in JobState)
        raise InvalidInput(f"state: unknown state {text!r} (known: {known})") from None


def placements(ctx: Context) -> dict[int, dict[str, list[int]]]:
    """The GPUs each job holds now, by node: one read for a whole listing."""
    held: dict[int, dict[str, list[int]]] = {}
    for p in sorted(ctx.store.held(), key=lambda p: (p.node, p.gpu)):
        held.setdefault(p.job_id, {}).setdefault(p.node, []).append(p.gpu)
    return held


def check_fits(nodes: list[Node], body: JobIn, team: str) -> None:
    """Refuse a job that no placement of this pool could ever hold."""
    if body.gpus_per_node is not None and body.gpus % body.gpus_per_node:
        raise InvalidInput(f"gpus_per_node: {body.gpus} GPUs do not split into members of {body.gpus_per_node}")
    probe = Job("new", team, body.priority, body.gpus, 0.0, body.gpus_per_node, body.gpu_type)
    if not any(can_ever_fit(s, nodes) for s in job_shapes(probe, FreeGpus(nodes, ()))):
        usable = [n for n in nodes if n.team in (None, team)]
        raise InvalidInput(f"gpus: {messages.never_fits(probe, usable)}")


def check_paths(body: JobIn, data_dir: Path) -> None:
    """Refuse a working directory that is not one, and log paths that could never be written
    or that lie in the scheduler's data directory (its store, tokens and other jobs' folders)."""
    workdir = Path(body.workdir)
    try:
        if not workdir.is_dir():
            raise InvalidInput(f"workdir: {body.workdir!r} is not a directory on this machine")
        if inside(workdir, data_dir):
            raise InvalidInput(f"workdir: {body.workdir!r} is in the scheduler's data directory")
    except OSError as exc:
        raise InvalidInput(f"workdir: {body.workdir!r}: {exc.strerror}") from None
    name = job_name(body.name, body.command)
    for field, template in (("output", body.output), ("error", body.error)):
        if template is None:
            continue
        if "\0" in template or not template.strip():
            raise InvalidInput(f"{field}: {template!r} is not a path")
        path = workdir / expand_log_path(template, 1, 0, name, 1, 0)
        try:
            if path.is_dir():
                raise InvalidInput(f"{field}: {template!r} is a folder; give a file name (with %j for the job)")
            if inside(path, data_dir):
                raise InvalidInput(f"{field}: {template!r} is in the scheduler's data directory")
        except OSError as exc:
            raise InvalidInput(f"{field}: {template!r}: {exc.strerror}") from None


def read_from(path: Path, offset: int) -> tuple[str, int]:
    """The text of `path` from byte `offset`, and the offset after it: bytes that are not UTF-8
    read as U+FFFD, and a character cut at the end waits for the next read."""
    try:
        with path.open("rb") as stream:
            stream.seek(offset)
            data = stream.read()
    except FileNotFoundError:
        return "", offset
    cut = len(data)
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the first byte of the last character
            needed = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
            if needed > back:
                cut = len(data) - back
            break
    return data[:cut].decode(errors="replace"), offset + cut
