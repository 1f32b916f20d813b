"""Replay speed at scale: synthetic traces of 10k, 100k and 1M jobs on 10,000 GPUs.

Each job draws its (GPUs, duration, team) from Philly's jobs.csv (seeded), and arrivals are
Poisson at the rate that offers `--load` of the pool's GPU-time, so the queue stays bounded
and the cost per job can be compared across sizes (near-linear is the target). Each replay
runs in a fresh process, so that its peak RSS is its own.
Run: .venv/bin/python -m benchmarks.replay_scale [--traces ../shared/data/traces] [--sizes 10000,100000,1000000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from gpupool.sim.jobmodel import JobModel
from gpupool.sim.replay import ClusterSpec, Policy, Settings, replay
from gpupool.sim.trace import Trace, TraceJob, load_trace

DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
NODES, GPUS_PER_NODE = 1_250, 8
SEED = 14


def synthetic(traces: Path, jobs: int, load: float) -> Trace:
    """`jobs` jobs with Philly's mix of sizes, durations and teams, offering `load` of the pool."""
    philly = load_trace(traces / "philly" / "jobs.csv")
    fits = [j for j in philly.jobs if j.gpus <= NODES * GPUS_PER_NODE]
    rng = np.random.default_rng(SEED)
    picks = rng.integers(0, len(fits), size=jobs)
    mean_gpu_seconds = float(np.mean([fits[i].gpus * fits[i].duration for i in picks[:100_000]]))
    rate = load * NODES * GPUS_PER_NODE / mean_gpu_seconds
    submits = np.cumsum(rng.exponential(1.0 / rate, size=jobs))
    made = tuple(
        TraceJob(f"s{n}", float(submit), fits[i].gpus, fits[i].duration, fits[i].team, None)
        for n, (i, submit) in enumerate(zip(picks.tolist(), submits.tolist(), strict=True))
    )
    return Trace(Path(f"synthetic-{jobs}"), made, 0, 0)


def one(traces: Path, jobs: int, policy: Policy, load: float) -> None:
    """Replay once in this process and print what it cost, as JSON."""
    trace = synthetic(traces, jobs, load)
    began = time.perf_counter()
    run = replay(
        trace, ClusterSpec(nodes=NODES, gpus_per_node=GPUS_PER_NODE), policy, Settings(JobModel({}, 1800.0, 30.0, 60.0))
    )
    seconds = time.perf_counter() - began
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "jobs": run.report["jobs"],
                "replay_seconds": round(seconds, 3),
                "decisions": run.report["decisions"],
                "rss_mib": round(rss_mib, 1),
                "utilization": run.report.get("utilization"),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--policies", default="pool-fifo,pool-priority")
    parser.add_argument("--load", type=float, default=0.8, help="offered GPU-time over the pool's (default 0.8)")
    parser.add_argument("--one", nargs=2, metavar=("JOBS", "POLICY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        jobs, policy = args.one
        one(args.traces, int(jobs), Policy(policy), args.load)
        return
    print(f"{NODES:,} nodes x {GPUS_PER_NODE} GPUs, offered load {args.load}")
    print(f"{'jobs':>10} {'policy':>14} {'replay s':>9} {'µs/job':>7} {'decisions':>10} {'RSS MiB':>8}")
    for policy in args.policies.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            command = [sys.executable, __file__, "--traces", str(args.traces), "--load", str(args.load)]
            command += ["--one", str(size), policy]
            out = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
            per_job = out["replay_seconds"] / out["jobs"] * 1e6
            print(
                f"{out['jobs']:>10,} {policy:>14} {out['replay_seconds']:>9.2f} {per_job:>7.0f} "
                f"{out['decisions']:>10,} {out['rss_mib']:>8.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
