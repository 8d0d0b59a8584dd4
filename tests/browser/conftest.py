"""Headless Debian chromium driven by playwright against pytest-django's live_server.

Skips (with the reason) when chromium or playwright is missing; CI installs chromium with
`apt-get install -y chromium`. Never run `playwright install`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("MMC_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]

# playwright's sync API runs an event loop in this thread; the test's own ORM calls are safe.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(scope="session")
def chromium():
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        pytest.skip(f"chromium not installed at {CHROMIUM} (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright Python package is not installed")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on the test item, for the `page` fixture to see a failed call."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def page(chromium, request):
    context = chromium.new_context(viewport={"width": 1360, "height": 900})
    page = context.new_page()
    page.set_default_timeout(20_000)
    yield page
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:  # what the browser showed, for a CI log
        try:
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            path = SCREENSHOTS / f"FAILED-{request.node.name[:120]}.png"
            page.screenshot(path=str(path), full_page=True)
            print(f"\n{page.url} (screenshot {path}):\n{page.inner_text('body')[:3000]}")
        except Exception as exc:  # noqa: BLE001 - a closed page: nothing more to show
            print(f"\nno screenshot of the failed page: {exc}")
    context.close()


@pytest.fixture
def shot():
    """shot(page, "name") saves a full-page screenshot to test-artifacts/screenshots/."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(page, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
