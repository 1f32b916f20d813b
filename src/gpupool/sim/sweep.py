"""A grid of replays: the same trace under every combination of some settings, run on every core.

Each cell of the grid is an ordinary `replay` with the cell's values put into its settings and
cluster, so a sweep's report for a cell is byte for byte the report of that single run (wall
time aside).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import Any

from gpupool.sim.failures import NodeFailures
from gpupool.sim.replay import ClusterSpec, Policy, Settings, replay
from gpupool.sim.trace import Trace
from gpupool.units import parse_duration

PARAMETERS: dict[str, str] = {
    "checkpoint-interval": "every class's checkpoint interval (a duration)",
    "save-cost": "the blocking time of one save (a duration)",
    "restart-cost": "a resumed attempt's time to its first step (a duration)",
    "scale": "the --scale of --vc-sizes or --machines (a factor > 0)",
    "node-mtbf": "each node's mean time between failures (a duration)",
}


@dataclass(frozen=True, slots=True)
class Axis:
    """One swept parameter and its values, as given (text) and as used (number)."""

    name: str
    texts: tuple[str, ...]
    values: tuple[float, ...]


def parse_axis(text: str) -> Axis:
    """`name=v1,v2,…` into an Axis; a ValueError says what is wrong."""
    name, sep, rest = (part.strip() for part in text.partition("="))
    if not sep or not name:
        raise ValueError(f"--sweep {text!r}: expected name=value,value,… (names: {', '.join(PARAMETERS)})")
    if name not in PARAMETERS:
        raise ValueError(f"--sweep {text!r}: unknown parameter {name!r} (names: {', '.join(PARAMETERS)})")
    texts = tuple(v.strip() for v in rest.split(","))
    if not rest or any(not v for v in texts):
        raise ValueError(f"--sweep {text!r}: an empty value")
    if len(set(texts)) != len(texts):
        raise ValueError(f"--sweep {text!r}: a value is given twice")
    values: list[float] = []
    for value in texts:
        try:
            number = float(value) if name == "scale" else parse_duration(value)
        except ValueError as exc:
            raise ValueError(f"--sweep {name}={value}: {exc}") from None
        if not (number > 0 and number != float("inf")):
            raise ValueError(f"--sweep {name}={value}: must be a finite number > 0")
        if number in values:
            raise ValueError(f"--sweep {text!r}: {texts[values.index(number)]} and {value} are the same value")
        values.append(number)
    return Axis(name, texts, tuple(values))


def parse_axes(texts: Sequence[str]) -> tuple[Axis, ...]:
    axes = tuple(parse_axis(t) for t in texts)
    names = [a.name for a in axes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"--sweep {twice[0]} is given twice: give all its values in one --sweep")
    return axes


Cell = tuple[tuple[str, str, float], ...]
"""(parameter, value as given, value) for each axis."""


def grid(axes: Sequence[Axis]) -> list[Cell]:
    """Every combination of the axes' values, the first axis slowest."""
    per_axis = [[(a.name, t, v) for t, v in zip(a.texts, a.values, strict=True)] for a in axes]
    return [tuple(cell) for cell in itertools.product(*per_axis)]


def configure(cell: Cell, spec: ClusterSpec, settings: Settings) -> tuple[ClusterSpec, Settings]:
    """The cluster and settings of one cell."""
    for name, _, value in cell:
        model = settings.model
        if name == "checkpoint-interval":
            settings = replace(settings, model=replace(model, interval={}, default_interval=value))
        elif name == "save-cost":
            settings = replace(settings, model=replace(model, save_cost=value), trace_costs=False)
        elif name == "restart-cost":
            settings = replace(settings, model=replace(model, restart_cost=value), trace_costs=False)
        elif name == "scale":
            if spec.vc_sizes is None and spec.machines is None:
                raise ValueError("--sweep scale scales --vc-sizes or --machines, which were not given")
            spec = replace(spec, scale=value)
        elif name == "node-mtbf":
            failures = settings.failures or NodeFailures(value, 4 * 3600.0)
            settings = replace(settings, failures=replace(failures, mtbf=value))
    return spec, settings


_worker: dict[str, Trace] = {}
"""The trace of this process's runs, given once to each worker rather than with every run."""


def _keep(trace: Trace) -> None:
    _worker["trace"] = trace


def _run(spec: ClusterSpec, policy: Policy, settings: Settings) -> dict[str, Any]:
    return replay(_worker["trace"], spec, policy, settings).report


Run = tuple[ClusterSpec, Policy, Settings]


def replay_all(
    trace: Trace,
    runs: Sequence[Run],
    *,
    workers: int | None = None,
    on_done: Callable[[int], None] | None = None,
    ray_address: str | None = None,
) -> list[dict[str, Any]]:
    """The report of each run of `trace`, in order, `workers` processes at once (every core by
    default; 1 runs here, in this process), or as tasks of the Ray cluster at `ray_address`.
    `on_done` is called with the count done so far."""
    if ray_address is not None:
        from gpupool.sim.on_ray import replay_on_ray

        return replay_on_ray(trace, runs, ray_address, on_done)
    workers = min(workers or os.cpu_count() or 1, len(runs))
    reports: dict[int, dict[str, Any]] = {}
    if workers <= 1:
        _keep(trace)
        for i, run in enumerate(runs):
            reports[i] = _run(*run)
            if on_done is not None:
                on_done(len(reports))
    else:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_keep, initargs=(trace,)) as pool:
            futures = {pool.submit(_run, *run): i for i, run in enumerate(runs)}
            for future in as_completed(futures):
                reports[futures[future]] = future.result()
                if on_done is not None:
                    on_done(len(reports))
    return [reports[i] for i in range(len(runs))]


@dataclass(frozen=True, slots=True)
class SweptRun:
    parameters: dict[str, str]
    """Each swept parameter's value, as given."""
    report: dict[str, Any]


def sweep(
    trace: Trace,
    spec: ClusterSpec,
    policies: Sequence[Policy],
    settings: Settings,
    axes: Sequence[Axis],
    *,
    workers: int | None = None,
    on_done: Callable[[int], None] | None = None,
    ray_address: str | None = None,
) -> list[SweptRun]:
    """Replay every cell of the grid under every policy (`replay_all`). Results in grid order,
    then policy order."""
    cells = grid(axes)
    # A cell that cannot be configured fails before any runs.
    configured = [configure(cell, spec, settings) for cell in cells]
    tasks = [
        (cell, (cell_spec, policy, cell_settings))
        for cell, (cell_spec, cell_settings) in zip(cells, configured, strict=True)
        for policy in policies
    ]
    reports = replay_all(trace, [run for _, run in tasks], workers=workers, on_done=on_done, ray_address=ray_address)
    return [
        SweptRun({name: text for name, text, _ in cell}, report)
        for (cell, _), report in zip(tasks, reports, strict=True)
    ]


def as_json(runs: Sequence[SweptRun]) -> list[Mapping[str, Any]]:
    """The runs as `--json` writes them: each report with its `parameters`."""
    return [{"parameters": run.parameters, **run.report} for run in runs]
