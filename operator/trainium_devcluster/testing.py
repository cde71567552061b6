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

from trainium_devcluster import build, cluster, kueue, objects, paths, sim, volcano
from trainium_devcluster.clients import Clients, clients_for, is_status
from trainium_operator.builders.job import VOLCANO_GROUP, VOLCANO_VERSION

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
            name,
            nodes=NODES,
            instance_type=INSTANCE_TYPE,
            neuron_taint=False,
            echo=echo,
            schedule_period=volcano.TEST_SCHEDULE_PERIOD,
        )
        echo(f"dev cluster {name} up in {report.timer.total:.1f}s")
        yield DevCluster(
            name, report.kubeconfig, clients_for(report.kubeconfig), toolchain.bin_dirs, owned=True
        )
    finally:
        cluster.down(name, echo=echo)


@contextlib.contextmanager
def extra_nodes(
    dev_cluster: DevCluster,
    count: int,
    *,
    instance_type: str = INSTANCE_TYPE,
    timeout: float = 60,
) -> Iterator[list[str]]:
    """`count` more fake nodes (with their CSINodes) for one suite, Ready when the block
    starts, numbered after the cluster's own, and counted in Kueue's ClusterQueue quota; deleted
    after it (and the quota shrunk again), so the suites that follow see the session's NODES
    nodes again. Yields the added nodes' names."""
    clients = dev_cluster.clients
    existing = [node.metadata.name for node in clients.core.list_node().items]
    first = objects.next_node_index(existing, instance_type)
    created = cluster.create_nodes(
        clients, objects.fake_nodes(count, instance_type, first_index=first)
    )
    try:
        cluster.create_csi_nodes(clients, created)
        cluster.wait_nodes_ready(clients, created, timeout=timeout)
        kueue.sync_cluster_queue(clients)
        yield created
    finally:
        cluster.delete_nodes(clients, created, timeout=timeout)
        kueue.sync_cluster_queue(clients)


@contextlib.contextmanager
def extra_dra_nodes(
    dev_cluster: DevCluster,
    count: int,
    *,
    instance_type: str = "trn2.48xlarge",
    group_limit: int = 16,
    timeout: float = 60,
) -> Iterator[list[str]]:
    """As `extra_nodes`, DRA nodes (cluster.create_dra_nodes): their devices only in
    ResourceSlices, counted in Kueue's quota through its deviceClassMappings. `group_limit`
    below 16 publishes no connected group of the whole instance."""
    clients = dev_cluster.clients
    created = cluster.create_dra_nodes(clients, count, instance_type, group_limit=group_limit)
    try:
        cluster.wait_nodes_ready(clients, created, timeout=timeout)
        kueue.sync_cluster_queue(clients)
        yield created
    finally:
        cluster.delete_nodes(clients, created, timeout=timeout)
        kueue.sync_cluster_queue(clients)


NAMESPACE_PREFIX = "t-"


@contextlib.contextmanager
def fresh_namespace(
    dev_cluster: DevCluster,
    *,
    prefix: str = NAMESPACE_PREFIX,
    ready_timeout: float = 30,
    cleanup_timeout: float = 30,
) -> Iterator[str]:
    """A new namespace, usable once its default ServiceAccount exists; deleted after.

    The clean-up does not wait for the namespace controller (seconds per namespace): it marks
    the namespace Terminating, so nothing can be created in it any more, then removes its pods,
    PodGroups and Kueue Workloads at once, which is what the next test would otherwise meet
    (node capacity, Volcano queue capacity and Kueue quota still held)."""
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    core = dev_cluster.core
    core.create_namespace({"metadata": {"name": name, "labels": {"trainium.dev/test": "true"}}})
    sim.wait_for(
        lambda: core.read_namespaced_service_account("default", name),
        timeout=ready_timeout,
        description=f"ServiceAccount {name}/default",
    )
    yield name
    release_namespace(dev_cluster, name, timeout=cleanup_timeout)


def release_namespace(dev_cluster: DevCluster, name: str, *, timeout: float = 30) -> None:
    """Deletes the namespace in the background and its capacity-holding objects now: pods (Kueue's
    finalizer stripped, so they go even while Kueue is busy or down), PodGroups and Workloads."""
    core, custom = dev_cluster.core, dev_cluster.custom
    try:
        core.delete_namespace(name)
    except Exception as error:
        if is_status(error, 404):
            return
        raise
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    custom.delete_collection_namespaced_custom_object(
        VOLCANO_GROUP, VOLCANO_VERSION, name, "podgroups"
    )
    with_kueue = kueue.api_installed(dev_cluster.clients)
    if with_kueue:
        custom.delete_collection_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, name, "workloads"
        )

    def released() -> bool:
        pods = core.list_namespaced_pod(name).items
        kueue.strip_finalizers(core, name, pods)
        groups = custom.list_namespaced_custom_object(
            VOLCANO_GROUP, VOLCANO_VERSION, name, "podgroups"
        )["items"]
        workloads = (
            custom.list_namespaced_custom_object(kueue.GROUP, kueue.VERSION, name, "workloads")[
                "items"
            ]
            if with_kueue
            else []
        )
        return not pods and not groups and not workloads

    sim.wait_for(
        released, timeout=timeout, description=f"pods, PodGroups and Workloads of {name} gone"
    )
