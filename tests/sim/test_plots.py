from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from gpupool.model import DEFAULT_CLASSES, Config, QueueOrder
from gpupool.sim.engine import Simulation
from gpupool.sim.jobmodel import JobModel
from gpupool.sim.metrics import summarize
from gpupool.sim.plots import allocation_by_class, class_colours, write_plots
from gpupool.sim.records import Outcome, SimJob, Usage
from gpupool.sim.replay import Replayed
from tests.support.builders import pool

PNG = b"\x89PNG\r\n\x1a\n"


def test_allocation_is_the_time_weighted_mean_per_bin_for_each_class() -> None:
    usage = [Usage(0.0, "low", 4), Usage(5.0, "high", 2), Usage(10.0, "low", -4), Usage(10.0, "high", -2)]
    edges, means = allocation_by_class(usage, 2)
    assert edges.tolist() == [0.0, 5.0, 10.0]
    assert list(means) == ["high", "low"]
    assert means["low"].tolist() == [4.0, 4.0]
    assert means["high"].tolist() == [0.0, 2.0]


def test_allocation_weights_a_change_inside_a_bin_by_the_time_on_each_side() -> None:
    usage = [Usage(0.0, "normal", 2), Usage(4.0, "normal", 4), Usage(9.0, "normal", -6)]
    edges, means = allocation_by_class(usage, 3)
    assert edges.tolist() == [0.0, 3.0, 6.0, 9.0]
    np.testing.assert_allclose(means["normal"], [2.0, (1 * 2 + 2 * 6) / 3, 6.0])


def test_allocation_of_no_usage_has_no_classes_and_bins_must_be_positive() -> None:
    edges, means = allocation_by_class([], 4)
    assert len(edges) == 5
    assert means == {}
    with pytest.raises(ValueError, match="bins must be at least 1"):
        allocation_by_class([Usage(0.0, "low", 1)], 0)


def test_default_classes_keep_their_colours_and_others_get_distinct_ones() -> None:
    colours = class_colours(["batch", "low", "urgent", "zeta", "high", "normal"])
    assert colours["urgent"] == "tab:red"
    assert colours["high"] == "tab:orange"
    assert colours["normal"] == "tab:blue"
    assert colours["low"] == "tab:grey"
    assert len(set(colours.values())) == 6


def replayed(policy: str, config: Config) -> Replayed:
    jobs = [
        SimJob("a", "vision", "low", 8, 0.0, 7200.0),
        SimJob("b", "nlp", "normal", 2, 100.0, 600.0),
        SimJob("c", "nlp", "urgent", 4, 900.0, 1200.0),
        SimJob("d", "vision", "high", 4, 1000.0, 900.0),
    ]
    outcome: Outcome = Simulation(jobs, pool(1, 8), config, JobModel({}, 1800.0, 30.0, 60.0)).run()
    report = summarize(policy, outcome, 30.0)
    report["left_out"] = {"team_not_sized": 0, "never_fits": 0}
    return Replayed(report, outcome)


def test_write_plots_writes_every_figure_as_a_png_and_closes_them(tmp_path: Path) -> None:
    runs = [
        replayed("pool-fifo", Config(DEFAULT_CLASSES, order=QueueOrder.FIFO, preemption=False, reclaim=False)),
        replayed("pool-priority", Config(DEFAULT_CLASSES)),
    ]
    directory = tmp_path / "out" / "plots"
    written = write_plots(runs, directory)
    assert [p.name for p in written] == [
        "utilization-pool-fifo.png",
        "utilization-pool-priority.png",
        "wait-cdf.png",
        "lost-work.png",
    ]
    for path in written:
        assert path.parent == directory
        data = path.read_bytes()
        assert data.startswith(PNG)
        assert len(data) > 1000
    assert plt.get_fignums() == []
