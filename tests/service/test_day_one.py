"""A lab's first day with `gpupool up`: what a new user did, and what broke."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.up import free_port
from tests.support.live import Service, running, state, wait_for

PRINT_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(Service(tmp_path))


def job_environment(service: Service, *options: str, token: str | None = None) -> dict[str, str]:
    env = dict(service.env, MY_SETTING="42")
    if token is not None:
        env["GPUPOOL_TOKEN"] = token
    submitted = service.run_cli(
        env, "submit", "--parsable", "--priority", "low", *options, "--", "python", "-c", PRINT_ENV
    )
    assert submitted.returncode == 0, submitted.stderr
    job = int(submitted.stdout)
    wait_for(lambda: state(service, job) in ("succeeded", "failed"))
    logs = service.cli("logs", str(job))
    assert state(service, job) == "succeeded", service.cli("logs", "--stderr", str(job)).stdout
    seen: dict[str, str] = json.loads(logs.stdout)
    return seen


def test_a_job_runs_in_the_submitters_environment_without_the_submitters_token(service: Service) -> None:
    admin = (service.data / "admin.token").read_text().strip()
    seen = job_environment(service, token=admin)
    # `python` resolves through the submitter's PATH (a bare environment had none: exit 127);
    # pyenv's shim may put its own folders before it.
    assert seen["PATH"].endswith(service.env["PATH"])
    assert seen["MY_SETTING"] == "42"
    assert seen["GPUPOOL_TOKEN"] != admin
    assert admin not in json.dumps(seen)
    assert seen["GPUPOOL_JOB_ID"] == "1"


def test_export_narrows_the_environment_and_env_adds_to_it(service: Service) -> None:
    only = job_environment(service, "--export", "PATH,EXTRA=x", "--env", "MORE=y")
    assert "MY_SETTING" not in only
    assert (only["EXTRA"], only["MORE"]) == ("x", "y")
    assert only["PATH"].endswith(service.env["PATH"])
    refused = service.cli("submit", "--env", "GPUPOOL_TOKEN=stolen", "--", "true")
    assert refused.returncode == 2
    assert "GPUPOOL_TOKEN is set by gpupool" in refused.stderr


def test_gpupool_api_in_the_environment_wins_over_the_configuration_and_a_flag_over_both(service: Service) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    env = dict(service.env, GPUPOOL_API=dead)
    unreachable = service.run_cli(env, "queue")
    assert unreachable.returncode == 4
    assert f"cannot reach gpupool at {dead}" in unreachable.stderr
    flagged = service.run_cli(env, "queue", "--api", f"http://127.0.0.1:{service.port}")
    assert flagged.returncode == 0, flagged.stderr


def test_team_set_with_a_new_token_keeps_the_teams_weight_and_guarantee(service: Service) -> None:
    assert service.cli("team", "set", "nlp", "--weight", "2", "--guaranteed-gpus", "1").returncode == 0
    assert service.cli("team", "set", "nlp", "--new-token").returncode == 0
    [nlp] = [t for t in service.get("/teams").json() if t["name"] == "nlp"]  # type: ignore[union-attr]
    assert (nlp["weight"], nlp["guaranteed_gpus"]) == (2.0, 1)


def test_usage_errors_not_found_and_refusals_have_their_own_exit_codes(service: Service) -> None:
    assert service.cli("show", "999").returncode == 3
    assert service.cli("submit", "--gpus", "0", "--", "true").returncode == 2
    submitted = service.cli("submit", "--parsable", "--priority", "low", "--", "true")
    wait_for(lambda: state(service, int(submitted.stdout)) == "succeeded")
    assert service.cli("cancel", submitted.stdout.strip()).returncode == 5


LAB = """
service: {{data_dir: {data}, port: {port}, virtual_gpus: 8, interval: 0.2, run_as: service}}
classes:
  high: {{value: 100, may_preempt: true, preemptible: true, min_runtime: 0s, grace_period: 3s}}
  normal: {{value: 10, may_preempt: true, preemptible: true, min_runtime: 0s, grace_period: 3s}}
  low: {{value: 0, may_preempt: false, preemptible: true, min_runtime: 0s, grace_period: 3s}}
teams:
  a: {{weight: 2, guaranteed_gpus: 3}}
  b: {{weight: 1, guaranteed_gpus: 3}}
  c: {{weight: 1, guaranteed_gpus: 2}}
"""


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Service]:
    """Three teams with guarantees 3/3/2 and weights 2/1/1 on 8 virtual GPUs."""
    service = Service(tmp_path)
    service.config.write_text(LAB.format(data=service.data, port=service.port))
    yield from running(service)


def test_a_reclaim_takes_one_victim_and_the_claimant_starts_without_thrashing(lab: Service) -> None:
    for team, count in (("a", 4), ("b", 2), ("c", 2)):
        for _ in range(count):
            assert lab.cli("submit", "--team", team, "--", "sleep", "600").returncode == 0
    wait_for(lambda: all(state(lab, j) == "running" for j in range(1, 9)))
    claimant = lab.cli("submit", "--parsable", "--team", "b", "--", "sleep", "600")
    job = int(claimant.stdout)
    wait_for(lambda: state(lab, job) == "running", timeout=30)
    time.sleep(2.0)  # several decisions later: nothing more happened
    events = lab.get("/events").json()  # type: ignore[union-attr]
    notices = [e for e in events if e["kind"] == "preempting"]
    assert len(notices) == 1, [e["message"] for e in notices]
    assert "team b reclaims its guaranteed GPUs from team a" in notices[0]["message"]
    assert state(lab, job) == "running"
    victim = notices[0]["job_id"]
    assert state(lab, victim) == "pending"


def test_show_quotes_the_command_and_counts_in_words(service: Service) -> None:
    submitted = service.cli("submit", "--parsable", "--priority", "low", "--", "sh", "-c", "echo 'a b'")
    job = int(submitted.stdout)
    wait_for(lambda: state(service, job) == "succeeded")
    shown = service.cli("show", str(job)).stdout
    assert "command: sh -c 'echo '\"'\"'a b'\"'\"''" in shown
    assert "1 GPU;" in shown


def test_time_limits_end_jobs_as_timeout_and_hold_across_a_kill_9(service: Service) -> None:
    short = int(service.cli("submit", "--parsable", "--priority", "low", "--time", "0:02", "--", "sleep", "600").stdout)
    wait_for(lambda: state(service, short) == "timeout", timeout=30)
    longer = int(service.cli("submit", "--parsable", "--priority", "low", "-t", "0:06", "--", "sleep", "600").stdout)
    wait_for(lambda: state(service, longer) == "running")
    service.kill()
    time.sleep(6.5)  # its limit passes while nobody watches
    service.up()
    wait_for(lambda: state(service, longer) == "timeout", timeout=30)
    assert state(service, short) == "timeout"
    shown = service.get(f"/jobs/{longer}").json()  # type: ignore[union-attr]
    assert shown["attempts"] == 1, "reached its limit: not run again"
    assert shown["run_seconds"] >= 6.0
    bad = service.cli("submit", "--time", "soon", "--", "true")
    assert bad.returncode == 2
    assert "--time: 'soon' is not a time limit" in bad.stderr
