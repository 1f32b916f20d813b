"""gpupool on a Ray cluster, beside the local executor in the same run: how long a 2-node gang
takes from the decision to every rank running, preemption latency with cooperating victims,
an elastic job's resize latency (a shrink's and a growth's notice to running at the new size)
beside it, attempts started per second, the time from a node's death to its job pending again, and the
core's decision time with 100 Ray nodes' worth of nodes in its snapshot.

A three-node Ray cluster on loopback (127.0.3.2-4, four virtual GPUs each) is started and
stopped by this script; `gpupool up --executor ray` runs in its own process, as in production.
Run: .venv/bin/python -m benchmarks.ray_cluster [--only-resizes]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import ray

from benchmarks.service_throughput import VICTIM, Service, in_state, says_ready, served
from gpupool.demo.loopback import LoopbackCluster
from gpupool.model import DEFAULT_CLASSES, Allocation, Config, Snapshot, Team
from gpupool.policy import PoolState, decide
from tests.support.builders import job, pool, running
from tests.support.live import wait_for

ROUNDS = 10
SHORT_JOBS = 200
ELASTIC: dict[str, object] = {"elastic": {"min_time_at_size": "1s"}}
"""Elastic jobs grow back a second after a resize (the default waits 10 minutes)."""


def event_time(service: Service, job_id: int, kind: str, after: float = 0.0) -> float:
    return next(e.time for e in service.store.events(job_id=job_id) if e.kind == kind and e.time >= after)


def gang_start(service: Service, gpus: int, per_node: int | None) -> list[float]:
    """Seconds from the decision (the attempt's GPUs allocated) to its every member running."""
    took = []
    with service.client() as client:
        for _ in range(ROUNDS):
            body: dict[str, object] = {"command": VICTIM, "priority": "low", "gpus": gpus}
            if per_node is not None:
                body["gpus_per_node"] = per_node
            job_id = client.post("/jobs", json=body).json()["id"]
            wait_for(partial(in_state, service, job_id, ("running",)), timeout=60)
            attempt = service.store.attempts(job_id)[-1]
            took.append(event_time(service, job_id, "running") - attempt.started_at)
            client.post(f"/jobs/{job_id}/cancel")
            wait_for(partial(in_state, service, job_id, ("cancelled",)), timeout=60)
    return took


def preemption(service: Service, nodes: int, per_node: int) -> list[float]:
    """A pool full of cooperating low-priority victims, one a node; a high-priority job that
    needs a whole node: seconds from its arrival to it running."""
    took = []
    with service.client() as client:
        victims = []
        for _ in range(nodes):
            body = {"command": VICTIM, "priority": "low", "gpus": per_node, "gpus_per_node": per_node}
            victims.append(client.post("/jobs", json=body).json()["id"])
        for _ in range(ROUNDS):
            for victim in victims:
                wait_for(partial(says_ready, client, victim), timeout=60)
            began = time.time()
            body = {"command": ["sleep", "0.2"], "priority": "high", "gpus": per_node, "gpus_per_node": per_node}
            urgent = client.post("/jobs", json=body).json()["id"]
            wait_for(partial(in_state, service, urgent, ("running", "succeeded")), timeout=60)
            took.append(event_time(service, urgent, "running") - began)
            wait_for(partial(in_state, service, urgent, ("succeeded",)), timeout=60)
            wait_for(lambda: all(in_state(service, v, ("running",)) for v in victims), timeout=60)
        for victim in victims:
            client.post(f"/jobs/{victim}/cancel")
    return took


def resizes(service: Service, nodes: int, per_node: int) -> tuple[list[float], list[float], list[float]]:
    """An elastic low job of cooperating members holding the whole pool (`nodes` x `per_node`
    GPUs, down to one node's); a high job that needs `per_node` GPUs. Each round: seconds from the
    shrink's notice to the job running again at its smaller size, from the high job's arrival
    to it running, and, once it is done, from the growth's notice to the job running again at
    its largest size."""
    shrunk, preemptor, grown = [], [], []
    sizes = [per_node * k for k in range(1, nodes + 1)] if nodes > 1 else [per_node // 2, per_node]
    body = {"command": VICTIM, "priority": "low", "gpus": sizes[-1], "sizes": sizes}
    if nodes > 1:
        body["gpus_per_node"] = per_node
    with service.client() as client:
        victim = client.post("/jobs", json=body).json()["id"]
        for _ in range(ROUNDS):
            wait_for(lambda: in_state(service, victim, ("running",)) and says_ready(client, victim), timeout=60)
            began = time.time()
            body = {"command": ["sleep", "0.2"], "priority": "high", "gpus": per_node // (1 if nodes > 1 else 2)}
            urgent = client.post("/jobs", json=body).json()["id"]
            wait_for(partial(in_state, service, urgent, ("succeeded",)), timeout=60)
            preemptor.append(event_time(service, urgent, "running") - began)
            shrunk.append(_resized(service, victim, -2))
            wait_for(lambda: service.store.attempts(victim)[-1].gpus == sizes[-1], timeout=60)
            wait_for(partial(in_state, service, victim, ("running",)), timeout=60)
            grown.append(_resized(service, victim, -1))
        client.post(f"/jobs/{victim}/cancel")
    return shrunk, preemptor, grown


def _resized(service: Service, job_id: int, index: int) -> float:
    """Seconds from the notice of the attempt before the `index`th one (from the last) to that
    attempt running."""
    wait_for(lambda: len(service.store.attempts(job_id)) >= -index + 1, timeout=60)
    attempts = service.store.attempts(job_id)
    before, after = attempts[index - 1], attempts[index]
    wait_for(
        lambda: any(e.kind == "running" and e.attempt == after.attempt for e in service.store.events(job_id=job_id))
    )
    running = next(
        e.time for e in service.store.events(job_id=job_id) if e.kind == "running" and e.attempt == after.attempt
    )
    assert before.notice_at is not None and before.outcome == "resized", before.outcome
    return running - before.notice_at


def starts_per_second(service: Service, gpus: int) -> float:
    """SHORT_JOBS one-GPU jobs (`true`) drain onto the pool once a job holding all of it ends:
    attempts reaching RUNNING per second, from the first to the last."""
    with service.client() as client:
        body = {"command": ["sleep", "600"], "priority": "high", "gpus": gpus}
        if gpus > 4:
            body["gpus_per_node"] = 4
        gate = client.post("/jobs", json=body).json()["id"]
        wait_for(partial(in_state, service, gate, ("running",)), timeout=60)
        ids = [
            client.post("/jobs", json={"command": ["true"], "priority": "low"}).json()["id"] for _ in range(SHORT_JOBS)
        ]
        client.post(f"/jobs/{gate}/cancel")
        # Looked at twice a second: the times come from the store's events, and a closer look
        # would take CPU from the scheduler it measures.
        wait_for(lambda: all(in_state(service, j, ("succeeded", "failed")) for j in ids), timeout=600, every=0.5)
        times = sorted(event_time(service, j, "running") for j in ids)
        return (len(times) - 1) / (times[-1] - times[0])


def node_loss(service: Service, cluster: LoopbackCluster) -> tuple[float, float]:
    """A 2-node gang, then SIGKILL of one of its nodes' raylet: seconds until Ray reports the
    node dead, and until the job is pending again."""
    with service.client() as client:
        body = {"command": VICTIM, "priority": "low", "gpus": 4, "gpus_per_node": 2}
        job_id = client.post("/jobs", json=body).json()["id"]
        wait_for(partial(in_state, service, job_id, ("running",)), timeout=60)
        nodes = {p.node for p in service.store.held() if p.job_id == job_id}
        victim = next(n for n in sorted(nodes) if n != cluster.ip(0))
        killed = time.time()
        cluster.kill_node(cluster.names.index(victim))
        dead = None
        while dead is None and time.time() - killed < 60:
            if not any(n["Alive"] and n["NodeManagerAddress"] == victim for n in ray.nodes()):  # type: ignore[no-untyped-call]
                dead = time.time()
            time.sleep(0.02)
        wait_for(lambda: any(e.kind == "pending" for e in service.store.events(job_id=job_id)), timeout=60)
        pending = event_time(service, job_id, "pending", killed)
        client.post(f"/jobs/{job_id}/cancel")
        return (dead or float("nan")) - killed, pending - killed


def decision_time(nodes: int = 100, gpus: int = 8) -> float:
    """Median seconds of one decision: `nodes` nodes of 8 GPUs, every GPU held by 2-GPU jobs,
    200 pending 2-node gangs and a high-priority one that must preempt."""
    cluster = pool(nodes=nodes, gpus=gpus)
    held = [
        running(job(f"r{n}-{i}", cls="low", gpus=2), (Allocation(f"n{n}", (2 * i, 2 * i + 1)),), started=0)
        for n in range(nodes)
        for i in range(gpus // 2)
    ]
    pending = [job(f"p{i}", cls="normal", gpus=16, gpus_per_node=8) for i in range(200)]
    pending.append(job("urgent", cls="urgent", gpus=16, gpus_per_node=8))
    snapshot = Snapshot(nodes=cluster, running=held, pending=pending)
    config = Config(DEFAULT_CLASSES, {"default": Team("default")})
    took = []
    for _ in range(20):
        began = time.perf_counter()
        decide(PoolState.of(snapshot), config, now=10_000.0)
        took.append(time.perf_counter() - began)
    return statistics.median(took)


def show(label: str, seconds: list[float]) -> None:
    median, most = statistics.median(seconds) * 1000, max(seconds) * 1000
    print(f"{label:64} median {median:6.0f} ms, max {most:6.0f} ms", flush=True)


def resize_latency(where: str, shrunk: list[float], preemptor: list[float], grown: list[float]) -> None:
    show(f"shrink, {where}: notice -> running smaller:", shrunk)
    show(f"shrink, {where}: preemptor's arrival -> running:", preemptor)
    show(f"growth, {where}: notice -> running larger:", grown)


def rate(label: str, value: float) -> None:
    print(f"{label:64} {value:6.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only-resizes", action="store_true", help="the resize latencies beside preemption's alone")
    only_resizes = parser.parse_args().only_resizes
    print(f"on {os.cpu_count()} CPUs, Ray {ray.__version__}, {ROUNDS} rounds each", flush=True)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-ray-") as tmp:
        cluster = LoopbackCluster(Path(tmp), k=3)
        cluster.start()
        ray.init(address=cluster.address, namespace="gpupool-bench", log_to_driver=False)
        try:
            ray_settings = {"executor": "ray", "ray_address": cluster.address, "interval": 0.2}
            with served(None, 4, ELASTIC, interval=0.2) as local:
                if not only_resizes:
                    show(
                        "gang start, local executor (1 node x 2 GPUs), decision -> running:", gang_start(local, 2, None)
                    )
                show("preemption latency, local executor (4 GPUs, one victim):", preemption(local, 1, 4))
                resize_latency("local executor (4 GPUs, 2 or 4)", *resizes(local, 1, 4))
                if not only_resizes:
                    rate("attempts reaching running/s, local executor, 4 GPUs:", starts_per_second(local, 4))
            with served(None, 0, ELASTIC, **ray_settings) as remote:
                if not only_resizes:
                    show(
                        "gang start, Ray (2 nodes x 2 GPUs), decision -> every rank running:", gang_start(remote, 4, 2)
                    )
                show("preemption latency, Ray (3 nodes full, 4-GPU preemptor):", preemption(remote, 3, 4))
                resize_latency("Ray (a gang of 1 to 3 nodes x 4 GPUs)", *resizes(remote, 3, 4))
                if only_resizes:
                    return
                rate("attempts reaching running/s, Ray, 3 nodes x 4 GPUs:", starts_per_second(remote, 12))
                detected, pending = node_loss(remote, cluster)
                print(f"{'node lost: Ray marks it dead after':64} {detected * 1000:6.0f} ms", flush=True)
                print(f"{'node lost: its job pending again after':64} {pending * 1000:6.0f} ms", flush=True)
        finally:
            ray.shutdown()
            cluster.stop()
    print(f"{'decision time, 100 nodes x 8 GPUs, 400 running, 201 pending gangs:':64} {decision_time() * 1000:6.1f} ms")


if __name__ == "__main__":
    main()
