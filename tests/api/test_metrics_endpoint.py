"""`GET /metrics`: who may scrape it, that it is valid exposition (Prometheus' own linter says
so), and that API requests are counted by route template, never by path."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.errors import StoreUnavailable
from tests.support.apiworld import ADMIN, Api, World, auth, opened, populated


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    for api in opened(tmp_path):
        yield populated(api)


def scrape(api: Api, token: str = ADMIN) -> str:
    assert api.telemetry is not None
    api.telemetry.refresh(api.now[0])
    answer = api.client.get("/metrics", headers=auth(token))
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    text: str = answer.text
    return text


def test_no_token_or_a_jobs_own_token_gets_no_metrics(world: World) -> None:
    api = world.api
    assert api.client.get("/metrics").status_code == 401
    job_token = world.attempt_tokens[world.job_a]
    assert api.client.get("/metrics", headers=auth(job_token)).status_code == 401


def test_a_teams_token_scrapes_the_pools_aggregates(world: World) -> None:
    text = scrape(world.api, world.tokens["b"])
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"gpupool_gpus", "gpupool_jobs", "gpupool_lost_gpu_seconds", "gpupool_queue_wait_seconds"} <= names
    # Per-job detail is for the API and the pages, never a label: no job id, user or command.
    assert "b-secret" not in text
    assert "b1" not in text


def test_requests_are_counted_by_route_template(world: World) -> None:
    api = world.api
    for job in (world.job_a, world.job_b):
        api.client.get(f"/jobs/{job}", headers=auth(ADMIN))
    api.client.get("/nowhere/123", headers=auth(ADMIN))
    api.client.request("BREW", "/jobs", headers=auth(ADMIN))
    text = scrape(api)
    assert api.telemetry is not None
    registry = api.telemetry.registry
    by_template = {"method": "GET", "route": "/jobs/{job_id}", "status": "200"}
    assert registry.get_sample_value("gpupool_http_requests_total", by_template) == 2
    assert (
        registry.get_sample_value("gpupool_http_requests_total", {**by_template, "route": "unmatched", "status": "404"})
        == 1
    )
    assert 'method="other"' in text
    assert f"/jobs/{world.job_a}" not in text


def test_the_exposition_passes_promtool(world: World) -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "the metrics tests need Debian's `prometheus` package (promtool)"
    text = scrape(world.api)
    linted = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_a_request_refused_before_routing_is_counted_under_its_route(world: World) -> None:
    api = world.api
    body = b"x" * (9 * 1024 * 1024)
    answer = api.client.post("/jobs", content=body, headers={**auth(ADMIN), "Content-Type": "application/json"})
    assert answer.status_code == 413
    scrape(api)
    assert api.telemetry is not None
    labels = {"method": "POST", "route": "/jobs", "status": "413"}
    assert api.telemetry.registry.get_sample_value("gpupool_http_requests_total", labels) == 1


def test_a_scrape_answers_while_the_store_does_not_confirm_tokens(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = world.api
    scrape(api, world.tokens["b"])

    def down(_: str) -> None:
        raise StoreUnavailable("the store does not answer")

    monkeypatch.setattr(api.store, "holder_of", down)
    assert api.client.get("/metrics", headers=auth(world.tokens["b"])).status_code == 200
    assert api.client.get("/metrics", headers=auth("never-seen")).status_code == 503
    assert api.client.get("/metrics").status_code == 401


def test_a_scrape_answers_while_the_database_itself_is_down(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlalchemy.exc import OperationalError

    api = world.api
    scrape(api, world.tokens["b"])
    assert api.context is not None
    for digest, (_, who) in list(api.context.scrapers.items()):
        api.context.scrapers[digest] = (time.monotonic() - 120, who)  # confirmed two minutes ago

    def refused(_: str) -> None:
        raise OperationalError("SELECT", {}, Exception("connection refused"))

    monkeypatch.setattr(api.store, "holder_of", refused)
    assert api.client.get("/metrics", headers=auth(world.tokens["b"])).status_code == 200
