"""Deep links: a profile's dashboard and a step of its timeline open from their URL alone, in
a browser that never visited the UI, with the profile not loaded on the server."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import pytest

from ui_serving import post_json

pytestmark = pytest.mark.browser

PROFILE_ID = "ml/llama-pretrain/0"  # written by conftest.profile_root


def fresh_page(chromium: Any, live_server: str) -> tuple[Any, Any, list[str]]:
    post_json(f"{live_server}/api/profiles/unload?id={PROFILE_ID}")
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    return context, page, errors


def test_a_dashboard_link_opens_that_profile_s_dashboard(chromium: Any, live_server: str) -> None:
    context, page, errors = fresh_page(chromium, live_server)
    link = f"{live_server}/#/dashboard?profile={urllib.parse.quote(PROFILE_ID)}"
    page.goto(link)
    page.wait_for_selector("main[data-ready=dashboard]", timeout=60_000)

    assert "llama-pretrain" in page.inner_text("main h1")
    assert "16 ranks" in page.inner_text("#current-profile")
    timeline_href = page.get_attribute("nav a[data-page=timeline]", "href")
    assert timeline_href == f"#/timeline?profile={urllib.parse.quote_plus(PROFILE_ID)}"
    context.close()
    assert errors == []


def test_a_step_link_opens_the_timeline_zoomed_to_that_step(
    chromium: Any, live_server: str
) -> None:
    context, page, errors = fresh_page(chromium, live_server)
    page.goto(f"{live_server}/#/timeline?profile={urllib.parse.quote(PROFILE_ID)}&step=3")
    page.wait_for_selector("main[data-ready=timeline]", timeout=60_000)

    assert page.input_value("[data-testid=step-picker]") == "3"
    tracks = page.evaluate(
        "fetch('/api/tracks?id=" + urllib.parse.quote(PROFILE_ID) + "').then(r => r.json())"
    )
    step = next(row for row in tracks["steps"] if row["step"] == 3)
    view = page.evaluate("window.__timeline.view")
    assert view["start"] <= step["start_ns"]
    assert view["end"] >= step["end_ns"]
    assert view["end"] - view["start"] < 1.2 * (step["end_ns"] - step["start_ns"])
    context.close()
    assert errors == []


def test_a_link_to_a_profile_that_cannot_be_opened_says_why(
    chromium: Any, live_server: str
) -> None:
    context, page, errors = fresh_page(chromium, live_server)
    page.goto(f"{live_server}/#/dashboard?profile=ml/no-such-job/0")
    page.wait_for_selector("[data-testid=load-error]", timeout=60_000)

    assert "ml/no-such-job/0" in page.inner_text("[data-testid=load-error]")
    assert "404" in page.inner_text("[data-testid=load-error]")
    context.close()
    assert errors == []


def test_a_link_to_a_profile_being_summarised_shows_its_progress_then_the_dashboard(
    chromium: Any, live_server: str
) -> None:
    context, page, errors = fresh_page(chromium, live_server)
    summarising = {"hold": True, "asked": 0}

    def answer(route: Any) -> None:
        summarising["asked"] += 1
        if not summarising["hold"]:
            route.continue_()
            return
        page.wait_for_timeout(20)  # as the server does, answer after a while
        progress = {"phase": "summarising", "done": 3, "total": 16}
        route.fulfill(
            status=202,
            content_type="application/json",
            body=json.dumps({"id": PROFILE_ID, "state": "loading", "progress": progress}),
        )

    page.route("**/api/profiles/open?*", answer)
    page.goto(f"{live_server}/#/dashboard?profile={urllib.parse.quote(PROFILE_ID)}")
    page.wait_for_selector("[data-testid=opening]:has-text('3 of 16')", timeout=60_000)

    assert page.get_attribute("[data-testid=opening-progress]", "value") == "3"
    assert page.get_attribute("[data-testid=opening-progress]", "max") == "16"
    summarising["hold"] = False
    page.wait_for_selector("main[data-ready=dashboard]", timeout=60_000)
    assert "llama-pretrain" in page.inner_text("main h1")
    assert summarising["asked"] >= 2  # the page asked again until the profile was open
    context.close()
    assert errors == []
