"""Every test of the core decides twice: on its snapshot as written, and on the same snapshot
with all the state a driver keeps between decisions (`policy.running.kept`); the plans must be
equal. The tests then check the plan as before."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpupool import policy
from gpupool.model import Config, Plan, Snapshot
from gpupool.policy.running import kept

_decide = policy.decide


def decide_both_ways(snapshot: Snapshot, config: Config, now: float) -> Plan:
    plan = _decide(snapshot, config, now)
    if snapshot.free is None and snapshot.running_index is None:
        assert _decide(kept(snapshot), config, now) == plan, "the kept state changed the plan"
    return plan


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "decides_once: the test counts what one decision does inside")


@pytest.fixture(autouse=True)
def _both_ways(request: pytest.FixtureRequest) -> Iterator[None]:
    module = request.module
    if getattr(module, "decide", None) is _decide and request.node.get_closest_marker("decides_once") is None:
        module.decide = decide_both_ways
        yield
        module.decide = _decide
    else:
        yield
