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

One router per part, each a module: `jobs` (submit, list, show, cancel, logs, events, the
report), `protocol` (what a running attempt reports), `pool` (nodes, teams, users, classes),
`history`, `metrics` (`/health` and `/metrics`), `sessions` (a shell's terminal, a WebSocket),
the `dashboard`'s pages and `notebooks` (a notebook session's server, proxied behind them). Their routes take
the app's `context.Context` (the store, and the running service through its narrow interface
`gpupool.service.interface.Service`, never the control loop) and `auth.Who`, the principal.
`create_app` only puts them together.
"""

from fastapi import FastAPI
from fastapi.routing import APIWebSocketRoute
from fastapi_offline import FastAPIOffline

from gpupool.api import access, changes, dashboard, history, jobs, limits, metrics, notebooks, pool, protocol, sessions
from gpupool.api.access import Principal
from gpupool.api.context import Context
from gpupool.api.errors import install
from gpupool.api.metering import RequestMetrics, every_route

__all__ = ["Context", "Principal", "create_app"]

DOCS_ASSETS = "/docs-assets"
"""Where Swagger UI's and ReDoc's files are served from (bundled with fastapi-offline)."""

DESCRIPTION = f"""One shared GPU pool, priority as a job attribute.

Who may see and do what: docs/access.md. Every error is `{{"error": kind, "message": text}}`.

**Limits**: a request body at most {limits.BODY_BYTES // (1024 * 1024)} MiB; a job's command
{limits.COMMAND_BYTES:,} bytes in all (at most {limits.ARGUMENTS:,} arguments, {limits.ARG_BYTES:,}
bytes each), its variables {limits.ENV_BYTES:,} bytes in all ({limits.VARIABLES:,}, {limits.ARG_BYTES:,}
bytes each `NAME=value`), its script {limits.SCRIPT_CHARS:,} characters; names in paths
{limits.NAME_MAX} bytes, whole paths {limits.PATH_MAX}; ids, attempts and steps 0 to 2^31-1; a log
answer at most {limits.LOG_BYTES // (1024 * 1024)} MiB (follow `X-Next-Offset`).
"""

ROUTERS = (
    metrics.health_router,
    jobs.router,
    changes.router,
    pool.router,
    history.router,
    metrics.router,
    protocol.router,
    sessions.router,
)
"""The API's parts, in the order of the OpenAPI document; the dashboard's pages come last."""


def create_app(ctx: Context) -> FastAPI:
    """The API over `ctx`: its error handlers and request metrics, then its routers; every
    route must have a rule in `access.ROUTES` (or be a page of the dashboard's)."""
    # The documentation pages load Swagger UI and ReDoc from the package, not from a CDN.
    app = FastAPIOffline(
        title="gpupool",
        summary="One shared GPU pool, priority as a job attribute.",
        description=DESCRIPTION,
        static_url=DOCS_ASSETS,
    )
    app.state.context = ctx
    install(app)
    if ctx.telemetry is not None:
        app.add_middleware(RequestMetrics, telemetry=ctx.telemetry, routes=app.router.routes)
    for router in ROUTERS:
        app.include_router(router)
    app.mount(dashboard.STATIC, dashboard.static_files(), name="dashboard-static")
    app.include_router(dashboard.router)
    app.include_router(notebooks.router)
    access.check_routes(
        (
            (method, getattr(route, "path", ""))
            for route in every_route(app.routes)
            for method in getattr(route, "methods", None) or (("WS",) if isinstance(route, APIWebSocketRoute) else ())
        ),
        pages=dashboard.PAGE_ROUTES | notebooks.PAGE_ROUTES,
    )
    return app
