"""After a restart: the loop adopts the attempts whose processes still run and settles the
others as they ended (`ControlLoop.reconcile`, at its start and when its guard lets it decide
again)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from gpupool.executors import Executor, Key, Recorded, Started
from gpupool.model import Config, SessionKind
from gpupool.service.sessions import Sessions
from gpupool.service.workspace import Workspace
from gpupool.settle import JobState
from gpupool.store import Store
from gpupool.store.schema import AttemptRow
from gpupool.units import plural

log = logging.getLogger("gpupool.service")


class Adoption:
    """The part of the control loop that runs after a restart (`ControlLoop` has the rest)."""

    store: Store
    executor: Executor
    config: Config
    workspace: Workspace
    sessions: Sessions
    requeued: set[Key]

    resume_resized: Callable[[Sequence[int], float], None]
    """Launch the next attempts of these resized jobs at once (the loop's)."""

    def reconcile(self, now: float) -> None:
        """Adopt every live attempt whose process is still the one it started; requeue the rest
        (their recorded exit status, if any, decides how they ended)."""
        live = self.store.live_attempts()
        adopted = 0
        for attempt in live:
            try:
                adopted += self.reconcile_one(attempt, now)
            except Exception:
                log.exception("could not reconcile job %s attempt %s", attempt.job_id, attempt.attempt)
        if live:
            log.info(
                "after the start: %s of %s adopted, the others ended or never started while gpupool was away",
                adopted,
                plural(len(live), "live attempt"),
            )

    def reconcile_one(self, attempt: AttemptRow, now: float) -> bool:
        """Adopt one live attempt, or end it as it ended; whether it was adopted."""
        key = (attempt.job_id, attempt.attempt)
        job = self.store.job(attempt.job_id)
        recorded = Recorded(
            *key,
            attempt.handle,
            self.workspace.attempt_dir(*key),
            tuple(self.workspace.log_file(job, attempt.attempt, stream) for stream in ("stdout", "stderr")),
            attempt.last_heartbeat_at or attempt.started_at,
            attempt.notice_deadline,
        )
        found = self.executor.adopt(recorded)
        if isinstance(found, Started):
            if attempt.handle is None or (found.running and job.state == JobState.STARTING.value):
                self.store.mark_started([(*key, found.handle, found.running, found.where)], now)
            if attempt.notice_at is not None:
                self.requeued.add(key)  # adopting gave it its notice again
            if job.session is not None:
                self.sessions.started(key, SessionKind(job.session), job.priority, now)
            log.info("adopted job %s attempt %s %s", job.label, attempt.attempt, found.where or "(starting)")
            return True
        if not found.started:
            log.info("job %s attempt %s never started: launched again (%s)", job.label, attempt.attempt, found.why)
            self.store.retry_launch(*key, now, found.why or "not started")
        else:
            log.info("job %s attempt %s ended while gpupool was away (%s)", job.label, attempt.attempt, found.why)
            # It ended while nobody watched: its time limit is charged up to when it ended, as
            # far as the executor can tell.
            ended = found.ended_at if found.ended_at is not None else recorded.since
            settled = self.store.end_attempt(
                *key,
                found.exit_code,
                now,
                why=found.why,
                ran_until=ended,
                node_lost=found.node_lost,
                max_node_losses=self.config.max_node_losses,
                usage=found.usage,
            )
            if settled is JobState.STARTING:  # it left for a resize: its next attempt starts now
                self.resume_resized([attempt.job_id], now)
        return False
