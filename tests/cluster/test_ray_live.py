"""`gpupool up --executor ray` on a real three-node Ray cluster on loopback: where gangs land,
what a lost node does to its job, and a scheduler killed while gangs run."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.demo.loopback import LoopbackCluster
from gpupool.executors import Executor, Exit, Launch, Member, Recorded, Started
from gpupool.executors.proc import kill_attempts, process_started
from gpupool.up import free_port
from tests.support.live import assert_no_gpu_held_twice, running, state, wait_for
from tests.support.ray import RayService, job
from tests.support.users import os_user


def node_of(executor: Any, name: str) -> Any:
    """The pool's node of that name, once its launcher is up (under load it may take longer
    than the executor waited for when it started)."""
    wait_for(lambda: name in {state.node.name for state in executor.nodes()}, timeout=60)
    return executor.pool.by_name(name)


@pytest.fixture
def service(cluster: LoopbackCluster, tmp_path: Path) -> Iterator[RayService]:
    yield from running(RayService(tmp_path, cluster.address))  # type: ignore[misc]


def test_every_ray_node_is_in_the_pool_and_a_gang_lands_where_the_core_placed_it(
    service: RayService, cluster: LoopbackCluster
) -> None:
    pool = service.get("/pool")
    assert pool is not None
    assert sorted(n["name"] for n in pool.json()["nodes"]) == [cluster.ip(i) for i in range(3)]
    job_id = service.gang()
    wait_for(lambda: state(service, job_id) == "running", timeout=60)
    placement = job(service, job_id)["placement"]
    assert isinstance(placement, dict) and len(placement) == 2
    reports = service.reports(job_id)
    assert [r["RANK"] for r in reports] == ["0", "1"] and {r["WORLD_SIZE"] for r in reports} == {"2"}
    for report in reports:
        node = str(report["GPUPOOL_NODE_ADDRESS"])  # where Ray ran it, as Ray says
        assert node == report["GPUPOOL_NODE"] and node in placement
        assert report["CUDA_VISIBLE_DEVICES"] == ",".join(str(g) for g in placement[node])
    assert {r["MASTER_ADDR"] for r in reports} == {reports[0]["GPUPOOL_NODE"]}
    assert len({r["MASTER_PORT"] for r in reports}) == 1
    service.done.touch()
    wait_for(lambda: state(service, job_id) == "succeeded", timeout=60)


def test_a_lost_node_requeues_its_gang_which_resumes_on_the_nodes_left(
    service: RayService, cluster: LoopbackCluster
) -> None:
    job_id = service.gang()
    wait_for(lambda: state(service, job_id) == "running", timeout=60)
    placement = job(service, job_id)["placement"]
    assert isinstance(placement, dict)
    reports = service.reports(job_id)
    victim = next(n for n in sorted(placement) if n != cluster.ip(0))  # the head's raylet carries the scheduler
    survivor = next(r for r in reports if r["GPUPOOL_NODE"] != victim)
    lost_at = time.time()
    cluster.kill_node(cluster.names.index(victim))

    def requeued_and_running() -> bool:
        shown = job(service, job_id)
        return shown["state"] == "running" and int(str(shown["attempts"])) == 2

    wait_for(requeued_and_running, timeout=90)
    shown = job(service, job_id)
    history = shown["history"]
    assert isinstance(history, list)
    assert history[0]["outcome"] == "node_lost"
    assert history[0]["ended_at"] - lost_at < 30, "Ray's tuned health checks see a dead node in seconds"
    assert (shown["failures"], shown["preemptions"], shown["node_losses"]) == (0, 0, 1)
    now_on = shown["placement"]
    assert isinstance(now_on, dict) and victim not in now_on and len(now_on) == 2
    assert process_started(int(str(survivor["pid"]))) is None, "no rank of the lost attempt is left running"
    account = shown["account"]
    assert isinstance(account, dict)
    assert [i["cause"] for i in account["interruptions"]] == ["node_lost"]
    pool = service.get("/pool")
    assert pool is not None and victim not in [n["name"] for n in pool.json()["nodes"]]
    service.done.touch()
    wait_for(lambda: state(service, job_id) == "succeeded", timeout=60)


def test_a_scheduler_killed_while_a_gang_runs_adopts_it_and_the_job_runs_once(service: RayService) -> None:
    job_id = service.gang()
    wait_for(lambda: state(service, job_id) == "running", timeout=60)
    before = service.reports(job_id)
    service.kill()
    service.up()
    wait_for(lambda: state(service, job_id) == "running", timeout=30)
    assert job(service, job_id)["attempts"] == 1
    assert all(process_started(int(str(r["pid"]))) for r in before), "its members ran on while it was down"
    service.done.touch()
    wait_for(lambda: state(service, job_id) == "succeeded", timeout=60)
    shown = job(service, job_id)
    history = shown["history"]
    assert isinstance(history, list)
    assert shown["attempts"] == 1 and [a["outcome"] for a in history] == ["succeeded"]


def ended_soon(executor: Executor) -> list[Exit]:
    ended: list[Exit] = []

    def some() -> bool:
        ended.extend(executor.poll().ended)
        return bool(ended)

    wait_for(some, timeout=30)
    return ended


PIDS = "import os, sys, time; open(sys.argv[1] + '/' + os.environ['RANK'], 'w').write(str(os.getpid())); time.sleep(60)"


def test_a_gang_whose_node_does_not_answer_in_time_is_given_back_whole(
    cluster: LoopbackCluster, tmp_path: Path
) -> None:
    import signal

    import ray

    from gpupool.executors.ray.executor import RayExecutor

    executor = RayExecutor(cluster.address, "placement-test", start_timeout=3.0)
    hung = None
    try:
        head, other = cluster.ip(0), cluster.ip(1)
        members = (Member(0, head, (0, 1)), Member(1, other, (0, 1)))
        node_of(executor, head)
        node = node_of(executor, other)
        hung = int(ray.get(node.launcher.ping.remote(), timeout=30)["pid"])
        os.kill(hung, signal.SIGSTOP)  # the node hangs between the decision and the launch
        out = tmp_path / "pids"
        out.mkdir()
        began = time.monotonic()
        executor.start(Launch(2, 0, [sys.executable, "-c", PIDS, str(out)], tmp_path, {}, tmp_path / "b", members))
        [given_back] = ended_soon(executor)
        assert given_back.started is False and "within 3 s" in str(given_back.why)
        assert time.monotonic() - began < 15
        assert (2, 0) not in executor.gangs
        os.kill(hung, signal.SIGCONT)
        hung = None
        time.sleep(2)  # the node answers again: its late start is refused, or its member killed
        pids = [int(p.read_text()) for p in out.iterdir() if p.read_text()]
        wait_for(lambda: not any(process_started(pid) for pid in pids), timeout=15)
        executor.start_timeout = 60.0  # under load, starting may take more than 3 s
        executor.start(Launch(2, 1, ["true"], tmp_path, {}, tmp_path / "c", members))
        again = ended_soon(executor)
        assert [e.exit_code for e in again] == [0], f"placed again once its node answers: {again}"
    finally:
        if hung is not None:
            os.kill(hung, signal.SIGCONT)
        executor.close()
        os.environ.pop("RAY_ADDRESS", None)


DDP = [sys.executable, "-m", "gpupool.examples.ddp_trainer", "--steps", "100"]
"""Long enough (10 s at 0.1 s a step) that the preemption comes before the end on a loaded machine."""


def losses(output: str) -> dict[int, str]:
    return {int(s): bits for s, bits in re.findall(r"^rank \d+ step (\d+) loss (\S+)$", output, re.MULTILINE)}


def golden_run(folder: Path) -> list[str]:
    """The job's two ranks on this machine, nobody interrupting them: each rank's output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env |= {"GPUPOOL_CHECKPOINT_DIR": str(folder), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env |= {"WORLD_SIZE": "2"}
    ranks = [subprocess.Popen(DDP, env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, text=True) for r in range(2)]
    return [rank.communicate(timeout=180)[0] for rank in ranks]


def test_a_two_node_job_preempted_through_ray_resumes_bit_identical(cluster: LoopbackCluster, tmp_path: Path) -> None:
    golden = golden_run(tmp_path / "golden")
    (tmp_path / "pool").mkdir()
    service = RayService(tmp_path / "pool", cluster.address, grace="20s")
    service.up()
    try:
        job_id = service.submit("--gpus", "4", "--gpus-per-node", "2", "--", *DDP, "--step-seconds", "0.1")
        wait_for(lambda: "step 12 " in service.cli("logs", str(job_id), "--rank", "1").stdout, timeout=120)
        urgent = service.run_cli(
            service.env,
            "submit",
            "--parsable",
            "-p",
            "high",
            "--gpus",
            "12",
            "--gpus-per-node",
            "4",
            "--",
            "sleep",
            "1",
        )
        assert urgent.returncode == 0, urgent.stderr
        wait_for(lambda: state(service, job_id) == "succeeded", timeout=240)
        shown = job(service, job_id)
        assert (shown["attempts"], shown["preemptions"]) == (2, 1)
        for rank in range(2):
            outputs = [
                service.cli("logs", str(job_id), "--rank", str(rank), "--attempt", str(a)).stdout for a in range(2)
            ]
            assert f"from step {max(losses(outputs[0])) + 1}" in outputs[1], (
                "every rank resumed right after its last step"
            )
            merged: dict[int, str] = {}
            for output in outputs:
                for step, bits in losses(output).items():
                    assert merged.setdefault(step, bits) == bits
            assert merged == losses(golden[rank]), f"rank {rank}'s losses, bit for bit"
        final = service.cli("logs", str(job_id), "--rank", "0", "--attempt", "1").stdout.strip().splitlines()[-1]
        assert final == golden[0].strip().splitlines()[-1], "the same final state"
        account = shown["account"]
        assert isinstance(account, dict) and [i["cause"] for i in account["interruptions"]] == ["preempted"]
        assert all(i["wasted"] == 0 for i in account["interruptions"]), "every rank left on notice, saved together"
    finally:
        if service.process is not None and service.process.poll() is None:
            service.process.terminate()
            service.process.wait(timeout=20)
        kill_attempts(service.data)


def test_an_elastic_gang_shrinks_to_one_node_for_a_high_job_and_grows_back_through_ray(
    cluster: LoopbackCluster, tmp_path: Path
) -> None:
    (tmp_path / "pool").mkdir()
    elastic = "elastic: {min_time_at_size: 10s}\n"
    service = RayService(tmp_path / "pool", cluster.address, grace="20s", more=elastic)
    service.up()
    try:
        command = [*DDP[:-1], "300", "--step-seconds", "0.1"]
        job_id = service.submit("--nodes", "1-2", "--gpus-per-node", "2", "--", *command)
        wait_for(lambda: "step 12 " in service.cli("logs", str(job_id), "--rank", "1").stdout, timeout=120)
        urgent = service.run_cli(service.env, "submit", "--parsable", "-p", "high", "--gpus", "10", "--", "sleep", "1")
        assert urgent.returncode == 0, urgent.stderr
        wait_for(lambda: state(service, job_id) == "succeeded", timeout=300)
        shown: Any = job(service, job_id)
        history = shown["history"]
        assert [(a["gpus"], a["outcome"]) for a in history] == [(4, "resized"), (2, "resized"), (4, "succeeded")]
        assert shown["preemptions"] == 0 and state(service, int(urgent.stdout)) == "succeeded"
        logs = [service.cli("logs", str(job_id), "--rank", "0", "--attempt", str(a)).stdout for a in range(3)]
        trained = [log for log in logs if losses(log)]
        for earlier, later in itertools.pairwise(trained):
            assert f"from step {max(losses(earlier)) + 1}" in later, "resumed right after its last step"
        assert "rank 0 of 1" in logs[1] and "rank 0 of 2" in logs[2], "each attempt at its own world size"
        steps: set[int] = set().union(*(losses(log) for log in trained))
        assert steps == set(range(300)), "every step once, none skipped"
        assert [i["cause"] for i in shown["account"]["interruptions"]] == ["resized", "resized"]
        output = service.output()
        assert "SnapshotDrift" not in output and "tick failed" not in output, output[-3000:]
    finally:
        if service.process is not None and service.process.poll() is None:
            service.process.terminate()
            service.process.wait(timeout=20)
        kill_attempts(service.data)


TRAP = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    out = Path(sys.argv[1])
    signal.signal(signal.SIGTERM, lambda *_: (out.joinpath(os.environ["RANK"]).touch(), sys.exit(0)))
    out.joinpath("ready-" + os.environ["RANK"]).touch()
    if os.environ["RANK"] == sys.argv[2]:
        time.sleep(1)
        sys.exit(3)
    time.sleep(120)
    """
)


@pytest.fixture
def executor(cluster: LoopbackCluster) -> Iterator[Any]:
    from gpupool.executors.ray.executor import RayExecutor

    made = RayExecutor(cluster.address, "review-findings", start_timeout=20.0, wait_timeout=1.0)
    made.nodes()
    yield made
    made.close()


def pair(cluster: LoopbackCluster) -> tuple[Member, Member]:
    return (Member(0, cluster.ip(1), (0, 1)), Member(1, cluster.ip(2), (2, 3)))


def trapping(executor: Any, cluster: LoopbackCluster, folder: Path, job_id: int, failing: str = "none") -> Path:
    """A gang of two ranks that each touch `out/RANK` on SIGTERM and leave (rank `failing`
    exits 3 after a second), running with both ranks ready; returns `out`."""
    script, out = folder / "trap.py", folder / f"out-{job_id}"
    script.write_text(TRAP)
    out.mkdir()
    command = [sys.executable, str(script), str(out), failing]
    executor.start(Launch(job_id, 0, command, folder, {}, folder / f"attempt-{job_id}", pair(cluster)))
    if failing == "none":
        wait_for(lambda: bool(executor.poll().running), timeout=60)
        wait_for(lambda: (out / "ready-0").exists() and (out / "ready-1").exists(), timeout=30)
    return out


def test_every_rank_gets_notice_and_one_that_fails_is_the_exit_reported(
    executor: Any, cluster: LoopbackCluster, tmp_path: Path
) -> None:
    out = trapping(executor, cluster, tmp_path, 1)
    time.sleep(2.5)  # longer than a wait's timeout: it is asked again, and the exit still comes
    executor.notify(1, 0, time.time() + 30)
    [ended] = ended_soon(executor)
    assert ended.exit_code == 0 and sorted(p.name for p in out.glob("[01]")) == ["0", "1"], "both ranks got SIGTERM"
    assert (tmp_path / "attempt-1" / "notice").exists()
    trapping(executor, cluster, tmp_path, 2, failing="1")
    [failed] = ended_soon(executor)
    assert failed.exit_code == 3, "the rank whose failure stopped the others, not a rank killed after it"


def test_a_gang_adopted_again_by_its_own_executor_runs_on_and_ends_once(
    executor: Any, cluster: LoopbackCluster, tmp_path: Path
) -> None:
    launch = Launch(3, 0, ["sleep", "3"], tmp_path, {}, tmp_path / "c", pair(cluster))
    started = executor.start(launch)
    wait_for(lambda: bool(executor.poll().running), timeout=60)
    again = executor.adopt(Recorded(3, 0, started.handle, tmp_path / "c", (), time.time(), None))
    assert isinstance(again, Started) and again.running, "after a halt: still watched, not lost"
    assert [e.exit_code for e in ended_soon(executor)] == [0]
    time.sleep(1.5)
    assert not executor.poll().ended, "one exit only"


def test_a_gang_whose_members_never_started_is_given_back_not_lost(
    executor: Any, cluster: LoopbackCluster, tmp_path: Path
) -> None:
    node = node_of(executor, cluster.ip(1))
    # The scheduler died after recording the handle, before the launcher started the member.
    handle = {"executor": "ray", "name": "x", "ranks": 1, "nodes": [cluster.ip(1)], "node_ids": [node.id]}
    found = executor.adopt(Recorded(4, 0, handle, tmp_path / "d", (), time.time(), None))
    assert isinstance(found, Exit) and found.started is False and found.node_lost is None
    found = executor.adopt(Recorded(5, 0, None, tmp_path / "e", (), time.time(), None))  # before the handle
    assert isinstance(found, Exit) and found.started is False and found.node_lost is None
    handle = {**handle, "node_ids": ["0" * 56]}  # its node died while no scheduler watched
    found = executor.adopt(Recorded(6, 0, handle, tmp_path / "f", (), time.time(), None))
    assert isinstance(found, Exit) and found.node_lost is not None


def test_a_notice_recorded_but_not_given_is_given_when_adopted(
    executor: Any, cluster: LoopbackCluster, tmp_path: Path
) -> None:
    from gpupool.executors.ray.executor import RayExecutor

    out = trapping(executor, cluster, tmp_path, 6)
    handle = executor.handle(executor.gangs[(6, 0)])
    executor.close()  # the scheduler stops; the gang runs on
    successor = RayExecutor(cluster.address, "review-findings", wait_timeout=1.0)
    try:
        recorded = Recorded(6, 0, handle, tmp_path / "attempt-6", (), time.time(), time.time() + 30)
        found = successor.adopt(recorded)
        assert isinstance(found, Started) and found.running
        [ended] = ended_soon(successor)
        assert ended.exit_code == 0 and sorted(p.name for p in out.glob("[01]")) == ["0", "1"]
    finally:
        successor.close()


def test_the_cluster_demo_preempts_loses_a_node_and_resumes_bit_identical() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "demo", "--cluster"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "requeued after notice (exit code 75)" in out
    assert "node loss 1 of 3" in out and "node_lost: wasted" in out
    assert "bit-identical" in out and "stopped everything the demo started" in out


def test_the_pool_follows_ray_as_a_node_leaves_and_comes_back(executor: Any, cluster: LoopbackCluster) -> None:
    import ray

    def alive() -> set[str]:
        return {n["NodeName"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")}  # type: ignore[no-untyped-call]

    def pool() -> set[str]:
        return {state.node.name for state in executor.nodes()}

    def reserved() -> set[str]:
        """The node ids the pool holds GPUs on in Ray."""
        from ray.util.placement_group import placement_group_table

        table = placement_group_table().values()
        return {e["name"].rsplit(":", 1)[-1] for e in table if e["state"] != "REMOVED" and ":node:" in e["name"]}

    assert pool() == alive() == set(cluster.names)
    dying = node_of(executor, cluster.ip(2)).id
    assert dying in reserved()
    cluster.kill_node(2)
    wait_for(lambda: cluster.ip(2) not in alive(), timeout=60)
    wait_for(lambda: pool() == alive() == set(cluster.names) - {cluster.ip(2)}, timeout=5)
    wait_for(lambda: dying not in reserved(), timeout=10)
    cluster.add_node(2)
    wait_for(lambda: pool() == alive() == set(cluster.names), timeout=60)


DRAIN = textwrap.dedent(
    """
    import signal, sys, time
    from pathlib import Path
    def drain(*_):
        time.sleep(3)  # saving, slowly
        sys.exit(0)
    signal.signal(signal.SIGTERM, drain)
    print("ready", flush=True)
    done = Path(sys.argv[1])
    while not done.exists():
        time.sleep(0.1)
    """
)


def test_a_scheduler_killed_while_a_gang_drains_adopts_it_and_no_gpu_is_held_twice(
    cluster: LoopbackCluster, tmp_path: Path
) -> None:
    service = RayService(tmp_path, cluster.address, grace="60s")
    script = tmp_path / "drain.py"
    script.write_text(DRAIN)
    service.up()
    try:
        victim = service.submit(
            "--gpus", "12", "--gpus-per-node", "4", "--", sys.executable, str(script), str(service.done)
        )
        wait_for(lambda: state(service, victim) == "running", timeout=60)
        wait_for(lambda: "ready" in service.cli("logs", str(victim), "--rank", "2").stdout, timeout=60)
        urgent = service.run_cli(service.env, "submit", "--parsable", "-p", "high", "--gpus", "4", "--", "sleep", "1")
        assert urgent.returncode == 0, urgent.stderr
        wait_for(lambda: state(service, victim) == "preempting", timeout=30)
        service.kill()  # while every rank drains
        service.up()
        wait_for(lambda: state(service, int(urgent.stdout)) == "succeeded", timeout=90)
        wait_for(lambda: state(service, victim) == "running", timeout=90)
        service.done.touch()
        wait_for(lambda: state(service, victim) == "succeeded", timeout=90)
        shown = job(service, victim)
        history = shown["history"]
        assert isinstance(history, list)
        assert [a["outcome"] for a in history] == ["preempted", "succeeded"], "each attempt ended once"
    finally:
        if service.process is not None and service.process.poll() is None:
            service.process.terminate()
            service.process.wait(timeout=20)
        kill_attempts(service.data)
    assert_no_gpu_held_twice(service)


WHO = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    data = Path(sys.argv[1])
    try:
        (data / "admin.token").read_text()
        token = "read"
    except OSError as exc:
        token = "refused: " + type(exc).__name__
    protocol = {"API", "ARRAY_ID", "ARRAY_INDEX", "ATTEMPT", "CACHE_DIR", "CHECKPOINT_DIR", "GPUS_ON_NODE",
                "INTERRUPTION_INTERVAL", "JOB_ID", "NODE", "NODE_ADDRESS", "NOTICE_FILE", "TOKEN"}
    # Ray's variables, and any of gpupool's that the job protocol does not give a job.
    ray = sorted(k for k in os.environ if k.startswith("RAY_")
                 or k.startswith("GPUPOOL_") and k.removeprefix("GPUPOOL_") not in protocol)
    print(json.dumps({"uid": os.getuid(), "rank": os.environ["RANK"], "admin.token": token, "ray env": ray}))
    """
)


