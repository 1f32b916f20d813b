"""The Lightning and Hugging Face examples as real processes: a SIGTERM (gpupool's notice by
signal) in the middle of training makes each save through its framework, leave with exit code
75, and the next run resume; the runs together print the loss bits of a run never stopped."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

pytest.importorskip("lightning", reason="needs gpupool[lightning]")
pytest.importorskip("transformers", reason="needs gpupool[huggingface]")

LIGHTNING = [sys.executable, "-m", "gpupool.examples.lightning_trainer"]
HUGGINGFACE = [sys.executable, "-m", "gpupool.examples.hf_trainer"]


def losses(output: str) -> dict[str, str]:
    """'[rank R ]step N [batch M]' -> the loss's bits."""
    return dict(re.findall(r"^((?:rank \d+ )?step \d+(?: batch \d+)?) loss (\S+)$", output, re.MULTILINE))


def evaluations(output: str) -> list[str]:
    return re.findall(r"^evaluated at .*$", output, re.MULTILINE)


def finals(output: str) -> set[str]:
    """What each rank says of its final state."""
    return set(re.findall(r"^(?:rank \d+ )?done: .*$", output, re.MULTILINE))


def step_of(key: str) -> int:
    found = re.search(r"step[ -](\d+)", key)
    assert found is not None
    return int(found.group(1))


def resumed_from(output: str) -> str:
    """What the example (its rank 0) says it resumes from: a checkpoint's path, or 'the start'."""
    found = re.search(r"^(?:rank 0 )?attempt \d+: from (.*)$", output, re.MULTILINE)
    assert found is not None, output[-3000:]
    return found.group(1)


