"""`gpupool up`: the service (API, control loop and executor) in the foreground, until SIGINT
or SIGTERM; the options that override the configuration's `service` section."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated, TextIO

import typer

from gpupool.cli.common import fail
from gpupool.config import load_spec, parse_spec, service_config

log = logging.getLogger("gpupool.up")

RunAsOption = Annotated[
    str | None,
    typer.Option(
        "--run-as",
        help="Whose OS user jobs run as: submitter, team or service (overrides service.run_as).",
        show_default=False,
    ),
]


ExecutorOption = Annotated[
    str | None,
    typer.Option(
        "--executor",
        help="Where jobs run: local (this machine) or ray (every node of a Ray cluster; overrides service.executor).",
        show_default=False,
    ),
]
RayAddressOption = Annotated[
    str | None,
    typer.Option(
        "--ray-address", help="The Ray cluster's head, host:port (overrides service.ray_address).", show_default=False
    ),
]
StoreOption = Annotated[
    str | None,
    typer.Option("--store", help="The store's URL: postgresql://… (overrides service.store).", show_default=False),
]


def up(
    config: Annotated[
        Path | None,
        typer.Option("--config", help="YAML configuration (default: $GPUPOOL_CONFIG, else /etc/gpupool/gpupool.yaml)."),
    ] = None,
    run_as: RunAsOption = None,
    executor: ExecutorOption = None,
    ray_address: RayAddressOption = None,
    store: StoreOption = None,
) -> None:
    """Run gpupool: API, control loop and executor, until SIGINT (Ctrl-C) or SIGTERM. Either
    stops it the same way: no new decision, running jobs go on and are adopted by the next
    `gpupool up`; it exits 0. With --executor ray, the pool is every node of the Ray cluster."""
    from gpupool.errors import GpupoolError
    from gpupool.up import shut_down, start

    log_lines(sys.stdout)
    try:
        spec = load_spec(service_config(config, os.environ))
        given = {"run_as": run_as, "executor": executor, "ray_address": ray_address, "store": store}
        options = {key: value for key, value in given.items() if value is not None}
        if options:
            named = ", ".join(f"--{key.replace('_', '-')}" for key in options)
            service = parse_spec({"service": {**spec.service.model_dump(), **options}}, named).service
            spec = spec.model_copy(update={"service": service})
        running = start(spec)
    except (GpupoolError, ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    url = spec.service.url
    log.info("gpupool listening on %s (API docs: %s/docs)", url, url)
    log.info("dashboard: %s/ (sign in with a token); metrics: %s/metrics", url, url)
    kind = "virtual" if running.gpus.virtual else "real"
    log.info("GPUs: %s (%s); data: %s", running.gpus.detail, kind, spec.service.data_path)
    log.info("jobs run as: %s", spec.service.run_as)
    (log.info if running.gpus.contained else log.warning)("containment: %s", running.gpus.containment)
    log.info("admin token: %s", spec.service.data_path / "admin.token")
    try:
        running.serve()
    finally:
        shut_down(running)
    signal = {2: "SIGINT", 15: "SIGTERM"}.get(running.server.stopped_by or 0, "a stop")
    log.info("gpupool stopped (%s); running jobs go on and are adopted by the next gpupool up", signal)


def log_lines(stream: TextIO) -> None:
    """What the service says, as lines with their time and level: to a terminal as to a file,
    a pipe or the journal, never wrapped (a URL stays whole), at info (each decision's starts
    and notices, and the attempts adopted after a start) and above."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger("gpupool")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False
