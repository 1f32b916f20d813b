"""Sessions through the API: a shell's terminal over a WebSocket (`/jobs/{job_id}/terminal`),
which `gpupool shell` and `gpupool attach` speak, and which works wherever the job runs (on a
Ray node, its launcher actor relays it: no SSH between machines).

The protocol, for any client:

- Authenticate as every route does (`Authorization: Bearer TOKEN`). Who may attach: the
  admin, and the job's own user (a team's token, for a session that team's token started):
  a terminal types as its user, so a teammate's token is not enough (`access.Rule.SESSION`).
- Client → service: binary messages are keystrokes; a text message `{"resize": [ROWS, COLS]}`
  sets the window size (send one at once, and on each change).
- Service → client: binary messages are what the terminal shows (first, the last 64 KiB it
  showed, so that an attach sees where it was); a text message `{"exit_code": N}` when the
  shell ended (the job ends once its processes are gone), or `{"error": KIND, "message":
  TEXT}` before the service closes the connection with code 4000 + the HTTP status the error
  stands for (4403, 4404, 4409...).

Closing the connection detaches: the session runs on, for `sessions.detach_grace`.
"""

# No `from __future__ import annotations`: FastAPI reads the parameters from the signatures.
import contextlib
import json
import time
from typing import Any

import anyio
from anyio.to_thread import run_sync
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from starlette.websockets import WebSocketState

from gpupool.api import access
from gpupool.api.access import Rule
from gpupool.api.auth import identify
from gpupool.api.context import Context
from gpupool.api.errors import status_of
from gpupool.errors import Conflict, GpupoolError, InvalidInput
from gpupool.service.interface import Terminal
from gpupool.store.schema import JobRow

router = APIRouter()

RECEIVE_WAIT = 0.5
"""Seconds one read of the terminal waits before it looks again whether the client is gone."""
TERMINAL_THREADS = 64
"""Threads the terminals' relays may hold at once, apart from those of the API's other routes
(each attached terminal holds one while it waits for output)."""
_limiter: list[anyio.CapacityLimiter] = []


def relaying() -> anyio.CapacityLimiter:
    if not _limiter:
        _limiter.append(anyio.CapacityLimiter(TERMINAL_THREADS))
    return _limiter[0]


def bearer(websocket: WebSocket) -> str | None:
    scheme, _, token = websocket.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def admitted(ctx: Context, job_id: int, token: str | None) -> JobRow:
    """The session `token` may attach to, or the error that says why not."""
    who = identify(ctx, token)
    job = ctx.store.job(job_id)
    access.enforce(who, Rule.SESSION, job)
    return job


@router.websocket("/jobs/{job_id}/terminal")
async def terminal(websocket: WebSocket, job_id: int) -> None:
    """A shell session's terminal (see the module's description)."""
    ctx: Context = websocket.app.state.context
    await websocket.accept()
    try:
        job = await run_sync(admitted, ctx, job_id, bearer(websocket))
        link = await run_sync(ctx.service.sessions.open_terminal, job)
    except GpupoolError as exc:
        await refuse(websocket, exc)
        return
    try:
        await run_sync(link.screen)
    except OSError as exc:
        await run_sync(link.close)
        await refuse(websocket, Conflict(f"job {job.label}'s terminal is gone ({exc})"))
        return
    ctx.service.sessions.attach(link.key, ctx.clock(), 1)
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(keystrokes, websocket, link, ctx, group.cancel_scope)
            await screen(websocket, link)
            group.cancel_scope.cancel()
    finally:
        ctx.service.sessions.attach(link.key, ctx.clock(), -1)
        await run_sync(link.close)
        if websocket.client_state is WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await websocket.close()


async def refuse(websocket: WebSocket, error: GpupoolError) -> None:
    status = status_of(error)
    await websocket.send_text(json.dumps({"error": type(error).__name__, "message": str(error)}))
    await websocket.close(code=4000 + status)


async def keystrokes(websocket: WebSocket, link: Terminal, ctx: Context, scope: Any) -> None:
    """What the client sends, to the terminal, until it leaves."""
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            if message.get("bytes"):
                ctx.service.sessions.active(link.key, ctx.clock())
                await run_sync(link.keys, message["bytes"], limiter=relaying())
            elif message.get("text"):
                rows, cols = resize_of(message["text"])
                await run_sync(link.resize, rows, cols)
    except (WebSocketDisconnect, OSError, InvalidInput):
        pass
    scope.cancel()


def resize_of(text: str) -> tuple[int, int]:
    try:
        rows, cols = json.loads(text)["resize"]
        if isinstance(rows, int) and isinstance(cols, int) and 0 < rows <= 1000 and 0 < cols <= 1000:
            return rows, cols
    except (ValueError, KeyError, TypeError):
        pass
    raise InvalidInput('a text message is {"resize": [ROWS, COLS]}, each from 1 to 1000')


async def screen(websocket: WebSocket, link: Terminal) -> None:
    """What the terminal shows, to the client, until the shell ends or the client leaves."""
    while True:
        found = await run_sync(link.output, RECEIVE_WAIT, abandon_on_cancel=True, limiter=relaying())
        if found is None:
            return
        shown, exit_code = found
        try:
            if shown:
                await websocket.send_bytes(shown)
            if exit_code is not None:
                await websocket.send_text(json.dumps({"exit_code": exit_code, "at": time.time()}))
                return
        except (WebSocketDisconnect, RuntimeError, OSError):  # the client left
            return
