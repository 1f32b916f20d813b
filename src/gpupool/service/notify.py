"""Webhooks: each job's start, end and notices told to the URL it named (`submit --notify`) and
to the service's own (`service.webhooks`), as Slack-compatible JSON.

The notifier follows the store's events by id (`store.tail.Tail`: on PostgreSQL ids become
visible in commit order, so an id passed over is asked for again for a while), so the control
loop never waits for a receiver. Each URL has a courier of its own, a thread with a queue: a
receiver that is slow or gone delays its own messages, no one else's; one that does not answer
is tried three times, then passed over for that message (logged). The notifier keeps its place
in the data directory (`notified`): a restart does not tell again what was told, nor skip what
happened while gpupool was down (a crash between a message's delivery and the next save of the
place may tell it twice).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from gpupool.store import Store
from gpupool.store.schema import EventRow, JobRow
from gpupool.store.tail import Tail

log = logging.getLogger("gpupool.notify")

TOLD = frozenset({"running", "preempting", "time_limit", "succeeded", "failed", "cancelled", "timeout"})
"""The kinds of events told: the job started, got notice (a preemption, a requeue, its time
limit), or ended."""

TRIES = 3
WAITING = 1000
"""Messages a courier holds for a receiver that does not keep up; past them, the oldest go."""


def payload(event: EventRow, job: JobRow) -> dict[str, Any]:
    """What a webhook receives: Slack's `text`, and the same facts for machines under `gpupool`."""
    about = f"job {job.label} ({job.name}, team {job.team}{f', user {job.user}' if job.user else ''})"
    return {
        "text": f"gpupool: {about} {event.kind}: {event.message}",
        "gpupool": {
            "event": event.kind,
            "reason": event.reason,
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


Post = Callable[[str, dict[str, Any]], None]


class Courier:
    """Carries the messages for one URL, in order, on a thread of its own."""

    def __init__(self, url: str, post: Post) -> None:
        self.url, self.post = url, post
        self.waiting: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=WAITING)
        threading.Thread(target=self.run, name=f"webhook {url[:40]}", daemon=True).start()

    def send(self, body: dict[str, Any]) -> None:
        while True:
            try:
                self.waiting.put_nowait(body)
                return
            except queue.Full:
                dropped = self.waiting.get_nowait()
                log.warning("webhook %s keeps no pace: %r passed over", self.url, dropped["text"][:200])

    def run(self) -> None:
        while True:
            body = self.waiting.get()
            for attempt in range(TRIES):
                try:
                    self.post(self.url, body)
                    break
                except (httpx.HTTPError, OSError) as exc:
                    if attempt == TRIES - 1:
                        log.warning(
                            "webhook %s did not take %r after %s tries: %s", self.url, body["text"][:200], TRIES, exc
                        )
                    else:
                        time.sleep(0.5 * 2**attempt)


class Notifier:
    """Tells `webhooks` (and each job's own URL) of the events of `TOLD`, in order."""

    def __init__(self, store: Store, webhooks: Sequence[str], data_dir: Path) -> None:
        self.store, self.webhooks = store, tuple(webhooks)
        self.place = data_dir / "notified"
        self.http = httpx.Client(timeout=5.0)
        self.couriers: dict[str, Courier] = {}
        self.tail = self._start()
        self._keep()  # a first start's place too: the next start goes on from it

    def run(self, stop: threading.Event, every: float = 1.0) -> None:
        while not stop.is_set():
            try:
                self.tell(time.monotonic())
            except Exception:
                log.exception("telling webhooks failed; going on")
            stop.wait(every)

    def tell(self, now: float) -> None:
        """Hand each new event of `TOLD` to the couriers of its URLs; keep the place."""
        found = self.store.events_to_tell(self.tail.mark, sorted(self.tail.gaps))
        fresh = self.tail.fresh([event.id for event, _ in found], now)
        for event, job in found:
            if event.id not in fresh or event.kind not in TOLD or job is None:
                continue
            urls = [*self.webhooks, *([job.notify] if job.notify else [])]
            for url in dict.fromkeys(urls):
                if url not in self.couriers:
                    self.couriers[url] = Courier(url, self._post)
                self.couriers[url].send(payload(event, job))
        if found:
            self._keep()

    def _post(self, url: str, body: dict[str, Any]) -> None:
        self.http.post(url, json=body).raise_for_status()

    def _start(self) -> Tail:
        """Where to go on from: the place kept, else the newest event (no history is told)."""
        try:
            kept = json.loads(self.place.read_text())
            return Tail(int(kept["mark"]), {int(gap): time.monotonic() for gap in kept.get("gaps", [])})
        except (OSError, ValueError, KeyError, TypeError):
            return Tail(self.store.last_event())

    def _keep(self) -> None:
        partial = self.place.with_suffix(".tmp")
        partial.write_text(json.dumps({"mark": self.tail.mark, "gaps": sorted(self.tail.gaps)}))
        os.replace(partial, self.place)
