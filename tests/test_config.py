"""The YAML configuration: defaults, durations, and errors that name the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpupool.config import ConfigError, load, parse
from gpupool.model import DEFAULT_CLASSES, PriorityBudget, QueueMode
from gpupool.units import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (90, 90.0),
        (1.5, 1.5),
        ("90", 90.0),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("1.5h", 5400.0),
        ("7d", 604800.0),
    ],
)
def test_durations_take_units(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["-1", "abc", "10w", "", True, float("inf")])
def test_bad_durations_are_refused(text: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_no_file_means_the_embedded_defaults() -> None:
    config = load(None)
    assert config.classes == DEFAULT_CLASSES
    assert config.queue is QueueMode.BACKFILL
    assert config.max_preemptions == 10


def test_a_full_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "gpupool.yaml"
    path.write_text(
        """
classes:
  gold: {value: 10, may_preempt: true, preemptible: false, grace_period: 2m}
  bronze: {value: 1, may_preempt: false, preemptible: true, min_runtime: 5m}
teams:
  nlp: {weight: 2, guaranteed_gpus: 16, budgets: {gold: {gpu_hours: 100, window: 7d}}}
policy: {queue: strict, max_preemptions: null}
"""
    )
    config = load(path)
    assert [c.name for c in config.classes] == ["gold", "bronze"]
    assert config.priority_class("gold").grace_period == 120.0
    assert config.priority_class("bronze").min_runtime == 300.0
    assert config.team("nlp").budgets == (PriorityBudget("gold", 100.0, 604800.0),)
    assert config.team("vision").guaranteed_gpus == 0
    assert config.queue is QueueMode.STRICT
    assert config.max_preemptions is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"teams": {"nlp": {"weight": "x"}}}, "c.yaml: teams.nlp.weight: Input should be a valid number"),
        ({"teams": {"nlp": {"weight": 0}}}, "c.yaml: teams.nlp.weight: Input should be greater than 0"),
        (
            {"teams": {"nlp": {"guaranteed_gpus": -4}}},
            "teams.nlp.guaranteed_gpus: Input should be greater than",
        ),
        ({"classes": {"a": {"value": 1}}}, "c.yaml: classes.a.may_preempt: Field required"),
        (
            {"classes": {"a": {"value": 1, "may_preempt": True, "preemptible": True, "grace_period": "soon"}}},
            "'soon' is not a duration",
        ),
        (
            {"teams": {"nlp": {"budgets": {"vip": {"gpu_hours": 1, "window": "1d"}}}}},
            "unknown priority class 'vip'",
        ),
        ({"policy": {"queue": "lifo"}}, "c.yaml: policy.queue: Input should be 'backfill' or 'strict'"),
        ({"typo": 1}, "c.yaml: typo: Extra inputs are not permitted"),
        ([1, 2], "c.yaml: Input should be a valid dictionary"),
    ],
)
def test_bad_configuration_names_the_key(data: object, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(data, "c.yaml")


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("teams:\n  nlp: {weight: 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line \d+, column \d+: not valid YAML"):
        load(path)


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read"):
        load(tmp_path / "nope.yaml")
