"""The simulator's results, held fixed while it is made faster: a busy window of Philly (1,500
jobs at a tenth of its VC sizes, so that jobs wait and get preempted) under every policy gives,
byte for byte, the report recorded in golden/philly-window.json (its wall time aside).

A change that is meant to change results writes the file anew, and the diff shows what moved:
GPUPOOL_WRITE_GOLDEN=1 .venv/bin/pytest tests/sim/test_results_fixed.py
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from gpupool.sim.cluster import load_vc_sizes
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.replay import ClusterSpec, Policy, Settings, replay
from gpupool.sim.trace import load_trace

GOLDEN = Path(__file__).parent / "golden" / "philly-window.json"
WINDOW = slice(20_000, 21_500)


def reports(traces: Path) -> str:
    trace = load_trace(traces / "philly" / "jobs.csv")
    trace = replace(trace, jobs=trace.jobs[WINDOW])
    spec = ClusterSpec(load_vc_sizes(traces / "philly" / "vc_sizes.csv"), scale=0.1)
    settings = Settings(JobModel({}, 1800.0, 30.0, 60.0))
    out = {}
    for policy in Policy:
        report = replay(trace, spec, policy, settings).report
        out[str(policy)] = {key: value for key, value in report.items() if key != "wall_seconds"}
    return json.dumps(out, indent=1, sort_keys=True) + "\n"


def test_every_policy_gives_the_recorded_report_byte_for_byte(traces_dir: Path) -> None:
    got = reports(traces_dir)
    if os.environ.get("GPUPOOL_WRITE_GOLDEN"):
        GOLDEN.write_text(got)
        pytest.skip(f"wrote {GOLDEN.name} anew: nothing was compared (git diff shows what moved)")
    recorded = json.loads(GOLDEN.read_text())
    assert recorded["pool-priority"]["preemptions"] > 100, "a window where preemption decides"
    assert got == GOLDEN.read_text()
