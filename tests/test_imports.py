"""The arrows of the layout point one way: the core loads nothing but the vocabulary."""

from __future__ import annotations

import json
import subprocess
import sys


def loaded_by(module: str) -> list[str]:
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    modules: list[str] = json.loads(out)
    return modules


def test_the_core_imports_only_the_vocabulary_the_standard_library_and_numpy() -> None:
    """numpy is arithmetic on arrays, no clock and no I/O: the victim search's bounds are
    worked out with it (policy/bounds.py). Nothing else from outside comes in."""
    modules = loaded_by("gpupool.policy")
    ours = {m for m in modules if m.startswith("gpupool")}
    assert ours <= {"gpupool", "gpupool.model", "gpupool.units"} | {m for m in ours if m.startswith("gpupool.policy")}
    third_party = {"rich", "typer", "yaml", "pydantic", "matplotlib", "sqlalchemy", "fastapi", "ray", "httpx"}
    assert not third_party & {m.split(".")[0] for m in modules}


def test_the_simulator_loads_no_service_or_cluster_engine() -> None:
    modules = {m.split(".")[0] for m in loaded_by("gpupool.sim.replay")}
    assert not {"sqlalchemy", "fastapi", "ray", "matplotlib"} & modules
