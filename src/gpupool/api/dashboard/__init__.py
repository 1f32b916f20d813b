"""The web dashboard: server-rendered pages (Jinja2) of the pool, the queue, the teams, the
interruptions and each job, under `/ui/`, with their CSS and one small script served by the
package itself (nothing is loaded from elsewhere).

Sign-in is with a token, as for the API: the page `/ui/signin` takes it and keeps it in a cookie
(HttpOnly, SameSite=Strict, for `/ui/` only); each page shows what that token may see
(`access`): a team's token the pool and its own team's jobs, the admin's everything. The API
itself never reads that cookie, so no other site can make a signed-in browser act through it.

Live parts poll their own page for the fragment that changes (`?fragment=1`) twice a second
and replace it when it differs; without JavaScript the page reloads itself every 5 s.
"""

# No `from __future__ import annotations`: FastAPI reads the parameters from the signatures.
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, quote

from fastapi import FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from gpupool.api import limits
from gpupool.api.access import Principal
from gpupool.api.dashboard import views
from gpupool.errors import GpupoolError, Unauthorized
from gpupool.units import human_seconds

HERE = Path(__file__).parent
COOKIE = "gpupool_token"
STATIC = "/ui/static"
templates = Jinja2Templates(directory=HERE / "templates")
templates.env.globals["human_seconds"] = human_seconds
STATUS = {"Unauthorized": 401, "Forbidden": 403, "NotFound": 404}
FRESH = 0.25
"""Seconds a rendered fragment is served again to the same token (half a poll)."""

Identify = Callable[[str | None], Principal]


def add_dashboard(app: FastAPI, ctx: Any, identify: Identify) -> None:
    app.mount(STATIC, StaticFiles(directory=HERE / "static"), name="dashboard-static")

    def principal(request: Request) -> Principal | None:
        try:
            return identify(request.cookies.get(COOKIE))
        except Unauthorized:
            return None

    def render(request: Request, name: str, who: Principal | None, status: int = 200, **data: Any) -> Response:
        fragment = request.query_params.get("fragment") == "1"
        template = f"_{name}.html" if fragment else f"{name}.html"
        query = "&".join(f"{k}={quote(v)}" for k, v in request.query_params.items() if k != "fragment")
        context = {"who": who, "page": name, "status": status, "query": query, **data}
        return templates.TemplateResponse(request, template, context, status_code=status)

    recent: dict[tuple[str, str, Principal], tuple[float, Response]] = {}
    drawn = threading.Lock()

    def page(request: Request, name: str, build: Callable[[Principal], dict[str, Any]]) -> Response:
        """A page for the signed-in token; to sign in first if there is none (a fragment: 401).
        A fragment is rendered at most once per `FRESH` seconds for each token's view of it:
        every open tab polls it, and a pool of 1,000 nodes takes a fifth of a second to draw."""
        who = principal(request)
        fragment = request.query_params.get("fragment") == "1"
        if who is None:
            if fragment:
                return PlainTextResponse("sign in again", status_code=401)
            return RedirectResponse(f"/ui/signin?next={quote(request.url.path)}", status_code=303)
        key = (request.url.path, request.url.query, who)
        now = time.monotonic()
        if fragment and key in recent and now - recent[key][0] < FRESH:
            return recent[key][1]
        try:
            answer = render(request, name, who, **build(who))
        except GpupoolError as exc:
            status = STATUS.get(type(exc).__name__, 409)
            answer = render(request, "error", who, status=status, message=str(exc))
        if fragment:
            with drawn:
                for stale in [k for k, (at, _) in list(recent.items()) if now - at >= FRESH]:
                    recent.pop(stale, None)
                recent[key] = (now, answer)
        return answer

    @app.get("/", include_in_schema=False)
    def home() -> Response:
        return RedirectResponse("/ui/pool", status_code=303)

    @app.get("/ui/signin", include_in_schema=False)
    def signin_page(request: Request) -> Response:
        return render(request, "signin", principal(request), next=safe_next(request.query_params.get("next")))

    @app.post("/ui/signin", include_in_schema=False)
    async def signin(request: Request) -> Response:
        if not same_origin(request):
            return PlainTextResponse("sign-in from another site refused", status_code=403)
        form = parse_qs((await request.body())[: limits.NAME_MAX * 4].decode(errors="replace"))
        token = (form.get("token") or [""])[0].strip()
        target = safe_next((form.get("next") or [""])[0])
        try:
            who = identify(token)
        except Unauthorized as exc:
            return render(request, "signin", None, status=401, next=target, message=str(exc))
        if who.attempt is not None:
            return render(request, "signin", None, status=401, next=target, message="a job's token cannot sign in")
        answer = RedirectResponse(target, status_code=303)
        answer.set_cookie(
            COOKIE, token, httponly=True, samesite="strict", path="/ui", secure=request.url.scheme == "https"
        )
        return answer

    @app.post("/ui/signout", include_in_schema=False)
    def signout(request: Request) -> Response:
        if not same_origin(request):
            return PlainTextResponse("sign-out from another site refused", status_code=403)
        answer = RedirectResponse("/ui/signin", status_code=303)
        answer.delete_cookie(COOKIE, path="/ui")
        return answer

    @app.get("/ui/pool", include_in_schema=False)
    def pool(
        request: Request,
        number: Annotated[int, Query(alias="page", ge=1, le=limits.INT32)] = 1,
        state: Annotated[Literal["idle", "allocated", "draining", "held", "down"] | None, Query()] = None,
    ) -> Response:
        return page(request, "pool", lambda who: views.pool(ctx, who, number, state))

    @app.get("/ui/queue", include_in_schema=False)
    def queue(
        request: Request,
        team: Annotated[str | None, Query(max_length=200)] = None,
        cls: Annotated[str | None, Query(alias="class", max_length=100)] = None,
    ) -> Response:
        return page(request, "queue", lambda who: views.queue(ctx, who, ctx.clock(), team or None, cls or None))

    @app.get("/ui/teams", include_in_schema=False)
    def teams(request: Request) -> Response:
        return page(request, "teams", lambda who: views.teams(ctx, ctx.clock()))

    @app.get("/ui/interruptions", include_in_schema=False)
    def interruptions(
        request: Request,
        days: Annotated[float, Query(gt=0, le=3650, allow_inf_nan=False, description="How far back.")] = 7.0,
    ) -> Response:
        now = ctx.clock()
        return page(request, "interruptions", lambda who: views.interruptions(ctx, who, now, now - days * 86400))

    @app.get("/ui/jobs/{job_id}", include_in_schema=False)
    def job(request: Request, job_id: Annotated[int, PathParam(ge=0, le=limits.INT32)]) -> Response:
        return page(request, "job", lambda who: views.job(ctx, who, job_id, ctx.clock()))


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a page of the dashboard, never another site."""
    if target and target.startswith("/ui/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/ui/pool"


def same_origin(request: Request) -> bool:
    """A form posted from this dashboard (or by a client that sends no Origin)."""
    origin = request.headers.get("origin")
    return origin is None or origin == f"{request.url.scheme}://{request.headers.get('host', '')}"


PAGE_ROUTES = {
    ("GET", "/"),
    ("GET", "/ui/signin"),
    ("POST", "/ui/signin"),
    ("POST", "/ui/signout"),
    ("GET", "/ui/pool"),
    ("GET", "/ui/queue"),
    ("GET", "/ui/teams"),
    ("GET", "/ui/interruptions"),
    ("GET", "/ui/jobs/{job_id}"),
}
"""The dashboard's routes: each checks the cookie's token itself (`page`), never the API's bearer."""
