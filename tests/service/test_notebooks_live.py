"""Notebook sessions (issue 35) against `gpupool up`: `gpupool notebook` starts a real Jupyter
server (JupyterLab) as a job, and the service proxies it behind the dashboard's sign-in. A real
Chromium signs in, opens a notebook and runs a cell; kernels run code through the proxied
WebSocket; another team's token and a teammate's get nothing; a request from another site is
refused; and idle culling reads the server's own kernel activity."""

from __future__ import annotations

import importlib.util
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from websockets.sync.client import connect

from tests.support.browser import browser
from tests.support.live import state, wait_for
from tests.support.sessions import Sessions, serving

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jupyterlab") is None, reason="gpupool[notebook] is not installed (make test installs it)"
)

NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "execution_count": None,
            "id": "check",
            "metadata": {},
            "outputs": [],
            "source": ["import os\n", "print('GPUS=' + os.environ['CUDA_VISIBLE_DEVICES'])"],
        }
    ],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Sessions]:
    """Sessions idle for 6 s are warned, and ended 2 s later."""
    yield from serving(Sessions(tmp_path, idle="6s"))


@pytest.fixture
def slow_lab(tmp_path: Path) -> Iterator[Sessions]:
    """Sessions idle for 15 s are warned, and ended 2 s later: time for a kernel to start on a
    loaded machine (which took longer than `lab`'s 6 s on CI)."""
    yield from serving(Sessions(tmp_path, idle="15s"))


@pytest.fixture
def patient_lab(tmp_path: Path) -> Iterator[Sessions]:
    """Sessions idle for an hour before they are warned: JupyterLab's first load in a browser
    (no kernel activity yet) may take longer than `lab`'s 6 s on a loaded machine."""
    yield from serving(Sessions(tmp_path, idle="1h"))


def notebook(lab: Sessions, workdir: Path, *options: str, token: str | None = None) -> int:
    """`gpupool notebook` in `workdir` (with `token`, else the admin's), which must say where
    the notebook is; its job's id."""
    env = {**lab.env, "GPUPOOL_TOKEN": token} if token else lab.env
    done = lab.run_cli(env, "notebook", *options, cwd=workdir)
    assert done.returncode == 0, done.stderr
    found = re.search(r"the notebook is at (\S+)/ui/notebooks/(\d+)/lab", done.stderr)
    assert found is not None, done.stderr
    return int(found.group(2))


def token_of(lab: Sessions, user: str, team: str) -> str:
    lab.cli("team", "set", team)
    made = lab.cli("user", "set", user, "--team", team, "--new-token")
    assert made.returncode == 0, made.stderr
    return made.stdout.split()[-1]


def run_code(lab: Sessions, job: int, token: str, code: str) -> str:
    """Start a kernel through the proxy, run `code` in it over the proxied WebSocket, and
    return what it printed."""
    base = f"http://127.0.0.1:{lab.port}/ui/notebooks/{job}"
    headers = {"Authorization": f"Bearer {token}"}
    kernel = httpx.post(f"{base}/api/kernels", headers=headers, json={"name": "python3"}, timeout=60).json()
    url = f"ws://127.0.0.1:{lab.port}/ui/notebooks/{job}/api/kernels/{kernel['id']}/channels"
    request: dict[str, Any] = {
        "header": {"msg_id": uuid.uuid4().hex, "session": uuid.uuid4().hex, "username": "", "version": "5.3"},
        "parent_header": {},
        "metadata": {},
        "content": {"code": code, "silent": False},
        "channel": "shell",
        "buffers": [],
    }
    request["header"]["msg_type"] = "execute_request"
    with connect(url, additional_headers=headers, proxy=None) as socket:
        socket.send(json.dumps(request))
        while True:
            message = json.loads(socket.recv(timeout=60))
            if message.get("msg_type") == "stream":
                return str(message["content"]["text"])


def test_a_notebooks_kernel_runs_on_the_jobs_gpus_through_the_proxy(lab: Sessions, tmp_path: Path) -> None:
    job = notebook(lab, tmp_path, "--gpus", "2")
    admin = (lab.data / "admin.token").read_text().strip()
    assert run_code(lab, job, admin, "import os; print('GPUS=' + os.environ['CUDA_VISIBLE_DEVICES'])") == "GPUS=0,1\n"
    page = httpx.get(
        f"http://127.0.0.1:{lab.port}/ui/notebooks/{job}/lab", headers={"Authorization": f"Bearer {admin}"}
    )
    assert page.status_code == 200
    assert f'data-status="/ui/notebooks/{job}/_gpupool/status"' in page.text  # gpupool's banner
    assert lab.job(job)["session"] == "notebook"
    assert lab.cli("cancel", str(job)).returncode == 0
    wait_for(lambda: state(lab, job) == "cancelled", timeout=60)


