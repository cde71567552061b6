"""Headless Chromium (Debian's /usr/bin/chromium, or $CHROMIUM) driven by Playwright, launched
once per test module: each browser test opens a context of its own (fresh storage, its own
viewport) in the module's browser instead of launching another. Not once per session: while
Playwright's sync API is open it holds an event loop as the thread's running one, and the
asyncio.run() of the other modules' tests would fail."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
LAUNCH_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """The launched browser; a missing Chromium skips the test, or fails it under CI."""
    if shutil.which(CHROMIUM) is None and not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} not found: apt-get install -y chromium"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=LAUNCH_FLAGS
        )
        yield browser
        browser.close()
