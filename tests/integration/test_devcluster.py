"""To the operator, the dev cluster behaves like EKS with trn1.32xlarge nodes and Volcano.

Everything here runs against real kube-apiserver, kube-controller-manager, kube-scheduler and etcd;
KWOK plays the kubelets; the real Volcano scheduler and controller manager (v1.14.1) gang-schedule.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
import uuid
from typing import Any

import pytest
from kubernetes import watch

from trainium_devcluster import cluster, objects, paths, sim, testing, volcano
from trainium_devcluster.testing import DevCluster
from trainium_operator.api import instance_types
from trainium_operator.builders.job import VOLCANO_GROUP_ANNOTATION

pytestmark = pytest.mark.integration

GROUP, VERSION = "scheduling.volcano.sh", "v1beta1"


def create_podgroup(
    cluster: DevCluster, namespace: str, name: str, *, min_member: int, queue: str = "test"
) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": min_member, "queue": queue},
    }
    cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "podgroups", body)


def read_podgroup(cluster: DevCluster, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "podgroups", name
    )
    return result


def trainium_pod(name: str, *, group: str | None, **spec: Any) -> dict[str, Any]:
    """A pod shaped like one training worker: a whole trn1.32xlarge's Neuron devices and EFA."""
    limits = {instance_types.NEURON_RESOURCE: "16", instance_types.EFA_RESOURCE: "8"}
    metadata: dict[str, Any] = {"name": name}
    if group:
        metadata["annotations"] = {VOLCANO_GROUP_ANNOTATION: group}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "schedulerName": volcano.SCHEDULER_NAME,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "worker",
                    "image": "public.ecr.aws/neuron/pytorch-training-neuronx:2.8.0",
                    "resources": {"limits": limits, "requests": {"cpu": "8", "memory": "64Gi"}},
                }
            ],
            **spec,
        },
    }


def read_pod(cluster: DevCluster, namespace: str, name: str) -> Any:
    return cluster.core.read_namespaced_pod(name, namespace)


def wait_running(cluster: DevCluster, namespace: str, name: str, timeout: float = 30) -> Any:
    return sim.wait_for(
        lambda: read_pod(cluster, namespace, name),
        until=lambda pod: (
            pod.status.phase == "Running"
            and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
        ),
        timeout=timeout,
        description=f"pod {namespace}/{name} Running and Ready",
    )


