"""The README's own examples, run as written against `gpupool up` in a fresh data directory.

Every `gpupool submit` line of the README's shell blocks (with the shell lines that set what
they use, such as `first=$(gpupool submit --parsable ...)`) and every inline example of one
runs verbatim, in order, in one shell; each must succeed, and so must every job they submit.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gpupool.executors.proc import kill_attempts
from gpupool.up import free_port
from tests.support.live import wait_for

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def submit_lines(text: str) -> list[str]:
    """The README's submit examples, in the order they appear."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for line in block.splitlines():
            command = line.split("  #", 1)[0].strip()
            if re.match(r"^(\w+=\$\()?gpupool submit ", command):
                lines.append(command)
    prose = "\n".join(line for line in text.splitlines() if not line.startswith("|"))  # tables name forms
    lines += re.findall(r"`(gpupool submit [^`]+)`", prose)
    return lines


def test_the_readme_has_submit_examples_to_run() -> None:
    lines = submit_lines(README.read_text())
    assert len(lines) >= 6
    assert "gpupool submit -- python -m gpupool.examples.torch_trainer --steps 200" in lines


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """`gpupool up` with the README's lab configuration, its data in a fresh folder."""
    config = yaml.safe_load((REPO / "examples" / "lab.yaml").read_text())
    port = free_port()
    data = tmp_path / "data"
    config["service"].update(data_dir=str(data), port=port, interval="0.2s", run_as="service")
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(config))
    work = tmp_path / "work"
    shutil.copytree(REPO / "examples", work / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "80"
    process = subprocess.Popen(
        [sys.executable, "-m", "gpupool", "up", "--config", str(path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: (data / "admin.token").exists() and answers(port))
    env["GPUPOOL_API"] = f"http://127.0.0.1:{port}"
    env["GPUPOOL_TOKEN"] = (data / "admin.token").read_text().strip()
    yield work, env
    process.terminate()
    process.wait(timeout=10)
    kill_attempts(data)


def answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health").is_success
    except httpx.TransportError:
        return False


def test_the_readmes_submit_examples_work_as_written(lab: tuple[Path, dict[str, str]]) -> None:
    work, env = lab
    script = "set -e\n" + "\n".join(submit_lines(README.read_text())) + "\n"
    done = subprocess.run(
        ["sh", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    headers = {"Authorization": f"Bearer {env['GPUPOOL_TOKEN']}"}
    api = env["GPUPOOL_API"]

    def jobs() -> list[dict[str, object]]:
        found: list[dict[str, object]] = httpx.get(f"{api}/jobs", headers=headers).json()
        return found

    wait_for(lambda: all(j["state"] in ("succeeded", "failed", "cancelled", "timeout") for j in jobs()), timeout=240)
    failed = [(j["id"], j["name"], j["state"]) for j in jobs() if j["state"] != "succeeded"]
    assert not failed, failed
    assert len(jobs()) >= 13  # 8 array tasks among them
    assert (work / "sweep-2_7.log").is_file()
    assert any(work.glob("line-fit-*.log"))
