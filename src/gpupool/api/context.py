"""What every route of one app shares (`Context`): the store, the running service through its
narrow interface (`gpupool.service.interface`), the admin token's hash, the clock, the
telemetry and the line. A route takes it as a parameter `ctx: Ctx`; `create_app` keeps it in
the app's state."""

# No `from __future__ import annotations`: FastAPI reads the dependencies from the signatures.
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from starlette.responses import Response

from gpupool.api.access import Principal
from gpupool.api.batching import SubmissionWriter
from gpupool.model import Node
from gpupool.service.interface import Line, Service
from gpupool.store import Store
from gpupool.telemetry import Telemetry


@dataclass
class Context:
    store: Store
    service: Service
    admin_hash: str
    clock: Callable[[], float] = time.time
    telemetry: Telemetry | None = None
    lineup: Line | None = None
    scrapers: dict[str, tuple[float, Principal]] = field(default_factory=dict)
    """Tokens that scraped /metrics: when the store last confirmed them, and whose they are."""
    drawn: dict[tuple[str, str, Principal], tuple[float, Response]] = field(default_factory=dict)
    """The dashboard's fragments drawn lately, for each token's view of each (`dashboard.FRESH`)."""
    drawing: threading.Lock = field(default_factory=threading.Lock)
    writer: SubmissionWriter = field(init=False)
    """Submissions, committed in groups; each commit wakes the service."""
    _nodes: tuple[float, list[Node]] | None = None

    def __post_init__(self) -> None:
        self.writer = SubmissionWriter(self.store, self.clock, self.service.wake)

    def nodes(self) -> list[Node]:
        """Every node the pool has known, up or not, read at most once a second: a job that fits
        a node that is away for now (rebooting, set aside after losing a member) is accepted."""
        now = time.monotonic()
        if self._nodes is None or now - self._nodes[0] > 1.0:
            self._nodes = (now, self.store.nodes_as_core(every=True))
        return self._nodes[1]


async def context(request: Request) -> Context:
    """The app's context (a coroutine: it is read on the event loop, with no thread hop)."""
    ctx: Context = request.app.state.context
    return ctx


Ctx = Annotated[Context, Depends(context)]
