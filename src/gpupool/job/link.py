"""The job's side of the job protocol (docs/job-protocol.md): who it is, its reports to the
scheduler, and the three ways a notice arrives (heartbeat reply, notice file, signal).

Signal handlers only set a flag with the time it came; whoever polls `notice()` acts on it at a
step boundary. Reports use the standard library, and a scheduler that cannot be reached costs a
log line, never the job; heartbeats go from a thread of their own, so a slow scheduler never
slows training (commits, the acknowledgement and completion are sent in line: they are rare,
and must be sent before the job goes on or leaves). Outside gpupool (no GPUPOOL_API) reports
go nowhere and the job runs.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

log = logging.getLogger("gpupool.job")

NOTICE_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
"""SIGUSR1 is left alone: some NCCL versions take it."""


@dataclass(frozen=True)
class Notice:
    source: str
    """'heartbeat', 'file' or 'signal': the first channel it came by."""
    deadline: float | None
    """Unix time of the SIGKILL, when the channel told it."""


class SchedulerLink:
    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        self.job_id = env.get("GPUPOOL_JOB_ID")
        self.attempt = int(env.get("GPUPOOL_ATTEMPT", "0"))
        self.checkpoint_dir = Path(env.get("GPUPOOL_CHECKPOINT_DIR", "checkpoints"))
        self.notice_file = Path(env["GPUPOOL_NOTICE_FILE"]) if env.get("GPUPOOL_NOTICE_FILE") else None
        self.api = env.get("GPUPOOL_API") or None
        self.token = env.get("GPUPOOL_TOKEN", "")
        self.interruption_interval = float(env.get("GPUPOOL_INTERRUPTION_INTERVAL", 6 * 3600))
        self._pid = os.getpid()
        self._signalled: int | None = None
        self._from_heartbeat: Notice | None = None
        self._previous: dict[int, Any] = {}
        self._beat = threading.Condition()
        self._next_beat: dict[str, object] | None = None
        self._sending = False
        self._sender: threading.Thread | None = None

    # --- reports --------------------------------------------------------------------------------

    def report(self, kind: str, body: Mapping[str, object]) -> dict[str, Any]:
        """POST one report; {} when not under gpupool or when the scheduler does not answer."""
        if self.api is None or self.job_id is None:
            return {}
        request = urllib.request.Request(
            f"{self.api}/jobs/{self.job_id}/attempts/{self.attempt}/{kind}",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                text = response.read()
            reply: dict[str, Any] = json.loads(text) if text else {}
        except (OSError, ValueError, http.client.HTTPException) as exc:
            log.warning("gpupool did not take the %s report (%s); going on", kind, exc)
            return {}
        return reply

    def heartbeat(self, step: int, phase: str, since_commit: float | None = None, **more: object) -> None:
        """Hand a heartbeat to the sender thread and return at once: training never waits on
        the scheduler. A heartbeat not sent yet is replaced by the newer one (keeping what only
        it said, such as the checkpoint it restored)."""
        if since_commit is not None:
            more["since_commit"] = round(since_commit, 3)
        if self.api is None or self.job_id is None:
            return
        with self._beat:
            self._next_beat = {**(self._next_beat or {}), "step": step, "phase": phase, **more}
            self._beat.notify()
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_beats, name="gpupool-heartbeat", daemon=True)
            self._sender.start()

    def _send_beats(self) -> None:
        while True:
            with self._beat:
                while self._next_beat is None:
                    self._beat.wait()
                body, self._next_beat = self._next_beat, None
                self._sending = True
            try:
                notice = self.report("heartbeat", body).get("notice")
                if notice and self._from_heartbeat is None:
                    self._from_heartbeat = Notice("heartbeat", float(notice["deadline"]))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                log.warning("gpupool's answer to a heartbeat made no sense (%s); going on", exc)
            finally:
                with self._beat:
                    self._sending = False
                    self._beat.notify_all()

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until the heartbeats handed over so far have been sent (or `timeout` passed):
        before a last report, so that the scheduler has the final step."""
        with self._beat:
            self._beat.wait_for(lambda: self._next_beat is None and not self._sending, timeout)

    # --- notice ---------------------------------------------------------------------------------

    def install_signals(self) -> None:
        """Take the notice signals; again, when a framework has put its own handler in since
        (restore_signals puts back what there was before the first time)."""
        for signum in NOTICE_SIGNALS:
            self._previous.setdefault(signum, signal.signal(signum, self._on_signal))

    def previous_handlers(self) -> dict[int, Any]:
        """The handlers the notice signals had before gpupool's."""
        return dict(self._previous)

    def restore_signals(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Forked DataLoader workers inherit the handler: only the job's own process takes note.
        if os.getpid() == self._pid and self._signalled is None:
            self._signalled = signum

    def _file_deadline(self) -> float | None:
        if self.notice_file is None:
            return None
        try:
            return float(json.loads(self.notice_file.read_text())["deadline"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def notice(self) -> Notice | None:
        """The notice, if one came by any channel (cheap: a flag and a stat)."""
        if self._from_heartbeat is not None:
            return self._from_heartbeat
        if self.notice_file is not None and self.notice_file.exists():
            return Notice("file", self._file_deadline())
        if self._signalled is not None:
            return Notice("signal", self._file_deadline())
        return None

    @staticmethod
    def seconds_left(notice: Notice) -> float:
        return float("inf") if notice.deadline is None else notice.deadline - time.time()