def test_every_rank_runs_as_the_jobs_user_and_reaches_nothing_of_the_schedulers(
    cluster: LoopbackCluster,
) -> None:
    import pwd
    import shutil
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("runs ranks as another OS user")
    os_user("gpupool-vision")
    top = Path(tempfile.mkdtemp(prefix="gpupool-ray-trust-"))
    top.chmod(0o711)
    work = top / "work"
    work.mkdir()
    work.chmod(0o777)
    (work / "who.py").write_text(WHO)
    service = RayService(top, cluster.address)
    service.config.write_text(
        service.config.read_text().replace("run_as: service", "run_as: team") + "teams: {vision: {}}\n"
    )
    service.up()
    try:
        command = ["/usr/bin/python3", str(work / "who.py"), str(service.data)]
        job_id = service.submit(
            "--team",
            "vision",
            "--chdir",
            str(work),
            "--export",
            "NONE",
            "--gpus",
            "4",
            "--gpus-per-node",
            "2",
            "--",
            *command,
        )
        wait_for(lambda: state(service, job_id) == "succeeded", timeout=90)
        reports = service.reports(job_id)
        uid = pwd.getpwnam("gpupool-vision").pw_uid
        assert [(r["uid"], r["admin.token"], r["ray env"]) for r in reports] == [
            (uid, "refused: PermissionError", [])
        ] * 2, "each rank on its node: the team's user, no scheduler data, no Ray or launcher variables"
    finally:
        if service.process is not None and service.process.poll() is None:
            service.process.terminate()
            service.process.wait(timeout=20)
        kill_attempts(service.data)
        shutil.rmtree(top, ignore_errors=True)


