"""A real Prometheus (Debian's `prometheus`, on loopback) scrapes a real `gpupool up` with the
shipped configuration and alert rules, through a monitoring team's token as
deploy/prometheus/prometheus.yml says; after a workload with a preemption, PromQL over its HTTP
API gives what the store says."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpupool.up import free_port
from tests.support.live import Service, running, state, wait_for

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(Service(tmp_path, grace="3s"))


class Prometheus:
    def __init__(self, folder: Path, target: int, token: str) -> None:
        prometheus = shutil.which("prometheus")
        assert prometheus is not None, "this test needs Debian's `prometheus` package"
        config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        (scrape,) = config["scrape_configs"]
        scrape["static_configs"] = [{"targets": [f"127.0.0.1:{target}"]}]
        token_file = folder / "gpupool.token"
        token_file.write_text(token + "\n")
        scrape["authorization"]["credentials_file"] = str(token_file)
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        shutil.copy(DEPLOY / "alerts.yml", folder / "alerts.yml")
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                prometheus,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(folder / "prometheus.log").open("w"),
        )
        self.log = folder / "prometheus.log"
        wait_for(self.ready, timeout=60)

    def ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/-/ready").is_success
        except httpx.TransportError:
            return False

    def api(self, path: str, **params: str) -> Any:
        answer = httpx.get(f"http://127.0.0.1:{self.port}/api/v1/{path}", params=params)
        answer.raise_for_status()
        return answer.json()["data"]

    def value(self, query: str) -> float | None:
        """The single value of an instant query; None if it has none yet."""
        result = self.api("query", query=query)["result"]
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gpupool-prometheus-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def trainer(steps: int) -> list[str]:
    return [sys.executable, "-m", "gpupool.examples.trainer", "--steps", str(steps), "--step-seconds", "0.2"]


def test_prometheus_scrapes_what_the_store_says(service: Service, folder: Path) -> None:
    made = service.cli("team", "set", "monitoring", "--new-token")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1].split()[-1]
    prometheus = Prometheus(folder, service.port, token)
    try:
        wait_for(lambda: prometheus.value('up{job="gpupool"}') == 1, timeout=60)
        low = service.submit("--gpus", "2", "--", *trainer(40))
        wait_for(lambda: "step 8 " in (service.cli("logs", str(low)).stdout), timeout=60)
        high = service.submit("--gpus", "2", "--priority", "high", "--", "sleep", "0.5")
        # (The victim drains for less than a second: too short a state to wait for in a scrape.)
        wait_for(lambda: prometheus.value("sum(gpupool_preemptions_total)") == 1, timeout=60)
        wait_for(lambda: state(service, low) == "succeeded" and state(service, high) == "succeeded", timeout=120)
        wait_for(lambda: prometheus.value("sum(gpupool_jobs_finished_total)") == 2, timeout=60)
        wait_for(lambda: prometheus.value("sum(gpupool_interruptions_total)") == 1, timeout=60)

        report = service.get("/report")
        assert report is not None
        pool = report.json()["pool"]
        assert prometheus.value("sum(gpupool_lost_gpu_seconds_total)") == pytest.approx(pool["lost"], abs=1e-6)
        assert prometheus.value('sum(gpupool_allocated_gpu_seconds_total{use="productive"})') == pytest.approx(
            pool["productive"], abs=1e-6
        )
        assert prometheus.value("sum(gpupool_allocated_gpu_seconds_total)") == pytest.approx(
            pool["allocated"], abs=1e-6
        )
        assert prometheus.value('sum(gpupool_preemptions_total{reason="priority", class="low"})') == 1
        assert prometheus.value('sum(gpupool_attempts_started_total{kind="resume"})') == 1
        assert prometheus.value('sum(gpupool_gpus{state="idle"})') == 2
        assert prometheus.value('sum(gpupool_jobs{state="pending"})') == 0
        assert prometheus.value('sum(gpupool_queue_wait_seconds_count{class="high"})') == 1

        (group,) = prometheus.api("rules")["groups"]
        assert len(group["rules"]) == 9
        assert {r["health"] for r in group["rules"]} == {"ok"}, group["rules"]
        assert not [a for a in prometheus.api("alerts")["alerts"] if a["state"] == "firing"]
    finally:
        prometheus.stop()
    assert "level=error" not in prometheus.log.read_text()
