"""A CPU-only run says what it is: the dashboard data, `profile report` and the dashboard page
state that no accelerator activity was recorded and why, and show the host operations of the
torch.profiler window where device kernels would be, instead of zeros. The profile is a real
CPU training loop under our profiler with the torch source, as the demo records."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler.profiler_helpers import start, stop_and_read
from support.browser import SCREENSHOTS, chromium_page
from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator import profiler
from trainium_operator.analysis.loading import load_profile
from trainium_operator.analysis.report import dashboard, text_report
from trainium_operator.cli import main
from trainium_operator.profiler.config import StepWindow
from trainium_operator.profiler.manifest import ProfileManifest, write_manifest
from trainium_operator.ui.app import create_app
from ui_serving import serving


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("cpu") / "ml" / "bert-cpu" / "0"
    rank_file = start(root, steps=StepWindow(2, 4), sources=frozenset({"torch"}))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data, target = torch.randn(16, 32), torch.randn(16, 4)
    for n in range(7):
        profiler.step(n)
        with profiler.annotate("forward"):
            loss = torch.nn.functional.mse_loss(model(data), target)
        with profiler.annotate("backward"):
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    stop_and_read(rank_file)
    write_manifest(
        root,
        ProfileManifest(job_name="bert-cpu", namespace="ml", step_window=(2, 4), finished=True),
    )
    return root


def test_the_dashboard_data_says_no_accelerator_activity_and_why(cpu_profile: Path) -> None:
    data = dashboard(load_profile(cpu_profile, workers=1))
    accelerator = data["accelerator"]
    assert accelerator["recorded"] is False
    assert accelerator["device_events"] == 0
    assert accelerator["sources"] == ["host", "torch"]
    assert "CPU-only run" in accelerator["reason"]
    assert "no CUDA device" in accelerator["reason"]
    assert accelerator["window"] == [2, 4]
    assert data["host_ops"]["count"] > 0, "the torch window's host operators are there to show"
    assert data["kernels"]["count"] == 0


def test_the_report_replaces_device_zeros_with_the_host_ops_of_the_window(
    cpu_profile: Path,
) -> None:
    outcome = CliRunner().invoke(main, ["profile", "report", str(cpu_profile), "--workers", "1"])
    assert outcome.exit_code == 0, outcome.output
    text = outcome.output
    assert "Accelerator: NO ACCELERATOR ACTIVITY RECORDED" in text
    assert "why: this was a CPU-only run (sources: host, torch)" in text
    assert "Host ops of the torch.profiler window (in place of device kernels), by time" in text
    assert "aten::addmm" in text
    for zero in ("Device utilisation", "Device time:", "Top kernels", "Launch -> execution"):
        assert zero not in text, zero


def test_a_profile_with_device_activity_is_reported_as_before(tmp_path: Path) -> None:
    root = write_synthetic_profile(tmp_path / "p", SyntheticSpec(nodes=1, ranks_per_node=2))
    data = dashboard(load_profile(root, workers=1))
    assert data["accelerator"]["recorded"] is True
    assert data["accelerator"]["reason"] is None
    text = text_report(data)
    assert "NO ACCELERATOR" not in text
    assert "Top kernels by time" in text


@pytest.mark.browser
def test_the_dashboard_page_explains_a_cpu_only_run(cpu_profile: Path) -> None:
    root = cpu_profile.parents[1]
    with serving(create_app(root, workers=1)) as url, chromium_page() as (page, errors):
        page.goto(f"{url}/#/profiles")
        row = page.locator("tr[data-profile='bert-cpu/0']")
        row.locator("[data-action=load]").click()
        page.wait_for_selector("tr[data-profile='bert-cpu/0'] [data-action=open]", timeout=60_000)
        row.locator("[data-action=open]").click()
        page.wait_for_selector("main[data-ready=dashboard]", timeout=60_000)
        notice = page.inner_text("[data-testid=no-accelerator]")
        assert "No accelerator activity recorded" in notice
        assert "CPU-only run" in notice
        assert "none recorded" in page.inner_text("[data-testid=kpi-busy]").lower()
        assert "0.0" not in page.inner_text("[data-testid=kpi-busy]")
        assert "HOST OP RUNS" in page.inner_text("[data-testid=kpi-kernels]")
        assert "aten::" in page.inner_text("[data-testid=kernels-table]")
        assert "aten::" in page.inner_text("#activity")
        assert page.locator("[data-testid=not-applicable]").count() == 3
        page.screenshot(path=str(SCREENSHOTS / "dashboard-cpu-only.png"), full_page=True)
    assert errors == [], errors
