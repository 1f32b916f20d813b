"""`GET /history`: the ended jobs as a trace the simulator replays (`gpupool.history`), for
`gpupool export`. The admin's token gets every team's; a team's or user's token its own team's."""

# No `from __future__ import annotations`: FastAPI reads the dependencies from the signatures.
import io
from typing import Annotated

from fastapi import APIRouter, Query, Response

from gpupool.api import access
from gpupool.api.auth import Who
from gpupool.api.context import Ctx
from gpupool.api.errors import responses
from gpupool.history import history_job, write_history

router = APIRouter()


@router.get(
    "/history",
    response_class=Response,
    responses={200: {"content": {"text/csv": {}}, "description": "One row per job."}, **responses(401, 422, 503)},
)
def history(
    who: Who,
    ctx: Ctx,
    since: Annotated[
        float | None, Query(allow_inf_nan=False, description="Unix time: jobs submitted since; all when omitted.")
    ] = None,
) -> Response:
    """The ended jobs submitted since `since`, as CSV in the normalised trace format with
    each job's class, team, GPU type, gang shape, observed save and restart costs, wait,
    preemptions and lost nodes (`gpupool simulate --trace` replays it)."""
    ended = ctx.store.ended_jobs(since=since, team=access.own_team(who))
    out = io.StringIO()
    write_history((history_job(job, attempts) for job, attempts in ended), out)
    return Response(out.getvalue(), media_type="text/csv")
