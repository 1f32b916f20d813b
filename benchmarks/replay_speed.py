"""Replay speed: Philly's jobs.csv on the 11 Helios VC sizes (2,816 GPUs).

The first 1k, 10k and all 82k jobs (in submit order), under pool-priority and, as the
baseline, pool-fifo. Each replay runs in a fresh process so that its peak RSS is its own.
Run: .venv/bin/python -m benchmarks.replay_speed [--traces ../shared/data/traces]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from gpupool.sim.cluster import load_vc_sizes
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.replay import ClusterSpec, Policy, Settings, replay
from gpupool.sim.trace import load_trace

SIZES = (1_000, 10_000, None)
DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"


def one(traces: Path, jobs: int | None, policy: Policy) -> None:
    """Replay once in this process and print what it cost, as JSON."""
    began = time.perf_counter()
    trace = load_trace(traces / "philly" / "jobs.csv")
    if jobs is not None:
        trace = replace(trace, jobs=trace.jobs[:jobs])
    spec = ClusterSpec(load_vc_sizes(traces / "philly" / "vc_sizes.csv"))
    run = replay(trace, spec, policy, Settings(JobModel({}, 1800.0, 30.0, 60.0)))
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "jobs": run.report["jobs"],
                "replay_seconds": run.report["wall_seconds"],
                "total_seconds": round(time.perf_counter() - began, 3),
                "decisions": run.report["decisions"],
                "rss_mib": round(rss_mib, 1),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--one", nargs=2, metavar=("JOBS", "POLICY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        jobs, policy = args.one
        one(args.traces, None if jobs == "all" else int(jobs), Policy(policy))
        return
    print(f"{'jobs':>8} {'policy':>14} {'replay s':>9} {'total s':>8} {'decisions':>10} {'RSS MiB':>8} {'µs/job':>7}")
    for size in SIZES:
        for policy in (Policy.POOL_PRIORITY, Policy.POOL_FIFO):
            command = [
                sys.executable,
                __file__,
                "--traces",
                str(args.traces),
                "--one",
                str(size or "all"),
                policy,
            ]
            out = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
            per_job = out["replay_seconds"] / out["jobs"] * 1e6
            print(
                f"{out['jobs']:>8,} {policy.value:>14} {out['replay_seconds']:>9.2f} {out['total_seconds']:>8.2f} "
                f"{out['decisions']:>10,} {out['rss_mib']:>8.0f} {per_job:>7.0f}"
            )


if __name__ == "__main__":
    main()
