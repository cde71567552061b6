"""The wheel the operator image installs carries the operator, never the dev harness."""

from __future__ import annotations

import tomllib
import zipfile
from pathlib import Path

import pytest

from images.dockerfile_model import ROOT


@pytest.fixture(scope="module")
def wheel(operator_wheel: Path) -> zipfile.ZipFile:
    return zipfile.ZipFile(operator_wheel)


def names(wheel: zipfile.ZipFile) -> list[str]:
    return wheel.namelist()


def test_the_wheel_has_the_operator_ui_and_profiler(wheel: zipfile.ZipFile) -> None:
    files = names(wheel)
    for expected in (
        "trainium_operator/controller/handlers.py",
        "trainium_operator/ui/static/app.js",
        "trainium_operator/profiler/capture.py",
    ):
        assert expected in files


def test_the_wheel_carries_the_whole_contract_package(wheel: zipfile.ZipFile) -> None:
    """The operator's half of what it shares with the training image (which copies the same
    folder): every module of trainium_operator/contract/."""
    contract = ROOT / "operator" / "trainium_operator" / "contract"
    modules = {f"trainium_operator/contract/{p.name}" for p in contract.glob("*.py")}
    assert "trainium_operator/contract/channel.py" in modules
    assert modules <= set(names(wheel))


def test_the_wheel_carries_no_dev_cluster_go_modules_or_scheduler(wheel: zipfile.ZipFile) -> None:
    files = names(wheel)
    assert not [f for f in files if "devcluster" in f]
    assert not [f for f in files if f.endswith(("go.mod", "go.sum"))]
    # (the operator's own Python modules may say "gang"; a scheduler build may not)
    assert not [
        f
        for f in files
        if ("gang" in Path(f).name and not f.endswith(".py")) or "volcano-scheduler" in f
    ]


def test_the_wheel_carries_no_test_support_code(wheel: zipfile.ZipFile) -> None:
    # The synthetic profile writer serves tests and benchmarks only (tests/support).
    assert (ROOT / "tests" / "support" / "synthetic.py").exists()
    assert not [f for f in names(wheel) if "synthetic" in f]


def test_the_wheel_needs_no_exclusion_rule_to_leave_the_dev_cluster_out() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "exclude-package-data" not in setuptools
    assert "exclude" not in setuptools["packages"]["find"]
    assert (ROOT / "operator" / "trainium_devcluster" / "__init__.py").exists()


def test_the_wheels_runtime_requirements_hold_no_dev_or_test_package(
    wheel: zipfile.ZipFile,
) -> None:
    (metadata,) = [n for n in names(wheel) if n.endswith(".dist-info/METADATA")]
    requires = [
        line.removeprefix("Requires-Dist: ")
        for line in wheel.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist: ") and "extra ==" not in line
    ]
    runtime = {r.split("==")[0].strip().lower() for r in requires}
    # boto3: the profile UI in the operator image reads profiles from S3; click: the CLI.
    assert runtime == {
        "click",
        "kopf",
        "kubernetes",
        "urllib3",
        "pyyaml",
        "pydantic",
        "aiohttp",
        "numpy",
        "boto3",
    }
