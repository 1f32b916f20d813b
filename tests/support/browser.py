"""Debian's Chromium, headless, driven by Selenium through Debian's chromedriver (built from the
same source as the browser, so no version skew, and no Selenium Manager: nothing downloads a
browser or a driver). For the dashboard's browser tests and its screenshots."""

from __future__ import annotations

import json
import shutil
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DESKTOP = (1280, 800)
PHONE = (390, 844)


def browser(size: tuple[int, int] = DESKTOP) -> webdriver.Chrome:
    """A headless Chromium of this window size that records every request it makes."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if shutil.which(path) is None:
            raise RuntimeError(f"{path} is missing: the browser tests need Debian's `{package}` package")
    options = Options()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument(f"--window-size={size[0]},{size[1]}")
    # Nothing of Chromium's own (updates, suggestions) may blur what the pages request.
    options.add_argument("--disable-background-networking")
    options.add_argument("--disable-component-update")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_window_size(*size)
    return driver


def requested(driver: WebDriver) -> list[str]:
    """The URLs the browser requested since the last call (from its DevTools log)."""
    urls = []
    entries: list[dict[str, Any]] = driver.get_log("performance")  # type: ignore[attr-defined]
    for entry in entries:
        message: dict[str, Any] = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(str(message["params"]["request"]["url"]))
    return urls
