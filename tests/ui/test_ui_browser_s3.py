"""The web UI in headless Chromium serving an `s3://` prefix of the local S3 server (moto):
the list is searched by job name and filtered by status, an interrupted upload is shown but
cannot be loaded, and a profile is loaded from S3 and opened in the dashboard. Screenshots go
to artifacts/screenshots/ (profiles-s3.png, dashboard-s3.png), beside the other UI tests'."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from s3_server import S3Bucket
from support.browser import SCREENSHOTS, chromium_page
from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.profiler.s3 import parse_s3_uri, upload_profile
from trainium_operator.ui.app import create_app
from trainium_operator.ui.profiles import JobInfo
from ui_serving import serving

pytestmark = pytest.mark.browser

SPEC = SyntheticSpec(nodes=2, ranks_per_node=4, kernels_per_step=24)


async def jobs() -> list[JobInfo]:
    return [
        JobInfo("bert-large", "ml", "2026-01-02T00:00:00Z", "Failed"),
        JobInfo(
            "llama-pretrain",
            "ml",
            "2026-01-01T00:00:00Z",
            "Succeeded",
            profile_s3_uri="s3://placeholder",  # replaced per test with the real bucket
        ),
    ]


@pytest.fixture
def s3_ui(s3: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Two uploaded profiles, one interrupted upload, and the UI serving the prefix."""
    monkeypatch.setenv("TRAINIUM_PROFILE_CACHE", str(tmp_path / "cache"))
    base = s3.uri("profiles")
    for job in ("bert-large", "llama-pretrain"):
        local = write_synthetic_profile(
            tmp_path / job, SyntheticSpec(**{**SPEC.__dict__, "job_name": job})
        )
        upload_profile(local, parse_s3_uri(f"{base}/ml/{job}/0"))
    client = s3.client()
    for rank_file in sorted((tmp_path / "bert-large").glob("*/rank-*.trnprof"))[:3]:
        key = f"profiles/ml/bert-large/1/{rank_file.relative_to(tmp_path / 'bert-large')}"
        client.upload_file(str(rank_file), s3.bucket, key)

    async def lister() -> list[JobInfo]:
        listed = await jobs()
        return [
            JobInfo(j.name, j.namespace, j.created, j.status, None, f"{base}/ml/{j.name}/0")
            for j in listed
        ]

    with serving(create_app(base, job_lister=lister, workers=1)) as url:
        yield url


def rows(page: Any) -> list[str]:
    found = page.evaluate(
        "Array.from(document.querySelectorAll('[data-testid=profiles-table] tbody tr'))"
        ".map((row) => row.dataset.profile)"
    )
    return [str(item) for item in found]


def wait_rows(page: Any, expected: list[str], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while rows(page) != expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"rows {rows(page)} != {expected}")
        page.wait_for_timeout(50)


def test_the_ui_lists_searches_filters_and_opens_a_profile_from_s3(s3_ui: str) -> None:
    with chromium_page() as (page, errors):
        page.goto(f"{s3_ui}/#/profiles")
        page.wait_for_selector("[data-testid=profiles-table]")
        assert "in S3 under" in page.inner_text("#profiles-root")
        wait_rows(page, ["ml/bert-large/0", "ml/bert-large/1", "ml/llama-pretrain/0"])
        incomplete = page.locator("tr[data-profile='ml/bert-large/1']")
        assert "not loadable" in incomplete.inner_text()
        assert incomplete.locator("[data-action=load]").count() == 0

        page.fill("[data-testid=profile-search]", "llama")
        wait_rows(page, ["ml/llama-pretrain/0"])
        assert "llama-pretrain" in page.inner_text("[data-testid=jobs-table]")
        assert "bert-large" not in page.inner_text("[data-testid=jobs-table]")
        page.fill("[data-testid=profile-search]", "")
        wait_rows(page, ["ml/bert-large/0", "ml/bert-large/1", "ml/llama-pretrain/0"])
        page.select_option("[data-testid=profile-status]", "Failed")
        wait_rows(page, ["ml/bert-large/0", "ml/bert-large/1"])
        page.select_option("[data-testid=profile-status]", "Succeeded")
        wait_rows(page, ["ml/llama-pretrain/0"])

        row = page.locator("tr[data-profile='ml/llama-pretrain/0']")
        row.locator("[data-action=load]").click()
        page.wait_for_selector(
            "tr[data-profile='ml/llama-pretrain/0'] [data-action=open]", timeout=60_000
        )
        assert "loaded" in row.inner_text()
        page.fill("[data-testid=profile-search]", "")
        page.select_option("[data-testid=profile-status]", "")
        wait_rows(page, ["ml/bert-large/0", "ml/bert-large/1", "ml/llama-pretrain/0"])
        page.screenshot(path=str(SCREENSHOTS / "profiles-s3.png"))

        page.locator("tr[data-profile='ml/llama-pretrain/0'] [data-action=open]").click()
        page.wait_for_selector("main[data-ready=dashboard]", timeout=60_000)
        assert str(SPEC.steps) in page.inner_text("[data-testid=kpi-steps]")
        assert "llama-pretrain" in page.inner_text("#current-profile")
        page.screenshot(path=str(SCREENSHOTS / "dashboard-s3.png"))
    assert errors == [], errors
