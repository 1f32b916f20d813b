"""The dashboard in a real browser (Debian's Chromium, headless) against a real `gpupool up`: the
pool page shows a preemption as it happens (the victim draining, a GPU held for the preemptor,
then the preemptor running) soon after the store records it, without a reload; a team's token
cannot see another team's job; no page makes a request that leaves loopback."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.support.browser import browser, requested
from tests.support.live import Service, running, state, wait_for


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from running(Service(tmp_path, grace="3s"))


@pytest.fixture
def chromium() -> Iterator[WebDriver]:
    driver = browser()
    yield driver
    driver.quit()


def token_of(service: Service, team: str) -> str:
    made = service.cli("team", "set", team, "--new-token")
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[-1].split()[-1]


def sign_in(driver: WebDriver, service: Service, token: str) -> None:
    driver.get(f"http://127.0.0.1:{service.port}/ui/signin")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "form.signin button").click()
    wait_for(lambda: "/ui/pool" in driver.current_url, timeout=20)


def shown(driver: WebDriver) -> list[tuple[str, str, str]]:
    """(state, holder, for whom) of every GPU on the page, as the browser shows it now."""
    cells = driver.find_elements(By.CSS_SELECTOR, "li.gpu[data-state]")
    try:
        return sorted(
            (c.get_attribute("data-state") or "", c.get_attribute("data-job") or "", c.get_attribute("data-for") or "")
            for c in cells
        )
    except Exception:  # the part was replaced while being read
        return []


def in_store(service: Service) -> list[tuple[str, str, str]]:
    answer = service.get("/pool")
    if answer is None or not answer.is_success:
        return []
    gpus = [g for n in answer.json()["nodes"] for g in n["gpu_states"]]
    return sorted((g["state"], str(g["job"] or ""), str(g["for_job"] or "")) for g in gpus)


def test_the_pool_page_shows_a_preemption_as_it_happens(service: Service, chromium: WebDriver) -> None:
    team_a, team_b = token_of(service, "a"), token_of(service, "b")
    stubborn = service.submit(
        "--team", "b", "--", "sh", "-c", "trap '' TERM; sleep 600", env=dict(service.env, GPUPOOL_TOKEN=team_b)
    )
    wait_for(lambda: state(service, stubborn) == "running", timeout=30)
    admin = (service.data / "admin.token").read_text().strip()
    sign_in(chromium, service, admin)
    page = chromium.current_window_handle
    big = service.submit(
        "--team", "a", "--priority", "high", "--gpus", "2", "--", "sleep", "600",
        env=dict(service.env, GPUPOOL_TOKEN=team_a),
    )  # fmt: skip
    draining = [("draining", str(stubborn), str(big)), ("held", "", str(big))]
    preemptor = [("allocated", str(big), ""), ("allocated", str(big), "")]
    seen_store: dict[str, float] = {}
    seen_page: dict[str, float] = {}
    began = time.monotonic()
    while len(seen_page) < 2 and time.monotonic() - began < 60:
        now = time.monotonic()
        for name, expected in (("draining", draining), ("running", preemptor)):
            if name not in seen_store and in_store(service) == sorted(expected):
                seen_store[name] = now
            if name not in seen_page and shown(chromium) == sorted(expected):
                seen_page[name] = time.monotonic()
        time.sleep(0.05)
    assert chromium.current_window_handle == page  # never reloaded nor left
    assert set(seen_page) == {"draining", "running"}, (seen_page, shown(chromium), in_store(service))
    assert seen_page["draining"] < seen_page["running"]
    for name in ("draining", "running"):
        lag = seen_page[name] - seen_store.get(name, seen_page[name])
        assert lag < 3.0, f"the page showed {name} {lag:.2f} s after the store"  # 0.5 s polls; a loaded CI
    assert state(service, big) == "running"

    outside = [u for u in requested(chromium) if urlsplit(u).hostname not in ("127.0.0.1", None)]
    assert outside == []


def test_a_teams_token_cannot_see_another_teams_job(service: Service, chromium: WebDriver) -> None:
    team_a, team_b = token_of(service, "a"), token_of(service, "b")
    theirs = service.submit(
        "--team", "a", "--name", "a-private", "--", "sleep", "600", env=dict(service.env, GPUPOOL_TOKEN=team_a)
    )
    mine = service.submit("--team", "b", "--", "echo", "hello from b", env=dict(service.env, GPUPOOL_TOKEN=team_b))
    wait_for(lambda: state(service, mine) == "succeeded", timeout=30)
    sign_in(chromium, service, team_b)
    chromium.get(f"http://127.0.0.1:{service.port}/ui/jobs/{theirs}")
    body = chromium.find_element(By.TAG_NAME, "main").text
    assert "Not yours to see" in body
    assert f"may not see job {theirs} of team a" in body
    assert "a-private" not in chromium.page_source
    chromium.get(f"http://127.0.0.1:{service.port}/ui/jobs/{mine}")
    wait_for(lambda: "hello from b" in chromium.find_element(By.CSS_SELECTOR, "pre.log").text, timeout=10)
    for page in ("pool", "queue", "teams", "interruptions"):
        chromium.get(f"http://127.0.0.1:{service.port}/ui/{page}")
        assert chromium.find_element(By.TAG_NAME, "h1").text
    outside = [u for u in requested(chromium) if urlsplit(u).hostname not in ("127.0.0.1", None)]
    assert outside == []
