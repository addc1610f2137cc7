"""A headless Chromium (Debian's, `make chromium`) for the console's browser tests, and a fresh
tab per test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, sync_playwright
from tests.console.browsertools import CHROMIUM


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run `make chromium` (Debian chromium and its driver)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    tab = context.new_page()
    tab.set_default_timeout(10_000)
    yield tab
    context.close()
