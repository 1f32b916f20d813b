"""`gpupool up --executor ray` for the tests on a loopback Ray cluster: the service, a gang of
ranks that say where they run, and what a rank printed."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from tests.support.live import Service, wait_for

RANK = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    keys = ("RANK", "WORLD_SIZE", "NODE_RANK", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT",
            "GPUPOOL_NODE", "GPUPOOL_NODE_ADDRESS", "GPUPOOL_ATTEMPT")
    print(json.dumps({**{k: os.environ.get(k) for k in keys}, "pid": os.getpid()}), flush=True)
    done = Path(sys.argv[1])
    while not done.exists():
        time.sleep(0.1)
    """
)


class RayService(Service):
    def __init__(self, tmp: Path, address: str, grace: str = "2s", more: str = "") -> None:
        super().__init__(tmp, grace, more)
        self.config.write_text(
            self.config.read_text().replace(
                "run_as: service}",
                f"run_as: service, executor: ray, ray_address: '{address}', start_timeout: 20s}}",
            )
        )
        self.env["RAY_AUTH_MODE"] = "disabled"
        self.done = tmp / "done"
        self.script = tmp / "rank.py"
        self.script.write_text(RANK)

    def gang(self, gpus: int = 4, per_node: int = 2) -> int:
        return self.submit(
            "--gpus",
            str(gpus),
            "--gpus-per-node",
            str(per_node),
            "--",
            sys.executable,
            str(self.script),
            str(self.done),
        )

    def reports(self, job: int, ranks: int = 2, attempt: int | None = None) -> list[dict[str, object]]:
        """What each rank printed first, read through `gpupool logs --rank`."""
        return [json.loads(self.first_line(job, rank, attempt)) for rank in range(ranks)]

    def first_line(self, job: int, rank: int, attempt: int | None) -> str:
        extra = ["--attempt", str(attempt)] if attempt is not None else []
        printed: list[str] = []

        def some() -> bool:
            done = self.cli("logs", str(job), "--rank", str(rank), *extra)
            printed[:] = done.stdout.splitlines() if done.returncode == 0 else []
            return bool(printed)

        wait_for(some, timeout=30)
        return printed[0]


def job(service: Service, job_id: int) -> dict[str, object]:
    response = service.get(f"/jobs/{job_id}")
    assert response is not None and response.is_success
    shown: dict[str, object] = response.json()
    return shown
