"""A bounded fuzz of the whole API from its OpenAPI document (schemathesis): valid and invalid
requests to every operation, with the admin token, a team's and a user's, get no server error
and only answers the document describes (status, content type, schema). A longer run:
benchmarks/fuzz_api.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.api.access import ROUTES
from tests.support.apiworld import Api, opened
from tests.support.fuzzing import fuzz, fuzz_world

CI = bool(os.environ.get("CI"))
EXAMPLES = 25
"""Per operation and mode (valid, invalid): about 20 s a token on two cores."""


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    yield from opened(tmp_path)


@pytest.mark.parametrize("who", ["admin", "team", "user"])
def test_fuzzed_requests_get_no_server_error_and_only_documented_answers(api: Api, who: str) -> None:
    token = fuzz_world(api)[who]
    report = fuzz(api.app, token, examples=EXAMPLES, derandomize=CI)
    # The OpenAPI document's routes: every one but the WebSockets, which it does not describe.
    documented = {(method, path) for method, path in ROUTES if method != "WS"}
    assert report.operations == {f"{method} {path}" for method, path in documented}
    assert report.examples >= len(documented) * EXAMPLES
    problems = "\n".join(f"{f.operation} ({f.mode}) {f.status}: {f.problem}\n  {f.request}" for f in report.findings)
    assert report.findings == [], f"{report.summary()}\n{problems}"
