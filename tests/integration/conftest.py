"""Fixtures the operator's integration modules share; a module opts in to the CRDs with
``pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]`` (the chart and
dev-cluster modules install nothing, so the chart's own CRD install is not pre-empted)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.operator_harness import OperatorProcess, install_crds, running_operator


@pytest.fixture(scope="module")
def crds(dev_cluster: Any) -> None:
    install_crds(dev_cluster.clients)


@pytest.fixture
def operator(dev_cluster: Any, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """One operator process watching the test's namespace, stopped after the test."""
    with running_operator(dev_cluster, namespace, tmp_path) as proc:
        yield proc