def test_an_attempt_that_ends_at_once_is_reported_running_first(
    executor: Any, cluster: LoopbackCluster, tmp_path: Path
) -> None:
    for node in range(3):  # a member on every node: each launcher has an `ended` call out
        executor.start(
            Launch(
                10 + node,
                0,
                ["sleep", "60"],
                tmp_path,
                {},
                tmp_path / f"s-{node}",
                (Member(0, cluster.ip(node), (3,)),),
            )
        )
    running: set[tuple[int, int]] = set()

    def reported(count: int) -> bool:
        running.update(executor.poll().running)
        return len(running) == count

    wait_for(lambda: reported(3), timeout=60)
    keys = {(job_id, 0) for job_id in range(20, 32)}
    with executor.lock:  # the watcher waits: the answers to the starts and the ends pile up
        for job_id, attempt in sorted(keys):
            member = (Member(0, cluster.ip(job_id % 3), (job_id % 3,)),)
            executor.start(Launch(job_id, attempt, ["true"], tmp_path, {}, tmp_path / f"a-{job_id}", member))
        wait_for(lambda: all((tmp_path / f"a-{j}" / "exit.json").exists() for j, _ in keys), timeout=60)
        time.sleep(1)
    ended: list[Exit] = []

    def all_ended() -> bool:
        progress = executor.poll()
        running.update(progress.running)
        for exit in progress.ended:
            assert (exit.job_id, exit.attempt) in running, f"{exit} ended before it was reported running"
        ended.extend(progress.ended)
        return len(ended) == len(keys)

    wait_for(all_ended, timeout=60)
    assert {(e.job_id, e.attempt) for e in ended} == keys and {e.exit_code for e in ended} == {0}


