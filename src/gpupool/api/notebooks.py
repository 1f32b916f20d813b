"""Notebook sessions through the service: `/ui/notebooks/{job_id}/...` is the session's Jupyter
server, proxied (HTTP and WebSocket) from wherever it runs, behind the dashboard's sign-in.

- Who may open it: the session's own user, and the admin (`access.Rule.SESSION`), signed in on
  the dashboard (its cookie is for `/ui/`); a bearer token works as well, for scripts.
- The browser never learns the server's token, nor the server the user's: the proxy removes
  gpupool's cookie and sends the server's token instead (`Authorization: token ...`), which
  also exempts the request from Jupyter's XSRF check: so the proxy itself refuses a request
  that changes anything, or a WebSocket, from another site (`Origin`).
- It reaches the server at the address of the node it runs on and the port the job reported
  (`service.interface.Service.notebook`), under the same path: a job cannot make the proxy
  reach anything but a path of its own session on its own node.
- Each page of the server (HTML) gets gpupool's banner, which says when the session is idle
  and will be reclaimed (`/ui/notebooks/{job_id}/_gpupool/status`).
"""

# No `from __future__ import annotations`: FastAPI reads the parameters from the signatures.
import contextlib
import logging
from typing import Any
from urllib.parse import quote

import anyio
import httpx
from anyio.to_thread import run_sync
from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.websockets import WebSocketDisconnect, WebSocketState
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from gpupool.api import access
from gpupool.api.access import Rule
from gpupool.api.auth import identify
from gpupool.api.context import Context
from gpupool.api.dashboard import COOKIE, STATIC, STATUS
from gpupool.errors import Forbidden, GpupoolError, Unauthorized
from gpupool.job.notebook import BASE as NOTEBOOK_BASE
from gpupool.store.schema import JobRow

router = APIRouter()

BASE = NOTEBOOK_BASE.format(job="{job_id}").rstrip("/")
"""Where a notebook session is served: the base URL its server is started with."""
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
        "authorization",
        "cookie",
        "origin",
        "referer",
    }
)
"""Request headers not passed on (the connection's own, gpupool's credentials, and where the
browser came from: the proxy checks that itself, and the server sees requests of its token's)."""
ANSWER_DROPPED = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"})
SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
log = logging.getLogger("gpupool.api")
UPSTREAM_TIMEOUT = httpx.Timeout(30.0, read=300.0)
BANNER = '<script src="{static}/session.js" data-status="{base}/_gpupool/status"></script>'


def token_of(connection: Request | WebSocket) -> tuple[str | None, bool]:
    """The dashboard's cookie, else a bearer token; and whether it came from the cookie."""
    scheme, _, bearer = connection.headers.get("authorization", "").partition(" ")
    cookie = connection.cookies.get(COOKIE)
    return (cookie, True) if cookie else ((bearer.strip() if scheme.lower() == "bearer" else None), False)


def admitted(ctx: Context, job_id: int, credentials: tuple[str | None, bool]) -> tuple[JobRow, tuple[str, str]]:
    """The notebook session the token may open, and where its server is; or the error that
    says why not. A notebook's pages are its user's code, run in the browser with the same
    origin as the dashboard: a browser signed in as the admin opens none (the admin's token,
    as a bearer from a script, still does)."""
    token, from_cookie = credentials
    who = identify(ctx, token)
    job = ctx.store.job(job_id)
    access.enforce(who, Rule.SESSION, job)
    if who.admin and from_cookie and job.session == "notebook":
        raise Forbidden(
            "a browser signed in with the admin token opens no notebook: its page runs its user's code "
            "with your sign-in; sign in with the user's own token"
        )
    return job, ctx.service.sessions.notebook(job)


def allowed(header: str, value: str, base: str) -> bool:
    """Whether an answer's header may reach the browser: a cookie only for the session's own
    path, and never gpupool's (a server could otherwise sign the browser in as someone else)."""
    if header.lower() != "set-cookie":
        return True
    name = value.split("=", 1)[0].strip()
    path = next(
        (part.split("=", 1)[1].strip() for part in value.split(";")[1:] if part.strip().lower().startswith("path=")),
        "",
    )
    return name != COOKIE and (path + "/").startswith(base + "/")


def same_origin(connection: Request | WebSocket) -> bool:
    origin = connection.headers.get("origin")
    scheme = "https" if connection.url.scheme in ("https", "wss") else "http"
    return origin is None or origin == f"{scheme}://{connection.headers.get('host', '')}"


def cookies_for_the_server(connection: Request | WebSocket) -> str:
    """The browser's cookies but gpupool's: the server's own (its XSRF cookie) go on."""
    return "; ".join(f"{name}={value}" for name, value in connection.cookies.items() if name != COOKIE)


def refused(error: GpupoolError, request: Request) -> Response:
    if isinstance(error, Unauthorized) and request.method in SAFE:
        return RedirectResponse(f"/ui/signin?next={quote(request.url.path, safe='/')}", status_code=303)
    return PlainTextResponse(str(error), status_code=STATUS.get(type(error).__name__, 409))