def test_only_its_own_user_reaches_a_notebook_and_never_from_another_site(lab: Sessions, tmp_path: Path) -> None:
    ana, ben, eve = token_of(lab, "ana", "vision"), token_of(lab, "ben", "vision"), token_of(lab, "eve", "nlp")
    job = notebook(lab, tmp_path, token=ana)
    base = f"http://127.0.0.1:{lab.port}/ui/notebooks/{job}"
    assert httpx.get(base + "/api/kernels", headers={"Authorization": f"Bearer {ana}"}).status_code == 200
    for intruder in (ben, eve):
        for path in ("/lab", "/api/kernels", "/_gpupool/status"):
            answer = httpx.get(base + path, headers={"Authorization": f"Bearer {intruder}"})
            assert answer.status_code == 403, (path, answer.text)
    not_signed_in = httpx.get(base + "/lab")
    assert not_signed_in.status_code == 303
    assert not_signed_in.headers["location"].startswith("/ui/signin?next=/ui/notebooks/")
    admin = (lab.data / "admin.token").read_text().strip()
    elsewhere = {"Authorization": f"Bearer {admin}", "Origin": "http://evil.example"}
    assert httpx.post(base + "/api/kernels", headers=elsewhere, json={}).status_code == 403


def test_idle_culling_reads_the_kernels_activity(slow_lab: Sessions, tmp_path: Path) -> None:
    lab = slow_lab
    job = notebook(lab, tmp_path)
    admin = (lab.data / "admin.token").read_text().strip()
    # A cell that computes for longer than idle_after (15 s) and its notice (2 s): busy, not idle.
    assert run_code(lab, job, admin, "import time; time.sleep(22); print('done')") == "done\n"
    assert state(lab, job) == "running"
    status = f"http://127.0.0.1:{lab.port}/ui/notebooks/{job}/_gpupool/status"
    headers = {"Authorization": f"Bearer {admin}"}
    wait_for(lambda: bool(httpx.get(status, headers=headers).json().get("warning")), timeout=60)
    wait_for(lambda: state(lab, job) == "cancelled", timeout=60)
    kinds = [e["kind"] for e in lab.json(f"/events?job={job}")]
    assert kinds.index("session_idle") < kinds.index("cancel_requested")


@pytest.fixture
def chromium() -> Iterator[WebDriver]:
    driver = browser()
    yield driver
    driver.quit()


def test_in_a_browser_sign_in_open_a_notebook_and_run_a_cell(
    patient_lab: Sessions, tmp_path: Path, chromium: WebDriver
) -> None:
    lab = patient_lab
    (tmp_path / "check.ipynb").write_text(json.dumps(NOTEBOOK))
    ana = token_of(lab, "ana", "vision")
    job = notebook(lab, tmp_path, token=ana)
    admin = (lab.data / "admin.token").read_text().strip()
    base = f"http://127.0.0.1:{lab.port}"

    def sign_in(token: str, then: str) -> None:
        chromium.delete_all_cookies()
        chromium.get(f"{base}{then}")
        wait_for(lambda: "/ui/signin" in chromium.current_url, timeout=30)  # not signed in yet
        chromium.find_element(By.ID, "token").send_keys(token)
        chromium.find_element(By.CSS_SELECTOR, "form.signin button").click()
        # The sign-in page's own address names `then` (?next=), so wait for the path itself.
        wait_for(lambda: urlsplit(chromium.current_url).path == then, timeout=30)

    # A browser signed in as the admin opens no user's notebook (its page is the user's code).
    sign_in(admin, "/ui/queue")
    row = chromium.find_element(By.CSS_SELECTOR, f'table.sessions tr[data-job="{job}"]')
    assert not row.find_elements(By.CSS_SELECTOR, "a.open")
    chromium.get(f"{base}/ui/notebooks/{job}/lab")
    assert "opens no notebook" in chromium.find_element(By.TAG_NAME, "body").text
    # Its own user: the queue lists the running sessions, with a link to open one's own notebook.
    sign_in(ana, "/ui/queue")
    wait_for(lambda: bool(chromium.find_elements(By.CSS_SELECTOR, "table.sessions")), timeout=30)
    row = chromium.find_element(By.CSS_SELECTOR, f'table.sessions tr[data-job="{job}"]')
    assert row.get_attribute("data-session") == "notebook"
    row.find_element(By.CSS_SELECTOR, "a.open").click()
    wait_for(lambda: f"/ui/notebooks/{job}/lab" in chromium.current_url, timeout=60)
    chromium.get(f"{base}/ui/notebooks/{job}/lab/tree/check.ipynb")

    def ready() -> bool:
        cells = chromium.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-Cell")
        return bool(cells) and "Idle" in chromium.find_element(By.TAG_NAME, "body").text

    wait_for(ready, timeout=300)  # the notebook is open and its kernel started (slow on a loaded CI machine)
    chromium.find_element(By.CSS_SELECTOR, ".jp-Notebook .jp-Cell .jp-InputPrompt").click()
    ActionChains(chromium).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
    wait_for(lambda: "GPUS=0" in chromium.find_element(By.CSS_SELECTOR, ".jp-Notebook").text, timeout=300)
