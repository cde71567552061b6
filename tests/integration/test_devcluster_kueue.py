"""The dev cluster's real Kueue (v0.19.2) admits plain pod groups against the ClusterQueue
`trainium`, whose quota `dev up` set to the nodes' capacity.

Pods reach Kueue through its webhooks, served on 127.0.0.1 with the dev cluster's CA; the default
scheduler places them once Kueue lifts its scheduling gate; KWOK plays the kubelet, including the
kill of a deleted pod that Kueue's finalizer holds.
"""

from __future__ import annotations

from typing import Any

import pytest

from trainium_devcluster import kueue, sim, testing
from trainium_devcluster.testing import DevCluster
from trainium_operator.api import instance_types
from trainium_operator.api import kueue as kueue_api

pytestmark = pytest.mark.integration

FLAVOR = kueue.flavor_name(testing.INSTANCE_TYPE)
NEURON_PER_NODE = 16  # trn1.32xlarge


def group_pod(name: str, group: str, total: int, neuron: int) -> dict[str, Any]:
    """One pod of a plain Kueue pod group, asking for `neuron` devices (the default scheduler)."""
    amounts = {instance_types.NEURON_RESOURCE: str(neuron)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                kueue.QUEUE_NAME_LABEL: kueue.LOCAL_QUEUE,
                kueue_api.POD_GROUP_NAME_LABEL: group,
            },
            "annotations": {kueue_api.POD_GROUP_TOTAL_COUNT_ANNOTATION: str(total)},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "worker",
                    "image": "public.ecr.aws/neuron/pytorch-training-neuronx:2.8.0",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi", **amounts},
                        "limits": amounts,
                    },
                }
            ],
        },
    }


def create_group(
    dev_cluster: DevCluster, namespace: str, group: str, count: int, neuron: int
) -> list[Any]:
    """Creates the group's pods; returns them as the API server answered the create (after
    Kueue's mutating webhook)."""
    return [
        dev_cluster.core.create_namespaced_pod(
            namespace, group_pod(f"{group}-{index}", group, count, neuron)
        )
        for index in range(count)
    ]


def neuron_quota(dev_cluster: DevCluster) -> int:
    queue = dev_cluster.custom.get_cluster_custom_object(
        kueue.GROUP, kueue.VERSION, "clusterqueues", kueue.CLUSTER_QUEUE
    )
    (flavor,) = [
        f
        for group in queue["spec"]["resourceGroups"]
        for f in group["flavors"]
        if f["name"] == FLAVOR
    ]
    (quota,) = [
        r["nominalQuota"]
        for r in flavor["resources"]
        if r["name"] == instance_types.NEURON_RESOURCE
    ]
    return int(quota)


def gated(pod: Any) -> bool:
    return kueue_api.ADMISSION_GATE in [gate.name for gate in pod.spec.scheduling_gates or []]


def group_pods(dev_cluster: DevCluster, namespace: str, group: str) -> list[Any]:
    selector = f"{kueue_api.POD_GROUP_NAME_LABEL}={group}"
    return list(dev_cluster.core.list_namespaced_pod(namespace, label_selector=selector).items)


def wait_group_running(
    dev_cluster: DevCluster, namespace: str, group: str, count: int
) -> list[Any]:
    return sim.wait_for(
        lambda: group_pods(dev_cluster, namespace, group),
        until=lambda pods: (
            len(pods) == count and all(p.status.phase == "Running" and not gated(p) for p in pods)
        ),
        timeout=30,
        description=f"group {group}: {count} pods ungated and Running",
    )


