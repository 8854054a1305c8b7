"""Headless Chromium from Debian's packages, driven by Selenium through Debian's chromedriver.

The driver is given by path, so Selenium downloads nothing (its manager is never asked). Where no
browser is installed the browser tests skip and say why, except where ``FASTSLOW_TEST_BROWSER`` is
``required`` (``.ci/run`` sets it after installing ``chromium`` and ``chromium-driver``): there a
missing browser fails, as a skipped browser test would hide a broken console.

The browser reaches loopback only: every other host goes to a proxy that is not there
(``--proxy-server`` on a closed port, with loopback bypassed), so a page that needs the network
fails to render, here as on a closed network.

Screenshots go to ``FASTSLOW_TEST_ARTIFACTS`` (default ``build/test-artifacts``), one PNG a page.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["ARTIFACTS", "browser", "find_browser", "screenshot"]

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("FASTSLOW_TEST_ARTIFACTS", REPO / "build" / "test-artifacts"))
_CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> tuple[str, str] | None:
    """Paths of Chromium and its chromedriver, or ``None``."""
    driver = shutil.which("chromedriver")
    binary = next((found for name in _CHROMIUM if (found := shutil.which(name))), None)
    return (binary, driver) if binary and driver else None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium (a Selenium ``WebDriver``) for the module's tests."""
    found = find_browser()
    if found is None:
        why = "no chromium and chromedriver on PATH (Debian: apt install chromium chromium-driver)"
        if os.environ.get("FASTSLOW_TEST_BROWSER") == "required":
            pytest.fail(f"{why}; FASTSLOW_TEST_BROWSER=required", pytrace=False)
        pytest.skip(why)
    selenium = pytest.importorskip("selenium", reason="selenium is in the test extra")
    del selenium
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = found
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in (
        "--headless=new",
        "--no-sandbox",  # as root (CI) Chromium refuses to start with its sandbox
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1360,1000",
        # No network but loopback: every other host goes to a closed port.
        "--proxy-server=http://127.0.0.1:9",
        "--proxy-bypass-list=127.0.0.1;localhost",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver: Any, name: str) -> Path:
    """Save the page as ``ARTIFACTS/<name>.png``, the whole page's height."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = int(driver.execute_script("return Math.min(document.documentElement.scrollHeight, 4000)"))
    driver.set_window_size(1360, max(800, height))
    path = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(path))
    driver.set_window_size(1360, 1000)
    return path