class NotReadyWatch:
    """Watches one pod from before a fault, in a thread: `seen` is set once any update shows
    its Ready condition False. Started before the fault, it cannot miss a False that KWOK
    turns back to True before the test looks (a poll, or a watch opened later, can)."""

    def __init__(self, cluster: DevCluster, namespace: str, name: str, timeout: int) -> None:
        self.seen = threading.Event()
        self._watch = watch.Watch()
        self._stream = self._watch.stream(
            cluster.core.list_namespaced_pod,
            namespace,
            field_selector=f"metadata.name={name}",
            timeout_seconds=timeout,
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for event in self._stream:
            conditions = event["object"].status.conditions or []
            if any(c.type == "Ready" and c.status == "False" for c in conditions):
                self.seen.set()
                return

    def stop(self) -> None:
        self._watch.stop()


def condition(podgroup: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for entry in (podgroup.get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return dict(entry)
    return None


def pod_events(cluster: DevCluster, namespace: str, name: str) -> list[Any]:
    events = cluster.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    ).items
    return list(events)


def test_gang_of_two_binds_together_and_ends_as_the_test_asks(
    dev_cluster: DevCluster, namespace: str
) -> None:
    create_podgroup(dev_cluster, namespace, "train", min_member=2)
    for name in ("worker-0", "worker-1"):
        dev_cluster.core.create_namespaced_pod(namespace, trainium_pod(name, group="train"))

    workers = [wait_running(dev_cluster, namespace, f"worker-{i}") for i in range(2)]
    assert len({w.spec.node_name for w in workers}) == 2
    assert all(w.status.pod_ip for w in workers)

    create_podgroup(dev_cluster, namespace, "extra", min_member=1)
    dev_cluster.core.create_namespaced_pod(namespace, trainium_pod("worker-2", group="extra"))
    extra = sim.wait_for(
        lambda: read_podgroup(dev_cluster, namespace, "extra"),
        until=lambda pg: (condition(pg, "Unschedulable") or {}).get("status") == "True",
        timeout=20,
        description="PodGroup extra Unschedulable",
    )
    unschedulable = condition(extra, "Unschedulable")
    assert unschedulable is not None
    assert unschedulable["reason"] == "NotEnoughResources"
    # Volcano's own gang message (scheduler v1.14.1), not one of ours.
    # The first count is Volcano's view of the group's tasks at that moment: 1/0 when the
    # pod's task is not yet counted, 1/1 after; the sentence is what this test is about.
    assert re.match(
        r"1/[01] tasks in gang unschedulable: pod group is not", unschedulable["message"]
    )
    assert read_pod(dev_cluster, namespace, "worker-2").spec.node_name is None
    assert read_pod(dev_cluster, namespace, "worker-2").status.phase == "Pending"
    failed_scheduling = sim.wait_for(
        lambda: [
            e
            for e in pod_events(dev_cluster, namespace, "worker-2")
            if e.reason == "FailedScheduling"
        ],
        timeout=10,
        description="FailedScheduling event on worker-2",
    )
    assert "pod group is not ready, 1 Pending, 1 minAvailable" in failed_scheduling[0].message
    scheduled = next(c for c in read_pod(dev_cluster, namespace, "worker-2").status.conditions)
    assert (scheduled.type, scheduled.status, scheduled.reason) == (
        "PodScheduled",
        "False",
        "Unschedulable",
    )
    assert read_podgroup(dev_cluster, namespace, "train")["status"]["phase"] == "Running"

    sim.simulate_pod_outcome(dev_cluster.core, namespace, "worker-0", succeeded=True, after="1s")
    sim.simulate_pod_outcome(
        dev_cluster.core,
        namespace,
        "worker-1",
        succeeded=False,
        exit_code=137,
        reason="OOMKilled",
        message="the simulated worker ran out of memory",
    )

    succeeded = sim.wait_for(
        lambda: read_pod(dev_cluster, namespace, "worker-0"),
        until=lambda pod: pod.status.phase == "Succeeded",
        timeout=20,
        description="worker-0 Succeeded",
    )
    failed = sim.wait_for(
        lambda: read_pod(dev_cluster, namespace, "worker-1"),
        until=lambda pod: pod.status.phase == "Failed",
        timeout=20,
        description="worker-1 Failed",
    )
    assert succeeded.status.container_statuses[0].state.terminated.exit_code == 0
    terminated = failed.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (137, "OOMKilled")
    assert terminated.message == "the simulated worker ran out of memory"
    finished = sim.wait_for(
        lambda: read_podgroup(dev_cluster, namespace, "train")["status"],
        until=lambda status: (status.get("succeeded"), status.get("failed")) == (1, 1),
        timeout=20,
        description="PodGroup train counts 1 succeeded and 1 failed",
    )
    # Volcano (v1.14) calls a gang Completed once every pod it placed finished, failed or
    # succeeded: the phase says nothing of the job's outcome, which the operator takes from the
    # pods.
    assert finished["phase"] == "Completed"
    # The finished gang returned its Neuron devices, so the waiting pod gets a node.
    wait_running(dev_cluster, namespace, "worker-2")


def test_gang_binds_nothing_until_min_member_pods_fit(
    dev_cluster: DevCluster, namespace: str
) -> None:
    create_podgroup(dev_cluster, namespace, "big", min_member=3)
    for index in range(3):
        dev_cluster.core.create_namespaced_pod(namespace, trainium_pod(f"w-{index}", group="big"))

    # A scheduling session may run between the PodGroup's and the pods' creation ("3/0 tasks"):
    # the verdict that counts is the one on all three pods.
    sim.wait_for(
        lambda: read_podgroup(dev_cluster, namespace, "big"),
        until=lambda pg: (
            (condition(pg, "Unschedulable") or {}).get("status") == "True"
            and "1/3 tasks in gang unschedulable"
            in (condition(pg, "Unschedulable") or {})["message"]
        ),
        timeout=20,
        description="PodGroup big Unschedulable: 1/3 tasks in gang unschedulable",
    )
    time.sleep(2)  # several scheduling sessions
    pods = dev_cluster.core.list_namespaced_pod(namespace).items
    assert [p.spec.node_name for p in pods] == [None, None, None]

    dev_cluster.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "podgroups", "big", {"spec": {"minMember": 2}}
    )

    sim.wait_for(
        lambda: [p.spec.node_name for p in dev_cluster.core.list_namespaced_pod(namespace).items],
        until=lambda nodes: sum(node is not None for node in nodes) == 2,
        timeout=20,
        description="two of three pods bound once minMember is 2",
    )


def test_pod_group_in_a_missing_queue_is_never_scheduled_and_gets_no_status(
    dev_cluster: DevCluster, namespace: str
) -> None:
    # Without Volcano's admission webhook nothing refuses such a PodGroup: the scheduler skips
    # it and writes nothing, which is why the operator checks the queue itself.
    create_podgroup(dev_cluster, namespace, "lost", min_member=1, queue="no-such-queue")
    dev_cluster.core.create_namespaced_pod(namespace, trainium_pod("w-0", group="lost"))

    time.sleep(4)  # several scheduling sessions

    assert read_pod(dev_cluster, namespace, "w-0").spec.node_name is None
    assert (read_podgroup(dev_cluster, namespace, "lost").get("status") or {}).get("phase") in (
        None,
        "Pending",
    )


def test_volcano_pod_without_a_group_gets_its_own(dev_cluster: DevCluster, namespace: str) -> None:
    dev_cluster.core.create_namespaced_pod(namespace, trainium_pod("solo", group=None))

    pod = wait_running(dev_cluster, namespace, "solo")

    group = pod.metadata.annotations[VOLCANO_GROUP_ANNOTATION]
    assert group == f"podgroup-{pod.metadata.uid}"
    assert read_podgroup(dev_cluster, namespace, group)["spec"]["minMember"] == 1


def test_fsx_claim_is_bound_by_the_controller_manager(dev_cluster: DevCluster) -> None:
    claim = dev_cluster.core.read_namespaced_persistent_volume_claim(
        objects.FSX_CLAIM_NAME, objects.FSX_CLAIM_NAMESPACE
    )
    volume = dev_cluster.core.read_persistent_volume(objects.FSX_PV_NAME)

    assert claim.status.phase == "Bound"
    assert claim.status.access_modes == ["ReadWriteMany"]
    assert volume.status.phase == "Bound"
    assert volume.spec.claim_ref.name == objects.FSX_CLAIM_NAME
    assert volume.spec.csi.driver == "fsx.csi.aws.com"


def test_deleting_an_owner_garbage_collects_its_pods(
    dev_cluster: DevCluster, namespace: str
) -> None:
    owner = dev_cluster.core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "owner"}, "data": {"purpose": "own pods"}}
    )
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner.metadata.uid,
        "blockOwnerDeletion": True,
    }
    for index in range(2):
        child = {
            "metadata": {"name": f"child-{index}", "ownerReferences": [reference]},
            # The default scheduler places these: kube-scheduler runs beside Volcano's.
            "spec": {
                "containers": [
                    {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
                ]
            },
        }
        dev_cluster.core.create_namespaced_pod(namespace, child)
    for index in range(2):
        wait_running(dev_cluster, namespace, f"child-{index}")

    dev_cluster.core.delete_namespaced_config_map(
        "owner", namespace, propagation_policy="Background"
    )

    sim.wait_for(
        lambda: dev_cluster.core.list_namespaced_pod(namespace).items,
        until=lambda pods: pods == [],
        timeout=60,
        description="child pods garbage-collected",
    )


def test_node_loss_makes_the_node_not_ready_and_restore_heals_it(
    dev_cluster: DevCluster, namespace: str
) -> None:
    # A node of its own (tainted so nothing else lands there) keeps the shared nodes healthy.
    name = f"loss-{uuid.uuid4().hex[:6]}"
    node = objects.fake_node(name, instance_types.INSTANCE_TYPES["trn1.32xlarge"])
    node["spec"]["taints"] = [{"key": "sim.trainium.dev/test-only", "effect": "NoSchedule"}]
    dev_cluster.core.create_node(node)
    try:
        sim.wait_for(
            lambda: sim.node_is_ready(
                dev_cluster.clients.api_client.sanitize_for_serialization(
                    dev_cluster.core.read_node(name)
                )
            ),
            timeout=30,
            description=f"node {name} Ready",
        )
        pinned = {
            "metadata": {"name": "on-lost-node"},
            "spec": {
                "nodeName": name,
                "tolerations": [{"key": "sim.trainium.dev/test-only", "operator": "Exists"}],
                "containers": [{"name": "c", "image": "busybox"}],
            },
        }
        dev_cluster.core.create_namespaced_pod(namespace, pinned)
        wait_running(dev_cluster, namespace, "on-lost-node")
        # The node lifecycle controller marks pods on its next monitor pass (a loaded 2-core CI
        # machine has been seen to take over 20 s), and KWOK may set the pod Ready again right
        # after, even before the taint below is visible: the watch runs from before the fault.
        pod_not_ready = NotReadyWatch(dev_cluster, namespace, "on-lost-node", timeout=240)

        def addresses(node: str) -> list[tuple[str, str]]:
            found = dev_cluster.core.read_node(node).status.addresses or []
            return sorted((a.type, a.address) for a in found)

        before = addresses(name)
        started = time.monotonic()
        sim.simulate_node_loss(dev_cluster.core, name)

        def ready_status() -> str:
            lost = dev_cluster.core.read_node(name)
            return next(c.status for c in lost.status.conditions if c.type == "Ready")

        assert (
            sim.wait_for(
                ready_status, until=lambda s: s != "True", timeout=90, description="node NotReady"
            )
            == "Unknown"
        )
        print(f"node {name} NotReady {time.monotonic() - started:.1f}s after the heartbeat stopped")
        sim.wait_for(
            lambda: dev_cluster.core.read_node(name).spec.taints or [],
            until=lambda taints: any(
                (t.key, t.effect) == ("node.kubernetes.io/unreachable", "NoExecute") for t in taints
            ),
            timeout=60,
            description="unreachable:NoExecute taint on the lost node",
        )
        assert pod_not_ready.seen.wait(90), "pod on the lost node never marked not ready"
        pod_not_ready.stop()

        sim.restore_node(dev_cluster.core, name)

        sim.wait_for(
            ready_status, until=lambda s: s == "True", timeout=60, description="node Ready again"
        )
        # KWOK marks the pod Ready again on its next pass over the healed node.
        wait_running(dev_cluster, namespace, "on-lost-node", timeout=60)
        # The healed node keeps its addresses: without one, the API server cannot reach it for
        # `kubectl logs` (KWOK's node-initialize template used to drop them).
        assert before, "a KWOK node starts with an address"
        assert addresses(name) == before
    finally:
        dev_cluster.core.delete_node(name)


# The chaos suite's fault: it runs with the chaos suite, after every other test (the control
# plane's clients and KWOK's controller back off after an API server crash, for up to a minute).
@pytest.mark.chaos
def test_a_crashed_api_server_comes_back_and_the_control_plane_works_again(
    dev_cluster: DevCluster,
) -> None:
    """The chaos suite's API server fault: SIGKILL, a gap, the same command line again."""
    old_pid = int(
        (paths.ClusterPaths(dev_cluster.name).kwok_dir / "pids/kube-apiserver.pid").read_text()
    )
    new_pid = cluster.restart_apiserver(dev_cluster.name, downtime=1.0)
    assert new_pid != old_pid
    assert cluster.apiserver_running(paths.ClusterPaths(dev_cluster.name))
    # The controller manager still works: a new namespace gets its default ServiceAccount.
    # Its informers relist with client-go's backoff, which grows to 30 s (plus jitter) when
    # the API server has gone away several times in the last two minutes.
    with testing.fresh_namespace(dev_cluster, ready_timeout=120) as name:
        assert dev_cluster.core.read_namespaced_service_account("default", name)


def test_kubectl_and_helm_talk_to_the_cluster(dev_cluster: DevCluster) -> None:
    env = dev_cluster.tool_env()
    nodes = subprocess.run(
        [
            "kubectl",
            "get",
            "nodes",
            "-l",
            "node.kubernetes.io/instance-type=trn1.32xlarge",
            "-o",
            "name",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    helm = subprocess.run(
        ["helm", "list", "--namespace", "default", "--output", "json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    server = subprocess.run(
        ["kubectl", "version", "-o", "json"], env=env, capture_output=True, text=True, check=True
    )

    assert "node/trn1-32xlarge-0" in nodes
    assert helm.stdout.strip() == "[]"
    assert '"gitVersion": "v1.36.5"' in server.stdout


def test_a_pod_delete_naming_a_uid_leaves_a_pod_that_has_another(
    dev_cluster: DevCluster, namespace: str
) -> None:
    """The operator deletes a deleted job's pods by name and uid: the API server refuses the
    delete (409) when the name now belongs to another pod, and the operator lets that be."""
    from trainium_operator.k8s.client import Cluster

    pod = {
        "metadata": {"name": "named"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], "schedulerName": "nobody"},
    }
    created = dev_cluster.core.create_namespaced_pod(namespace, pod)
    operator_client = Cluster(dev_cluster.clients.api_client)
    operator_client.delete_pod(namespace, "named", force=True, uid="another-pods-uid")
    assert read_pod(dev_cluster, namespace, "named").metadata.deletion_timestamp is None
    operator_client.delete_pod(namespace, "named", force=True, uid=created.metadata.uid)
    sim.wait_for(
        lambda: dev_cluster.core.list_namespaced_pod(namespace).items,
        until=lambda pods: pods == [],
        timeout=30,
        description="the pod with that uid deleted",
    )
