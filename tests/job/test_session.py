"""`Job` in one process: RNG restored before anything can save or draw, and what leaving does."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpupool.job import Job, mark
from gpupool.job.link import SchedulerLink
from gpupool.job.session import LEAVE_CODE
from tests.support.live import wait_for


class Counter:
    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"]


def offline(tmp_path: Path) -> SchedulerLink:
    return SchedulerLink({"GPUPOOL_CHECKPOINT_DIR": str(tmp_path)})


def test_a_save_before_the_first_step_keeps_the_resumed_random_state(tmp_path: Path) -> None:
    random.seed(7)
    job = Job(counter=Counter(), save_every=None, link=offline(tmp_path))
    for _ in job.steps(5):
        random.random()
    job.finish()
    expected = random.random()  # what step 5 of an uninterrupted run draws

    random.seed(123)  # a new process: some other state until the resume
    resumed = Job(counter=Counter(), save_every=None, link=offline(tmp_path))
    resumed.save()  # at once, before any step
    assert random.random() == expected
    random.seed(456)
    again = Job(counter=Counter(), save_every=None, link=offline(tmp_path))
    assert again.step == 5
    next(again.steps(6))
    assert random.random() == expected, "the early save kept the restored state, not the one before"
    again.link.restore_signals()


def test_leaving_on_notice_saves_and_exits_with_ex_tempfail(tmp_path: Path) -> None:
    (tmp_path / "notice").write_text('{"deadline": 4102444800}')
    link = SchedulerLink(
        {"GPUPOOL_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "GPUPOOL_NOTICE_FILE": str(tmp_path / "notice")}
    )
    counter = Counter()
    job = Job(counter=counter, save_every=None, link=link)
    counter.value = 3
    job.step_done()
    with pytest.raises(SystemExit) as left:
        job.leave()
    assert left.value.code == LEAVE_CODE == 75
    assert [c.step for c in job.checkpoints.committed()] == [1]


def test_a_notice_before_any_step_leaves_without_saving_the_untrained_state(tmp_path: Path) -> None:
    (tmp_path / "notice").write_text('{"deadline": 4102444800}')
    env = {"GPUPOOL_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "GPUPOOL_NOTICE_FILE": str(tmp_path / "notice")}
    job = Job(counter=Counter(), save_every=None, link=SchedulerLink(env))
    with pytest.raises(SystemExit) as left:
        job.leave()
    assert left.value.code == LEAVE_CODE
    assert job.checkpoints.committed() == [], "a fresh start is the same state"


def test_restart_marks_are_named_printably_and_not_as_gpupool_names_its_own() -> None:
    for bad in ("", "x" * 41, "imports\n", "\x1b[31mred", "launch", "other"):
        with pytest.raises(ValueError, match="phase"):
            mark(bad)


class Recording(SchedulerLink):
    def __init__(self, env: dict[str, str]) -> None:
        super().__init__({**env, "GPUPOOL_API": "http://unused", "GPUPOOL_JOB_ID": "1"})
        self.reports: list[tuple[str, dict[str, object]]] = []

    def report(self, kind: str, body: Mapping[str, object]) -> dict[str, Any]:
        self.reports.append((kind, dict(body)))
        return {}


def test_the_scheduler_is_told_which_checkpoint_a_resume_used_and_which_it_skipped(tmp_path: Path) -> None:
    env = {"GPUPOOL_CHECKPOINT_DIR": str(tmp_path)}
    first = Job(counter=Counter(), save_every=1, link=Recording(env))
    for _ in first.steps(2):
        pass
    first.finish()
    (tmp_path / "step-000000002" / "objects.pt").write_bytes(b"torn")
    link = Recording(env)
    resumed = Job(counter=Counter(), save_every=None, link=link)
    next(resumed.steps(3))

    def trained() -> list[dict[str, object]]:
        return [body for kind, body in link.reports if kind == "heartbeat" and body.get("phase") == "train"]

    wait_for(lambda: bool(trained()))  # heartbeats go from their own thread
    train = trained()[0]
    assert (train["restored_step"], train["step"]) == (1, 1)
    assert 0 <= float(train["since_commit"]) < 60  # type: ignore[arg-type]
    assert train["restore_skipped"] == [
        "step-000000002: " + f"{tmp_path}/step-000000002/objects.pt is damaged (its size differs from the manifest)"
    ]
    resumed.link.restore_signals()


class SlowScheduler(BaseHTTPRequestHandler):
    """Answers every report after a long pause; with a notice once `notice` is set."""

    notice = False

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(1.0)
        body = json.dumps({"notice": {"deadline": time.time() + 60, "seconds_left": 60} if self.notice else None})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_: object) -> None:
        pass


def test_a_slow_scheduler_never_slows_training_and_its_notice_still_arrives(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowScheduler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        "GPUPOOL_CHECKPOINT_DIR": str(tmp_path),
        "GPUPOOL_API": f"http://127.0.0.1:{server.server_address[1]}",
        "GPUPOOL_JOB_ID": "1",
    }
    job = Job(counter=Counter(), save_every=None, heartbeat_every=0.0, link=SchedulerLink(env))
    began = time.monotonic()
    for _ in range(50):
        assert not job.should_stop()
        job.step_done()  # a heartbeat at every step, each answered after 1 s
    assert time.monotonic() - began < 1.0, "training waited for the scheduler"
    SlowScheduler.notice = True
    assert wait_for(job.should_stop, timeout=10) < 10
    job.link.restore_signals()
    server.shutdown()
