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
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from gpupool.api import limits
from gpupool.api.access import Principal
from gpupool.api.auth import identify
from gpupool.api.context import Context, Ctx
from gpupool.api.dashboard import views
from gpupool.errors import GpupoolError, InvalidInput, Unauthorized
from gpupool.units import human_seconds

HERE = Path(__file__).parent
COOKIE = "gpupool_token"
STATIC = "/ui/static"
templates = Jinja2Templates(directory=HERE / "templates")
templates.env.globals["human_seconds"] = human_seconds
STATUS = {"InvalidInput": 400, "Unauthorized": 401, "Forbidden": 403, "NotFound": 404, "StoreUnavailable": 503}
FRESH = 0.25
"""Seconds a rendered fragment is served again to the same token (half a poll)."""

router = APIRouter()


def static_files() -> StaticFiles:
    """The pages' CSS and script, mounted at `STATIC` (a router cannot hold a mount)."""
    return StaticFiles(directory=HERE / "static")


def principal(ctx: Context, request: Request) -> Principal | None:
    try:
        return identify(ctx, request.cookies.get(COOKIE))
    except Unauthorized:
        return None


def render(request: Request, name: str, who: Principal | None, status: int = 200, **data: Any) -> Response:
    fragment = request.query_params.get("fragment") == "1"
    template = f"_{name}.html" if fragment else f"{name}.html"
    query = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "fragment"])
    context = {"who": who, "page": name, "status": status, "query": query, **data}
    return templates.TemplateResponse(request, template, context, status_code=status)


def page(ctx: Context, request: Request, name: str, build: Callable[[Principal], dict[str, Any]]) -> Response:
    """A page for the signed-in token; to sign in first if there is none (a fragment: 401).
    Whatever goes wrong is a page that says so, never JSON. A fragment is drawn at most
    once per `FRESH` seconds for each token's view of it: every open tab polls it, and a
    pool of 1,000 nodes takes a fifth of a second to draw."""
    fragment = request.query_params.get("fragment") == "1"
    who: Principal | None = None
    try:
        who = principal(ctx, request)
        if who is None:
            if fragment:
                return PlainTextResponse("sign in again", status_code=401)
            here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/ui/signin?next={quote(here, safe='/')}", status_code=303)
        key = (request.url.path, request.url.query, who)
        now = time.monotonic()
        with ctx.drawing:
            cached = ctx.drawn.get(key)
        if fragment and cached is not None and now - cached[0] < FRESH:
            return cached[1]
        answer = render(request, name, who, **build(who))
    except (GpupoolError, DBAPIError, PoolTimeout) as exc:
        status, message = problem(exc)
        return render(request, "error", who, status=status, message=message)
    if fragment:
        with ctx.drawing:
            for stale in [k for k, (at, _) in list(ctx.drawn.items()) if now - at >= FRESH]:
                ctx.drawn.pop(stale, None)
            ctx.drawn[key] = (now, answer)
    return answer


@router.get("/", include_in_schema=False)
def home() -> Response:
    return RedirectResponse("/ui/pool", status_code=303)


@router.get("/ui/signin", include_in_schema=False)
def signin_page(request: Request) -> Response:
    return render(request, "signin", None, next=safe_next(request.query_params.get("next")))


@router.post("/ui/signin", include_in_schema=False)
async def signin(request: Request, ctx: Ctx) -> Response:
    if not same_origin(request):
        return PlainTextResponse("sign-in from another site refused", status_code=403)
    form = parse_qs((await request.body())[: limits.NAME_MAX * 4].decode(errors="replace"))
    token = (form.get("token") or [""])[0].strip()
    target = safe_next((form.get("next") or [""])[0])
    try:
        who = await run_in_threadpool(identify, ctx, token)
    except Unauthorized as exc:
        return render(request, "signin", None, status=401, next=target, message=str(exc))
    except (GpupoolError, DBAPIError, PoolTimeout) as exc:
        status, message = problem(exc)
        return render(request, "signin", None, status=status, next=target, message=message)
    if who.attempt is not None:
        return render(request, "signin", None, status=401, next=target, message="a job's token cannot sign in")
    answer = RedirectResponse(target, status_code=303)
    answer.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/ui", secure=request.url.scheme == "https")
    return answer


@router.post("/ui/signout", include_in_schema=False)
def signout(request: Request) -> Response:
    if not same_origin(request):
        return PlainTextResponse("sign-out from another site refused", status_code=403)
    answer = RedirectResponse("/ui/signin", status_code=303)
    answer.delete_cookie(COOKIE, path="/ui")
    return answer


# The pages read their parameters themselves: a bad one is a page that says so (400).


@router.get("/ui/pool", include_in_schema=False)
def pool(request: Request, ctx: Ctx) -> Response:
    def build(who: Principal) -> dict[str, Any]:
        state = choice(request, "state", views.GPU_STATES)
        return views.pool(ctx, who, number(request, "page", 1, 1, limits.INT32), state)

    return page(ctx, request, "pool", build)


@router.get("/ui/queue", include_in_schema=False)
def queue(request: Request, ctx: Ctx) -> Response:
    def build(who: Principal) -> dict[str, Any]:
        team, cls = text(request, "team"), text(request, "class")
        return views.queue(ctx, who, ctx.clock(), team, cls)

    return page(ctx, request, "queue", build)


@router.get("/ui/teams", include_in_schema=False)
def teams(request: Request, ctx: Ctx) -> Response:
    return page(ctx, request, "teams", lambda who: views.teams(ctx, ctx.clock()))


@router.get("/ui/interruptions", include_in_schema=False)
def interruptions(request: Request, ctx: Ctx) -> Response:
    def build(who: Principal) -> dict[str, Any]:
        days = number(request, "days", 7, 1, 3650)
        now = ctx.clock()
        return views.interruptions(ctx, who, now, now - days * 86400)

    return page(ctx, request, "interruptions", build)


@router.get("/ui/jobs/{job_id}", include_in_schema=False)
def job(request: Request, ctx: Ctx, job_id: str) -> Response:
    def build(who: Principal) -> dict[str, Any]:
        return views.job(ctx, who, whole("job", job_id, 0, limits.INT32), ctx.clock())

    return page(ctx, request, "job", build)


def problem(exc: Exception) -> tuple[int, str]:
    """The status and the words of what went wrong, as the API would say them."""
    if isinstance(exc, GpupoolError):
        return STATUS.get(type(exc).__name__, 409), str(exc)
    return 503, "the store does not answer now; this page tries again"


def whole(name: str, raw: str, least: int, most: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput(f"{name}: {raw[:50]!r} is not a whole number") from None
    if not least <= value <= most:
        raise InvalidInput(f"{name}: {value} is not between {least} and {most}")
    return value


def number(request: Request, name: str, default: int, least: int, most: int) -> int:
    raw = request.query_params.get(name)
    return default if raw is None or raw == "" else whole(name, raw, least, most)


def choice(request: Request, name: str, allowed: Sequence[str]) -> str | None:
    raw = request.query_params.get(name) or None
    if raw is not None and raw not in allowed:
        raise InvalidInput(f"{name}: {raw[:50]!r} is none of {', '.join(allowed)}")
    return raw


def text(request: Request, name: str, most: int = 200) -> str | None:
    raw = request.query_params.get(name) or None
    if raw is not None and len(raw) > most:
        raise InvalidInput(f"{name}: at most {most} characters")
    return raw


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
