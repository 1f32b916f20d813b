"""Every request counted and timed by its route's template (`/jobs/{job_id}`, never the path
itself, so that ids do not become labels), its method and its status code."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpupool.telemetry import Telemetry

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RequestMetrics:
    """Plain ASGI (no `BaseHTTPMiddleware`, which buffers answers): reads the status as the
    answer starts and the route the router matched, once the answer is sent."""

    def __init__(self, app: ASGIApp, telemetry: Telemetry, routes: Sequence[BaseRoute] = ()) -> None:
        self.app = app
        self.telemetry = telemetry
        self.routes = routes
        """The app's routes: a request answered before the router saw it (a body too large)
        is counted under the route it was for."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None) or self.route_of(scope)
            method = scope["method"] if scope["method"] in METHODS else "other"
            self.telemetry.on_request(method, route, status, time.perf_counter() - began)

    def route_of(self, scope: Scope) -> str:
        matches = [(r.matches(scope)[0], getattr(r, "path", "")) for r in every_route(self.routes)]
        for wanted in (Match.FULL, Match.PARTIAL):
            found = [path for match, path in matches if match is wanted and path]
            if found:
                return found[0]
        return "unmatched"


def every_route(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """Each route, an included router's too: FastAPI 0.137 and later keep an included router as
    one entry of `app.routes` (its `original_router`), where earlier versions copied its routes."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is None:
            yield route
        else:
            yield from every_route(included.routes)