@router.get(BASE + "/_gpupool/status", include_in_schema=False)
async def status(request: Request, job_id: int) -> Response:
    """Whether the session's server answers, and what it was warned of (the banner reads it)."""
    ctx: Context = request.app.state.context
    try:
        await run_sync(admitted, ctx, job_id, token_of(request))
    except GpupoolError as exc:
        return JSONResponse({"ready": False, "message": str(exc)}, status_code=STATUS.get(type(exc).__name__, 409))
    return JSONResponse({"ready": True, "warning": ctx.service.sessions.warning(job_id)})


@router.api_route(BASE + "/{path:path}", methods=list(METHODS), include_in_schema=False)
async def proxy(request: Request, job_id: int, path: str) -> Response:
    """A request of the notebook's page, passed on to its server."""
    ctx: Context = request.app.state.context
    if request.method not in SAFE and not same_origin(request):
        return PlainTextResponse("a request from another site is refused", status_code=403)
    try:
        _job, (upstream, token) = await run_sync(admitted, ctx, job_id, token_of(request))
    except GpupoolError as exc:
        return refused(exc, request)
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    headers["Authorization"] = f"token {token}"
    if cookies := cookies_for_the_server(request):
        headers["Cookie"] = cookies
    path_as_sent = request.scope.get("raw_path", request.url.path.encode()).decode("latin-1")
    url = upstream + path_as_sent + (f"?{request.url.query}" if request.url.query else "")
    client = httpx.AsyncClient(timeout=UPSTREAM_TIMEOUT, trust_env=False)
    try:
        sent = client.build_request(request.method, url, headers=headers, content=request.stream())
        answer = await client.send(sent, stream=True)
    except httpx.HTTPError as exc:
        await client.aclose()
        log.warning("job %d's notebook server does not answer %s %r: %r", job_id, request.method, path, exc)
        return PlainTextResponse(f"job {job_id}'s notebook server does not answer ({exc})", status_code=502)
    base = BASE.format(job_id=job_id)
    kept = [(k, v) for k, v in answer.headers.multi_items() if k.lower() not in ANSWER_DROPPED and allowed(k, v, base)]
    if answer.headers.get("content-type", "").startswith("text/html"):
        page = (await answer.aread()).decode(errors="replace")
        await answer.aclose()
        await client.aclose()
        banner = BANNER.format(static=STATIC, base=base)
        page = page.replace("</body>", banner + "</body>", 1) if "</body>" in page else page
        shown = Response(page.encode(), status_code=answer.status_code)
        for key, value in kept:
            shown.headers.append(key, value)
        return shown

    async def close() -> None:
        await answer.aclose()
        await client.aclose()

    response = StreamingResponse(answer.aiter_bytes(), status_code=answer.status_code, background=BackgroundTask(close))
    for key, value in kept:
        response.headers.append(key, value)
    return response


@router.websocket(BASE + "/{path:path}")
async def proxy_socket(websocket: WebSocket, job_id: int, path: str) -> None:
    """A WebSocket of the notebook's page (a kernel's, a terminal's), passed on to its server."""
    ctx: Context = websocket.app.state.context
    if not same_origin(websocket):
        await websocket.close(code=4403)
        return
    try:
        _job, (upstream, token) = await run_sync(admitted, ctx, job_id, token_of(websocket))
    except GpupoolError:
        await websocket.close(code=4403)
        return
    url = (
        "ws"
        + upstream.removeprefix("http")
        + websocket.scope.get("raw_path", websocket.url.path.encode()).decode("latin-1")
    )
    if websocket.url.query:
        url += f"?{websocket.url.query}"
    headers = {"Authorization": f"token {token}"}
    if cookies := cookies_for_the_server(websocket):
        headers["Cookie"] = cookies
    offered: list[Any] = list(websocket.scope.get("subprotocols") or [])
    try:
        async with connect(
            url, additional_headers=headers, subprotocols=offered or None, max_size=None, compression=None, proxy=None
        ) as server:
            await websocket.accept(subprotocol=server.subprotocol)
            async with anyio.create_task_group() as group:
                group.start_soon(to_server, websocket, server, group.cancel_scope)
                await to_browser(websocket, server)
                group.cancel_scope.cancel()
    except (OSError, InvalidHandshake, ConnectionClosed):
        pass
    finally:
        if websocket.client_state is WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await websocket.close()


async def to_server(websocket: WebSocket, server: Any, scope: Any) -> None:
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            await server.send(message["bytes"] if message.get("bytes") is not None else message.get("text", ""))
    except (WebSocketDisconnect, ConnectionClosed, RuntimeError):
        pass
    scope.cancel()


async def to_browser(websocket: WebSocket, server: Any) -> None:
    try:
        async for message in server:
            if isinstance(message, bytes):
                await websocket.send_bytes(message)
            else:
                await websocket.send_text(message)
    except (WebSocketDisconnect, ConnectionClosed, RuntimeError):
        pass


PAGE_ROUTES = {
    ("GET", BASE + "/_gpupool/status"),
    ("WS", BASE + "/{path:path}"),
    *((method, BASE + "/{path:path}") for method in METHODS),
}
"""The routes here: each checks its token itself, as the dashboard's pages do."""
