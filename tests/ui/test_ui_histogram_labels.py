"""The dashboard's histograms keep their x-axis labels apart, in headless Chromium.

uPlot draws axes on a canvas, so each x-axis label's box is rebuilt from the chart itself: the
tick position (valToPos) and the label's width in the axis font (measureText). The profile's
step times spread like the dev-cluster demo's (about 60 ms to 1.3 s), whose labels
("200.000 ms", "400.000 ms", ...) overlapped; its launch latencies and annotations fill the
other two histograms. Each is measured from a desktop window's width down to a phone's; the
step histogram's screenshots land in artifacts/screenshots/ for a person to look at.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.browser import SCREENSHOTS, chromium_page
from trainium_operator.profiler.events import Event, EventKind
from trainium_operator.profiler.format import RankHeader, write_rank_file
from trainium_operator.profiler.manifest import ProfileManifest, write_manifest
from trainium_operator.ui.app import create_app
from ui_serving import post_json, serving

pytestmark = pytest.mark.browser

PROFILE_ID = "default/demo-like/0"
# The demo's 30 step times (ms), from its profile report.
STEP_MS = [1295, 70, 71, 68, 66, 72, 69, 70, 67, 71, 110, 120, 105, 98, 75]
STEP_MS += [62, 64, 66, 70, 71, 72, 73, 150, 160, 587, 585, 280, 436, 120, 285]
HISTOGRAMS = ("step-hist", "latency-hist", "annotation-hist")
# 1280: the step histogram spans 7 of 12 columns; 1120: the narrowest columns before the
# layout stacks (below 1100 px); 760 and 480: stacked, one chart per row (a tablet, a phone).
VIEWPORT_WIDTHS = (1280, 1120, 760, 480)
MIN_GAP_PX = 4

# Every x-axis label of a chart as drawn: its text, centre and width in CSS pixels.
LABEL_BOXES = """async (testid) => {
  await new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
  const u = document.querySelector(`[data-testid=${testid}]`).uplot;
  const axis = u.axes[0];
  const context = document.createElement("canvas").getContext("2d");
  context.font = axis.font[0];
  const devicePxPerCssPx = axis.font[1] / axis.font[2];
  return axis._splits.map((value, i) => ({
    text: axis._values[i],
    centre: u.valToPos(value, "x"),
    width: context.measureText(axis._values[i] ?? "").width / devicePxPerCssPx,
  })).filter((label) => label.text);
}"""


def demo_like_events() -> list[Event]:
    events, at, flow = [], 1_000_000_000, 0
    for number, ms in enumerate(STEP_MS, start=1):
        step_ns = ms * 1_000_000
        events.append(Event(EventKind.STEP, "step", at, step_ns, value=number))
        # The data loader takes half of each step; launches wait 10 µs to 1.3 ms for the device.
        events.append(Event(EventKind.ANNOTATION, "data_load", at, step_ns // 2))
        for latency_us in (10, 40, 150, 600, 1300 if number % 5 == 0 else 90):
            flow += 1
            launch_at = at + step_ns // 2 + flow * 1000
            events.append(Event(EventKind.LAUNCH, "nrt_execute", launch_at, 5_000, flow_id=flow))
            events.append(
                Event(
                    EventKind.KERNEL,
                    "matmul",
                    launch_at + latency_us * 1000,
                    200_000,
                    device=0,
                    flow_id=flow,
                )
            )
        at += step_ns
    return sorted(events, key=lambda event: event.start_ns)


def demo_like_profile(root: Path) -> Path:
    directory = root / PROFILE_ID
    header = RankHeader(
        rank=0, world_size=1, local_rank=0, group_rank=0, node="node-a", hostname="h",
        pid=1, job_name="demo-like", namespace="default", job_uid="u", attempt=0,
        step_window=None, sources=("host", "neuron"), clock_sync=(),
    )  # fmt: skip
    (directory / "node-a").mkdir(parents=True)
    write_rank_file(directory / "node-a" / "rank-0.trnprof", header, demo_like_events())
    write_manifest(
        directory, ProfileManifest(job_name="demo-like", namespace="default", finished=True)
    )
    return root


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Any]:
    root = demo_like_profile(tmp_path / "profiles")
    with (
        serving(create_app(root, workers=1)) as url,
        chromium_page(width=VIEWPORT_WIDTHS[0], height=900) as (browser_page, errors),
    ):
        post_json(f"{url}/api/profiles/load?id={PROFILE_ID}")
        browser_page.goto(f"{url}/#/profiles")
        opened = browser_page.locator(f"tr[data-profile='{PROFILE_ID}'] [data-action=open]")
        opened.wait_for(timeout=60_000)
        opened.click()
        browser_page.wait_for_selector("main[data-ready=dashboard]", timeout=60_000)
        yield browser_page
    assert errors == [], errors


def overlapping_neighbours(labels: list[dict[str, Any]]) -> list[str]:
    overlaps = []
    for left, right in itertools.pairwise(labels):
        gap = (right["centre"] - right["width"] / 2) - (left["centre"] + left["width"] / 2)
        if gap < MIN_GAP_PX:
            overlaps.append(f"{left['text']!r} and {right['text']!r} ({gap:.1f} px apart)")
    return overlaps


def test_no_two_adjacent_x_axis_labels_of_a_dashboard_histogram_overlap(page: Any) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    overlaps, drawn = [], {}
    for width in VIEWPORT_WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        for testid in HISTOGRAMS:
            labels = page.evaluate(LABEL_BOXES, testid)
            drawn[f"{testid} at {width} px"] = [label["text"] for label in labels]
            assert len(labels) >= 3, (testid, width, labels)
            overlaps += [f"{testid} at {width} px: {o}" for o in overlapping_neighbours(labels)]
        page.locator("[data-testid=step-hist]").screenshot(
            path=str(SCREENSHOTS / f"step-histogram-{width}px.png")
        )

    assert overlaps == [], "\n".join(overlaps + [f"{k}: {v}" for k, v in drawn.items()])
