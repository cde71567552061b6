"""The operator's watches on the real API server: server-side selection, relisting, sync."""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import pytest

from trainium_devcluster.sim import wait_for
from trainium_devcluster.testing import DevCluster
from trainium_operator.k8s.informer import Reflector, WatchEvent

pytestmark = pytest.mark.integration


def bare_pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            # Never placed: the test only watches API objects.
            "nodeSelector": {"sim.trainium.dev/none": "none"},
            "containers": [{"name": "c", "image": "busybox"}],
        },
    }


def test_a_reflector_lists_then_watches_only_what_its_selector_matches(
    dev_cluster: DevCluster, namespace: str
) -> None:
    core = dev_cluster.core
    core.create_namespaced_pod(namespace, bare_pod("before", {"trainium.dev/job-name": "a"}))
    seen: list[tuple[str, str]] = []
    managed_fields_kept: list[str] = []
    lock = threading.Lock()

    def record(event: WatchEvent) -> None:
        with lock:
            seen.append((event.type, event.obj["metadata"]["name"]))
            if "managedFields" in event.obj["metadata"]:
                managed_fields_kept.append(event.obj["metadata"]["name"])

    reflector = Reflector(
        "pods",
        partial(core.list_namespaced_pod, namespace),
        record,
        label_selector="trainium.dev/job-name",
    )
    reflector.start()
    try:
        assert reflector.synced.wait(30), "the first LIST was never reported"
        assert seen == [("ADDED", "before")]
        core.create_namespaced_pod(namespace, bare_pod("stranger", {"app": "other"}))
        core.create_namespaced_pod(namespace, bare_pod("after", {"trainium.dev/job-name": "a"}))
        wait_for(lambda: ("ADDED", "after") in seen, timeout=30, description="watched create")
        core.delete_namespaced_pod("after", namespace, grace_period_seconds=0)
        wait_for(lambda: ("DELETED", "after") in seen, timeout=30, description="watched delete")
        assert all(name != "stranger" for _, name in seen), "an unselected pod reached us"
        # The server sends managedFields (created through the client: a manager is recorded);
        # neither the listed nor the watched pod reaches the cache with it.
        assert core.read_namespaced_pod("before", namespace).metadata.managed_fields
        assert managed_fields_kept == []
    finally:
        reflector.stop()
        reflector.thread.join(timeout=10)
    assert not reflector.thread.is_alive()


def test_a_relist_reports_what_was_deleted_while_nobody_watched(
    dev_cluster: DevCluster, namespace: str
) -> None:
    core = dev_cluster.core
    for name in ("keep", "drop"):
        core.create_namespaced_pod(namespace, bare_pod(name, {"trainium.dev/job-name": "a"}))
    seen: list[tuple[str, str]] = []
    reflector = Reflector(
        "pods",
        partial(core.list_namespaced_pod, namespace),
        lambda e: seen.append((e.type, e.obj["metadata"]["name"])),
        label_selector="trainium.dev/job-name",
    )
    reflector._relist()  # the first LIST, without the watch thread
    core.delete_namespaced_pod("drop", namespace, grace_period_seconds=0)
    wait_for(
        lambda: [p.metadata.name for p in core.list_namespaced_pod(namespace).items],
        until=lambda names: "drop" not in names,
        timeout=30,
        description="pod drop gone",
    )
    seen.clear()
    reflector._relist()  # as after a 410 Gone
    assert ("DELETED", "drop") in seen
    assert ("MODIFIED", "keep") in seen
