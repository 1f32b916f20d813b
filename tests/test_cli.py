"""The command line, as a person runs it: real processes for the main paths, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpupool.cli import app

runner = CliRunner()


def gpupool(*args: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "gpupool", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )


def simulate_tiresias(traces_dir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return gpupool(
        "simulate",
        "--trace",
        str(traces_dir / "tiresias-sample" / "jobs.csv"),
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        "--compare",
        "partitioned,pool-fifo,pool-priority",
        "--json",
        str(out),
        *extra,
    )


def without_wall_time(path: Path) -> list[dict[str, object]]:
    reports: list[dict[str, object]] = json.loads(path.read_text())
    for report in reports:
        report.pop("wall_seconds")
    return reports


def test_simulate_writes_one_report_per_policy_and_the_same_bytes_twice(traces_dir: Path, tmp_path: Path) -> None:
    first = simulate_tiresias(traces_dir, tmp_path / "a.json", "--plots", str(tmp_path / "plots"))
    assert first.returncode == 0, first.stderr
    assert "Policies compared" in first.stdout
    second = simulate_tiresias(traces_dir, tmp_path / "b.json")
    assert second.returncode == 0, second.stderr
    reports = without_wall_time(tmp_path / "a.json")
    assert [r["policy"] for r in reports] == ["partitioned", "pool-fifo", "pool-priority"]
    keys = {"policy", "jobs", "gpus", "utilization", "jct", "wait", "by_priority", "by_team", "preemptions"}
    assert keys | {"lost_gpu_hours", "goodput", "fairness", "young_daly_interval"} <= set(reports[0])
    assert all(r["jobs"] == 60 for r in reports)
    assert reports == without_wall_time(tmp_path / "b.json")
    pngs = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert "lost-work.png" in pngs
    assert "wait-cdf.png" in pngs
    assert "utilization-pool-priority.png" in pngs


def test_the_live_demo_shows_a_preemption_a_resume_and_a_summary() -> None:
    result = gpupool("demo")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "preempting  preempted job" in out
    assert "requeued after notice (exit code 75)" in out  # gpupool.job leaves with EX_TEMPFAIL
    assert "attempt 1 on GPUs" in out
    assert "from step 0" not in out.split("its next attempt said:")[1]
    assert out.count("succeeded (exit code 0)") == 5
    assert "Waits per class" in out


def test_the_simulated_demo_shows_a_preemption_a_resume_and_a_summary() -> None:
    result = gpupool("demo", "--simulated")
    assert result.returncode == 0, result.stderr
    assert "notice" in result.stdout
    assert "resumes from its checkpoint" in result.stdout
    assert "Waits per priority class" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "2", "--policy", "fastest"], "unknown policy 'fastest'"),
        (["--nodes", "2", "--policy", "pool-fifo", "--compare", "partitioned"], "not both"),
        ([], "give the cluster as --vc-sizes FILE, --nodes N or --machines FILE, one of them"),
        (["--nodes", "2", "--priority-mix", "high=0.5,low=0.4"], "sum"),
        (["--nodes", "2", "--priority-mix", "vip=1"], "vip"),
        (["--nodes", "2", "--from", "yesterday"], "--from 'yesterday'"),
        (["--nodes", "2", "--checkpoint-interval", "low=soon"], "--checkpoint-interval 'low=soon'"),
        (["--nodes", "2", "--checkpoint-interval", "vip=10m"], "unknown priority class 'vip'"),
        (["--nodes", "2", "--queue", "lifo"], "--queue 'lifo'"),
        (["--nodes", "2", "--restart-cost", "-5"], "--restart-cost"),
        (["--nodes", "2", "--fair-share", "maybe"], "--fair-share 'maybe': use off or preempt"),
        (["--nodes", "2", "--priority-preemption", "all"], "use pool or team or above_guarantee"),
        (["--nodes", "2", "--seniority-after", "soon"], "--seniority-after"),
        (
            ["--nodes", "2", "--policy", "pool-fifo", "--seniority-after", "2h"],
            "--seniority-after sets an option of pool-priority",
        ),
        (
            ["--nodes", "2", "--policy", "pool-fair", "--fair-share", "off"],
            "--fair-share sets an option of pool-priority",
        ),
        (["--nodes", "2", "--node-repair", "1h"], "--node-repair shape(s) node failures: give --node-mtbf too"),
        (["--nodes", "2", "--seed", "3"], "--seed shape(s) node failures"),
        (["--nodes", "2", "--node-mtbf", "0"], "--node-mtbf '0': a node's mean time between failures must be > 0"),
        (["--nodes", "2", "--node-mtbf", "often"], "--node-mtbf: 'often' is not a duration"),
        (["--nodes", "2", "--node-mtbf", "3d", "--node-repair", "-1h"], "--node-repair"),
        (["--nodes", "2", "--node-mtbf", "3d", "--failure-times", "weibull"], "use exponential or constant"),
        (["--nodes", "2", "--sweep", "speed=1,2"], "--sweep 'speed=1,2': unknown parameter 'speed'"),
        (["--nodes", "2", "--sweep", "scale=0.5"], "--sweep scale scales --vc-sizes or --machines"),
        (["--nodes", "2", "--workers", "2"], "--workers N (N ≥ 1) goes with --sweep"),
        (["--nodes", "2", "--priority-from", "qos"], "no column 'qos' to take priorities from"),
        (["--nodes", "2", "--priority-map", "LS=high"], "--priority-map VALUE=CLASS,… needs --priority-from COLUMN"),
        (["--nodes", "2", "--priority-from", "qos", "--priority-map", "LS=vip"], "unknown class 'vip'"),
        (["--nodes", "2", "--placement", "worst-fit"], "--placement 'worst-fit': use best-fit, first-fit or count"),
        (["--nodes", "2", "--placement", "count", "--node-mtbf", "1d"], "node failures need nodes"),
    ],
)
def test_bad_options_say_what_is_wrong(traces_dir: Path, args: list[str], message: str) -> None:
    trace = str(traces_dir / "tiresias-sample" / "jobs.csv")
    result = runner.invoke(app, ["simulate", "--trace", trace, *args])
    assert result.exit_code == 2
    assert message in result.output


@pytest.mark.parametrize("command", ["simulate", "advise"])
def test_a_trace_with_no_job_to_replay_says_so(tmp_path: Path, command: str) -> None:
    trace = tmp_path / "cpu.csv"
    trace.write_text("job_id,submit_time,num_gpus,duration,vc\na,0,0,60,\nb,1,1,,\n")
    result = runner.invoke(app, [command, "--trace", str(trace), "--nodes", "1"])
    assert result.exit_code == 2
    assert "cpu.csv: no job to replay (1 without GPUs, 1 without a run time)" in " ".join(result.output.split())


def test_a_pool_too_small_for_partitions_runs_the_pools_and_refuses_partitioned_first(tmp_path: Path) -> None:
    trace = tmp_path / "lab.csv"
    trace.write_text("job_id,submit_time,num_gpus,duration,vc\na,0,2,60,nlp\nb,1,2,60,vision\nc,2,1,60,robotics\n")
    pools = runner.invoke(
        app, ["simulate", "--trace", str(trace), "--nodes", "1", "--compare", "pool-fifo,pool-priority"]
    )
    assert pools.exit_code == 0, pools.output
    both = runner.invoke(app, ["simulate", "--trace", str(trace), "--nodes", "1", "--compare", "pool-fifo,partitioned"])
    assert both.exit_code == 2
    assert "partitioned needs whole nodes for each team: 1 node(s) cannot give each of the 3 teams" in " ".join(
        both.output.split()
    )
    assert "Policies compared" not in both.output


def test_budgets_of_a_team_the_cluster_does_not_have_are_refused(traces_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "gpupool.yaml"
    config.write_text("teams:\n  nlp: {budgets: {high: {gpu_hours: 1, window: 1d}}}\n")
    trace = str(traces_dir / "tiresias-sample" / "jobs.csv")
    result = runner.invoke(app, ["simulate", "--trace", trace, "--nodes", "2", "--config", str(config)])
    assert result.exit_code == 2
    assert "budgets of team(s) nlp, which the cluster does not have (teams: default)" in result.output


def test_seniority_after_reaches_the_replay(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    # One node: a 1-GPU job takes a GPU before the 8-GPU gang arrives, then 1-GPU jobs keep
    # arriving and backfilling; only seniority lets the gang in before they stop.
    rows = ["gang,10,8,100,x", *(f"s{i},{i * 50},1,400,x" for i in range(60))]
    trace.write_text(
        "job_id,submit_time,num_gpus,duration,vc\n" + "\n".join(sorted(rows, key=lambda r: int(r.split(",")[1]))) + "\n"
    )
    reports = {}
    for value in ("off", "10m"):
        out = tmp_path / f"{value}.json"
        args = ["simulate", "--trace", str(trace), "--nodes", "1", "--priority-mix", "low=1"]
        result = runner.invoke(app, [*args, "--seniority-after", value, "--json", str(out)])
        assert result.exit_code == 0, result.output
        reports[value] = json.loads(out.read_text())[0]
    assert reports["off"]["preemptions"] == 0
    assert reports["10m"]["preemptions"] > 0
    # The gang's is the longest wait (p99 of 61 jobs).
    assert reports["10m"]["wait"]["p99"] < reports["off"]["wait"]["p99"]


def test_a_bad_trace_row_is_reported_with_file_line_and_column(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("job_id,submit_time,num_gpus,duration,vc\na,0,1,10,x\nb,5,-2,10,x\n")
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--nodes", "1"])
    assert result.exit_code == 2
    assert "line 3, column num_gpus: '-2'" in result.output


def test_a_window_on_a_trace_without_datetimes_is_refused(traces_dir: Path) -> None:
    trace = str(traces_dir / "tiresias-sample" / "jobs.csv")
    result = runner.invoke(app, ["simulate", "--trace", trace, "--nodes", "2", "--from", "2017-10-01"])
    assert result.exit_code == 2
    assert "no submit_datetime column" in result.output


def test_simulate_makes_its_output_folders_and_refuses_an_unwritable_one_before_replaying(
    traces_dir: Path, tmp_path: Path
) -> None:
    fresh = tmp_path / "out" / "r.json"
    made = simulate_tiresias(traces_dir, fresh, "--plots", str(tmp_path / "out" / "r"))
    assert made.returncode == 0, made.stderr
    assert fresh.is_file()
    assert (tmp_path / "out" / "r" / "wait-cdf.png").is_file()
    blocker = tmp_path / "file"
    blocker.write_text("")
    refused = simulate_tiresias(traces_dir, blocker / "r.json")
    assert refused.returncode == 2
    assert f"--json {blocker / 'r.json'}: cannot make {blocker}" in refused.stderr
    assert "Policies compared" not in refused.stdout


def simulate_at_80_columns(*args: str) -> list[str]:
    """`gpupool simulate ARGS` piped at 80 columns: its lines, each checked to fit uncut."""
    return at_80_columns("simulate", *args)


def at_80_columns(*args: str) -> list[str]:
    """`gpupool ARGS` piped at 80 columns: its lines, each checked to fit uncut."""
    done = gpupool(*args, columns=80)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert not any("…" in line for line in lines), "a cell was cut"
    return lines


def test_simulate_compare_reads_at_80_columns_when_piped(traces_dir: Path) -> None:
    trace = str(traces_dir / "tiresias-sample" / "jobs.csv")
    lines = simulate_at_80_columns("--trace", trace, "--nodes", "2", "--compare", "partitioned,pool-fifo,pool-priority")
    assert any("p95 wait urgent" in line for line in lines)


def test_simulate_with_node_failures_reads_at_80_columns_and_reports_them(traces_dir: Path, tmp_path: Path) -> None:
    trace = str(traces_dir / "tiresias-sample" / "jobs.csv")
    out = tmp_path / "failures.json"
    args = ["--trace", trace, "--nodes", "4", "--compare", "pool-fifo,pool-priority"]
    lines = simulate_at_80_columns(
        *args, "--node-mtbf", "20m", "--node-repair", "5m", "--seed", "1", "--json", str(out)
    )
    assert any("losses" in line for line in lines)
    reports = json.loads(out.read_text())
    assert all(r["node_failures"] > 0 and "lost_gpu_hours_by_cause" in r for r in reports)


def test_failed_jobs_of_a_trace_with_node_failures_read_at_80_columns(traces_dir: Path, tmp_path: Path) -> None:
    openb = traces_dir / "alibaba-openb-2023"
    out = tmp_path / "openb.json"
    args = ["--trace", str(openb / "jobs.csv"), "--machines", str(openb / "source" / "openb_node_list_gpu_node.csv")]
    args += [
        "--scale",
        "0.02",
        "--priority-from",
        "qos",
        "--priority-map",
        "LS=high,Guaranteed=high,Burstable=normal,BE=low",
    ]
    lines = simulate_at_80_columns(
        *args, "--compare", "pool-fifo,pool-priority", "--node-mtbf", "30d", "--json", str(out)
    )
    assert "1,869 failed in the trace" in " ".join(" ".join(lines).split())
    assert any(line.split("┃")[-4:-1] == [" nodes ", " failed ", "   Y/D "] for line in lines)
    reports = json.loads(out.read_text())
    assert all(r["trace_failed_jobs"] == 1869 and r["lost_gpu_hours_by_cause"]["failure"] > 0 for r in reports)


def test_advise_reads_at_80_columns_and_writes_yaml_the_config_reads(traces_dir: Path, tmp_path: Path) -> None:
    trace = str(traces_dir / "tiresias-sample" / "jobs.csv")
    out = tmp_path / "advice" / "advice.yaml"
    args = ["--trace", trace, "--nodes", "2", "--target", "high.wait.p95<=5m", "--workers", "1", "-o", str(out)]
    lines = at_80_columns("advise", *args)
    assert any("Checkpoint interval per class" in line for line in lines)
    assert any(line.startswith("│ high.wait.p95<=5m") for line in lines)
    from gpupool.config import load

    assert load(out).team("default").budgets  # the snippet is a configuration file as it is
    refused = runner.invoke(app, ["advise", "--trace", trace, "--nodes", "2", "--target", "high.wait<=5m"])
    assert refused.exit_code == 2
    assert "expected CLASS.MEASURE.STAT<=DURATION" in refused.output
    refused = runner.invoke(app, ["advise", "--trace", trace, "--nodes", "2", "--policy", "pool-fifo"])
    assert refused.exit_code == 2 and "use pool-priority or pool-fair" in refused.output


def test_a_sweep_of_node_failures_takes_their_repair_time_and_says_what_it_skipped(
    traces_dir: Path, tmp_path: Path
) -> None:
    openb = traces_dir / "alibaba-openb-2023"
    out = tmp_path / "sweep.json"
    args = ["--trace", str(openb / "jobs.csv"), "--nodes", "8", "--policy", "pool-fifo", "--workers", "1"]
    args += ["--sweep", "node-mtbf=2d,8d", "--node-repair", "1d", "--json", str(out)]
    lines = simulate_at_80_columns(*args)
    first = " ".join(" ".join(lines).split())
    assert "1,949 without GPUs or run time skipped" in first and "; 2 runs" in first
    reports = json.loads(out.read_text())
    assert [r["parameters"]["node-mtbf"] for r in reports] == ["2d", "8d"]
    # A repair of a day: the GPU-hours out exceed those that a 4-hour repair would give.
    assert reports[0]["node_down_gpu_hours"] >= 8 * 24 * reports[0]["node_failures"] * 0.5


def test_a_sweep_reads_at_80_columns_and_writes_its_cells(traces_dir: Path, tmp_path: Path) -> None:
    trace = str(traces_dir / "tiresias-sample" / "jobs.csv")
    out, plots = tmp_path / "sweep.json", tmp_path / "plots"
    args = ["--trace", trace, "--nodes", "2", "--compare", "pool-fifo,pool-priority", "--workers", "1"]
    args += ["--sweep", "checkpoint-interval=5m,1h", "--sweep", "restart-cost=10s,2m", "--json", str(out)]
    lines = simulate_at_80_columns(*args, "--plots", str(plots))
    assert any("5m, 10s" in line and "pool-priority" in line for line in lines)
    cells = json.loads(out.read_text())
    assert len(cells) == 8
    assert cells[0]["parameters"] == {"checkpoint-interval": "5m", "restart-cost": "10s"}
    assert sorted(p.name for p in plots.iterdir()) == ["sweep-checkpoint-interval.png", "sweep-restart-cost.png"]


def test_a_job_submitted_from_inside_a_job_does_not_take_its_compile_caches() -> None:
    from gpupool.cli.submit import job_environment

    inside = {
        "GPUPOOL_CACHE_DIR": "/data/jobs/s-7/cache",
        "TORCHINDUCTOR_CACHE_DIR": "/data/jobs/s-7/cache/torchinductor",
        "HF_HOME": "/home/me/hf",
    }
    env = job_environment("ALL", [], inside)
    assert env == {"HF_HOME": "/home/me/hf"}, "the parent's cache is its own; the child gets one of its own"


def test_jobs_that_need_a_gpu_type_no_node_has_are_named(tmp_path: Path) -> None:
    trace = tmp_path / "typed.csv"
    trace.write_text(
        "job_id,submit_time,num_gpus,duration,vc,gpu_type\na,0,1,60,t,\nb,1,1,60,t,A100\nc,2,2,60,t,V100\n"
    )
    lines = simulate_at_80_columns("--trace", str(trace), "--nodes", "2")
    assert "2 need a GPU type no node has (A100: 1, V100: 1; give" in " ".join(lines)


def test_a_cost_axis_starts_at_zero_and_has_height_when_every_cost_is_zero() -> None:
    from gpupool.cli.report_plots import cost_axis

    assert cost_axis([0.0, 0.0]) == (0.0, 1.0)
    assert cost_axis([]) == (0.0, 1.0)
    low, high = cost_axis([2.0, 10.0])
    assert low == 0.0 and high > 10.0


def test_the_admin_token_is_found_in_the_first_data_directory_that_has_one(tmp_path: Path, monkeypatch: Any) -> None:
    """A users' client.yaml names no data directory: root's command line finds the admin token
    in the service's (`cli.common.client` passes both)."""
    from gpupool.client import Client

    monkeypatch.delenv("GPUPOOL_TOKEN", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-login"))
    users, service = tmp_path / "users", tmp_path / "service"
    service.mkdir()
    (service / "admin.token").write_text("the-admins\n")
    assert Client.from_env("http://x", [users, service]).http.headers["Authorization"] == "Bearer the-admins"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "2-7", "--resize-step", "2"], "--gpus 2-7: 5 GPUs between them are not steps of 2"),
        (["--gpus", "4", "--resize-step", "2"], "--resize-step '2' goes with --gpus MIN-MAX (an elastic job)"),
        (["--gpus", "two"], "--gpus 'two': a number of GPUs, or the fewest and the most, as 4-16"),
        (["--nodes", "1-2"], "--nodes goes with --gpus-per-node"),
        (["--nodes", "1-2", "--gpus", "4", "--gpus-per-node", "2"], "give --gpus or --nodes, not both"),
        (["--nodes", "a-b", "--gpus-per-node", "2"], "--nodes 'a-b': a number of nodes, or the fewest and the most"),
        (["--nodes", "0-2", "--gpus-per-node", "2"], "--nodes 0-2: at least 1 node"),
        (
            ["--nodes", "1-3", "--gpus-per-node", "2", "--resize-step", "pow2"],
            "--nodes 1-3 (2-6 GPUs): by powers of two",
        ),
    ],
)
def test_an_elastic_submission_that_makes_no_sizes_is_refused_before_it_is_sent(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["submit", *args, "--api", "http://127.0.0.1:9", "--", "true"])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_elastic_sizes_come_from_gpus_or_whole_nodes_and_a_step() -> None:
    from gpupool.cli.submit import requested_gpus

    assert requested_gpus("4-16", None, "pow2", None) == (16, (4, 8, 16))
    assert requested_gpus(None, "1-3", None, 8) == (24, (8, 16, 24))
    assert requested_gpus(None, "2", None, 8) == (16, ())
    assert requested_gpus(None, None, None, None) == (1, ())


def test_the_queue_shows_an_elastic_jobs_gpus_held_of_its_largest() -> None:
    from gpupool.cli.jobs import gpus_now

    assert gpus_now({"gpus": 4, "sizes": [2, 4], "placement": {"vm": [0, 1]}}) == "2/4"
    assert gpus_now({"gpus": 4, "sizes": [2, 4], "placement": {}}) == "4", "in line: what it asks for"
    assert gpus_now({"gpus": 4, "sizes": None, "placement": {"vm": [0, 1, 2, 3]}}) == "4"
