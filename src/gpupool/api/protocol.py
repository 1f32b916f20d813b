"""The job protocol: what a running attempt reports, with its own token (`GPUPOOL_TOKEN`) and
only for itself (`/jobs/{job_id}/attempts/{attempt}/...`): heartbeats (answered with its notice,
if it has one), checkpoint commits, that it saw its notice (`ack`), and that its job is done
(`complete`), and where a notebook session's server answers (`server`). What these reports
carry is here too; the rest of the API's models are in
`models`."""

# No `from __future__ import annotations`: FastAPI reads the dependencies from the signatures.
from typing import Annotated, Any, Literal

from fastapi import APIRouter
from fastapi import Path as PathParam
from pydantic import BaseModel, Field, field_validator

from gpupool.api import limits
from gpupool.api.auth import Who
from gpupool.api.context import Ctx
from gpupool.api.errors import responses
from gpupool.api.jobs import JobId
from gpupool.api.models import PhaseName, Seconds, Step, _In, no_nul


class HeartbeatIn(_In):
    step: Step | None = None
    phase: Literal["startup", "restore", "train", "save"] | None = None
    restored_step: Step | None = Field(default=None, description="the checkpoint step this attempt resumed from")
    restore_seconds: float | None = Field(default=None, ge=0, description="how long the restore took")
    since_commit: float | None = Field(default=None, ge=0, description="seconds since its last checkpoint commit")
    restore_skipped: list[Annotated[str, Field(max_length=1000)]] = Field(
        default_factory=list, max_length=20, description="newer checkpoints it could not use, and why"
    )
    process_started_at: float | None = Field(default=None, ge=0, description="Unix time the job's process started")
    restart_phases: dict[PhaseName, Seconds] | None = Field(
        default=None, max_length=12, description="seconds of each phase of its start-up, in order, up to the first step"
    )
    first_step_seconds: Seconds | None = Field(default=None, description="how long its first step took")
    steady_step_seconds: Seconds | None = Field(default=None, description="how long the steps after it took, each")

    def restart(self) -> dict[str, Any]:
        """What it said of its start-up, as the store keeps it."""
        said = {
            "process_started_at": self.process_started_at,
            "phases": self.restart_phases,
            "first_step": self.first_step_seconds,
            "steady_step": self.steady_step_seconds,
        }
        return {key: value for key, value in said.items() if value is not None}


class NoticeOut(BaseModel):
    deadline: float
    seconds_left: float


class HeartbeatOut(BaseModel):
    notice: NoticeOut | None


class CheckpointIn(_In):
    step: Step | None = None
    path: str | None = Field(default=None, max_length=limits.PATH_MAX)
    seconds: float | None = Field(default=None, ge=0, description="how long the save blocked training")
    background_seconds: float | None = Field(
        default=None, ge=0, description="how long a background save was written after training went on"
    )

    @field_validator("path")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        return no_nul(value)


class ServerIn(_In):
    port: int = Field(ge=1024, le=65535, description="the port of its node the notebook server answers on")
    token: str = Field(min_length=16, max_length=200, pattern=r"^[A-Za-z0-9_.~-]+$")


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


@router.post(f"{PROTOCOL}/server", status_code=204, responses=WITH_BODY)
def server(job_id: JobId, attempt: AttemptNo, body: ServerIn, who: Who, ctx: Ctx) -> None:
    """A notebook session's server answers: the service's proxy reaches it on this port of the
    attempt's node, with this token (docs/sessions.md)."""
    ctx.store.serve(job_id, attempt, body.port, body.token)