def test_a_pod_group_is_admitted_whole_and_one_beyond_the_quota_waits_gated(
    dev_cluster: DevCluster, namespace: str
) -> None:
    kueue.ensure_local_queue(dev_cluster.clients, namespace)
    quota = neuron_quota(dev_cluster)
    # Sizes that hold on any cluster: the first group takes three quarters of the quota (at most
    # a node per pod), the second asks for more than is left.
    size = min(NEURON_PER_NODE, quota // 4)
    left = quota - 3 * size
    second = left // size + 1

    created = create_group(dev_cluster, namespace, "g", 3, size)
    assert all(gated(pod) for pod in created), "Kueue's webhook gates every pod at create"
    assert all(kueue.MANAGED_FINALIZER in pod.metadata.finalizers for pod in created)

    admitted = sim.wait_for(
        lambda: kueue.read_workload(dev_cluster.custom, namespace, "g"),
        until=lambda found: kueue.condition(found, "Admitted").get("status") == "True",
        timeout=30,
        description="Workload g admitted",
    )
    assignment = admitted["status"]["admission"]["podSetAssignments"][0]
    assert assignment["count"] == 3
    assert assignment["flavors"][instance_types.NEURON_RESOURCE] == FLAVOR
    running = wait_group_running(dev_cluster, namespace, "g", 3)
    nodes = {node.metadata.name for node in dev_cluster.core.list_node().items}
    assert {pod.spec.node_name for pod in running} <= nodes
    # Kueue steers the pods to its flavor's nodes.
    assert all(
        pod.spec.node_selector[instance_types.INSTANCE_TYPE_LABEL] == testing.INSTANCE_TYPE
        for pod in running
    )

    create_group(dev_cluster, namespace, "h", second, size)
    waiting = sim.wait_for(
        lambda: kueue.read_workload(dev_cluster.custom, namespace, "h"),
        until=lambda found: kueue.condition(found, "QuotaReserved").get("status") == "False",
        timeout=30,
        description="Workload h refused a quota reservation",
    )
    assert (
        "insufficient unused quota for aws.amazon.com/neuron"
        in kueue.condition(waiting, "QuotaReserved")["message"]
    )
    assert all(gated(pod) for pod in group_pods(dev_cluster, namespace, "h"))

    # g ends: Kueue lets go of its pods (finalizers removed), they can be deleted, and its quota
    # goes to h.
    for pod in running:
        sim.simulate_pod_outcome(dev_cluster.core, namespace, pod.metadata.name, succeeded=True)
    sim.wait_for(
        lambda: group_pods(dev_cluster, namespace, "g"),
        until=lambda pods: all(
            p.status.phase == "Succeeded" and not p.metadata.finalizers for p in pods
        ),
        timeout=30,
        description="g's pods Succeeded, Kueue's finalizers removed",
    )
    for pod in running:
        dev_cluster.core.delete_namespaced_pod(pod.metadata.name, namespace)
    sim.wait_for(
        lambda: group_pods(dev_cluster, namespace, "g"),
        until=lambda pods: not pods,
        timeout=30,
        description="g's pods deleted",
    )
    wait_group_running(dev_cluster, namespace, "h", second)


def test_a_running_kueue_pod_deleted_is_killed_and_let_go(
    dev_cluster: DevCluster, namespace: str
) -> None:
    """KWOK plays the kubelet for a pod Kueue's finalizer holds: its containers end (137), the
    pod Failed, and Kueue, seeing its (one-pod) Workload ended, removes the finalizer, so the
    delete completes. (A Failed pod of a pod group keeps the finalizer until a replacement
    arrives or the group is ended with `kueue.x-k8s.io/retriable-in-group: "false"`.)"""
    kueue.ensure_local_queue(dev_cluster.clients, namespace)
    body = group_pod("lone", "none", 1, 1)
    del body["metadata"]["labels"][kueue_api.POD_GROUP_NAME_LABEL]
    del body["metadata"]["annotations"]
    dev_cluster.core.create_namespaced_pod(namespace, body)
    sim.wait_for(
        lambda: dev_cluster.core.read_namespaced_pod("lone", namespace),
        until=lambda pod: pod.status.phase == "Running" and not gated(pod),
        timeout=30,
        description="the lone Kueue pod Running",
    )
    dev_cluster.core.delete_namespaced_pod("lone", namespace)

    def remaining() -> list[str]:
        return [p.metadata.name for p in dev_cluster.core.list_namespaced_pod(namespace).items]

    sim.wait_for(remaining, until=lambda names: not names, timeout=30, description="pod gone")
    reasons = [
        event.reason
        for event in dev_cluster.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=lone"
        ).items
    ]
    assert "Killing" in reasons, "KWOK's pod-kill-held stage ended the pod's containers"


def test_pods_without_a_queue_label_never_reach_kueue(
    dev_cluster: DevCluster, namespace: str
) -> None:
    body = group_pod("plain", "none", 1, 1)
    del body["metadata"]["labels"][kueue.QUEUE_NAME_LABEL]
    pod = dev_cluster.core.create_namespaced_pod(namespace, body)
    assert not gated(pod)
    assert not pod.metadata.finalizers
    sim.wait_for(
        lambda: dev_cluster.core.read_namespaced_pod("plain", namespace),
        until=lambda found: found.status.phase == "Running",
        timeout=30,
        description="the unlabelled pod Running without Kueue",
    )


def test_the_cluster_queue_quota_follows_nodes_added_and_removed(dev_cluster: DevCluster) -> None:
    before = neuron_quota(dev_cluster)
    with testing.extra_nodes(dev_cluster, 1):
        assert neuron_quota(dev_cluster) == before + NEURON_PER_NODE
    assert neuron_quota(dev_cluster) == before
