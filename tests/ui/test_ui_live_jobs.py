"""The Profiles page's job list shows each TrainingJob's live progress and health, in headless
Chromium, and picks up a changed status on its next poll without reloading the page.

The fake lister maps TrainingJob objects (status as the operator writes it) through the UI's
own mapping (ui/jobs.py listed_jobs), so the page shows what it would for a cluster's jobs."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.browser import SCREENSHOTS, chromium_page
from trainium_operator.ui.app import create_app
from trainium_operator.ui.jobs import listed_jobs
from trainium_operator.ui.profiles import JobInfo
from ui_serving import get_json, serving

pytestmark = pytest.mark.browser

HOSTILE = '<img src=x onerror="window.__xss=1">'
PROGRESS = {
    "attempt": 0,
    "step": 1200,
    "maxStep": 1203,
    "totalSteps": 5000,
    "stepTimeP50Ms": 412.5,
    "stepsPerSecond": 2.42,
    "eta": "2026-12-03T14:00:00Z",
    "etaSummary": "26m",
    "lastProgressTime": "2026-12-03T12:00:00Z",
}


def job(name: str, created: str, status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "creationTimestamp": created},
        "spec": {"profile": {"enabled": name != "plain"}},
        "status": {"attempt": 0, **status},
    }


def cluster_jobs() -> dict[str, dict[str, Any]]:
    stalled = {"type": "Stalled", "status": "True", "reason": "NoProgress"}
    return {
        "llama": job("llama", "2026-12-03T10:00:00Z", {"phase": "Training", "progress": PROGRESS}),
        "bert": job(
            "bert",
            "2026-12-03T09:00:00Z",
            {
                "phase": "Training",
                "progress": {**PROGRESS, "step": 800, "etaSummary": "1h10m"},
                "conditions": [stalled],
                "stall": {
                    "attempt": 0,
                    "boundSeconds": 120,
                    "stoppedRanks": [{"rank": 7, "node": HOSTILE, "step": 800}],
                },
            },
        ),
        "gpt": job(
            "gpt",
            "2026-12-03T08:00:00Z",
            {
                "phase": "Training",
                "progress": {**PROGRESS, "step": 40, "stepsPerSecond": 0.5},
                "stragglers": {
                    "attempt": 0,
                    "ranks": [{"rank": 12, "node": "trn-2", "ratio": 1.8}],
                },
            },
        ),
        "plain": job(
            "plain",
            "2026-12-03T07:00:00Z",
            {
                "phase": "Restarting",
                "restarts": {"total": 3, "application": 1, "infrastructure": 1, "stall": 1},
                "lastFailure": {"class": "Infrastructure", "reason": "NodeLost"},
            },
        ),
    }


class FakeCluster:
    """What the lister reads: TrainingJob objects a test changes between polls."""

    def __init__(self) -> None:
        self.items = cluster_jobs()

    async def list_jobs(self) -> list[JobInfo]:
        return listed_jobs([copy.deepcopy(item) for item in self.items.values()])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, FakeCluster]]:
    cluster = FakeCluster()
    (tmp_path / "profiles").mkdir()
    with serving(create_app(tmp_path / "profiles", job_lister=cluster.list_jobs)) as url:
        yield url, cluster


@pytest.fixture
def page(served: tuple[str, FakeCluster]) -> Iterator[Any]:
    with chromium_page(height=900) as (browser_page, errors):
        browser_page.goto(f"{served[0]}/#/profiles")
        browser_page.wait_for_selector("[data-testid=jobs-table]", timeout=30_000)
        yield browser_page
    assert errors == [], errors


def cell(page: Any, name: str, testid: str) -> str:
    text: str = page.inner_text(f"tr[data-job='ml/{name}'] [data-testid={testid}]")
    return " ".join(text.split())


def test_api_jobs_lists_every_job_with_its_live_columns(served: tuple[str, FakeCluster]) -> None:
    jobs = {row["name"]: row for row in get_json(f"{served[0]}/api/jobs")["jobs"]}
    assert sorted(jobs) == ["bert", "gpt", "llama", "plain"]
    assert jobs["plain"]["profiling"] is False
    assert (jobs["llama"]["step"], jobs["llama"]["health"]) == (1200, "healthy")
    assert jobs["plain"]["restarts"]["infrastructure"] == 1


def test_job_rows_show_step_rate_eta_and_health_state(page: Any) -> None:
    assert cell(page, "llama", "job-step") == "1,200 / 5,000 fastest 1,203"
    assert cell(page, "llama", "job-rate") == "2.42 steps/s"
    assert cell(page, "llama", "job-eta").startswith("26m")
    assert cell(page, "llama", "job-p50") == "412.500 ms"
    assert "ago" in cell(page, "llama", "job-last-progress")
    assert cell(page, "llama", "job-health") == "healthy"
    assert cell(page, "bert", "job-health") == "stalled"
    assert cell(page, "gpt", "job-health") == "straggler"
    assert "rank 12 on trn-2 1.80x" in cell(page, "gpt", "job-health-reason")
    assert cell(page, "plain", "job-health") == "restarting"
    assert cell(page, "plain", "job-restarts") == "3 application 1 · infrastructure 1 · stall 1"
    assert "profiling off" in page.inner_text("tr[data-job='ml/plain']")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("[data-testid=jobs-table]").screenshot(path=str(SCREENSHOTS / "live-jobs.png"))


def test_status_strings_are_shown_as_text_not_markup(page: Any) -> None:
    assert HOSTILE in cell(page, "bert", "job-health-reason")
    assert page.locator("[data-testid=jobs-table] img").count() == 0
    assert page.evaluate("window.__xss") is None


def test_a_changed_status_appears_after_the_poll_without_a_reload(
    page: Any, served: tuple[str, FakeCluster]
) -> None:
    _, cluster = served
    page.evaluate("window.__notReloaded = true")
    polls = page.evaluate("window.__ui.jobsPolls")
    llama = cluster.items["llama"]["status"]
    llama["progress"] = {**PROGRESS, "step": 1300, "maxStep": 1300, "etaSummary": "24m"}
    llama["conditions"] = [{"type": "Stalled", "status": "True"}]
    # A function, not a string: the page's CSP forbids eval.
    page.wait_for_function("(seen) => window.__ui.jobsPolls > seen", arg=polls, timeout=15_000)
    assert cell(page, "llama", "job-step") == "1,300 / 5,000"
    assert cell(page, "llama", "job-eta").startswith("24m")
    assert cell(page, "llama", "job-health") == "stalled"
    assert page.evaluate("window.__notReloaded") is True
