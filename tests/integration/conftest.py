"""Fixtures the operator's integration modules share; a module opts in to the CRDs with
``pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]`` (the chart and
dev-cluster modules install nothing, so the chart's own CRD install is not pre-empted).

`operator` is one operator process per module, shared by the module's tests (as JobSet's envtest
suite starts its manager once): it watches the namespace pattern `ts-<module tag>-*`, and a test
that asks for it gets a namespace matching that pattern. Tests that kill, restart or reconfigure
the operator use `own_operator` (or `running_operator`) instead, in a plain `t-` namespace the
shared one never sees.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.operator_harness import (
    HealthOperator,
    OperatorProcess,
    OperatorView,
    ensure_shared_claim,
    install_crds,
    operator_serving,
    running_operator,
    supervised,
)
from trainium_devcluster import testing

SHARED_FIXTURE = "operator"


def shared_prefix(module_name: str) -> str:
    return f"ts-{hashlib.sha256(module_name.encode()).hexdigest()[:6]}-"


@pytest.fixture(scope="module")
def crds(dev_cluster: Any) -> None:
    install_crds(dev_cluster.clients)


@pytest.fixture
def clients(dev_cluster: Any) -> Any:
    """The dev cluster's API clients (core, custom objects, ...)."""
    return dev_cluster.clients


@pytest.fixture
def namespace(dev_cluster: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    shared = SHARED_FIXTURE in request.fixturenames
    prefix = shared_prefix(request.module.__name__) if shared else testing.NAMESPACE_PREFIX
    with testing.fresh_namespace(dev_cluster, prefix=prefix) as name:
        yield name


@pytest.fixture(scope="module")
def shared_operator(
    dev_cluster: Any, crds: None, request: pytest.FixtureRequest, tmp_path_factory: Any
) -> Iterator[OperatorProcess]:
    pattern = shared_prefix(request.module.__name__) + "*"
    proc = OperatorProcess(
        kubeconfig=Path(dev_cluster.kubeconfig),
        namespace=pattern,
        log_path=tmp_path_factory.mktemp("shared-operator") / "operator.log",
    )
    with supervised(proc):
        yield proc


@pytest.fixture
def operator(dev_cluster: Any, namespace: str, shared_operator: OperatorProcess) -> Iterator[Any]:
    """The module's operator, seen from one test: its log since the test began, checked after
    the test for a crash or an unhandled exception."""
    ensure_shared_claim(dev_cluster.clients, namespace)
    view = OperatorView(shared_operator)
    yield view
    print(view.log()[-6000:])
    view.assert_alive()
    assert "Traceback" not in view.log(), "the operator logged an unhandled exception"


@pytest.fixture
def health_operator(dev_cluster: Any, namespace: str, tmp_path: Path) -> Iterator[HealthOperator]:
    """An operator of the test's own serving the health channel and /metrics on free ports: the
    process, the health port and the metrics port."""
    ports = ("--health-port", "--metrics-port")
    with operator_serving(dev_cluster, namespace, tmp_path, *ports) as (proc, (health, metrics)):
        yield proc, health, metrics


@pytest.fixture
def own_operator(dev_cluster: Any, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """An operator process of the test's own, watching only its namespace (for tests that kill,
    restart or reconfigure it), stopped after the test."""
    with running_operator(dev_cluster, namespace, tmp_path) as proc:
        yield proc
