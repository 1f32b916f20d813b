"""A property-based fuzz of the whole API from its own OpenAPI document (schemathesis): every
operation, with valid and with invalid input, against the ASGI app in-process. Each answer must
not be a server error and must match the document (status, content type, schema). Used by
tests/api/test_fuzz.py (bounded) and benchmarks/fuzz_api.py (long), on the world `fuzz_world` makes."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Err

from gpupool.service.workspace import token_hash
from gpupool.store import JobSpec
from tests.support.apiworld import ADMIN, Api

CHECK_NAMES = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
)


@dataclass
class Finding:
    operation: str
    mode: str
    status: int
    problem: str
    request: str


@dataclass
class Report:
    examples: int = 0
    operations: set[str] = field(default_factory=set)
    statuses: Counter[int] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)
    unsatisfiable: list[str] = field(default_factory=list)
    """Operations and modes for which no input could be made (a route without parameters has
    no invalid input)."""

    def summary(self) -> str:
        codes = ", ".join(f"{status}: {n}" for status, n in sorted(self.statuses.items()))
        return (
            f"{self.examples} examples over {len(self.operations)} operations ({codes}); {len(self.findings)} findings"
        )


def fuzz(app: FastAPI, token: str, *, examples: int, derandomize: bool, seed: int | None = None) -> Report:
    """Fuzz every operation of `app` with `token`: `examples` per operation and mode."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    checks = [CHECKS.get_one(name) for name in CHECK_NAMES]
    headers = {"Authorization": f"Bearer {token}"}
    report = Report()
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()
        operation = result.ok()
        report.operations.add(operation.label)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            run_operation(operation, mode, headers, checks, report, examples, derandomize, seed)
    return report


def run_operation(
    operation: Any,
    mode: GenerationMode,
    headers: dict[str, str],
    checks: list[Any],
    report: Report,
    examples: int,
    derandomize: bool,
    seed: int | None,
) -> None:
    seen: set[tuple[str, int, str]] = set()

    @settings(
        max_examples=examples,
        derandomize=derandomize,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(operation.as_strategy(generation_mode=mode))
    def one(case: Any) -> None:
        report.examples += 1
        try:
            response = case.call(headers=headers)
        except Exception as exc:  # the app raised instead of answering: a 500 at best
            report.statuses[500] += 1
            note(case, 500, f"the app raised {type(exc).__name__}: {exc}")
            return
        report.statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=checks, headers=headers)
        except FailureGroup as exc:
            note(case, response.status_code, str(exc))

    def note(case: Any, status: int, text: str) -> None:
        """One finding per operation, status and kind of failure."""
        problem = " ".join(text.split())[:600]
        key = (operation.label, status, problem[:80])
        if key not in seen:
            seen.add(key)
            request = f"{case.method} {case.formatted_path} query={case.query} body={str(case.body)[:300]}"
            report.findings.append(Finding(operation.label, mode.value, status, problem, request))

    if seed is not None:
        one = hypothesis.seed(seed)(one)
    try:
        one()
    except Unsatisfiable:  # no such input exists (nothing to make invalid): not a finding
        report.unsatisfiable.append(f"{operation.label} ({mode.value})")


def fuzz_world(api: Api) -> dict[str, str]:
    """Team `fuzz` with a user, team `other`, jobs of both (some running, with output), made in
    the store; the tokens to fuzz with."""
    tokens = {"admin": ADMIN, "team": "fuzz-team-token", "user": "fuzz-user-token"}
    api.store.set_team("fuzz", token_hash=token_hash(tokens["team"]))
    api.store.set_team("other", token_hash=token_hash("other-token"))
    api.store.set_user("fuzzer", team="fuzz", token_hash=token_hash(tokens["user"]))
    for team, user in (("fuzz", "fuzzer"), ("other", None), ("fuzz", None)):
        api.store.submit(JobSpec(["true"], team=team, user=user, workdir=str(api.workdir), max_failures=1), 1.0)
    api.loop.tick(100.0)
    api.executor.finish(1, 0, 1)
    api.loop.tick(200.0)
    for job in api.store.jobs():
        for stream in ("stdout", "stderr"):
            path = api.loop.workspace.log_file(job, max(0, job.attempts - 1), stream)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{stream} of {job.id} ✓\n")
    return tokens
