"""`gpupool export`: the lab's own history as a trace for `gpupool simulate`."""

from __future__ import annotations

import csv
import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from gpupool.cli.common import ApiOption, ConfigOption, call, client, console, fail, prepare_output
from gpupool.units import parse_duration, plural


def export(
    output: Annotated[Path, typer.Option("--output", "-o", help="The CSV file to write.")],
    since: Annotated[
        str | None, typer.Option(help="Only jobs submitted in the last DURATION, e.g. 30d (default: all).")
    ] = None,
    machines: Annotated[
        Path | None, typer.Option(help="Also write the pool's nodes as a machine list (simulate --machines).")
    ] = None,
    config: ConfigOption = None,
    api: ApiOption = None,
) -> None:
    """Write the ended jobs as a trace that gpupool simulate replays.

    The normalised jobs.csv format with each job's class, team, GPU type, gang shape, observed
    save and restart costs, wait, preemptions and lost nodes; `gpupool simulate --trace FILE
    --priority-from class` replays it. A team's token exports its own team's jobs; the
    admin's, every team's."""
    try:
        start = time.time() - parse_duration(since) if since is not None else None
    except ValueError as exc:
        raise fail(f"--since: {exc}") from None
    prepare_output(output, "--output")
    if machines is not None:
        prepare_output(machines, "--machines")
    connected = client(config, api)
    text = call(lambda: connected.history(start))
    nodes = call(connected.pool)["nodes"] if machines is not None else []
    try:
        output.write_text(text, encoding="utf-8")
        if machines is not None:
            kinds = Counter((node["gpu_type"], node["gpus"]) for node in nodes)
            with machines.open("w", encoding="utf-8", newline="") as stream:
                writer = csv.writer(stream, lineterminator="\n")
                writer.writerow(["gpu_type", "gpus", "nodes"])
                writer.writerows([gpu_type, gpus, count] for (gpu_type, gpus), count in kinds.items())
    except OSError as exc:
        raise fail(f"cannot write {exc.filename}: {exc.strerror}") from None
    rows = list(csv.DictReader(text.splitlines()))
    never_ran = sum(1 for row in rows if not row["duration"])
    console.print(
        f"{output}: {plural(len(rows), 'job')}"
        + (f" ({never_ran:,} never held GPUs: no run time)" if never_ran else "")
        + (f"; machines: {machines}" if machines is not None else ""),
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    if len(rows) == never_ran:
        since_text = f" in the last {since}" if since is not None else ""
        console.print(f"no job submitted{since_text} has run to its end yet", highlight=False, markup=False)
        return
    cluster = f"--machines {machines}" if machines is not None else "--nodes N --gpus-per-node G"
    console.print(
        f"replay it: gpupool simulate --trace {output} {cluster} --priority-from class",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
