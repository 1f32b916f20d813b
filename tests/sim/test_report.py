from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.table import Table

from gpupool.sim.metrics import summarize
from gpupool.sim.records import JobRecord, Outcome, SimJob
from gpupool.sim.report import (
    comparison_table,
    lost_work_table,
    ordered_classes,
    team_table,
    write_json,
)
from gpupool.units import human_seconds


def record(
    id: str,
    team: str,
    priority: str,
    gpus: int,
    submit: float,
    wait: float,
    work: float,
    preemptions: int = 0,
) -> JobRecord:
    lost = 600.0 * gpus * preemptions
    return JobRecord(
        SimJob(id, team, priority, gpus, submit, work),
        first_start=submit + wait,
        finish=submit + wait + work + lost / gpus,
        wait=wait,
        preemptions=preemptions,
        allocated=gpus * work + lost,
        wasted=lost / 2,
        drain=lost / 4,
        restart=lost / 4,
    )


def report(policy: str, *records: JobRecord) -> dict[str, Any]:
    out = summarize(policy, Outcome(list(records), [], decisions=1, capacity=16), save_cost=30.0)
    out["left_out"] = {"team_not_sized": 1, "never_fits": 2}
    return out


def render(table: Table) -> str:
    console = Console(record=True, width=200)
    console.print(table)
    return console.export_text()


PRIORITY = report(
    "pool-priority",
    record("a", "vision", "low", 8, 0.0, 0.0, 7200.0, preemptions=1),
    record("b", "nlp", "urgent", 8, 600.0, 30.0, 1800.0),
    record("c", "nlp", "batch", 2, 0.0, 90.0, 600.0),
)
FIFO = report(
    "pool-fifo",
    record("a", "vision", "low", 8, 0.0, 0.0, 7200.0),
    record("b", "nlp", "urgent", 8, 600.0, 6600.0, 1800.0),
)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0 s"),
        (0.4, "0 s"),
        (42.0, "42 s"),
        (59.4, "59 s"),
        (59.6, "1.0 min"),
        (210.0, "3.5 min"),
        (3599.0, "1.0 h"),
        (7560.0, "2.1 h"),
        (86399.0, "1.0 d"),
        (112320.0, "1.3 d"),
        (30 * 86400.0, "30.0 d"),
        (-90.0, "-1.5 min"),
        (math.inf, "∞"),
        (math.nan, "—"),
    ],
)
def test_human_seconds_picks_the_largest_readable_unit(seconds: float, text: str) -> None:
    assert human_seconds(seconds) == text


def test_classes_are_ordered_as_the_default_classes_then_unknown_ones_by_name() -> None:
    assert ordered_classes(["low", "zeta", "urgent", "batch", "normal"]) == [
        "urgent",
        "normal",
        "low",
        "batch",
        "zeta",
    ]


def test_the_comparison_table_has_one_column_per_report_and_a_p95_wait_row_per_class() -> None:
    table = comparison_table([FIFO, PRIORITY])
    assert [str(c.header) for c in table.columns] == ["measure", "pool-fifo", "pool-priority"]
    text = render(table)
    lines = text.splitlines()
    measures = [line.split("│")[1].strip() for line in lines if line.startswith("│")]
    assert measures == [
        "jobs",
        "GPUs",
        "utilization",
        "mean JCT",
        "p95 wait",
        "p95 wait urgent",
        "p95 wait low",
        "p95 wait batch",
        "preemptions",
        "lost GPU-h",
        "goodput",
        "fairness (Jain)",
        "left out",
    ]

    def row(measure: str) -> list[str]:
        line = next(line for line in lines if line.startswith("│") and line.split("│")[1].strip() == measure)
        return [cell.strip() for cell in line.split("│")[2:-1]]

    # FIFO ran no batch job: its cell says so rather than showing zero.
    assert row("p95 wait batch")[0] == "—"
    assert row("p95 wait urgent")[0] == "1.8 h"
    lost = 8 * 600 / 3600
    share = lost / PRIORITY["trace_gpu_hours"] * 100
    assert row("lost GPU-h")[1] == f"{lost:.1f} ({share:.1f} %)"
    assert row("left out")[1] == "3"  # 2 never fit + 1 of a team without a size


def test_the_comparison_counts_resizes_where_jobs_are_elastic() -> None:
    elastic = {**PRIORITY, "resizes": 1234}
    plain = render(comparison_table([FIFO, PRIORITY])).splitlines()
    assert "resizes" not in [line.split("│")[1].strip() for line in plain if line.startswith("│")]
    lines = render(comparison_table([FIFO, elastic])).splitlines()
    row = next(line for line in lines if line.startswith("│") and line.split("│")[1].strip() == "resizes")
    assert [cell.strip() for cell in row.split("│")[2:-1]] == ["0", "1,234"]


def test_the_comparison_reads_at_80_columns() -> None:
    console = Console(record=True, width=80)
    console.print(comparison_table([FIFO, PRIORITY, FIFO]))
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert not any("…" in line for line in lines), "a cell was cut"


def test_the_team_table_lists_the_team_with_the_most_gpu_hours_first() -> None:
    table = team_table(PRIORITY)
    assert table.row_count == 2
    lines = render(table).splitlines()
    rows = [line for line in lines if "vision" in line or "nlp" in line]
    assert "vision" in rows[0]
    assert "nlp" in rows[1]
    assert "pool-priority" in lines[0]


def test_the_lost_work_table_shows_causes_and_a_dash_without_interruptions() -> None:
    table = lost_work_table([FIFO, PRIORITY])
    assert table.row_count == 2
    lines = render(table).splitlines()
    fifo = next(line for line in lines if "pool-fifo" in line)
    priority = next(line for line in lines if "pool-priority" in line)
    assert "—" in fifo
    assert PRIORITY["young_daly_interval"] is not None
    assert human_seconds(PRIORITY["young_daly_interval"]) in priority
    assert "0.7" in priority  # wasted: half of 1.33 GPU-h
    assert "1.3" in priority  # total


def test_write_json_gives_the_same_bytes_for_equal_reports_with_keys_sorted(tmp_path: Path) -> None:
    shuffled = [dict(reversed(list(r.items()))) for r in (FIFO, PRIORITY)]
    write_json([FIFO, PRIORITY], tmp_path / "a.json")
    write_json(shuffled, tmp_path / "b.json")
    write_json([FIFO, PRIORITY], tmp_path / "c.json")
    data = (tmp_path / "a.json").read_bytes()
    assert data == (tmp_path / "b.json").read_bytes() == (tmp_path / "c.json").read_bytes()
    assert data.endswith(b"}\n]\n")
    loaded = json.loads(data)
    assert [r["policy"] for r in loaded] == ["pool-fifo", "pool-priority"]
    assert list(loaded[0]) == sorted(loaded[0])
    assert list(loaded[0]["lost_gpu_hours"]) == sorted(loaded[0]["lost_gpu_hours"])