class Scheduler(BaseHTTPRequestHandler):
    """gpupool's side of the job protocol, recording what each attempt reported."""

    reports: ClassVar[list[tuple[int, str, dict[str, Any]]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        _, _, _, attempt, kind = self.path.strip("/").split("/")
        self.reports.append((int(attempt), kind, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"notice": null}')

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def scheduler() -> Iterator[str]:
    Scheduler.reports = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scheduler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def reported(attempt: int) -> list[str]:
    return [kind for a, kind, _ in Scheduler.reports if a == attempt and kind != "heartbeat"]


def last_step(attempt: int) -> object:
    return [body["step"] for a, kind, body in Scheduler.reports if a == attempt and kind == "heartbeat"][-1]


def environment(checkpoints: Path, api: str | None = None, attempt: int = 0) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env |= {"GPUPOOL_CHECKPOINT_DIR": str(checkpoints), "GPUPOOL_ATTEMPT": str(attempt)}
    # One thread per run: a CI run's uninterrupted Trainer printed a step's loss a bit apart from
    # its resumed runs' (a few steps, the state itself alike); bit for bit is what is compared.
    env |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return env | ({"GPUPOOL_API": api, "GPUPOOL_JOB_ID": "1"} if api else {})


def run(
    command: list[str],
    checkpoints: Path,
    *,
    notice_at: str | None = None,
    api: str | None = None,
    attempt: int = 0,
    step_seconds: float = 0.05,
) -> tuple[int, str]:
    """Run to the end, or send SIGTERM to its process group (as gpupool does) once the line
    starting `notice_at` is printed."""
    process = subprocess.Popen(
        [*command, "--step-seconds", str(step_seconds)],
        env=environment(checkpoints, api, attempt),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if notice_at is not None and line.startswith(f"{notice_at} "):
            os.killpg(process.pid, signal.SIGTERM)
    return process.wait(timeout=120), "".join(lines)


def python(script: str, checkpoints: Path) -> subprocess.CompletedProcess[str]:
    """`python -c script`, which must succeed."""
    command = [sys.executable, "-c", script]
    out = subprocess.run(
        command, env=environment(checkpoints), capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def golden(command: list[str], checkpoints: Path) -> str:
    return subprocess.run(
        command, env=environment(checkpoints), capture_output=True, text=True, timeout=180, check=True
    ).stdout


@pytest.mark.parametrize(
    ("command", "notices"),
    [
        pytest.param([*LIGHTNING, "--steps", "30"], ["step 7 batch 7", "step 19 batch 19"], id="lightning"),
        pytest.param(
            [*LIGHTNING, "--steps", "12", "--accumulate", "3"],
            ["step 3 batch 10", "step 8 batch 24"],
            id="lightning-accumulating",
        ),
        # The saves fall on steps a validation follows (it draws from the RNG; a resume skips it).
        pytest.param(
            [*LIGHTNING, "--steps", "20", "--val-every", "4"],
            ["step 3 batch 3", "step 11 batch 11"],
            id="lightning-validating",
        ),
        # Two DDP processes, each with its own dropout and its own share of the data.
        pytest.param(
            [*LIGHTNING, "--steps", "12", "--devices", "2", "--val-every", "4"],
            ["rank 0 step 3 batch 3", "rank 1 step 9 batch 9"],
            id="lightning-ddp",
        ),
        # 32 steps an epoch: the second notice comes in the second epoch.
        pytest.param([*HUGGINGFACE, "--steps", "50"], ["step 9", "step 40"], id="huggingface"),
        # The first save falls on the epoch's last step, which an evaluation follows (a resume skips it).
        pytest.param([*HUGGINGFACE, "--steps", "40", "--eval-epoch"], ["step 31", "step 35"], id="huggingface-eval"),
    ],
)
def test_a_framework_job_given_notice_twice_resumes_bit_identical(
    command: list[str], notices: list[str], tmp_path: Path, scheduler: str
) -> None:
    expected = golden(command, tmp_path / "golden")
    merged: dict[str, str] = {}
    outputs = []
    for attempt, notice_at in enumerate([*notices, None]):
        code, output = run(command, tmp_path / "checkpoints", notice_at=notice_at, api=scheduler, attempt=attempt)
        assert code == (75 if notice_at else 0), output[-3000:]
        outputs.append(output)
        for key, bits in losses(output).items():
            assert merged.setdefault(key, bits) == bits, f"{key} differs on resume"
        assert reported(attempt)[-2:] == (["checkpoint", "ack"] if notice_at else ["complete"])
    assert merged == losses(expected)
    assert evaluations("".join(outputs)) == evaluations(expected), "every evaluation, once"
    assert finals(outputs[-1]) == finals(expected), "the same final state"
    assert last_step(len(notices)) == int(command[command.index("--steps") + 1]), "the final step reported"
    for earlier, later in itertools.pairwise(outputs):
        trained = max(step_of(key) for key in losses(earlier))
        assert f"step-{trained + 1:09d}" in resumed_from(later), "resumed at the step after the last one it trained"


def test_a_damaged_newest_checkpoint_is_set_aside_and_the_one_before_used(tmp_path: Path) -> None:
    command = [*LIGHTNING, "--steps", "16", "--save-every", "4"]
    checkpoints = tmp_path / "checkpoints"
    code, _ = run(command, checkpoints, notice_at="step 9 batch 9")
    assert code == 75
    # The notice lands at step 10 or later, on a loaded machine: the two kept are that one and one before.
    before, newest = sorted(checkpoints.glob("step-*"))
    manifest = json.loads((newest / "MANIFEST.json").read_text())
    assert manifest["framework"] == "lightning" and {"lightning.ckpt", "rank-0.pt"} <= set(manifest["files"])
    with (newest / "lightning.ckpt").open("r+b") as damaged:
        damaged.truncate(100)
    code, output = run(command, checkpoints)
    assert code == 0, output[-3000:]
    assert before.name in resumed_from(output)
    assert list(checkpoints.glob(f"{newest.name}.damaged-*")) or not newest.exists()
    assert losses(output) == {
        k: v for k, v in losses(golden(command, tmp_path / "golden")).items() if step_of(k) >= step_of(before.name)
    }


def test_a_notice_at_the_last_step_completes_and_a_rerun_from_it_completes_too(tmp_path: Path, scheduler: str) -> None:
    command = [*LIGHTNING, "--steps", "8"]
    checkpoints = tmp_path / "checkpoints"
    # A second a step: the notice surely lands in the last one, on a loaded machine too.
    code, output = run(command, checkpoints, notice_at="step 7 batch 7", api=scheduler, step_seconds=1.0)
    assert code == 0, output[-3000:]  # the work is done: no requeue for it
    assert reported(0) == ["checkpoint", "complete"] and last_step(0) == 8
    # Run again from that checkpoint (as after a crash once it was committed): Lightning skips
    # the training and its hooks, and the job still tells gpupool that it completed.
    code, output = run(command, checkpoints, api=scheduler, attempt=1)
    assert code == 0, output[-3000:]
    assert "step-000000008" in resumed_from(output) and not losses(output)
    assert reported(1) == ["complete"] and last_step(1) == 8


def test_a_notice_whose_deadline_comes_during_the_validation_commits_before_it(tmp_path: Path) -> None:
    """The validation after a step runs before the commit (for the random numbers), unless it
    would run past the deadline: then the step commits at once and the job leaves in time."""
    notice = tmp_path / "notice"
    command = [*LIGHTNING, "--steps", "20", "--val-every", "4", "--validation-seconds", "4", "--step-seconds", "0.05"]
    env = environment(tmp_path / "checkpoints") | {"GPUPOOL_NOTICE_FILE": str(notice)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("step 3 batch 3 ") and not notice.exists():
            deadline = time.time() + 6  # one validation batch of 4 s fits, two do not
            notice.write_text(json.dumps({"deadline": deadline}))
    code = process.wait(timeout=120)
    output = "".join(lines)
    assert code == 75, output[-3000:]
    # The order is what the job decides (the log says it committed before the validation);
    # the clock only gets a generous ceiling: a CI run under load took 2.4 s past the deadline
    # to exit, while running the validations it was told to skip takes 40 s.
    assert "step 4 committed before the validation after it" in output
    assert time.time() < deadline + 20, "it ran the validations instead of leaving"
    assert (tmp_path / "checkpoints" / "step-000000004" / "MANIFEST.json").exists()


def test_a_trainer_given_notice_in_its_last_step_completes(tmp_path: Path, scheduler: str) -> None:
    code, output = run([*HUGGINGFACE, "--steps", "10"], tmp_path, notice_at="step 9", api=scheduler)
    assert code == 0, output[-3000:]
    assert reported(0)[-1:] == ["complete"] and "ack" not in reported(0) and last_step(0) == 10


def test_after_fit_the_signal_handlers_from_before_are_back(tmp_path: Path) -> None:
    out = python(
        "import signal, sys; sys.argv = ['x', '--steps', '2'];"
        "import gpupool.examples.lightning_trainer as t; t.main();"
        "print('after', signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)",
        tmp_path,
    )
    assert "after True" in out.stdout
    out = python(
        "import signal, sys; sys.argv = ['x', '--steps', '4'];"
        "import gpupool.examples.lightning_trainer as t;"
        "t.Regression.training_step = lambda self, batch, i: 1 / 0\n"
        "try: t.main()\n"
        "except ZeroDivisionError: print('failed, then', signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)",
        tmp_path / "failing",
    )
    assert "failed, then True" in out.stdout


def test_lightning_left_to_itself_would_not_resume_and_is_told_so(tmp_path: Path) -> None:
    """A job that forgets `ckpt_path=` starts over: the callback says checkpoints were there."""
    checkpoints = tmp_path / "checkpoints"
    code, _ = run([*LIGHTNING, "--steps", "8"], checkpoints, notice_at="step 3 batch 3")
    assert code == 75
    out = python(
        "import sys; sys.argv = ['x', '--steps', '8'];"
        "import gpupool.integrations.lightning as g; g.GpupoolCallback.ckpt_path = property(lambda self: None);"
        "import gpupool.examples.lightning_trainer as t; t.main()",
        checkpoints,
    )
    assert "was not told to resume from one" in out.stderr


def test_the_trainer_is_refused_settings_that_would_lose_a_save_on_notice(tmp_path: Path) -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from gpupool.integrations.huggingface import GpupoolTrainerCallback

    callback = GpupoolTrainerCallback(directory=tmp_path)
    try:
        for settings in (
            {"save_strategy": "best", "metric_for_best_model": "loss", "eval_strategy": "steps"},
            {"load_best_model_at_end": True, "eval_strategy": "steps", "save_strategy": "steps"},
        ):
            args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], **settings)
            with pytest.raises(ValueError, match="best"):
                callback.on_train_begin(args, TrainerState(), TrainerControl())
    finally:
        callback.gpupool.link.restore_signals()


def test_a_lightning_ddp_job_resumed_on_fewer_ranks_goes_on_from_its_next_step_and_item(
    tmp_path: Path, scheduler: str
) -> None:
    """An elastic job shrunk from 2 ranks to 1: Lightning's state loads (replicated by DDP), the
    rank takes rank 0's random state, and the data goes on from the next item (`Batches`)."""
    command = [*LIGHTNING, "--steps", "12"]
    code, first = run([*command, "--devices", "2"], tmp_path, notice_at="rank 0 step 4 batch 4", api=scheduler)
    assert code == 75, first[-3000:]
    trained = max(step_of(key) for key in losses(first))
    code, second = run(command, tmp_path, api=scheduler, attempt=1)
    assert code == 0, second[-3000:]
    assert f"step-{trained + 1:09d}" in resumed_from(second)
    steps = sorted(step_of(key) for key in losses(second))
    assert steps == list(range(trained + 1, 12)), "every step after the checkpoint, once"
    assert "resharded from 2 ranks to 1" in second
