"""The study the Ai2 report never published: one pool with priorities against reservations.

Philly, 2017-10-01 to 2017-11-30, the 11 Helios VCs; VC sizes as slices (partitioned) and as
guarantees (pool policies); priority mix urgent 2 %, high 8 %, normal 50 %, low 40 %;
checkpoints every 30 min (30 s blocking), restart 60 s. At the Helios sizes (scale 1, offered
load ≈ 0.17) and at high load (scale 0.2, 70 nodes, offered load ≈ 0.84).

Writes out/study/scale-<s>/report.json and its plots, and prints a Markdown table.
Run: .venv/bin/python -m benchmarks.philly_study [--scales 1,0.2] [--out out/study] [--workers 2]
(`--workers`: policies replayed side by side in that many processes; each one's `wall` is its own.)
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from gpupool.sim.cluster import load_vc_sizes
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.plots import write_plots
from gpupool.sim.replay import ClusterSpec, Policy, Settings, compare, replay
from gpupool.sim.report import write_json
from gpupool.sim.trace import load_trace
from gpupool.units import human_seconds

DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
CLASSES = ("urgent", "high", "normal", "low")


def offered_load(trace_gpu_seconds: float, gpus: int, span: float) -> float:
    return trace_gpu_seconds / (gpus * span)


def row(scale: float, report: dict[str, Any]) -> str:
    waits = " | ".join(
        human_seconds(report["by_priority"][c]["wait"]["p95"]) if c in report["by_priority"] else "—" for c in CLASSES
    )
    lost = report["lost_gpu_hours"]["total"]
    share = lost / report["trace_gpu_hours"] * 100 if report["trace_gpu_hours"] else 0.0
    left = report["left_out"]["never_fits"]
    return (
        f"| {scale:g} | {report['policy']} | {report['jobs']:,} | {report['utilization'] * 100:.1f} % "
        f"| {human_seconds(report['jct']['mean'])} | {waits} | {report['preemptions']:,} "
        f"| {lost:,.1f} ({share:.2f} %) | {report['fairness']:.2f} | {left} | {report['wall_seconds']:.0f} s |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--scales", default="1,0.2")
    parser.add_argument("--out", type=Path, default=Path("out/study"))
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    philly = args.traces / "philly"
    trace = load_trace(philly / "jobs.csv", start=datetime(2017, 10, 1), end=datetime(2017, 12, 1))
    sizes = load_vc_sizes(philly / "vc_sizes.csv")
    settings = Settings(JobModel({}, 1800.0, save_cost=30.0, restart_cost=60.0))
    span = max(j.submit_time for j in trace.jobs) - min(j.submit_time for j in trace.jobs)
    lines = [
        "| scale | policy | jobs | util. | mean JCT | p95 wait urgent | high | normal | low "
        "| preemptions | lost GPU-h (of trace) | Jain | never fit | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for scale in (float(s) for s in args.scales.split(",")):
        spec = ClusterSpec(sizes, scale=scale)
        if args.workers > 1:
            with ProcessPoolExecutor(args.workers) as pool:
                runs = list(pool.map(partial(replay, trace, spec, settings=settings), Policy))
        else:
            runs = compare(trace, spec, list(Policy), settings)
        folder = args.out / f"scale-{scale:g}"
        folder.mkdir(parents=True, exist_ok=True)
        write_json([r.report for r in runs], folder / "report.json")
        write_plots(runs, folder)
        sized = [j for j in trace.jobs if j.team in sizes]
        load = offered_load(sum(j.gpus * j.duration for j in sized), runs[0].report["gpus"], span)
        print(f"scale {scale:g}: {runs[0].report['gpus']:,} GPUs, offered load {load:.2f}", flush=True)
        lines += [row(scale, r.report) for r in runs]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