def test_a_rank_that_fails_before_the_others_start_fails_the_attempt_and_they_never_run(
    executor: Any, cluster: LoopbackCluster, tmp_path: Path
) -> None:
    import signal

    import ray

    node = node_of(executor, cluster.ip(2))
    hung = int(ray.get(node.launcher.ping.remote(), timeout=30)["pid"])
    out = tmp_path / "pids"
    out.mkdir()
    script = "import os, sys\nif os.environ['RANK'] == '0':\n    sys.exit(3)\n" + PIDS.replace("; ", "\n")
    os.kill(hung, signal.SIGSTOP)
    try:
        members = (Member(0, cluster.ip(1), (0,)), Member(1, cluster.ip(2), (0,)))
        executor.start(Launch(70, 0, [sys.executable, "-c", script, str(out)], tmp_path, {}, tmp_path / "g", members))
        [failed] = ended_soon(executor)
        assert (failed.exit_code, failed.started) == (3, True), "the job's failure, not a launch given back"
    finally:
        os.kill(hung, signal.SIGCONT)
    time.sleep(2)  # rank 1's start reaches its launcher now: refused, or killed at once
    pids = [int(p.read_text()) for p in out.iterdir() if p.read_text()]
    wait_for(lambda: not any(process_started(pid) for pid in pids), timeout=15)


