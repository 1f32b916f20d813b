"""The OpenAPI document says exactly what the API answers: its errors, its enumerations, its
security scheme and the shape of every answer."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.settle import JobState
from tests.support.apiworld import opened


@pytest.fixture
def document(tmp_path: Path) -> Iterator[dict[str, Any]]:
    for api in opened(tmp_path):
        yield api.client.get("/openapi.json").json()


def operation(document: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    found: dict[str, Any] = document["paths"][path][method.lower()]
    return found


ERRORS = [
    ("GET", "/classes", {401, 503}),
    ("GET", "/pool", {401, 503}),
    ("GET", "/teams", {401, 503}),
    ("PUT", "/teams/{name}", {400, 401, 403, 409, 413, 422, 503}),
    ("DELETE", "/teams/{name}", {400, 401, 403, 404, 409, 422, 503}),
    ("PUT", "/teams/{name}/budgets/{priority}", {400, 401, 403, 404, 409, 422, 503}),
    ("DELETE", "/teams/{name}/budgets/{priority}", {400, 401, 403, 404, 409, 422, 503}),
    ("DELETE", "/users/{name}", {400, 401, 403, 404, 409, 422, 503}),
    ("GET", "/users", {401, 503}),
    ("PUT", "/users/{name}", {400, 401, 403, 404, 413, 422, 503}),
    ("POST", "/jobs", {400, 401, 403, 404, 409, 413, 422, 503}),
    ("GET", "/jobs", {400, 401, 422, 503}),
    ("GET", "/jobs/{job_id}", {401, 403, 404, 422, 503}),
    ("GET", "/jobs/{job_id}/logs", {401, 403, 404, 409, 422, 503}),
    ("POST", "/jobs/{job_id}/cancel", {401, 403, 404, 409, 422, 503}),
    ("POST", "/jobs/{job_id}/hold", {400, 401, 403, 404, 409, 422, 503}),
    ("POST", "/jobs/{job_id}/release", {400, 401, 403, 404, 409, 422, 503}),
    ("PATCH", "/jobs/{job_id}", {400, 401, 403, 404, 409, 422, 503}),
    ("POST", "/jobs/{job_id}/requeue", {400, 401, 403, 404, 409, 422, 503}),
    ("GET", "/events", {401, 403, 404, 422, 503}),
    ("GET", "/report", {401, 422, 503}),
    ("GET", "/metrics", {401, 404, 503}),
    ("POST", "/jobs/{job_id}/attempts/{attempt}/heartbeat", {400, 401, 403, 404, 409, 413, 422, 503}),
    ("POST", "/jobs/{job_id}/attempts/{attempt}/checkpoint", {400, 401, 403, 404, 409, 413, 422, 503}),
    ("POST", "/jobs/{job_id}/attempts/{attempt}/ack", {401, 403, 404, 409, 422, 503}),
    ("POST", "/jobs/{job_id}/attempts/{attempt}/complete", {401, 403, 404, 409, 422, 503}),
]


@pytest.mark.parametrize(("method", "path", "statuses"), ERRORS, ids=[f"{m} {p}" for m, p, _ in ERRORS])
def test_every_route_declares_the_errors_it_answers_with_one_model(
    document: dict[str, Any], method: str, path: str, statuses: set[int]
) -> None:
    responses = operation(document, method, path)["responses"]
    declared = {int(status) for status in responses if int(status) >= 400}
    assert declared == statuses
    for status in statuses:
        schema = responses[str(status)]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/ErrorOut"}, (status, schema)


def test_every_route_but_health_names_the_bearer_scheme(document: dict[str, Any]) -> None:
    schemes = document["components"]["securitySchemes"]
    assert list(schemes) == ["HTTPBearer"]
    assert (schemes["HTTPBearer"]["type"], schemes["HTTPBearer"]["scheme"]) == ("http", "bearer")
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            expected: list[dict[str, list[str]]] = [] if path == "/health" else [{"HTTPBearer": []}]
            assert op.get("security", []) == expected, (method, path)


def parameter(document: dict[str, Any], method: str, path: str, name: str) -> dict[str, Any]:
    params = operation(document, method, path)["parameters"]
    found: dict[str, Any] = next(p for p in params if p["name"] == name)
    return found


def test_enumerated_values_are_listed(document: dict[str, Any]) -> None:
    stream = parameter(document, "GET", "/jobs/{job_id}/logs", "stream")["schema"]
    assert stream["enum"] == ["stdout", "stderr"]
    state = parameter(document, "GET", "/jobs", "state")["schema"]
    pattern = next(s["pattern"] for s in state["anyOf"] if "pattern" in s)
    assert all(s.value in pattern for s in JobState)


def test_numbers_are_bounded_in_the_document(document: dict[str, Any]) -> None:
    job_id = parameter(document, "GET", "/jobs/{job_id}", "job_id")["schema"]
    assert (job_id["minimum"], job_id["maximum"]) == (0, 2**31 - 1)
    offset = parameter(document, "GET", "/jobs/{job_id}/logs", "offset")["schema"]
    assert offset["maximum"] == 2**63 - 1
    heartbeat = document["components"]["schemas"]["HeartbeatIn"]["properties"]["step"]
    assert next(s for s in heartbeat["anyOf"] if s.get("type") == "integer")["maximum"] == 2**31 - 1


def test_lists_of_jobs_are_full_or_brief_by_their_brief_field(document: dict[str, Any]) -> None:
    schema = operation(document, "GET", "/jobs")["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema["items"]["discriminator"]["propertyName"] == "brief"
    brief = document["components"]["schemas"]["JobBriefOut"]
    assert set(brief["properties"]) == {"id", "label", "team", "priority", "state", "gpus", "brief"}


def test_classes_have_a_response_model(document: dict[str, Any]) -> None:
    schema = operation(document, "GET", "/classes")["responses"]["200"]["content"]["application/json"]["schema"]
    assert (schema["type"], schema["items"]) == ("array", {"$ref": "#/components/schemas/ClassOut"})


def test_a_replayed_submission_and_log_offsets_are_documented_headers(document: dict[str, Any]) -> None:
    created = operation(document, "POST", "/jobs")["responses"]["201"]
    assert "Idempotent-Replayed" in created["headers"]
    assert parameter(document, "POST", "/jobs", "Idempotency-Key")["in"] == "header"
    assert "X-Next-Offset" in operation(document, "GET", "/jobs/{job_id}/logs")["responses"]["200"]["headers"]
    assert "Retry-After" in operation(document, "POST", "/jobs")["responses"]["503"]["headers"]


def test_the_api_is_documented_for_people_at_docs(tmp_path: Path) -> None:
    for api in opened(tmp_path):
        assert api.client.get("/docs").status_code == 200
        assert "Limits" in api.client.get("/openapi.json").json()["info"]["description"]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_documentation_pages_load_nothing_from_outside(tmp_path: Path, page: str) -> None:
    for api in opened(tmp_path):
        html = api.client.get(page).text
        assets = re.findall(r"""(?:src|href)=["']([^"']+)["']|url: ?["']([^"']+)["']""", html)
        urls = [a or b for a, b in assets]
        assert urls, html
        for url in urls:
            assert url.startswith("/"), f"{page} loads {url}"
            answer = api.client.get(url)
            assert answer.status_code == 200, url
            assert answer.content, url


def test_the_brief_field_is_in_every_job_answer(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    for name in ("JobOut", "JobBriefOut"):
        assert "brief" in schemas[name]["required"], name
