"""Screenshots of every dashboard page, at 1280×800 and at a phone's 390×844, for docs/metrics.md.

Starts `gpupool up` on a throwaway data directory with 8 virtual GPUs on loopback, runs a small
day through it (team vision's low-priority trainers fill the pool; team nlp's high-priority job
preempts two of them, which resume from their checkpoints; one job ignores its notice, so the
pool shows a GPU draining and one held for its preemptor), and photographs each page with
Debian's headless Chromium. Nothing is downloaded.

Run: .venv/bin/python -m tools.screenshots [docs/screenshots]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from selenium.webdriver.remote.webdriver import WebDriver

from gpupool.executors.proc import kill_attempts
from gpupool.up import free_port
from tests.support.browser import DESKTOP, PHONE, browser
from tests.support.live import wait_for

CONFIG = {
    "classes": {
        "high": {"value": 100, "may_preempt": True, "preemptible": False, "grace_period": "20s"},
        "normal": {"value": 10, "may_preempt": False, "preemptible": True, "grace_period": "20s"},
        "low": {"value": 0, "may_preempt": False, "preemptible": True, "grace_period": "20s", "min_runtime": "2s"},
    },
    "teams": {
        "vision": {"guaranteed_gpus": 2, "budgets": {"normal": {"gpu_hours": 2, "window": "1d"}}},
        "nlp": {"guaranteed_gpus": 4},
        "robotics": {"guaranteed_gpus": 2},
    },
}


def trainer(steps: int) -> list[str]:
    return [sys.executable, "-m", "gpupool.examples.trainer", "--steps", str(steps), "--step-seconds", "0.25"]


class Day:
    def __init__(self, folder: Path) -> None:
        self.data, self.port = folder / "data", free_port()
        service = {
            "data_dir": str(self.data),
            "port": self.port,
            "virtual_gpus": 8,
            "interval": 0.2,
            "run_as": "service",
        }
        config = {**CONFIG, "service": service}
        (folder / "gpupool.yaml").write_text(yaml.safe_dump(config))
        self.config = folder / "gpupool.yaml"
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpupool", "up", "--config", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: (self.data / "admin.token").exists() and self.answers(), timeout=60)
        self.admin = (self.data / "admin.token").read_text().strip()

    def answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health").is_success
        except httpx.TransportError:
            return False

    def submit(self, team: str, priority: str, gpus: int, command: list[str], name: str) -> int:
        body = {"command": command, "team": team, "priority": priority, "gpus": gpus, "name": name, "workdir": "/tmp"}
        answer = httpx.post(f"{self.url}/jobs", json=body, headers={"Authorization": f"Bearer {self.admin}"})
        answer.raise_for_status()
        return int(answer.json()["id"])

    def job(self, job: int) -> dict[str, object]:
        answer = httpx.get(f"{self.url}/jobs/{job}", headers={"Authorization": f"Bearer {self.admin}"})
        answer.raise_for_status()
        shown: dict[str, object] = answer.json()
        return shown

    def state(self, job: int) -> str:
        return str(self.job(job)["state"])

    def attempts(self, job: int) -> int:
        return int(str(self.job(job)["attempts"]))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        kill_attempts(self.data)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        day = Day(Path(tmp))
        try:
            sweeps = [day.submit("vision", "normal", 1, trainer(160), f"sweep-{i}") for i in range(5)]
            day.submit("robotics", "normal", 2, trainer(400), "sim2real")
            stubborn = day.submit("vision", "low", 1, ["sh", "-c", "trap '' TERM; sleep 600"], "ignores-notice")
            wait_for(lambda: day.state(stubborn) == "running", timeout=60)
            time.sleep(4)
            first = day.submit("nlp", "high", 2, trainer(40), "finetune")
            # The low job ignores its notice: for its 20 s of grace its GPU drains, and the
            # sweep's, freed at once, is held for the preemptor.
            wait_for(lambda: day.state(stubborn) == "preempting", timeout=60)
            time.sleep(2)
            shoot(day, out, {"pool": "/ui/pool", "queue": "/ui/queue", "teams": "/ui/teams"})
            wait_for(lambda: day.state(first) == "succeeded", timeout=120)
            time.sleep(3)
            preempted = next(s for s in sweeps if day.attempts(s) > 1)
            shoot(day, out, {"interruptions": "/ui/interruptions", "job": f"/ui/jobs/{preempted}"})
            print(f"screenshots of 5 pages at 2 sizes in {out}")
        finally:
            day.stop()


def signed_in(driver: WebDriver, day: Day) -> None:
    driver.get(f"{day.url}/ui/signin")
    driver.find_element("id", "token").send_keys(day.admin)
    driver.find_element("css selector", "form.signin button").click()
    wait_for(lambda: "/ui/pool" in driver.current_url, timeout=20)


def shoot(day: Day, out: Path, pages: dict[str, str]) -> None:
    for label, size in (("desktop", DESKTOP), ("phone", PHONE)):
        driver = browser(size)
        try:
            signed_in(driver, day)
            for name, path in pages.items():
                driver.get(day.url + path)
                time.sleep(0.8)
                height = driver.execute_script("return document.documentElement.scrollHeight")
                driver.set_window_size(size[0], min(max(size[1], int(height)), 2400))
                driver.save_screenshot(str(out / f"{name}-{label}.png"))
                driver.set_window_size(*size)
        finally:
            driver.quit()


if __name__ == "__main__":
    os.environ.pop("GPUPOOL_TOKEN", None)
    main()