def test_a_gang_whose_handle_was_never_recorded_is_stopped_wherever_it_started(
    executor: Any, cluster: LoopbackCluster, tmp_path: Path
) -> None:
    from gpupool.executors.ray.executor import RayExecutor

    out = tmp_path / "pids"
    out.mkdir()
    members = pair(cluster)
    executor.start(Launch(80, 0, [sys.executable, "-c", PIDS, str(out)], tmp_path, {}, tmp_path / "h", members))
    wait_for(lambda: len(list(out.iterdir())) == 2 and all(p.read_text() for p in out.iterdir()), timeout=60)
    pids = [int(p.read_text()) for p in out.iterdir()]
    executor.close()  # the scheduler dies after its start calls, before it records the handle
    successor = RayExecutor(cluster.address, "review-findings", wait_timeout=1.0)
    try:
        found = successor.adopt(Recorded(80, 0, None, tmp_path / "h", (), time.time(), None))
        assert isinstance(found, Exit) and found.started is False
        wait_for(lambda: not any(process_started(pid) for pid in pids), timeout=15)
    finally:
        successor.close()


def test_a_gang_killed_but_not_yet_recorded_is_not_taken_for_one_that_never_ran(
    executor: Any, cluster: LoopbackCluster, tmp_path: Path
) -> None:
    trapping(executor, cluster, tmp_path, 81)
    handle = executor.handle(executor.gangs[(81, 0)])
    executor.kill(81, 0)  # cancelled: SIGKILL, no exit record
    ended_soon(executor)  # the scheduler dies before it records this end
    found = executor.adopt(Recorded(81, 0, handle, tmp_path / "attempt-81", (), time.time(), None))
    assert isinstance(found, Exit) and found.started is True and found.exit_code is None


