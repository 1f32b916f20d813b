"""`gpupool demo`: the scheduling core on a small workload it makes itself, told as it happens.

The workload runs through the simulator, which drives the very `decide` of the scheduler on a
virtual clock: low-priority jobs fill an idle pool, a high-priority job arrives, a victim gets
notice, saves a checkpoint, goes back in line and resumes from it later.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from gpupool.model import DEFAULT_CLASSES, Config, Node, Plan, Team
from gpupool.sim.engine import Simulation
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.metrics import summarize
from gpupool.sim.records import Outcome, SimJob
from gpupool.sim.report import ordered_classes
from gpupool.units import human_seconds

MINUTE = 60.0


def workload() -> list[SimJob]:
    """Two teams on 2 nodes × 4 GPUs: vision fills the pool with low-priority sweeps, then nlp
    needs 4 GPUs at high priority and 2 more at normal priority."""
    jobs = [SimJob(f"sweep-{i}", "vision", "low", 1, i * 0.5 * MINUTE, 90 * MINUTE) for i in range(8)]
    jobs.append(SimJob("pretrain", "nlp", "high", 4, 20 * MINUTE, 30 * MINUTE))
    jobs.append(SimJob("finetune", "nlp", "normal", 2, 25 * MINUTE, 20 * MINUTE))
    jobs.append(SimJob("eval", "vision", "low", 1, 40 * MINUTE, 10 * MINUTE))
    return jobs


def run_demo(console: Console) -> Outcome:
    nodes = [Node("node-0", 4, "virtual"), Node("node-1", 4, "virtual")]
    config = Config(
        DEFAULT_CLASSES,
        {"vision": Team("vision", guaranteed_gpus=4), "nlp": Team("nlp", guaranteed_gpus=4)},
    )
    model = JobModel({}, default_interval=10 * MINUTE, save_cost=15.0, restart_cost=30.0)
    console.rule("[bold]gpupool demo[/]: one pool of 8 virtual GPUs, two teams, four priority classes")

    attempts: dict[str, int] = {}

    def tell(now: float, plan: Plan) -> None:
        clock = f"[dim]t={human_seconds(now):>8}[/]"
        for p in plan.preemptions:
            console.print(f"{clock} [bold red]notice[/]  {p.message}; deadline in {human_seconds(p.deadline - now)}")
        for s in plan.starts:
            attempts[s.job] = attempts.get(s.job, -1) + 1
            again = f" [cyan](attempt {attempts[s.job]}: resumes from its checkpoint)[/]" if attempts[s.job] else ""
            console.print(f"{clock} [green]start[/]   {s.message}{again}")

    outcome = Simulation(workload(), nodes, config, model, on_plan=tell).run()
    report = summarize("pool-priority", outcome, model.save_cost)
    console.print(summary_table(report, outcome))
    lost = report["lost_gpu_hours"]
    parts = ", ".join(f"{part} {lost[part] * 60:.1f}" for part in ("wasted", "drain", "restart"))
    console.print(
        f"{report['preemptions']} preemption(s); work lost: {lost['total'] * 60:.1f} GPU-minutes ({parts}); "
        f"goodput {report['goodput'] * 100:.1f} %"
    )
    return outcome


def summary_table(report: dict[str, object], outcome: Outcome) -> Table:
    by_priority = report["by_priority"]
    assert isinstance(by_priority, dict)
    table = Table(title="Waits per priority class")
    for header in ("class", "jobs", "mean wait", "max wait", "preemptions"):
        table.add_column(header, justify="left" if header == "class" else "right")
    for name in ordered_classes(by_priority):
        records = [r for r in outcome.records if r.job.priority == name]
        table.add_row(
            name,
            str(len(records)),
            human_seconds(by_priority[name]["wait"]["mean"]),
            human_seconds(max(r.wait for r in records)),
            str(sum(r.preemptions for r in records)),
        )
    return table
