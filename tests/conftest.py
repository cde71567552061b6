"""The local control plane for integration and chaos tests: one cluster per session, one
namespace per test. Test tiers (unit, integration, e2e) are the `tiers` plugin's.

Set TRAINIUM_DEV_CLUSTER=<name> to run against a cluster started with `trainium-operator dev up`
(it is left running). Otherwise the session builds whatever binaries are missing, starts a fresh,
uniquely named cluster and always deletes it at the end. When the binaries cannot be built the
tests are skipped with the reason, except under CI (CI set), where that is a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from trainium_devcluster import testing
from trainium_devcluster.testing import DevCluster

# Each module's Chromium; the local S3 API server (moto in server mode) and its per-test
# bucket; the test tiers.
pytest_plugins = ["browser", "s3_server", "tiers"]


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
