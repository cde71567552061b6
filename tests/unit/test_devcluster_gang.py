"""Gang-scheduling decisions of the dev cluster's Volcano stand-in, as pure functions over dicts."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from trainium_operator.api import instance_types
from trainium_operator.devcluster import gang, objects

NOW = "2026-01-01T00:00:00Z"
TRN1 = instance_types.INSTANCE_TYPES["trn1.32xlarge"]


def ready_node(name: str, **kwargs: Any) -> dict[str, Any]:
    node = objects.fake_node(name, TRN1, **kwargs)
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return node


def pod(
    name: str,
    *,
    group: str | None = "pg",
    neuron: int = 16,
    efa: int = 8,
    node: str | None = None,
    phase: str = "Pending",
    namespace: str = "ns",
    **spec: Any,
) -> dict[str, Any]:
    annotations = {gang.GROUP_NAME_ANNOTATION: group} if group else {}
    limits = {instance_types.NEURON_RESOURCE: str(neuron), instance_types.EFA_RESOURCE: str(efa)}
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations, "uid": name},
        "spec": {
            "schedulerName": gang.SCHEDULER_NAME,
            "containers": [{"name": "main", "resources": {"limits": limits}}],
            **spec,
        },
        "status": {"phase": phase},
    }
    if node:
        body["spec"]["nodeName"] = node
    return body


def podgroup(
    name: str = "pg", *, min_member: int, queue: str = "default", **status: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": NOW},
        "spec": {"minMember": min_member, "queue": queue},
        "status": status,
    }


def open_queues() -> list[dict[str, Any]]:
    return [{"metadata": {"name": "default"}, "status": {"state": "Open"}}]


def plan(
    nodes: list[Any], pods: list[Any], podgroups: list[Any], **kwargs: Any
) -> gang.SchedulingPlan:
    return gang.plan_scheduling(
        nodes=nodes,
        pods=pods,
        podgroups=podgroups,
        queues=kwargs.pop("queues", open_queues()),
        bound_claims=kwargs.pop("bound_claims", set()),
        now=NOW,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("128", Fraction(128)),
        ("512Gi", Fraction(512 * 2**30)),
        ("250m", Fraction(1, 4)),
        ("1k", Fraction(1000)),
        ("1e3", Fraction(1000)),
        ("1.5", Fraction(3, 2)),
    ],
)
def test_parse_quantity_reads_kubernetes_notation(text: str, expected: Fraction) -> None:
    assert gang.parse_quantity(text) == expected


def test_parse_quantity_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        gang.parse_quantity("16 chips")


def test_pod_requests_take_limits_and_count_the_pod() -> None:
    requests = gang.pod_requests(pod("a"))
    assert requests[instance_types.NEURON_RESOURCE] == 16
    assert requests[instance_types.EFA_RESOURCE] == 8
    assert requests["pods"] == 1


def test_pod_requests_take_the_larger_of_init_containers_and_containers_plus_sidecars() -> None:
    body = pod("a", neuron=1, efa=0)
    body["spec"]["initContainers"] = [
        {"name": "compile", "resources": {"requests": {"cpu": "8"}}},
        {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
    ]
    body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}
    assert gang.pod_requests(body)["cpu"] == 8  # max(8, 2 + 1)


def test_gang_of_two_binds_both_to_different_nodes_and_third_group_waits() -> None:
    nodes = [ready_node("n-0"), ready_node("n-1")]
    pods = [pod("w-0"), pod("w-1"), pod("x-0", group="other")]
    groups = [podgroup(min_member=2), podgroup("other", min_member=1)]
    groups[1]["metadata"]["creationTimestamp"] = "2026-01-01T00:00:01Z"

    result = plan(nodes, pods, groups)

    assert result.bindings == {("ns", "w-0"): "n-0", ("ns", "w-1"): "n-1"}
    assert result.podgroup_status[("ns", "pg")]["phase"] == "Running"
    other = result.podgroup_status[("ns", "other")]
    assert other["phase"] == "Inqueue"
    (condition,) = [c for c in other["conditions"] if c["type"] == "Unschedulable"]
    assert condition["status"] == "True"
    assert condition["reason"] == "NotEnoughResources"
    assert condition["message"].startswith(
        "1/1 tasks in gang unschedulable: pod group is not ready"
    )
    assert "0/2 nodes are available: 2 Insufficient aws.amazon.com/neuron" in condition["message"]
    assert ("ns", "x-0") in result.unschedulable_pods
    assert any(e.reason == "FailedScheduling" and e.name == "x-0" for e in result.events)


def test_gang_binds_nothing_while_min_member_pods_do_not_all_fit() -> None:
    nodes = [ready_node("n-0"), ready_node("n-1")]
    pods = [pod(f"w-{i}") for i in range(3)]

    result = plan(nodes, pods, [podgroup(min_member=3)])

    assert result.bindings == {}
    status = result.podgroup_status[("ns", "pg")]
    assert status["phase"] == "Inqueue"
    message = next(c["message"] for c in status["conditions"] if c["type"] == "Unschedulable")
    assert "1/3 tasks in gang unschedulable" in message
    assert "2 Schedulable" in message
    assert set(result.unschedulable_pods) == {("ns", "w-0"), ("ns", "w-1"), ("ns", "w-2")}


def test_gang_waits_until_min_member_pods_exist() -> None:
    result = plan([ready_node("n-0"), ready_node("n-1")], [pod("w-0")], [podgroup(min_member=2)])

    assert result.bindings == {}
    message = result.podgroup_status[("ns", "pg")]["conditions"][0]["message"]
    assert "1 of minMember 2 pods exist" in message


def test_pods_beyond_a_satisfied_gang_bind_as_they_fit() -> None:
    nodes = [ready_node("n-0"), ready_node("n-1")]
    running = [pod("w-0", node="n-0", phase="Running"), pod("w-1", node="n-1", phase="Running")]
    extra = pod("w-2", neuron=0, efa=0)

    result = plan(nodes, [*running, extra], [podgroup(min_member=2, phase="Running")])

    assert result.bindings == {("ns", "w-2"): "n-0"}


def test_bound_pods_of_other_schedulers_consume_node_capacity() -> None:
    nodes = [ready_node("n-0")]
    other = pod("default-sched", group=None, node="n-0", phase="Running", schedulerName="default")

    result = plan(nodes, [other, pod("w-0")], [podgroup(min_member=1)])

    assert result.bindings == {}


def test_finished_pods_free_their_node() -> None:
    nodes = [ready_node("n-0")]
    done = pod("old", group=None, node="n-0", phase="Succeeded")

    result = plan(nodes, [done, pod("w-0")], [podgroup(min_member=1)])

    assert result.bindings == {("ns", "w-0"): "n-0"}


def test_untolerated_taint_keeps_pods_off_the_node() -> None:
    nodes = [ready_node("n-0", neuron_taint=True)]
    result = plan(nodes, [pod("w-0")], [podgroup(min_member=1)])

    assert result.bindings == {}
    assert (
        "untolerated taint {aws.amazon.com/neuron: present}"
        in result.unschedulable_pods[("ns", "w-0")]
    )


def test_toleration_admits_pods_to_the_tainted_node() -> None:
    nodes = [ready_node("n-0", neuron_taint=True)]
    tolerant = pod("w-0", tolerations=[{"key": "aws.amazon.com/neuron", "operator": "Exists"}])

    result = plan(nodes, [tolerant], [podgroup(min_member=1)])

    assert result.bindings == {("ns", "w-0"): "n-0"}


def test_node_selector_and_required_affinity_choose_the_node() -> None:
    nodes = [ready_node("n-0"), ready_node("n-1", extra_labels={"rack": "b"})]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["b"]}]}
                ]
            }
        }
    }
    selected = pod(
        "w-0",
        nodeSelector={instance_types.INSTANCE_TYPE_LABEL: "trn1.32xlarge"},
        affinity=affinity,
    )

    result = plan(nodes, [selected], [podgroup(min_member=1)])

    assert result.bindings == {("ns", "w-0"): "n-1"}


def test_node_selector_for_another_instance_type_matches_nothing() -> None:
    wrong = pod("w-0", nodeSelector={instance_types.INSTANCE_TYPE_LABEL: "trn1n.32xlarge"})
    result = plan([ready_node("n-0")], [wrong], [podgroup(min_member=1)])

    assert "didn't match Pod's node affinity/selector" in result.unschedulable_pods[("ns", "w-0")]


def test_not_ready_and_cordoned_nodes_get_no_pods() -> None:
    lost = ready_node("n-0")
    lost["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    cordoned = ready_node("n-1")
    cordoned["spec"]["unschedulable"] = True

    result = plan([lost, cordoned], [pod("w-0")], [podgroup(min_member=1)])

    assert result.bindings == {}
    message = result.unschedulable_pods[("ns", "w-0")]
    assert "1 node(s) were not ready" in message
    assert "1 node(s) were unschedulable" in message


def test_missing_queue_keeps_the_group_pending_with_a_reason() -> None:
    result = plan([ready_node("n-0")], [pod("w-0")], [podgroup(min_member=1, queue="nope")])

    assert result.bindings == {}
    status = result.podgroup_status[("ns", "pg")]
    assert status["phase"] == "Pending"
    assert status["conditions"][0]["reason"] == gang.QUEUE_NOT_OPEN
    assert "queue 'nope' is missing" in status["conditions"][0]["message"]


def test_closed_queue_admits_nothing() -> None:
    queues = [{"metadata": {"name": "default"}, "status": {"state": "Closed"}}]
    result = plan([ready_node("n-0")], [pod("w-0")], [podgroup(min_member=1)], queues=queues)

    assert result.bindings == {}


def test_unbound_claim_blocks_placement() -> None:
    with_claim = pod(
        "w-0", volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "fsx-claim"}}]
    )

    blocked = plan([ready_node("n-0")], [with_claim], [podgroup(min_member=1)])
    admitted = plan(
        [ready_node("n-0")],
        [with_claim],
        [podgroup(min_member=1)],
        bound_claims={("ns", "fsx-claim")},
    )

    assert (
        "unbound immediate PersistentVolumeClaims: fsx-claim"
        in blocked.unschedulable_pods[("ns", "w-0")]
    )
    assert admitted.bindings == {("ns", "w-0"): "n-0"}


@pytest.mark.parametrize(
    ("phases", "expected"),
    [
        (["Running", "Running"], "Running"),
        (["Succeeded", "Running"], "Running"),
        (["Succeeded", "Succeeded"], "Completed"),
        (["Succeeded", "Failed"], "Completed"),
    ],
)
def test_podgroup_phase_follows_volcano_job_status(phases: list[str], expected: str) -> None:
    pods = [pod(f"w-{i}", node=f"n-{i}", phase=p) for i, p in enumerate(phases)]
    result = plan(
        [ready_node("n-0"), ready_node("n-1")], pods, [podgroup(min_member=2, phase="Running")]
    )

    status = result.podgroup_status[("ns", "pg")]
    assert status["phase"] == expected
    assert status["running"] == phases.count("Running")
    assert status["succeeded"] == phases.count("Succeeded")
    assert status["failed"] == phases.count("Failed")


def test_running_group_that_cannot_place_its_gang_is_unknown() -> None:
    pods = [pod("w-0", node="n-0", phase="Running"), pod("w-1"), pod("w-2")]
    result = plan([ready_node("n-0")], pods, [podgroup(min_member=3, phase="Inqueue")])

    assert result.podgroup_status[("ns", "pg")]["phase"] == "Unknown"


def test_min_resources_larger_than_the_cluster_stay_pending() -> None:
    group = podgroup(min_member=1)
    group["spec"]["minResources"] = {instance_types.NEURON_RESOURCE: "64"}

    result = plan([ready_node("n-0")], [pod("w-0")], [group])

    assert result.bindings == {}
    assert result.podgroup_status[("ns", "pg")]["phase"] == "Pending"
    assert any(e.reason == gang.UNINQUEUEABLE_EVENT for e in result.events)


def test_unchanged_status_is_not_rewritten() -> None:
    nodes = [ready_node("n-0")]
    pods = [pod("w-0", node="n-0", phase="Running")]
    first = plan(nodes, pods, [podgroup(min_member=1, phase="Inqueue")])
    settled = podgroup(min_member=1, **first.podgroup_status[("ns", "pg")])

    second = plan(nodes, pods, [settled])

    assert ("ns", "pg") not in second.podgroup_status


def test_scheduled_group_clears_its_earlier_unschedulable_condition() -> None:
    earlier = [
        {"type": "Unschedulable", "status": "True", "reason": "NotEnoughResources", "message": "x"}
    ]
    result = plan(
        [ready_node("n-0")],
        [pod("w-0")],
        [podgroup(min_member=1, phase="Inqueue", conditions=earlier)],
    )

    conditions = {c["type"]: c for c in result.podgroup_status[("ns", "pg")]["conditions"]}
    assert conditions["Unschedulable"]["status"] == "False"
    assert conditions["Scheduled"]["status"] == "True"


def test_queue_status_counts_groups_and_allocations() -> None:
    nodes = [ready_node("n-0"), ready_node("n-1")]
    result = plan(nodes, [pod("w-0"), pod("w-1")], [podgroup(min_member=2)])

    status = result.queue_status["default"]
    assert status["state"] == "Open"
    assert status["running"] == 1
    assert status["allocated"][instance_types.NEURON_RESOURCE] == "32"


def test_implicit_podgroup_follows_the_controller_owner() -> None:
    owned = pod("w-0", group=None)
    owned["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "rs",
            "uid": "u-1",
            "controller": True,
        }
    ]
    owned["metadata"]["annotations"] = {gang.QUEUE_NAME_ANNOTATION: "test"}

    group = gang.implicit_podgroup(owned)

    assert group["metadata"]["name"] == "podgroup-u-1"
    assert group["spec"] == {"minMember": 1, "queue": "test", "priorityClassName": ""}
    assert group["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"


def test_pods_behind_scheduling_gates_are_not_placed() -> None:
    gated = pod("w-0", schedulingGates=[{"name": "example.com/wait"}])

    result = plan([ready_node("n-0")], [gated], [podgroup(min_member=1)])

    assert result.bindings == {}
