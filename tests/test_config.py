"""The YAML configuration: defaults, durations, and errors that name the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpupool.config import ConfigError, load, load_spec, parse, parse_spec
from gpupool.model import DEFAULT_CLASSES, PlacementRule, PriorityBudget, QueueMode
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
policy: {queue: strict, max_preemptions: null, placement: first-fit}
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
    assert config.placement is PlacementRule.FIRST_FIT


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
        ({"service": {"executor": "slurm"}}, "c.yaml: service.executor: Input should be 'local' or 'ray'"),
        ({"service": {"ray_address": "a b"}}, "service.ray_address: must be auto or the Ray head's host:port"),
        ({"service": {"api_url": "head:8470"}}, "service.api_url: must be an http:// or https:// address"),
        ({"service": {"start_timeout": "0s"}}, "service.start_timeout: Input should be greater than 0"),
        ({"policy": {"max_node_losses": -1}}, "policy.max_node_losses: Input should be greater than or equal to 0"),
        ({"policy": {"placement": "worst-fit"}}, "policy.placement: Input should be 'best-fit' or 'first-fit'"),
        ({"policy": {"explain_depth": -1}}, "policy.explain_depth: Input should be greater than or equal to 0"),
        ({"policy": {"explain_depth": "all"}}, "policy.explain_depth: Input should be a valid integer"),
        ([1, 2], "c.yaml: Input should be a valid dictionary"),
    ],
)
def test_bad_configuration_names_the_key(data: object, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(data, "c.yaml")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        pytest.param(
            "bad.yaml", "teams:\n  nlp: {weight: 2\n", r"bad.yaml: line \d+, column \d+: not valid YAML", id="malformed"
        ),
        pytest.param(
            "dup.yaml",
            "teams:\n  nlp: {weight: 2}\n  vision: {}\n  nlp: {weight: 3}\n",
            r"dup\.yaml: line 4, column 3: duplicate key 'nlp' \(first on line 2\)",
            id="duplicate-key",
        ),
        pytest.param(
            "dup.yaml",
            "service: {port: 1, port: 2}\n",
            r"dup\.yaml: line 1, column \d+: duplicate key 'port'",
            id="duplicate-key-in-a-flow-mapping",
        ),
    ],
)
def test_yaml_that_is_malformed_or_repeats_a_key_is_refused_at_its_line(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load(path)


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read"):
        load(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"classes": {"a": {"value": 10**20, "may_preempt": True, "preemptible": True}}},
            "c.yaml: classes.a.value: Input should be less than or equal to 2147483647",
        ),
        (
            {"classes": {"a": {"value": -(2**31) - 1, "may_preempt": True, "preemptible": True}}},
            "c.yaml: classes.a.value: Input should be greater than or equal to -2147483648",
        ),
        (
            {"service": {"virtual_gpus": 100_000_000}},
            "c.yaml: service.virtual_gpus: Input should be less than or equal to 4096",
        ),
        ({"teams": {"nlp": {"weight": float("inf")}}}, "c.yaml: teams.nlp.weight: Input should be a finite number"),
        ({"teams": {"nlp": {"weight": float("nan")}}}, "c.yaml: teams.nlp.weight: Input should be a finite number"),
        (
            {"teams": {"nlp": {"weight": 1e7}}},
            "c.yaml: teams.nlp.weight: Input should be less than or equal to 1000000",
        ),
        (
            {"teams": {"nlp": {"guaranteed_gpus": 10**12}}},
            "c.yaml: teams.nlp.guaranteed_gpus: Input should be less than or equal to 1000000",
        ),
        (
            {"teams": {"nlp": {"budgets": {"high": {"gpu_hours": float("inf"), "window": "1d"}}}}},
            "c.yaml: teams.nlp.budgets.high.gpu_hours: Input should be a finite number",
        ),
        (
            {"teams": {"nlp": {"budgets": {"high": {"gpu_hours": 1, "window": "100000d"}}}}},
            "c.yaml: teams.nlp.budgets.high.window: '100000d' is more than 10 years",
        ),
        (
            {"classes": {"a": {"value": 1, "may_preempt": True, "preemptible": True, "grace_period": 1e300}}},
            "c.yaml: classes.a.grace_period: 1e+300 is more than 10 years",
        ),
        (
            {"policy": {"max_preemptions": 10**20}},
            "c.yaml: policy.max_preemptions: Input should be less than or equal to",
        ),
        ({"service": {"interval": float("inf")}}, "c.yaml: service.interval: inf is not a duration"),
        ({"service": {"store": "nonsense"}}, "c.yaml: service.store: not a sqlite or postgresql URL"),
        ({"service": {"store": "mysql://u@h/db"}}, "c.yaml: service.store: not a sqlite or postgresql URL"),
        ({"service": {"store": "postgresql://u@h:notaport/db"}}, "c.yaml: service.store: "),
        ({"service": {"store": "postgresql://u@h:99999/db"}}, "c.yaml: service.store: port 99999"),
        ({"service": {"run_as": "root"}}, "c.yaml: service.run_as: Input should be 'service', 'submitter' or 'team'"),
        ({"service": {"job_user": "gp-{uid}"}}, "c.yaml: service.job_user: unknown placeholder {uid}"),
        ({"service": {"job_user": "Bad User"}}, "c.yaml: service.job_user: 'Bad User' is not a POSIX user name"),
        ({"service": {"job_user": "{user"}}, "c.yaml: service.job_user: "),
    ],
)
def test_values_the_store_or_the_service_cannot_hold_are_refused(data: object, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(data, "c.yaml")


def test_a_store_password_is_not_echoed_in_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        parse({"service": {"store": "mysql://u:s3cret@h/db"}}, "c.yaml")
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    "store", [None, "sqlite:///tmp/x.db", "postgresql://u:p@db.example:5432/gpupool", "postgresql+psycopg://h/db"]
)
def test_store_urls_of_both_backends_are_accepted(store: str | None) -> None:
    assert parse_spec({"service": {"store": store}}).service.store == store


def test_jobs_run_as_the_submitter_by_default_and_the_user_template_is_checked() -> None:
    service = parse_spec({}).service
    assert service.run_as == "submitter"
    assert service.job_user is None
    assert service.job_user_template == "{user}"
    spec = parse_spec({"service": {"run_as": "team", "job_user": "gp-{team}"}}).service
    assert (spec.run_as, spec.job_user) == ("team", "gp-{team}")
    assert parse_spec({"service": {"run_as": "submitter", "job_user": "{user}"}}).service.job_user == "{user}"
    both = parse_spec({"service": {"run_as": "team", "job_user": "lab_{team}-{user}"}}).service
    assert both.job_user_template == "lab_{team}-{user}"


@pytest.mark.parametrize(
    ("run_as", "template"), [("service", None), ("submitter", "{user}"), ("team", "gpupool-{team}")]
)
def test_without_job_user_each_run_as_has_its_user(run_as: str, template: str | None) -> None:
    assert parse_spec({"service": {"run_as": run_as}}).service.job_user_template == template


def test_a_job_user_for_jobs_that_run_as_the_service_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"c\.yaml: service: job_user is used only with run_as: submitter or team"):
        parse({"service": {"run_as": "service", "job_user": "gp-{team}"}}, "c.yaml")


def test_a_bad_value_stops_up_before_the_data_directory_is_made(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpupool.cli import app

    data = tmp_path / "data"
    path = tmp_path / "gpupool.yaml"
    path.write_text(
        f"classes:\n  a: {{value: {10**20}, may_preempt: true, preemptible: true}}\nservice:\n  data_dir: {data}\n"
    )
    result = CliRunner().invoke(app, ["up", "--config", str(path)])
    assert result.exit_code == 2
    assert "classes.a.value" in result.output
    assert "Traceback" not in result.output
    assert not data.exists()


def test_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text("teams:\n  nlp: &base {weight: 2, guaranteed_gpus: 1}\n  vision: {<<: *base, weight: 3}\n")
    config = load(path)
    assert (config.team("vision").weight, config.team("vision").guaranteed_gpus) == (3.0, 1)


def test_waits_are_explained_for_the_first_thousand_jobs_in_line_by_default() -> None:
    assert parse({}).explain_depth == 1000
    assert parse({"policy": {"explain_depth": None}}).explain_depth is None
    assert parse({"policy": {"explain_depth": 50}}).explain_depth == 50


def test_off_is_the_word_off_as_the_documentation_writes_it(tmp_path: Path) -> None:
    """YAML 1.1 reads an unquoted off as false; the documented `fair_share: off` and
    `containment: {mode: off}` mean the word."""
    path = tmp_path / "gpupool.yaml"
    path.write_text("policy: {fair_share: off, preemption: false}\nservice: {containment: {mode: off}}\n")
    spec = load_spec(path)
    assert (spec.policy.fair_share, spec.policy.preemption, spec.service.containment.mode) == ("off", False, "off")
