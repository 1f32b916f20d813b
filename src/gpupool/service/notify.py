"""Webhooks: each job's start, end and notices told to the URL it named (`submit --notify`) and
to the service's own (`service.webhooks`), as Slack-compatible JSON.

The notifier reads the store's events after the last one it told of, so the control loop never
waits for a slow receiver, and it keeps its place in the data directory (`notified`): a restart
neither repeats what was told nor skips what happened while gpupool was down. A receiver that
does not answer is tried three times, then given up on for that event (logged).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from gpupool.store import Store
from gpupool.store.schema import EventRow, JobRow

log = logging.getLogger("gpupool.notify")

TOLD = ("running", "preempting", "time_limit", "succeeded", "failed", "cancelled", "timeout")
"""The kinds of events told: the job started, got notice (a preemption, a requeue, its time
limit), or ended."""

TRIES = 3


def payload(event: EventRow, job: JobRow | None) -> dict[str, Any]:
    """What a webhook receives: Slack's `text`, and the same facts for machines under `gpupool`."""
    if job is None:
        return {"text": f"gpupool: {event.kind}: {event.message}", "gpupool": {"event": event.kind}}
    about = f"job {job.label} ({job.name}, team {job.team}{f', user {job.user}' if job.user else ''})"
    return {
        "text": f"gpupool: {about} {event.kind}: {event.message}",
        "gpupool": {
            "event": event.kind,
            "job": job.id,
            "job_label": job.label,
            "name": job.name,
            "team": job.team,
            "user": job.user,
            "state": job.state,
            "time": event.time,
            "message": event.message,
        },
    }


class Notifier:
    """Tells `webhooks` (and each job's own URL) of the events of `TOLD`, in order."""

    def __init__(
        self,
        store: Store,
        webhooks: Sequence[str],
        data_dir: Path,
        post: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.store, self.webhooks = store, tuple(webhooks)
        self.place = data_dir / "notified"
        self.post = post or self._post
        self.http = httpx.Client(timeout=5.0)

    def run(self, stop: threading.Event, every: float = 1.0) -> None:
        after = self._start()
        while not stop.is_set():
            try:
                after = self.tell(after)
            except Exception:
                log.exception("telling webhooks failed; going on")
            stop.wait(every)

    def tell(self, after: int) -> int:
        """Tell of the events after the id `after`; the id of the last one told."""
        for event, job in self.store.events_to_tell(after, TOLD):
            urls = [*self.webhooks, *([job.notify] if job is not None and job.notify else [])]
            for url in dict.fromkeys(urls):
                self._deliver(url, payload(event, job))
            after = event.id
            self._keep(after)
        return after

    def _deliver(self, url: str, body: dict[str, Any]) -> None:
        for attempt in range(TRIES):
            try:
                self.post(url, body)
                return
            except (httpx.HTTPError, OSError) as exc:
                if attempt == TRIES - 1:
                    log.warning("webhook %s did not take %r after %s tries: %s", url, body["text"][:200], TRIES, exc)
                else:
                    time.sleep(0.5 * 2**attempt)

    def _post(self, url: str, body: dict[str, Any]) -> None:
        self.http.post(url, json=body).raise_for_status()

    def _start(self) -> int:
        """Where to go on from: the place kept, else the newest event (no history is told)."""
        try:
            return int(self.place.read_text())
        except (OSError, ValueError):
            newest = self.store.last_event()
            self._keep(newest)
            return newest

    def _keep(self, after: int) -> None:
        partial = self.place.with_suffix(".tmp")
        partial.write_text(str(after))
        os.replace(partial, self.place)
