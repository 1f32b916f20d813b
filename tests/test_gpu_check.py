"""The GPU check's parts that need no GPU (issue 37): what the device machine is given to run
gpupool, the script's arguments, and the summary it writes. The GPU steps themselves run on a
device machine only (docs/gpu.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu import check, wheels


def distributions_gpupool_imports() -> set[str]:
    """The distributions of every module a service and its command line import, normalized."""
    probe = (
        "import json, sys\n"
        "from importlib.metadata import packages_distributions\n"
        "import gpupool.up, gpupool.cli, gpupool.api, gpupool.executors.local, gpupool.job\n"
        "owners = packages_distributions()\n"
        "names = {d for m in list(sys.modules) for d in owners.get(m.split('.')[0], [])}\n"
        "print(json.dumps(sorted(names)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    return {re.sub(r"[-_.]+", "-", name).lower() for name in json.loads(done.stdout)}


def test_every_package_gpupool_imports_is_in_the_image_or_among_the_wheels() -> None:
    needed = distributions_gpupool_imports() - {"gpupool", "torch", "nvidia-ml-py"}
    given = wheels.IMAGE_HAS | set(wheels.MISSING)
    assert needed - given == set(), "carry these as wheels, or say the image has them"
    assert not wheels.IMAGE_HAS & set(wheels.MISSING)


def test_the_wheels_are_pinned_to_this_checkouts_versions_and_installed_apart() -> None:
    pins = wheels.pinned()
    assert [p.split("==")[0] for p in pins] == list(wheels.MISSING)
    assert all(re.fullmatch(r"[a-z0-9-]+==\d[\w.]*", pin) for pin in pins), pins
    assert "--no-index" in wheels.INSTALL and "--target /tmp/site" in wheels.INSTALL


def test_an_unknown_step_is_refused_naming_the_known_ones(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        check.main(["--out", str(tmp_path), "--only", "discovery,warp-drive"])
    assert exited.value.code == 2
    assert (
        "--only: unknown step(s) warp-drive (known: discovery, resume, checkpoint-cost, restart, sharded, containment)"
        in capsys.readouterr().err
    )


def test_the_summary_says_each_step_with_its_figures_or_why_it_did_not_run() -> None:
    outcomes = [
        check.Outcome("discovery", True, 0.21, {"gpu_type": "NVIDIA H100 80GB HBM3", "memory_bytes": 85520809984}),
        check.Outcome("checkpoint-cost", False, 3.0, why="Traceback...\nRuntimeError: CUDA out of memory"),
        check.Outcome("sharded", False, 0.0, why="not here: no NVIDIA GPU found"),
        check.Outcome("timing", True, 1.0, {"slowdown": 0.031234, "eager": {"launch": 0.25, "restore": 1.5}}),
    ]
    assert check.summary(outcomes, "cuda", {"gpupool": "0.1.0", "torch": "2.11.0"}) == (
        "gpupool GPU check on cuda: gpupool 0.1.0, torch 2.11.0\n"
        "discovery: ok in 0.2 s; gpu_type NVIDIA H100 80GB HBM3; memory_bytes 85520809984\n"
        "checkpoint-cost: FAILED in 3.0 s; RuntimeError: CUDA out of memory\n"
        "sharded: skipped in 0.0 s; not here: no NVIDIA GPU found\n"
        "timing: ok in 1.0 s; slowdown 0.03123; eager (launch 0.25, restore 1.5)\n"
    )


def test_on_a_machine_without_a_gpu_discovery_says_so_and_the_check_writes_its_figures(tmp_path: Path) -> None:
    assert check.main(["--out", str(tmp_path), "--device", "cpu", "--only", "discovery"]) == 0
    record = json.loads((tmp_path / "figures.json").read_text())
    assert (record["device"], record["scale"]) == ("cpu", "small")
    (step,) = record["steps"]
    if step["ok"]:  # a machine with a GPU
        assert step["figures"]["gpus"] >= 1 and step["figures"]["memory_bytes"] > 0
        return
    assert step["why"].startswith("not here: no NVIDIA GPU found")
    assert (tmp_path / "summary.txt").read_text().splitlines()[1].startswith("discovery: skipped in ")


def test_steps_past_the_budget_are_not_run_and_say_so(tmp_path: Path) -> None:
    assert check.main(["--out", str(tmp_path), "--device", "cpu", "--only", "sharded", "--budget", "5"]) == 1
    (step,) = json.loads((tmp_path / "figures.json").read_text())["steps"]
    assert (step["ok"], step["why"]) == (False, "not run: the budget of 5 s was spent")


def test_a_gpupool_installed_from_an_older_wheel_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    import gpupool

    source = Path(gpupool.__file__).parent
    assert check.stale_install() is None, "this checkout's own"
    installed = tmp_path / "site" / "gpupool"
    shutil.copytree(source, installed, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(gpupool, "__file__", str(installed / "__init__.py"))
    assert check.stale_install() is None, "a copy of the same files"
    (installed / "shapes.py").write_text("# older\n")
    assert check.stale_install() == f"the installed gpupool ({installed}) is not this checkout's: shapes.py differ"
