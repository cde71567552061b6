"""Headless Chromium for the browser tests: Debian's /usr/bin/chromium (or $CHROMIUM) driven by
Playwright, each page in a browser profile of its own. Screenshots land in
artifacts/screenshots/ for a person to look at."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
LAUNCH_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run")


@contextlib.contextmanager
def chromium_page(
    width: int = 1600, height: int = 1000, flags: Sequence[str] = LAUNCH_FLAGS
) -> Iterator[tuple[Any, list[str]]]:
    """A new page and the JavaScript errors it raises (the caller asserts on them). Skipped
    without Chromium or Playwright, except under CI, where a missing browser fails."""
    if shutil.which(CHROMIUM) is None and not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} not found: apt-get install -y chromium"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    sync_api = pytest.importorskip("playwright.sync_api")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile_dir:
        context = playwright.chromium.launch_persistent_context(
            profile_dir,
            executable_path=CHROMIUM,
            headless=True,
            args=list(flags),
            viewport={"width": width, "height": height},
        )
        try:
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            yield page, errors
        finally:
            context.close()
