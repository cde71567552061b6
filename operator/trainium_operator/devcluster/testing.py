"""Test support for integration suites: a session cluster handle and per-test namespaces.

Kept in the package (not a conftest) so every integration suite, ours and the operator's, shares
one definition; pytest itself is only imported by the conftest that wires these into fixtures.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainium_operator.devcluster import build, cluster, paths, sim
from trainium_operator.devcluster.clients import Clients, clients_for, is_status

REUSE_ENV = "TRAINIUM_DEV_CLUSTER"
NODES = 2
INSTANCE_TYPE = "trn1.32xlarge"


class ClusterUnavailableError(RuntimeError):
    """The dev cluster cannot be provided (binaries unbuildable, or the named cluster is down)."""


@dataclass(frozen=True)
class DevCluster:
    name: str
    kubeconfig: Path
    clients: Clients
    bin_dirs: list[Path]
    owned: bool  # started by this session, so deleted at its end

    @property
    def core(self) -> Any:
        return self.clients.core

    @property
    def custom(self) -> Any:
        return self.clients.custom

    def tool_env(self) -> dict[str, str]:
        """Environment for running kubectl/helm against this cluster."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = os.pathsep.join([*map(str, self.bin_dirs), env.get("PATH", "")])
        return env


_TEST_CLUSTER_NAME = re.compile(r"^pytest-(\d+)-[0-9a-f]{4}$")


def _test_cluster_name() -> str:
    return f"pytest-{os.getpid()}-{uuid.uuid4().hex[:4]}"


def reap_abandoned_test_clusters(echo: Callable[[str], None]) -> list[str]:
    """Deletes test clusters whose pytest process is gone (killed sessions leave them running)."""
    clusters_dir = paths.kwok_workdir() / "clusters"
    reaped = []
    for entry in sorted(clusters_dir.iterdir()) if clusters_dir.is_dir() else []:
        match = _TEST_CLUSTER_NAME.match(entry.name)
        if match is None:
            continue
        try:
            os.kill(int(match.group(1)), 0)
            continue  # its session still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        echo(f"deleting abandoned test cluster {entry.name}")
        cluster.down(entry.name, echo=echo)
        reaped.append(entry.name)
    return reaped


@contextlib.contextmanager
def session_cluster(echo: Callable[[str], None]) -> Iterator[DevCluster]:
    """Reuses $TRAINIUM_DEV_CLUSTER, or builds what is missing and runs a fresh uniquely named
    cluster that is always deleted afterwards."""
    reused = os.environ.get(REUSE_ENV)
    if reused:
        cluster_paths = paths.ClusterPaths(reused)
        if not cluster.apiserver_running(cluster_paths):
            raise ClusterUnavailableError(
                f"{REUSE_ENV}={reused} but that cluster is not running "
                f"(start it with `trainium-operator dev up --name {reused}`)"
            )
        yield DevCluster(
            reused,
            cluster_paths.kubeconfig,
            clients_for(cluster_paths.kubeconfig),
            build.expected_toolchain().bin_dirs,
            owned=False,
        )
        return
    reap_abandoned_test_clusters(echo)
    try:
        build.build_all(jobs=build.default_jobs(), echo=echo)
        toolchain = build.require_toolchain()
    except (build.BuildError, build.ToolchainMissingError, OSError) as error:
        raise ClusterUnavailableError(f"dev-cluster binaries cannot be built: {error}") from error
    name = _test_cluster_name()
    try:
        report = cluster.up(
            name, nodes=NODES, instance_type=INSTANCE_TYPE, neuron_taint=False, echo=echo
        )
        echo(f"dev cluster {name} up in {report.timer.total:.1f}s")
        yield DevCluster(
            name, report.kubeconfig, clients_for(report.kubeconfig), toolchain.bin_dirs, owned=True
        )
    finally:
        cluster.down(name, echo=echo)


@contextlib.contextmanager
def fresh_namespace(dev_cluster: DevCluster, *, delete_timeout: float = 90) -> Iterator[str]:
    """A new namespace, usable once its default ServiceAccount exists; deleted and gone after."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    core = dev_cluster.core
    core.create_namespace({"metadata": {"name": name, "labels": {"trainium.dev/test": "true"}}})
    sim.wait_for(
        lambda: core.read_namespaced_service_account("default", name),
        timeout=30,
        description=f"ServiceAccount {name}/default",
    )
    yield name
    # Pods first and without grace: the namespace controller otherwise re-checks only after the
    # pods' grace period, which makes every test pay seconds for its clean-up.
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    core.delete_namespace(name)

    def gone() -> bool:
        try:
            core.read_namespace(name)
        except Exception as error:
            if is_status(error, 404):
                return True
            raise
        return False

    # Waiting keeps the next test from meeting this test's pods still holding node capacity.
    sim.wait_for(gone, timeout=delete_timeout, description=f"namespace {name} deleted")
