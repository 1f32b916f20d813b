"""A bounded fuzz of the whole API from its OpenAPI document (schemathesis): valid and invalid
requests to every operation, with the admin token, a team's and a user's, get no server error
and only answers the document describes (status, content type, schema). A longer run:
benchmarks/fuzz_api.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from apiworld import ADMIN, Api, opened
from fuzzing import fuzz

from gpupool.api.access import ROUTES
from gpupool.service import token_hash
from gpupool.store import JobSpec

CI = bool(os.environ.get("CI"))
EXAMPLES = 25
"""Per operation and mode (valid, invalid): about 20 s a token on two cores."""


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    yield from opened(tmp_path)


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
            path = api.loop.log_file(job, max(0, job.attempts - 1), stream)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{stream} of {job.id} ✓\n")
    return tokens


@pytest.mark.parametrize("who", ["admin", "team", "user"])
def test_fuzzed_requests_get_no_server_error_and_only_documented_answers(api: Api, who: str) -> None:
    token = fuzz_world(api)[who]
    report = fuzz(api.app, token, examples=EXAMPLES, derandomize=CI)
    assert report.operations == {f"{method} {path}" for method, path in ROUTES}
    assert report.examples >= len(ROUTES) * EXAMPLES
    problems = "\n".join(f"{f.operation} ({f.mode}) {f.status}: {f.problem}\n  {f.request}" for f in report.findings)
    assert report.findings == [], f"{report.summary()}\n{problems}"
