"""A real headless Chromium for tests of pages ustack writes (Debian's
chromium + chromium-driver, driven through selenium): what a person sees
is tested as a person sees it.

    from browser import chromium          # a pytest fixture: a WebDriver
    def test_x(chromium, tmp_path):
        chromium.get(f"file://{page}")

`network_requests(driver)` lists every resource the page loaded, so a test
can assert that a page meant to work offline asked for nothing."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"   # screenshots kept by CI

# Without the background-networking flags Chromium keeps trying hosts that
# this machine's closed network refuses; as root it needs --no-sandbox.
_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
          "--no-first-run", "--disable-background-networking",
          "--disable-component-update", "--disable-sync",
          "--disable-dev-shm-usage", "--window-size=1200,900",
          "--allow-file-access-from-files")


def skip_reason() -> str | None:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        return "Debian's chromium and chromium-driver are not installed (.ci/run installs them)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


@pytest.fixture
def chromium():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    profile = tempfile.mkdtemp(prefix="ustack-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in _FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    # the given driver path: selenium must not try to download one
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def network_requests(driver) -> list:
    """URLs of every resource the current page loaded (scripts, styles,
    images, fetches) after the document itself."""
    return driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")


def keep_screenshot(driver, name: str) -> Path:
    """Save a PNG of the page under tests/artifacts/ and return its path."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
