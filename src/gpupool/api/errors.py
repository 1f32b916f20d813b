"""Every error the API answers is JSON `{"error": kind, "message": what was wrong}` (`ErrorOut`):
domain errors by the one table of `gpupool.errors`, the store's by what went wrong with it (a
busy store is a 503 with Retry-After), a body over the limit a 413, anything unexpected a 500
that points to the service log. `responses` declares them in the OpenAPI document."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpupool.api import limits
from gpupool.api.models import ErrorOut
from gpupool.errors import HTTP_STATUS, GpupoolError

log = logging.getLogger("gpupool.api")

RETRY_AFTER = 2
"""Seconds a client waits before it tries a busy store again."""

DESCRIPTIONS = {
    400: "The request is wrong: the message says what and where.",
    401: "No token, or one nobody has.",
    403: "The token may not do this (docs/access.md).",
    404: "No such job, team, user or class.",
    409: "The request is valid but the state forbids it now.",
    413: f"The body is over {limits.BODY_BYTES // (1024 * 1024)} MiB.",
    422: "A field is missing, of the wrong type or out of its bounds.",
    503: "The store is busy (try again after Retry-After seconds) or cannot be written.",
}

KINDS = {400: "InvalidInput", 404: "NotFound", 405: "MethodNotAllowed", 413: "TooLarge", 503: "Unavailable"}
"""Error kinds of HTTP errors raised by the framework itself."""


def responses(*statuses: int, plain: bool = False) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a route that may answer with these error statuses (`plain`:
    a route whose own answers are text, where FastAPI would file its errors under text too)."""
    declared: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        declared[status] = {"model": ErrorOut, "description": DESCRIPTIONS[status]}
        if plain:
            schema = {"$ref": f"#/components/schemas/{ErrorOut.__name__}"}
            declared[status] = {
                "description": DESCRIPTIONS[status],
                "content": {"application/json": {"schema": schema}},
            }
        if status == 503:
            declared[status]["headers"] = {
                "Retry-After": {"description": "Seconds to wait when the store is busy.", "schema": {"type": "integer"}}
            }
    return declared


def error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": kind, "message": message}, status_code=status, headers=headers)


def status_of(exc: GpupoolError) -> int:
    for kind in type(exc).__mro__:
        if kind in HTTP_STATUS:
            return HTTP_STATUS[kind]
    return 400


BUSY_SQLSTATES = frozenset({"55P03", "40001", "40P01", "57014"})
"""PostgreSQL: lock not available, serialization failure, deadlock, statement timeout."""


def is_busy(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", None)
    if getattr(orig, "sqlstate", None) in BUSY_SQLSTATES:
        return True
    text = str(orig if orig is not None else exc).lower()
    return "database is locked" in text or "database table is locked" in text or "busy" in text


def first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    return (str(orig if orig is not None else exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def store_problem(exc: DBAPIError | PoolTimeout) -> JSONResponse:
    """A store error as an answer: the request's fault (400, 409) or the store's (503)."""
    if isinstance(exc, DataError):
        # PostgreSQL refuses a value its column cannot hold (SQLite takes any).
        return error(400, "InvalidInput", f"a value is out of range for the store ({first_line(exc)})")
    if isinstance(exc, IntegrityError):
        return error(409, "Conflict", f"the store refused the change: it conflicts with its data ({first_line(exc)})")
    if isinstance(exc, PoolTimeout) or is_busy(exc):  # every connection in use, or a lock held
        log.warning("store busy: %s", first_line(exc))
        message = f"the store is busy ({first_line(exc)}); try again in {RETRY_AFTER} s"
        return error(503, "Unavailable", message, {"Retry-After": str(RETRY_AFTER)})
    log.error("store failed: %s", first_line(exc))
    text = first_line(exc)
    if "readonly" in text.lower():
        text += ": the store is read-only"
    return error(503, "Unavailable", f"the store cannot be used now ({text}); see the service log")


def install(app: FastAPI) -> None:
    """The error handlers, the body limit and the last resort for unexpected errors."""

    @app.exception_handler(GpupoolError)
    def domain_error(_request: Request, exc: GpupoolError) -> JSONResponse:
        return error(status_of(exc), type(exc).__name__, str(exc))

    # Other SQLAlchemy errors are the service's bugs: the last resort's 500.
    @app.exception_handler(DBAPIError)
    @app.exception_handler(PoolTimeout)
    def store_error(_request: Request, exc: DBAPIError | PoolTimeout) -> JSONResponse:
        return store_problem(exc)

    @app.exception_handler(RequestValidationError)
    def bad_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(422, "InvalidInput", validation_message(exc.errors()))

    @app.exception_handler(HTTPException)
    def framework_error(_request: Request, exc: HTTPException) -> JSONResponse:
        kind = KINDS.get(exc.status_code, "InvalidInput" if exc.status_code < 500 else "InternalError")
        return error(exc.status_code, kind, str(exc.detail), dict(exc.headers or {}))

    app.add_middleware(BodyLimit, limit=limits.BODY_BYTES)
    app.add_middleware(LastResort)


def validation_message(errors: Any) -> str:
    problems = []
    for e in errors:
        loc = list(e["loc"])
        if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
            loc = loc[1:]
        where = ".".join(str(p) for p in loc)
        what = str(e["msg"]).removeprefix("Value error, ")
        problems.append(f"{where}: {what}" if where else what)
    return "; ".join(problems)


class BodyLimit:
    """Refuse a request body over `limit` bytes with a 413: at once by its Content-Length, or
    counted as it arrives when it is chunked (pure ASGI: the body is read once, here)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await error(400, "InvalidInput", "Content-Length is not a number of bytes")(scope, receive, send)
                return
            if int(declared) > self.limit:
                await self.refuse(scope, receive, send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away: let the app see it
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                await self.refuse(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        mib = self.limit // (1024 * 1024)
        message = f"the request body is over {mib} MiB ({self.limit} bytes); see docs/access.md, Limits"
        await error(413, "TooLarge", message, {"Connection": "close"})(scope, receive, send)


class LastResort:
    """An unexpected error is logged with its traceback and answered as a JSON 500 (when the
    answer has not begun), never a plain-text one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            where = f"{scope.get('method')} {scope.get('path')}"
            log.exception("unexpected error answering %s", where)
            if started:
                raise  # too late to answer: the server closes the connection
            message = f"the service failed to answer {where} ({type(exc).__name__}); see the service log"
            await error(500, "InternalError", message)(scope, receive, sending)
