"""How the service is: `/health` for a load balancer or a supervisor (no token), and `/metrics`
for Prometheus (any token but a job's, confirmed with the store at most once a minute, so that
a scrape still answers while the store does not)."""

# No `from __future__ import annotations`: FastAPI reads the dependencies from the signatures.
import time
from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import PlainTextResponse
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from gpupool.api.access import Principal
from gpupool.api.auth import Credentials, identify
from gpupool.api.context import Context, Ctx
from gpupool.api.errors import responses
from gpupool.api.models import HealthOut
from gpupool.errors import NotFound, StoreUnavailable
from gpupool.service.workspace import token_hash

EXPOSITION = "text/plain; version=0.0.4; charset=utf-8"
"""Prometheus' text format as every Prometheus server reads it (names are plain ASCII here)."""

health_router = APIRouter()
router = APIRouter()


@health_router.get("/health", response_model=HealthOut, responses={503: {"model": HealthOut}})
def health(ctx: Ctx) -> Any:
    """No token needed: 200 when the API and the store answer, 503 when the store does not
    or the scheduler has stopped deciding (its data directory or store is not the one it
    started with)."""
    try:
        if ctx.service.halted is not None:
            raise StoreUnavailable(f"the scheduler has stopped deciding: {ctx.service.halted}")
        ctx.store.classes()
    except Exception as exc:
        problem = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        return Response(
            HealthOut(status="unavailable", store=problem).model_dump_json(), 503, media_type="application/json"
        )
    return HealthOut(status="ok", store="ok")


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={200: {"content": {EXPOSITION: {}}}, **responses(401, 404, 503, plain=True)},
)
def metrics(ctx: Ctx, credentials: Credentials) -> Response:
    """The pool, the queue, teams, interruptions and the scheduler itself in Prometheus'
    exposition format, as of the last read of the store (at most a few seconds old). Any
    token but a job's; a token is checked against the store at most once a minute, so a
    scrape still answers while the store does not."""
    scraper(ctx, credentials.credentials if credentials is not None else None)
    if ctx.telemetry is None:
        raise NotFound("this service keeps no metrics")
    return Response(ctx.telemetry.exposition(), media_type=EXPOSITION)


def scraper(ctx: Context, token: str | None) -> Principal:
    digest = token_hash(token or "")
    now = time.monotonic()
    known = ctx.scrapers.get(digest)
    if known is not None and now - known[0] < 60:
        return known[1]
    try:
        who = identify(ctx, token)
    except (StoreUnavailable, DBAPIError, PoolTimeout):
        if known is not None and now - known[0] < 600:
            return known[1]
        raise
    ctx.scrapers[digest] = (now, who)
    return who
