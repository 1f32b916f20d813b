"""The control loop with real processes: notice by signal and file, requeue, resume, deadlines."""

from __future__ import annotations

import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpupool.executors import NodeState
from gpupool.executors.local import LocalExecutor
from gpupool.model import DEFAULT_CLASSES, Config, Node, Team
from gpupool.service.loop import ControlLoop
from gpupool.settle import JobState
from gpupool.store import JobSpec, Store
from tests.support.live import wait_for

GRACE = 3.0
CLASSES = tuple(replace(c, grace_period=GRACE, min_runtime=0.0) for c in DEFAULT_CLASSES)
CONFIG = Config(CLASSES, {"vision": Team("vision"), "nlp": Team("nlp")})

# A job in the protocol's terms: on SIGTERM it saves a "checkpoint" and exits 0 (if asked to);
# a resumed attempt finds the checkpoint and finishes.
TRAINER = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    ckpt = Path(os.environ["GPUPOOL_CHECKPOINT_DIR"]) / "state"
    attempt = os.environ["GPUPOOL_ATTEMPT"]
    if sys.argv[1] == "cooperate":
        def stop(signum, frame):
            ckpt.write_text("step 42")
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
    else:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("attempt", attempt, "gpus", os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
    if ckpt.exists():
        print("resumed from", ckpt.read_text(), flush=True)
        sys.exit(0)
    time.sleep(float(sys.argv[2]))
    """
)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[Store, ControlLoop]]:
    store = Store.open(f"sqlite:///{tmp_path / 'gpupool.db'}")
    store.sync_config(CONFIG)
    store.set_nodes([Node("local", 2, "virtual")], virtual=True)
    (tmp_path / "trainer.py").write_text(TRAINER)
    node = NodeState(Node("local", 2, "virtual"), virtual=True)
    loop = ControlLoop(store, CONFIG, LocalExecutor(node), tmp_path / "data", interval=0.5)
    loop.executor = LocalExecutor(node, on_exit=loop.wakeup.set)
    stop = threading.Event()
    runner = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    runner.start()
    yield store, loop
    stop.set()
    loop.wakeup.set()
    runner.join(timeout=10)
    for attempt in store.live_attempts():
        loop.executor.kill(attempt.job_id, attempt.attempt)
    store.close()


def submit(store: Store, loop: ControlLoop, tmp: Path, *args: str, **spec: object) -> int:
    command = [sys.executable, str(tmp / "trainer.py"), *args]
    job = store.submit(JobSpec(command, workdir=str(tmp), **spec), now=time.time())  # type: ignore[arg-type]
    loop.wakeup.set()
    return job.id


def training(loop: ControlLoop, job: int, attempt: int = 0) -> Callable[[], bool]:
    """The attempt has set up its signal handling (it prints once it has)."""
    log = loop.workspace.attempt_dir(job, attempt) / "stdout.log"
    return lambda: log.exists() and f"attempt {attempt}" in log.read_text()


def preempted(store: Store, loop: ControlLoop, tmp: Path, victim: str) -> tuple[int, int, float]:
    """A low job of vision on both GPUs that does as `victim` says on notice (cooperate or
    ignore), then, once it trains, a high job of nlp that preempts it: their ids, and the
    seconds the high job took to run."""
    low = submit(store, loop, tmp, victim, "60", team="vision", priority="low", gpus=2)
    wait_for(training(loop, low))
    high = submit(store, loop, tmp, "cooperate", "0.2", team="nlp", priority="high", gpus=2)
    return low, high, wait_for(lambda: store.job(high).state == JobState.RUNNING.value)


def test_a_cooperating_victim_checkpoints_is_requeued_and_resumes(
    service: tuple[Store, ControlLoop], tmp_path: Path
) -> None:
    store, loop = service
    low, high, latency = preempted(store, loop, tmp_path, "cooperate")
    assert latency < 1.0, f"the preemptor took {latency:.2f} s to start"
    wait_for(lambda: store.job(high).state == JobState.SUCCEEDED.value)
    wait_for(lambda: store.job(low).state == JobState.SUCCEEDED.value)
    job = store.job(low)
    assert (job.attempts, job.preemptions, job.failures) == (2, 1, 0)
    log = (loop.workspace.attempt_dir(low, 1) / "stdout.log").read_text()
    assert "attempt 1 gpus 0,1" in log
    assert "resumed from step 42" in log
    kinds = [e.kind for e in store.events(job_id=low)]
    assert kinds == ["submitted", "starting", "running", "preempting", "pending", "starting", "running", "succeeded"]


def test_a_victim_that_ignores_its_notice_is_killed_at_the_deadline(
    service: tuple[Store, ControlLoop], tmp_path: Path
) -> None:
    store, loop = service
    low, _, latency = preempted(store, loop, tmp_path, "ignore")
    assert GRACE - 0.5 < latency < GRACE + 1.0, f"the preemptor started after {latency:.2f} s"
    assert store.job(low).state == JobState.PENDING.value
    assert (loop.workspace.attempt_dir(low, 0) / "notice").exists()


def test_a_launcher_has_recorded_itself_before_its_pid_is_known(tmp_path: Path) -> None:
    """A scheduler that dies before recording an attempt's handle finds its launcher by its
    record: the launcher writes it before the fork server tells its pid."""
    from gpupool.executors import Launch
    from gpupool.executors.local import LocalExecutor
    from gpupool.executors.proc import owner, process_started, recorded_launcher

    folder = tmp_path / "attempt-0"
    executor = LocalExecutor(NodeState(Node("local", 1)), store_id="s1")
    handle = executor.start(Launch(7, 0, ["sleep", "30"], tmp_path, {}, folder)).handle
    try:
        assert recorded_launcher(folder, owner("s1", 7, 0)) == (handle["pid"], process_started(handle["pid"]))
        assert recorded_launcher(folder, owner("another store", 7, 0)) is None
    finally:
        executor.kill(7, 0)
        wait_for(lambda: bool(executor.poll().ended))
        executor.close()
    assert recorded_launcher(tmp_path / "attempt-1") is None


def test_a_zombie_is_not_alive() -> None:
    import subprocess

    from gpupool.executors.proc import process_started

    child = subprocess.Popen(["true"])
    try:
        stat = Path(f"/proc/{child.pid}/stat")
        wait_for(lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")  # ended, not reaped
        assert process_started(child.pid) is None
    finally:
        child.wait()


def test_a_fresh_store_on_an_old_data_directory_shares_no_job_folder(tmp_path: Path) -> None:
    from gpupool.executors.proc import owner, recorded_exit
    from gpupool.model import DEFAULT_CLASSES, Config
    from tests.support.fakes import FakeExecutor

    data = tmp_path / "data"
    old, new = (Store.open(f"sqlite:///{tmp_path / name}.db") for name in ("old", "new"))
    loops = [ControlLoop(store, Config(DEFAULT_CLASSES), FakeExecutor(store), data) for store in (old, new)]
    spaces = [loop.workspace for loop in loops]
    for store in (old, new):
        store.sync_config(Config(DEFAULT_CLASSES))
        assert store.submit(JobSpec(["train"]), now=0.0).id == 1
    assert spaces[0].job_dir(1) != spaces[1].job_dir(1), "job 1 of each store has a folder of its own"
    folder = spaces[0].attempt_dir(1, 0)
    folder.mkdir(parents=True)
    (folder / "exit.json").write_text(f'{{"exit_code": 3, "owner": "{owner(spaces[0].store_id, 1, 0)}"}}')
    assert recorded_exit(folder, owner(spaces[0].store_id, 1, 0)) == 3
    assert recorded_exit(folder, owner(spaces[1].store_id, 1, 0)) is None, "another store's record is not taken"


def test_a_command_the_launcher_cannot_start_for_the_schedulers_reasons_is_not_the_jobs_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import json

    from gpupool.executors import launcher
    from gpupool.executors.local import LocalExecutor
    from gpupool.executors.proc import owner

    def no_fork(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr("subprocess.Popen", no_fork)
    mine = owner("s1", 4, 0)
    code = launcher.main([str(tmp_path), mine, "-", "/", "/dev/null", "/dev/null", "true"], {})
    assert code == launcher.NOT_STARTED
    assert json.loads((tmp_path / "exit.json").read_text())["not_started"].startswith("[Errno 11]")
    executor = LocalExecutor(NodeState(Node("local", 1)), store_id="s1")
    executor.dirs[(4, 0)] = tmp_path
    ended = executor._exit((4, 0), code)
    assert (ended.started, ended.exit_code) == (False, None) and "Resource temporarily" in str(ended.why)


def test_an_attempt_adopted_again_by_its_own_executor_is_watched_once(tmp_path: Path) -> None:
    from gpupool.executors import Launch, Recorded, Started

    executor = LocalExecutor(NodeState(Node("local", 1)), store_id="s1")
    started = executor.start(Launch(8, 0, ["sleep", "0.5"], tmp_path, {}, tmp_path / "attempt-0"))
    again = executor.adopt(Recorded(8, 0, started.handle, tmp_path / "attempt-0", (), 0.0, None))
    assert isinstance(again, Started) and again.handle == started.handle
    ended: list[object] = []

    def some() -> bool:
        ended.extend(executor.poll().ended)
        return bool(ended)

    wait_for(some, timeout=30)
    time.sleep(0.3)
    ended.extend(executor.poll().ended)
    assert len(ended) == 1, "one exit, not one per adoption"


def test_a_job_gets_the_default_action_of_signals_its_scheduler_ignored_or_blocked(tmp_path: Path) -> None:
    """`gpupool up` run under `nohup`, or with `&` from a script, ignores SIGHUP, or SIGINT and
    SIGQUIT; a library may have blocked some in the thread that starts it; and a process passes
    what it ignores and blocks on to its children. A job must not inherit either (a shell
    session would never be hung up, Ctrl-C would not reach its program)."""
    import signal

    from gpupool.executors import Launch

    ignored, blocked = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT), {signal.SIGHUP, signal.SIGTERM, signal.SIGCHLD}
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in ignored}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        executor = LocalExecutor(NodeState(Node("local", 1)), store_id="s1")
        folder, out = tmp_path / "attempt-0", tmp_path / "status"
        # bash, not sh: Debian's dash clears the mask itself, and would hide an inherited one.
        command = ["bash", "-c", f"grep -E 'SigIgn|SigBlk' /proc/self/status > {out}; sleep 2"]
        launcher = int(executor.start(Launch(7, 0, command, tmp_path, {}, folder)).handle["pid"])
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in before.items():
            signal.signal(sig, handler)
    try:
        wait_for(lambda: out.exists() and out.read_text().count("\n") == 2, timeout=30)
        seen = {"launcher": Path(f"/proc/{launcher}/status").read_text(), "job": out.read_text()}
        wait_for(lambda: bool(executor.poll().ended), timeout=30)
    finally:
        executor.close()
    for who, status in seen.items():
        found = dict(line.split(":", 1) for line in status.splitlines() if line.startswith(("SigIgn", "SigBlk")))
        for name, signals in (("SigIgn", ignored), ("SigBlk", tuple(blocked))):
            bits = int(found[name], 16)
            assert [sig.name for sig in signals if bits & (1 << (sig - 1))] == [], (who, name)