def test_a_gang_an_older_gpupool_started_is_stopped_and_its_gpus_come_back(
    executor: Any, cluster: LoopbackCluster, tmp_path: Path
) -> None:
    import ray
    from ray.util.placement_group import placement_group, placement_group_table

    from gpupool.executors.proc import owner

    @ray.remote(num_cpus=0)
    class OlderLauncher:
        def ping(self) -> int:
            return 1

    name = owner(executor.store_id, 82, 0)
    group = placement_group([{"CPU": 0.01}], name=name, lifetime="detached")
    ray.get(group.ready(), timeout=30)
    actor = OlderLauncher.options(  # type: ignore[attr-defined]
        name=f"{name}:0", namespace=executor.namespace, lifetime="detached"
    ).remote()
    ray.get(actor.ping.remote(), timeout=30)
    handle = {"executor": "ray", "namespace": executor.namespace, "group": name, "ranks": 1, "nodes": [cluster.ip(1)]}
    found = executor.adopt(Recorded(82, 0, handle, tmp_path / "o", (), time.time(), None))
    assert isinstance(found, Exit) and found.node_lost is not None, "requeued, not charged to the job"
    wait_for(lambda: not any(e["name"] == f"{name}:0" for e in ray.util.list_named_actors(all_namespaces=True)))
    wait_for(lambda: all(e["state"] == "REMOVED" for e in placement_group_table().values() if e["name"] == name))


def test_a_gang_whose_launcher_was_replaced_while_no_scheduler_watched_lost_its_node(
    executor: Any, cluster: LoopbackCluster, tmp_path: Path
) -> None:
    import ray

    from gpupool.executors.ray.executor import RayExecutor

    trapping(executor, cluster, tmp_path, 83)
    handle = executor.handle(executor.gangs[(83, 0)])
    node = node_of(executor, cluster.ip(2))
    executor.close()  # the scheduler is down; rank 1's launcher dies, and its member with it
    ray.kill(node.launcher, no_restart=True)
    successor = RayExecutor(cluster.address, "review-findings", wait_timeout=1.0)  # a new launcher there
    try:
        found = successor.adopt(Recorded(83, 0, handle, tmp_path / "attempt-83", (), time.time(), None))
        assert isinstance(found, Exit) and found.node_lost is not None, "lost with its node, not the job's failure"
    finally:
        successor.close()
