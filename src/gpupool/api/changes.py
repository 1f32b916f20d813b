"""What people change of a job after submitting it, as scontrol does: hold and release a
pending job, update its time limit, class or dependencies, requeue a running one (`Store`'s
`ChangesStore` says the rules; `access` says who may call each route)."""

# No `from __future__ import annotations`: FastAPI reads the dependencies from the signatures.
from fastapi import APIRouter

from gpupool.api.auth import Who
from gpupool.api.context import Ctx
from gpupool.api.errors import responses
from gpupool.api.jobs import JobId
from gpupool.api.models import JobOut, JobUpdateIn
from gpupool.api.submission import parsed
from gpupool.slurm import parse_after
from gpupool.store import JobUpdate

ACTS = responses(400, 401, 403, 404, 409, 422, 503)

router = APIRouter()


@router.post("/jobs/{job_id}/hold", response_model=JobOut, responses=ACTS)
def hold(job_id: JobId, who: Who, ctx: Ctx) -> JobOut:
    """Hold a waiting job: it stays in line but is not started until released. The admin's
    hold is released by the admin only."""
    job = ctx.store.hold_job(job_id, ctx.clock(), by_admin=who.admin)
    ctx.service.wake()
    return JobOut.of(job)


@router.post("/jobs/{job_id}/release", response_model=JobOut, responses=ACTS)
def release(job_id: JobId, who: Who, ctx: Ctx) -> JobOut:
    """Release a held job: it waits in line again, in its place."""
    job = ctx.store.release_hold(job_id, ctx.clock(), by_admin=who.admin)
    ctx.service.wake()
    return JobOut.of(job)


@router.patch("/jobs/{job_id}", response_model=JobOut, responses=ACTS)
def update(job_id: JobId, body: JobUpdateIn, who: Who, ctx: Ctx) -> JobOut:
    """Change a job's time limit (a team's or user's token only lowers it), or, while it waits,
    its class or its dependencies."""
    dependencies = None
    if body.after is not None:
        dependencies = (parsed("after", parse_after, body.after) or []) if body.after.strip() else []
    change = JobUpdate(body.time_limit, body.priority, dependencies)
    job = ctx.store.update_job(job_id, change, ctx.clock(), by_admin=who.admin)
    ctx.service.wake()
    return JobOut.of(job)


@router.post("/jobs/{job_id}/requeue", response_model=JobOut, responses=ACTS)
def requeue(job_id: JobId, who: Who, ctx: Ctx) -> JobOut:
    """Requeue a running job: it gets notice with its class's grace, as a preemption for no
    job, saves, leaves and waits in line again."""
    job = ctx.store.requeue_job(job_id, ctx.clock())
    ctx.service.wake()
    return JobOut.of(job)
