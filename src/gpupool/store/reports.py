"""What a job reports of its live attempt, by the job protocol: heartbeats (its step, phase and
restart), checkpoint commits, a notice acknowledged, completion, a notebook's server; and the
check of the attempt's token that every report goes through."""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from typing import Any

from gpupool.errors import Conflict, Forbidden
from gpupool.store.attempts import AttemptsStore
from gpupool.store.schema import AttemptRow, CheckpointRow, EventRow


class ReportsStore(AttemptsStore):
    def check_attempt_token(self, job_id: int, attempt: int, token_hash: str) -> None:
        """Raise unless `token_hash` is that of the job's live attempt `attempt`."""
        with self.transaction() as s:
            row = self.live_attempt(s, job_id, attempt)
            if not row.token_hash or not hmac.compare_digest(row.token_hash, token_hash):
                raise Forbidden(f"this token is not the one of attempt {attempt} of job {job_id}")

    def serve(self, job_id: int, attempt: int, port: int, token: str) -> None:
        """A notebook session's server answers on `port` of its node (the job protocol's
        `server` report); `Conflict` for an attempt that is not live."""
        with self.transaction() as s:
            row = self.live_attempt(s, job_id, attempt)
            row.server = {"port": port, "token": token}

    def heartbeat(
        self,
        job_id: int,
        attempt: int,
        now: float,
        step: int | None,
        phase: str | None,
        *,
        restored_step: int | None = None,
        restore_seconds: float | None = None,
        restore_skipped: Sequence[str] = (),
        since_commit: float | None = None,
        restart: Mapping[str, Any] | None = None,
    ) -> AttemptRow:
        """Note that the attempt is alive (and productive from its first `train` phase, which
        may say which checkpoint it restored); returns the attempt, whose notice fields tell the
        job whether to stop."""
        with self.transaction() as s:
            row = self.live_attempt(s, job_id, attempt)
            row.last_heartbeat_at, row.step, row.phase, row.since_commit = now, step, phase, since_commit
            if phase == "train" and row.productive_at is None:
                row.productive_at = now
            if restart:
                # Merged, each key once: the phases come with the first step, the step times later.
                row.restart = {**restart, **(row.restart or {})}
            if restored_step is not None and row.restored_step is None:
                row.restored_step, row.restore_seconds = restored_step, restore_seconds
                skipped = f"; skipped {'; '.join(restore_skipped)}" if restore_skipped else ""
                message = f"resumed from the checkpoint of step {restored_step}{skipped}"
                s.add(EventRow(time=now, kind="restored", job_id=job_id, attempt=attempt, message=message[:2000]))
            return row

    def commit_checkpoint(
        self,
        job_id: int,
        attempt: int,
        now: float,
        step: int | None,
        path: str | None,
        seconds: float | None = None,
        background_seconds: float | None = None,
    ) -> None:
        """A commit the job reported. A background save's state is of the step boundary its
        write began after: the work since then is what a crash now would lose."""
        background = background_seconds or 0.0
        with self.transaction() as s:
            row = self.live_attempt(s, job_id, attempt)
            row.last_checkpoint_at = max(row.started_at, now - background)
            s.add(
                CheckpointRow(
                    job_id=job_id,
                    attempt=attempt,
                    time=now,
                    step=step,
                    path=path,
                    seconds=seconds,
                    background_seconds=background_seconds,
                )
            )
            message = f"checkpoint at step {step}"
            if seconds is not None:
                message += f", blocked training {seconds:.3g} s"
            if background_seconds:
                message += f", then written in the background in {background_seconds:.3g} s"
            s.add(EventRow(time=now, kind="checkpoint", job_id=job_id, attempt=attempt, message=message))

    def acknowledge(self, job_id: int, attempt: int, now: float) -> None:
        with self.transaction() as s:
            row = self.live_attempt(s, job_id, attempt)
            if row.notice_at is None:
                raise Conflict(f"attempt {attempt} of job {job_id} has no notice to acknowledge")
            row.acked_at = now

    def report_completed(self, job_id: int, attempt: int, now: float) -> None:
        """The job says it finished: the attempt succeeds whatever its exit code."""
        with self.transaction() as s:
            self.live_attempt(s, job_id, attempt).completed_at = now
