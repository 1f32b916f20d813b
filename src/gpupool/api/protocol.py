"""The job protocol: what a running attempt reports, with its own token (`GPUPOOL_TOKEN`) and
only for itself (`/jobs/{job_id}/attempts/{attempt}/...`): heartbeats (answered with its notice,
if it has one), checkpoint commits, that it saw its notice (`ack`), and that its job is done
(`complete`)."""

# No `from __future__ import annotations`: FastAPI reads the dependencies from the signatures.
from typing import Annotated

from fastapi import APIRouter
from fastapi import Path as PathParam

from gpupool.api import limits
from gpupool.api.auth import Who
from gpupool.api.context import Ctx
from gpupool.api.errors import responses
from gpupool.api.jobs import JobId
from gpupool.api.models import CheckpointIn, HeartbeatIn, HeartbeatOut, NoticeOut

AttemptNo = Annotated[int, PathParam(ge=0, le=limits.INT32, description="The attempt's number, from 0.")]
PROTOCOL = "/jobs/{job_id}/attempts/{attempt}"
WITH_BODY = responses(400, 401, 403, 404, 409, 413, 422, 503)
WITHOUT_BODY = responses(401, 403, 404, 409, 422, 503)

router = APIRouter()


@router.post(f"{PROTOCOL}/heartbeat", response_model=HeartbeatOut, responses=WITH_BODY)
def heartbeat(job_id: JobId, attempt: AttemptNo, body: HeartbeatIn, who: Who, ctx: Ctx) -> HeartbeatOut:
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


@router.post(f"{PROTOCOL}/checkpoint", status_code=204, responses=WITH_BODY)
def checkpoint(job_id: JobId, attempt: AttemptNo, body: CheckpointIn, who: Who, ctx: Ctx) -> None:
    ctx.store.commit_checkpoint(
        job_id, attempt, ctx.clock(), body.step, body.path, body.seconds, body.background_seconds
    )


@router.post(f"{PROTOCOL}/ack", status_code=204, responses=WITHOUT_BODY)
def ack(job_id: JobId, attempt: AttemptNo, who: Who, ctx: Ctx) -> None:
    ctx.store.acknowledge(job_id, attempt, ctx.clock())


@router.post(f"{PROTOCOL}/complete", status_code=204, responses=WITHOUT_BODY)
def complete(job_id: JobId, attempt: AttemptNo, who: Who, ctx: Ctx) -> None:
    ctx.store.report_completed(job_id, attempt, ctx.clock())
