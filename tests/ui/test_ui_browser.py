"""The web UI in headless Chromium (Debian's /usr/bin/chromium driven by Playwright).

Each page is opened on a generated 2-node profile; the numbers it shows are compared with
the analysis layer's, the timeline is zoomed to a step and an event is clicked. Screenshots
land in artifacts/screenshots/ for a person to look at.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.browser import LAUNCH_FLAGS, SCREENSHOTS, chromium_page
from trainium_operator.analysis.loading import LoadedProfile, load_profile
from trainium_operator.analysis.report import format_ns
from trainium_operator.analysis.stats import (
    activity_breakdown,
    annotation_table,
    launch_latency,
    precision_breakdown,
    rank_step_matrix,
    step_summary,
    stragglers,
    top_operations,
    transfer_breakdown,
    utilisation_over_time,
)
from trainium_operator.profiler.events import EventKind

pytestmark = pytest.mark.browser

PROFILE_ID = "ml/llama-pretrain/0"  # written by conftest.profile_root
# Nothing fetched but the UI: no QUIC, background networking, component updates or sync.
OFFLINE_FLAGS = (
    *LAUNCH_FLAGS,
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@pytest.fixture(scope="module")
def page(live_server: str) -> Iterator[Any]:
    with chromium_page(flags=OFFLINE_FLAGS) as (browser_page, errors):
        # Nothing may be fetched from anywhere but the UI server itself.
        outside: list[str] = []
        browser_page.on(
            "request",
            lambda request: (
                None
                if request.url.startswith(live_server) or request.url.startswith("data:")
                else outside.append(request.url)
            ),
        )
        # Start from an unloaded profile whatever other tests did with the shared server.
        urllib.request.urlopen(
            urllib.request.Request(
                f"{live_server}/api/profiles/unload?id={PROFILE_ID}",
                method="POST",
                headers={"X-Trainium-UI": "1"},
            ),
            timeout=30,
        ).close()
        browser_page.goto(f"{live_server}/#/profiles")
        yield browser_page
    assert errors == [], f"JavaScript errors: {errors}"
    assert outside == [], f"requests left the server: {outside}"


@pytest.fixture(scope="module")
def expected(profile_root: Path) -> LoadedProfile:
    return load_profile(profile_root / PROFILE_ID, workers=1)


def wait_until(page: Any, expression: str, timeout_s: float = 30.0) -> None:
    """Polls a JavaScript expression (wait_for_function would need 'unsafe-eval', which the
    UI's content security policy rightly forbids)."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {expression}")
        page.wait_for_timeout(50)


def text(page: Any, selector: str) -> str:
    return str(page.inner_text(selector))


def test_profiles_page_lists_the_profile_and_jobs_and_loads_it(page: Any) -> None:
    page.wait_for_selector("[data-testid=profiles-table]")
    row = page.locator(f"tr[data-profile='{PROFILE_ID}']")
    assert "ml/llama-pretrain" in row.inner_text()
    assert "Running" in text(page, "[data-testid=jobs-table]")

    row.locator("[data-action=load]").click()
    page.wait_for_selector(f"tr[data-profile='{PROFILE_ID}'] [data-action=open]", timeout=60_000)
    assert "loaded" in row.inner_text()
    page.screenshot(path=str(SCREENSHOTS / "profiles.png"))


def test_dashboard_shows_the_numbers_the_analysis_computes(
    page: Any, expected: LoadedProfile
) -> None:
    page.locator(f"tr[data-profile='{PROFILE_ID}'] [data-action=open]").click()
    page.wait_for_selector("main[data-ready=dashboard]", timeout=60_000)
    columns = expected.columns
    steps = step_summary(columns)
    kernels = top_operations(columns)
    latency = launch_latency(columns)

    assert str(len(steps.rows)) in text(page, "[data-testid=kpi-steps]")
    assert format_ns(steps.stats.p50_ns) in text(page, "[data-testid=kpi-step-p50]")
    assert f"{sum(k.count for k in kernels):,}" in text(page, "[data-testid=kpi-kernels]")
    assert format_ns(latency.stats.p50_ns) in text(page, "[data-testid=kpi-latency]")

    first = page.locator("[data-testid=kernels-table] tbody tr").first
    cells = first.locator("td").all_inner_texts()
    assert cells[:3] == [kernels[0].name, f"{kernels[0].count:,}", format_ns(kernels[0].total_ns)]
    assert page.locator("[data-testid=kernels-table] tbody tr").count() == min(15, len(kernels))
    page.select_option("#topk", "5")
    assert page.locator("[data-testid=kernels-table] tbody tr").count() == 5

    for row in precision_breakdown(columns):
        shown = text(page, f"[data-testid=precision-legend] .pct[data-key={row.precision}]")
        assert shown == f"{100 * row.share:.1f} %"
    for key, share in activity_breakdown(columns).shares().items():
        assert (
            text(page, f"[data-testid=activity-legend] .pct[data-key={key}]")
            == f"{100 * share:.1f} %"
        )

    assert page.locator("[data-testid=steps-table] tbody tr").count() == len(steps.rows)
    for chart in ("util-chart", "step-hist", "latency-hist", "annotation-hist"):
        box = page.locator(f"[data-testid={chart}] canvas").first.bounding_box()
        assert box is not None, chart
        assert box["width"] > 200, chart
        assert box["height"] > 100, chart
    page.screenshot(path=str(SCREENSHOTS / "dashboard.png"), full_page=True)


def test_dashboard_draws_device_and_rank_step_heatmaps_memory_mix_and_cpu(
    page: Any, expected: LoadedProfile
) -> None:
    columns = expected.columns
    devices = utilisation_over_time(columns, len(expected.nodes), 0, expected.end_ns, 240).devices
    matrix = rank_step_matrix(columns)

    device_map = page.locator("[data-testid=device-heatmap]")
    assert device_map.get_attribute("data-rows") == str(len(devices))
    assert device_map.get_attribute("data-cols") == "240"
    rank_map = page.locator("[data-testid=rank-step-heatmap]")
    assert rank_map.get_attribute("data-rows") == str(matrix.ranks.size)
    assert rank_map.get_attribute("data-cols") == str(matrix.first_step.size)
    for testid in ("device-heatmap", "rank-step-heatmap"):
        box = page.locator(f"[data-testid={testid}] canvas").bounding_box()
        assert box is not None, testid
        assert box["width"] > 300, testid
        assert box["height"] > 50, testid

    straggler = stragglers(columns, matrix)[0]
    first_straggler = page.locator("[data-testid=stragglers] tbody tr").first
    assert first_straggler.get_attribute("data-rank") == str(straggler.rank)
    assert f"{straggler.mean_relative:.3f}" in first_straggler.inner_text()

    memory_rows = page.locator("[data-testid=memory-table] tbody tr")
    expected_memory = transfer_breakdown(columns)
    assert memory_rows.count() == len(expected_memory)
    assert memory_rows.first.get_attribute("data-name") == expected_memory[0].name
    assert (
        text(page, f"[data-testid=memory-legend] .pct[data-key={expected_memory[0].name}]")
        == f"{100 * expected_memory[0].share:.1f} %"
    )
    assert page.locator("[data-testid=collectives-table] tbody tr").count() == len(
        transfer_breakdown(columns, EventKind.COLLECTIVE)
    )
    assert page.locator("[data-testid=cpu-table] tbody tr").count() == len(expected.nodes)
    assert "cores" in text(page, "[data-testid=kpi-cpu]")

    page.select_option("[data-testid=ops-order]", "by_count")
    by_count = top_operations(columns, order="count")
    first = page.locator("[data-testid=kernels-table] tbody tr").first
    assert first.locator("td").all_inner_texts()[:2] == [by_count[0].name, f"{by_count[0].count:,}"]
    page.select_option("[data-testid=ops-source]", "host_ops")
    host_ops = top_operations(columns, kind=EventKind.HOST_OP, order="count")
    assert first.locator("td").first.inner_text() == host_ops[0].name

    page.select_option("[data-testid=heat-mode]", "duration")
    assert rank_map.get_attribute("data-rows") == str(matrix.ranks.size)
    page.select_option("[data-testid=heat-mode]", "relative")
    page.locator("[data-testid=rank-step-heatmap]").screenshot(
        path=str(SCREENSHOTS / "rank-step-heatmap.png")
    )
    page.screenshot(path=str(SCREENSHOTS / "dashboard-full.png"), full_page=True)


def test_annotation_picker_switches_the_histogram(page: Any, expected: LoadedProfile) -> None:
    forward = next(row for row in annotation_table(expected.columns) if row.name == "forward")

    page.select_option("[data-testid=annotation-picker]", "forward")
    page.wait_for_selector("[data-testid=annotation-stats][data-name=forward]")

    shown = text(page, "[data-testid=annotation-stats]")
    assert f"count {forward.stats.count:,}" in shown
    assert f"p50 {format_ns(forward.stats.p50_ns)}" in shown
    page.locator("[data-testid=annotation-hist]").screenshot(
        path=str(SCREENSHOTS / "annotation-forward.png")
    )


def test_a_rank_step_heatmap_cell_opens_that_step_in_the_timeline(
    page: Any, expected: LoadedProfile
) -> None:
    step = step_summary(expected.columns).rows[5]
    page.goto(page.url.split("#")[0] + "#/dashboard")
    page.wait_for_selector("main[data-ready=dashboard]", timeout=60_000)
    canvas = page.locator("[data-testid=rank-step-heatmap] canvas")
    box = canvas.bounding_box()
    assert box is not None
    columns = int(canvas.evaluate("c => c.parentElement.dataset.cols"))
    label_width = 150
    x = label_width + (box["width"] - label_width) * (5 + 0.5) / columns
    canvas.click(position={"x": x, "y": 5})

    page.wait_for_selector("main[data-ready=timeline]", timeout=60_000)
    assert page.input_value("[data-testid=step-picker]") == str(step.step)
    view = page.evaluate("window.__timeline.view")
    assert view["start"] <= step.start_ns
    assert view["end"] >= step.end_ns
    assert view["end"] - view["start"] < 1.2 * (step.end_ns - step.start_ns)


def test_timeline_zooms_to_a_step_and_shows_event_details(
    page: Any, expected: LoadedProfile
) -> None:
    page.goto(page.url.split("#")[0] + "#/timeline")
    page.wait_for_selector("main[data-ready=timeline]", timeout=60_000)
    wait_until(page, "!!window.__timeline && window.__timeline.stats.queries > 0")
    page.screenshot(path=str(SCREENSHOTS / "timeline.png"))
    step = next(row for row in step_summary(expected.columns).rows if row.step == 4)

    queries = page.evaluate("window.__timeline.stats.queries")
    page.select_option("[data-testid=step-picker]", "4")
    wait_until(page, f"window.__timeline.stats.queries > {queries}")
    view = page.evaluate("window.__timeline.view")
    margin = (step.end_ns - step.start_ns) * 0.05
    assert step.start_ns - margin <= view["start"] <= step.start_ns
    assert step.end_ns <= view["end"] <= step.end_ns + margin
    stats = page.evaluate("window.__timeline.stats")
    assert stats["drawnEvents"] > 100
    assert stats["drawnFlows"] > 10
    page.screenshot(path=str(SCREENSHOTS / "timeline-step-4.png"))

    kernel = page.evaluate(
        "(() => { const h = window.__timeline.hits.find(h => h.kind === 5 && h.w > 4);"
        " return h && {x: h.x + h.w / 2, y: h.y + h.h / 2, name: h.name}; })()"
    )
    assert kernel is not None
    page.locator("[data-testid=timeline-canvas]").click(
        position={"x": kernel["x"], "y": kernel["y"]}
    )
    page.wait_for_selector("[data-testid=event-name]")
    assert text(page, "[data-testid=event-name]") == kernel["name"]
    assert "µs" in text(page, "[data-testid=event-latency]") or "ms" in text(
        page, "[data-testid=event-latency]"
    )
    page.screenshot(path=str(SCREENSHOTS / "timeline-event.png"))


def test_timeline_keyboard_zoom_and_pan_change_the_view(page: Any) -> None:
    before = page.evaluate("window.__timeline.view")
    page.locator("[data-testid=timeline-canvas]").hover(position={"x": 800, "y": 300})
    page.keyboard.press("w")
    zoomed = page.evaluate("window.__timeline.view")
    page.keyboard.press("d")
    panned = page.evaluate("window.__timeline.view")

    assert zoomed["end"] - zoomed["start"] < before["end"] - before["start"]
    assert panned["start"] > zoomed["start"]


def test_unloading_the_profile_frees_it_and_empties_the_dashboard(page: Any) -> None:
    page.goto(page.url.split("#")[0] + "#/profiles")
    row = page.locator(f"tr[data-profile='{PROFILE_ID}']")
    row.locator("[data-action=unload]").click()
    page.wait_for_selector(f"tr[data-profile='{PROFILE_ID}'] [data-action=load]")

    assert row.locator(".badge").inner_text() == "unloaded"
    assert text(page, "#current-profile") == "No profile loaded"
    page.goto(page.url.split("#")[0] + "#/dashboard")
    page.wait_for_selector("text=No profile loaded. Choose one on the Profiles page.")
