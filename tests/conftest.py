"""Test tiers, and the local control plane for integration and chaos tests: one cluster per
session, one namespace per test.

Every test gets exactly one tier marker, so `pytest -m unit`, `-m integration` and `-m e2e`
together run what plain `pytest` runs:
- e2e: marked so explicitly (the README's fresh clone, full training runs);
- integration: marked so, or using the dev cluster (the real API server and Volcano);
- unit: everything else (no cluster: pure functions, builders, the state machine, the
  reconciler against a fake cluster, the UI and profiler on local files).

Set TRAINIUM_DEV_CLUSTER=<name> to run against a cluster started with `trainium-operator dev up`
(it is left running). Otherwise the session builds whatever binaries are missing, starts a fresh,
uniquely named cluster and always deletes it at the end. When the binaries cannot be built the
tests are skipped with the reason, except under CI (CI set), where that is a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tiers import TIERS
from trainium_operator.devcluster import testing
from trainium_operator.devcluster.testing import DevCluster

# The local S3 API server (moto in server mode) and its per-test bucket.
pytest_plugins = ["s3_server"]


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        explicit = [tier for tier in TIERS if item.get_closest_marker(tier)]
        if len(explicit) > 1:
            raise pytest.UsageError(f"{item.nodeid} is marked with several tiers: {explicit}")
        if explicit:
            continue
        uses_cluster = "dev_cluster" in getattr(item, "fixturenames", ())
        item.add_marker("integration" if uses_cluster else "unit")
    # The chaos tests crash the API server: they run last, so the backoff that leaves in the
    # control plane's own clients and KWOK's controller (up to a minute) slows no other test.
    items.sort(key=lambda item: item.get_closest_marker("chaos") is not None)


def _echo(message: str) -> None:
    print(message, flush=True)


@pytest.fixture(scope="session")
def dev_cluster() -> Iterator[DevCluster]:
    try:
        with testing.session_cluster(_echo) as cluster:
            yield cluster
    except testing.ClusterUnavailableError as error:
        if os.environ.get("CI"):
            pytest.fail(f"integration tests cannot run under CI: {error}", pytrace=False)
        pytest.skip(str(error))


@pytest.fixture
def namespace(dev_cluster: DevCluster) -> Iterator[str]:
    with testing.fresh_namespace(dev_cluster) as name:
        yield name
