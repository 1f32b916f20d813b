"""`gpupool demo`: the demonstrations (`gpupool.demo`), each loaded only when asked for."""

from __future__ import annotations

from typing import Annotated

import typer

from gpupool.cli.common import console
from gpupool.cli.replay import UsageError


def demo(
    simulated: Annotated[bool, typer.Option(help="Replay the demonstration in the simulator instead.")] = False,
    cluster: Annotated[
        bool,
        typer.Option(help="One pool over a 3-node Ray cluster it starts on loopback, a 2-node PyTorch job in it."),
    ] = False,
) -> None:
    """A short demonstration: the live scheduler on virtual GPUs with real jobs (under a minute;
    --cluster: under three minutes, needs gpupool[ray,torch])."""
    if cluster:
        try:
            from gpupool.demo.cluster import run_cluster_demo
        except ImportError as exc:
            raise UsageError(f"--cluster needs gpupool[ray,torch] ({exc})") from None
        raise typer.Exit(run_cluster_demo(console))
    if simulated:
        from gpupool.demo.simulated import run_demo

        run_demo(console)
        return
    from gpupool.demo.live import run_live_demo

    run_live_demo(console)
