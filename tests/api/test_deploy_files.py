"""deploy/: the Prometheus configuration and alert rules load (promtool), the alert rules do what
their unit tests say, and every metric the rules and the Grafana dashboard name is one that
`/metrics` gives (a dashboard that queries a name nobody emits shows nothing, silently)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.apiworld import ADMIN, World, auth, opened, populated

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
METRIC = re.compile(r"\b(gpupool_[a-z_]+)\b")


def promtool(*args: str, cwd: Path = DEPLOY / "prometheus") -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool is not None, "these tests need Debian's `prometheus` package (promtool)"
    return subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=120)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    for api in opened(tmp_path):
        yield populated(api)


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "info": ("_info",)}


def emitted(world: World) -> set[str]:
    """Every sample name /metrics gives or would give (a metric with no sample yet, such as a
    histogram nothing was observed in, is described all the same)."""
    assert world.api.telemetry is not None
    world.api.telemetry.refresh(world.api.now[0])
    text = world.api.client.get("/metrics", headers=auth(ADMIN)).text
    return {f.name + suffix for f in text_string_to_metric_families(text) for suffix in SUFFIXES[f.type]}


def test_the_configuration_loads(tmp_path: Path) -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    token = tmp_path / "gpupool.token"
    token.write_text("a-token\n")
    config["scrape_configs"][0]["authorization"]["credentials_file"] = str(token)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    shutil.copy(DEPLOY / "prometheus" / "alerts.yml", tmp_path)
    checked = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_alert_rules_load_and_pass_their_unit_tests() -> None:
    checked = promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_is_unit_tested() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    tests = yaml.safe_load((DEPLOY / "prometheus" / "alerts_test.yml").read_text())
    tested = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"]}
    assert alerts == tested


def queries(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "query", "definition") and isinstance(value, str):
                yield value
            else:
                yield from queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from queries(item)


def test_the_rules_and_the_dashboard_name_only_metrics_that_exist(world: World) -> None:
    names = emitted(world)
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    dashboard = json.loads((DEPLOY / "grafana" / "gpupool.json").read_text())
    used = {m for q in (*queries(rules), *queries(dashboard)) for m in METRIC.findall(q)}
    assert len(used) >= 20
    assert used - names == set()


def test_the_dashboard_asks_for_its_data_source_and_has_a_fixed_uid() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "gpupool.json").read_text())
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    assert dashboard["uid"] == "gpupool-pool"
    sources = [p["datasource"]["uid"] for p in dashboard["panels"] if "datasource" in p]
    assert sources
    assert set(sources) == {"${DS_PROMETHEUS}"}
    titles = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert titles == ["Pool", "Queue", "Teams", "Interruptions and lost work", "Scheduler"]
