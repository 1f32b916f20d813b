"""Rigid against elastic jobs (issue 36): the same traces under pool-priority with none, 30 %
and all of their multi-GPU jobs elastic (`--elastic-share`), down to a quarter of their GPUs,
at a parallel fraction of 0.95 (`sim.elastic`) and, as the most a resize could gain, 1.0.

- Philly, 2017-10-01 to 2017-11-30, the 11 Helios VCs at scale 0.2 (70 nodes, offered load
  about 0.84): the high load of `philly_study`.
- alibaba-openb-2023, 5 nodes of 8 GPUs, teams and classes from `qos`
  (LS=high, Guaranteed=high, Burstable=normal, BE=low): its high-load setting in
  docs/benchmarks.md.

Checkpoints every 30 min (30 s blocking), restart 60 s, elastic.min_time_at_size 10 min.
Prints a Markdown table per trace and writes out/elastic/<trace>.json and a plot of mean JCT
and the p95 wait per class against the elastic share; then, for each trace with every
multi-GPU job elastic (p = 0.95), how its elastic jobs started and how often they grew.
Run: .venv/bin/python -m benchmarks.elastic_study [--traces DIR] [--out out/elastic] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from gpupool.model import Plan
from gpupool.sim.cluster import load_vc_sizes
from gpupool.sim.engine import Simulation
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.replay import ClusterSpec, Policy, Settings, admissible, build_cluster, policy_config, replay
from gpupool.sim.trace import Trace, load_trace
from gpupool.sim.workload import parse_priority_map
from gpupool.units import human_seconds

DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
CLASSES = ("urgent", "high", "normal", "low")
RUNS = ((0.0, 0.95), (0.3, 0.95), (1.0, 0.95), (0.3, 1.0), (1.0, 1.0))
"""(elastic share, parallel fraction) of each replay; the first is rigid."""


@dataclass(frozen=True)
class Study:
    name: str
    trace: Trace
    spec: ClusterSpec
    settings: Settings


def studies(traces: Path) -> list[Study]:
    model = JobModel({}, 1800.0, save_cost=30.0, restart_cost=60.0)
    philly = traces / "philly"
    window = load_trace(philly / "jobs.csv", start=datetime(2017, 10, 1), end=datetime(2017, 12, 1))
    openb = load_trace(traces / "alibaba-openb-2023" / "jobs.csv", priority_from="qos", team_from="qos")
    qos = parse_priority_map("LS=high,Guaranteed=high,Burstable=normal,BE=low", CLASSES)
    return [
        Study("philly", window, ClusterSpec(load_vc_sizes(philly / "vc_sizes.csv"), scale=0.2), Settings(model)),
        Study("alibaba-openb-2023", openb, ClusterSpec(nodes=5), Settings(model, priority_map=qos)),
    ]


def one(study: Study, share: float, parallel: float) -> dict[str, Any]:
    settings = replace(study.settings, elastic_share=share, parallel=parallel)
    report = replay(study.trace, study.spec, Policy.POOL_PRIORITY, settings).report
    return {"elastic_share": share, "parallel_fraction": parallel, **report}


def starts(study: Study) -> Counter[str]:
    """How the elastic jobs of `study`, all of its multi-GPU jobs (p = 0.95), started (at their
    largest size, below it, at their smallest), and how many growths and shrinks there were."""
    settings = replace(study.settings, elastic_share=1.0)
    cluster = build_cluster(study.trace, study.spec, Policy.POOL_PRIORITY)
    jobs, _, _ = admissible(study.trace, cluster, settings)
    bounds = {job.id: (job.sizes[0], job.gpus) for job in jobs if job.sizes}
    seen: Counter[str] = Counter()

    def count(now: float, plan: Plan) -> None:
        for start in plan.starts:
            if start.job in bounds:
                (smallest, largest), size = bounds[start.job], sum(len(a.gpus) for a in start.placement)
                seen["starts"] += 1
                seen["below largest"] += size < largest
                seen["at smallest"] += size == smallest
        seen["growths"] += len(plan.grows)
        seen["shrinks"] += sum(1 for p in plan.preemptions if p.keep)

    config = policy_config(Policy.POOL_PRIORITY, cluster, settings)
    Simulation(jobs, cluster.nodes, config, settings.model, on_plan=count, parallel=settings.parallel).run()
    return seen


def row(report: dict[str, Any]) -> str:
    waits = " | ".join(
        human_seconds(report["by_priority"][c]["wait"]["p95"]) if c in report["by_priority"] else "—" for c in CLASSES
    )
    return (
        f"| {report['elastic_share'] * 100:.0f} % | {report['parallel_fraction']:g} "
        f"| {human_seconds(report['jct']['mean'])} | {waits} | {report['utilization'] * 100:.1f} % "
        f"| {report['goodput'] * 100:.1f} % | {report['preemptions']:,} | {report.get('resizes', 0):,} "
        f"| {report['lost_gpu_hours']['total']:,.1f} | {report.get('lost_gpu_hours_to_resizes', 0.0):,.1f} "
        f"| {report['wall_seconds']:.0f} s |"
    )


def plot(name: str, reports: list[dict[str, Any]], path: Path) -> None:
    """Mean JCT and the p95 wait per class against the elastic share, one line per parallel fraction."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for parallel in sorted({r["parallel_fraction"] for r in reports}):
        mine = [r for r in reports if r["parallel_fraction"] == parallel or r["elastic_share"] == 0]
        mine.sort(key=lambda r: r["elastic_share"])
        shares = [r["elastic_share"] * 100 for r in mine]
        axes[0].plot(shares, [r["jct"]["mean"] / 3600 for r in mine], marker="o", label=f"p = {parallel:g}")
        for cls in ("high", "normal", "low"):
            waits = [r["by_priority"].get(cls, {}).get("wait", {}).get("p95", 0.0) / 3600 for r in mine]
            axes[1].plot(shares, waits, marker="o", label=f"{cls}, p = {parallel:g}")
    axes[0].set(title=f"{name}: mean JCT", xlabel="elastic jobs (% of multi-GPU jobs)", ylabel="hours")
    axes[1].set(title=f"{name}: p95 wait by class", xlabel="elastic jobs (% of multi-GPU jobs)", ylabel="hours")
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--out", type=Path, default=Path("out/elastic"))
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    header = [
        "| elastic | p | mean JCT | p95 wait urgent | high | normal | low | util. | goodput | preemptions "
        "| resizes | lost GPU-h | of it, resizes | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for study in studies(args.traces):
        with ProcessPoolExecutor(args.workers) as pool:
            reports = list(pool.map(one, [study] * len(RUNS), *zip(*RUNS, strict=True)))
        (args.out / f"{study.name}.json").write_text(json.dumps(reports, indent=1) + "\n")
        plot(study.name, reports, args.out / f"{study.name}.png")
        print(f"\n{study.name}: {reports[0]['gpus']:,} GPUs, {reports[0]['jobs']:,} jobs", flush=True)
        print("\n".join(header + [row(r) for r in reports]), flush=True)
    for study in studies(args.traces):
        seen = starts(study)
        print(
            f"{study.name}, all elastic: {seen['starts']:,} starts of elastic jobs, {seen['below largest']:,} "
            f"below their largest size, {seen['at smallest']:,} at their smallest; {seen['growths']:,} growths, "
            f"{seen['shrinks']:,} shrinks",
            flush=True,
        )


if __name__ == "__main__":
    main()
