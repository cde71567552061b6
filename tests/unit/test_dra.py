"""Devices through DRA: the ResourceClaimTemplate's shape per instance type, the pods that name
it, the spec's refusals, and the pass that creates it (docs/neuron-stacks.md, "Devices through
DRA")."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from trainium_operator.api import dra, kueue
from trainium_operator.api.instance_types import INSTANCE_TYPES
from trainium_operator.builders import claims
from trainium_operator.builders import pods as pod_builders
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.lifecycle.observed import (
    LocalQueueView,
    Observed,
    PodView,
    WorkloadView,
)
from trainium_operator.lifecycle.parse import parse_job
from trainium_operator.lifecycle.render import render_stages
from trainium_operator.lifecycle.snapshot import PassSettings
from unit.jobs import decide, job_document

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
DRA_ON = PassSettings(kueue=True, dra=True)
TRN2 = "trn2.48xlarge"
PLUGIN_RESOURCES = {"aws.amazon.com/neuron", "aws.amazon.com/neuroncore", "vpc.amazonaws.com/efa"}


def dra_document(*, queued: bool = True, **spec: Any) -> dict[str, Any]:
    document = job_document(**{"compile": {"enabled": False}, "deviceAllocation": "dra", **spec})
    if queued:
        document["metadata"]["labels"] = {kueue.QUEUE_NAME_LABEL: "team-a-queue"}
    return document


def dra_job(**spec: Any) -> JobRef:
    parsed = parse_job(dra_document(**spec))
    assert isinstance(parsed, JobRef), parsed
    return parsed


def seen(*pods: PodView, workloads: tuple[WorkloadView, ...] = ()) -> Observed:
    return Observed(
        pods=pods,
        podgroups={},
        service_exists=True,
        nodes={},
        now=T0,
        network_policy_missing=False,
        workloads={w.name: w for w in workloads},
        local_queue=LocalQueueView("team-a-queue", exists=True, active=True),
    )


def pod_view(job: JobRef, rank: int, **kw: Any) -> PodView:
    fields: dict[str, Any] = {
        "ready": False,
        "node": None,
        "deleting": False,
        "exit_code": None,
        "reason": None,
        "message": None,
        "disrupted": False,
    }
    fields.update(kw)
    return PodView(job.pod_name(Stage.TRAIN, 0, rank), Stage.TRAIN, 0, rank, "Pending", **fields)


def devices(template: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = template["spec"]["spec"]["devices"]
    return spec


# -- the template ------------------------------------------------------------------------------


def test_a_trn2_pod_claims_its_16_devices_and_16_efas_as_one_connected_group_at_the_jobs_lnc() -> (
    None
):
    template = claims.device_claim_template(dra_job(instanceType="trn2.48xlarge", lnc=1))

    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert template["metadata"]["name"] == "bert-devices"
    neurons, efas = devices(template)["requests"]
    assert neurons["exactly"] == {
        "deviceClassName": "neuron.aws.com",
        "allocationMode": "ExactCount",
        "count": 16,
        "selectors": [
            {"cel": {"expression": "device.attributes['neuron.aws.com'].instanceType == "
                     "'trn2.48xlarge'"}}
        ],
    }  # fmt: skip
    assert efas["exactly"] == {
        "deviceClassName": "efa.networking.k8s.aws",
        "allocationMode": "ExactCount",
        "count": 16,
    }
    assert devices(template)["constraints"] == [
        {"requests": ["neurons", "efas"], "matchAttribute": "resource.aws.com/devicegroup16_id"}
    ]
    assert devices(template)["config"] == [
        {
            "requests": ["neurons"],
            "opaque": {
                "driver": "neuron.aws.com",
                "parameters": {
                    "apiVersion": "neuron.aws.com/v1",
                    "kind": "NeuronConfig",
                    "logicalNeuronCore": 1,
                },
            },
        }
    ]


def test_a_trn2_claim_carries_the_default_lnc_2_when_the_job_sets_none() -> None:
    template = claims.device_claim_template(dra_job(instanceType="trn2u.48xlarge"))
    assert devices(template)["config"][0]["opaque"]["parameters"]["logicalNeuronCore"] == 2


@pytest.mark.parametrize(
    ("instance_type", "efa", "group"),
    [("trn1.32xlarge", 8, 16), ("trn1n.32xlarge", 16, 16), ("trn2.48xlarge", 16, 16)],
)
def test_every_count_is_the_instance_types_own(instance_type: str, efa: int, group: int) -> None:
    shape = INSTANCE_TYPES[instance_type]
    template = claims.device_claim_template(dra_job(instanceType=instance_type))
    counts = {r["name"]: r["exactly"]["count"] for r in devices(template)["requests"]}
    assert counts == {"neurons": shape.neuron_devices, "efas": efa}
    assert devices(template)["constraints"][0]["matchAttribute"] == (
        f"resource.aws.com/devicegroup{group}_id"
    )


def test_trn1_claims_carry_no_lnc_config() -> None:
    assert "config" not in devices(claims.device_claim_template(dra_job()))


def test_a_trn1_2xlarge_claims_its_one_device_with_no_efa_and_no_group_attribute() -> None:
    # Its one device has no EFA interface, and the driver publishes devicegroup ids only on
    # EFA-enabled instances: a constraint on one would leave the device unallocatable.
    template = claims.device_claim_template(dra_job(instanceType="trn1.2xlarge", nodes=1))
    assert [r["name"] for r in devices(template)["requests"]] == ["neurons"]
    assert devices(template)["requests"][0]["exactly"]["count"] == 1
    assert "constraints" not in devices(template)


def test_the_connected_group_is_the_smallest_documented_size_that_holds_the_devices() -> None:
    assert [dra.connected_group_size(n) for n in (1, 2, 4, 5, 8, 16, 17)] == [
        1, 4, 4, 8, 8, 16, None,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="no connected group of 2"):
        dra.device_group_attribute(2)


# -- the pods ----------------------------------------------------------------------------------


def test_a_dra_pod_names_the_jobs_template_and_requests_no_device_plugin_resource() -> None:
    job = dra_job(instanceType="trn2.48xlarge", resources={"limits": {"memory": "1900Gi"}})
    built = pod_builders.pod(job, Stage.TRAIN, 0, 1)

    assert built["spec"]["resourceClaims"] == [
        {"name": "trainium-devices", "resourceClaimTemplateName": "bert-devices"}
    ]
    resources = built["spec"]["containers"][0]["resources"]
    assert resources == {"limits": {"memory": "1900Gi"}, "claims": [{"name": "trainium-devices"}]}


def test_a_device_plugin_pod_is_unchanged_and_names_no_claim() -> None:
    job = dra_job(deviceAllocation="devicePlugin")
    built = pod_builders.pod(job, Stage.TRAIN, 0, 0)
    assert "resourceClaims" not in built["spec"]
    assert built["spec"]["containers"][0]["resources"] == {
        "limits": {"aws.amazon.com/neuron": "16", "vpc.amazonaws.com/efa": "8"}
    }


def test_render_shows_the_template_before_the_pods_that_name_it() -> None:
    (_, objects), *_ = render_stages(dra_document(), T0)
    kinds = [o["kind"] for o in objects]
    assert kinds.index("ResourceClaimTemplate") < kinds.index("Pod")
    for pod in (o for o in objects if o["kind"] == "Pod"):
        assert not PLUGIN_RESOURCES & set(
            pod["spec"]["containers"][0]["resources"].get("limits", {})
        )


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["limits", "requests"])
@pytest.mark.parametrize("resource", sorted(PLUGIN_RESOURCES))
def test_device_plugin_resources_beside_dra_are_refused_naming_the_field_and_the_fix(
    field: str, resource: str
) -> None:
    problems = parse_job(dra_document(resources={field: {resource: "1"}}))
    assert isinstance(problems, list)
    assert any(
        p.startswith("spec.resources: with spec.deviceAllocation dra") and "remove them" in p
        for p in problems
    ), problems


def test_a_dra_job_under_volcano_is_refused_naming_the_label_to_add() -> None:
    problems = parse_job(dra_document(queued=False))
    assert problems == [
        "spec.deviceAllocation: dra needs a job Kueue queues (label kueue.x-k8s.io/queue-name: "
        "<LocalQueue>): Volcano's queues and PodGroup minResources do not count devices claimed "
        "through DRA; add the label or use devicePlugin"
    ]


def test_the_crd_declares_device_allocation_immutable() -> None:
    from trainium_operator.api.crd import spec_schema

    field = spec_schema()["properties"]["deviceAllocation"]
    assert field["enum"] == ["devicePlugin", "dra"]
    assert field["default"] == "devicePlugin"
    assert {"rule": "self == oldSelf", "message": "spec.deviceAllocation is immutable"} in field[
        "x-kubernetes-validations"
    ]


# -- the pass ----------------------------------------------------------------------------------


def test_the_pass_creates_the_template_with_the_gangs_pods_and_not_once_they_exist() -> None:
    job = dra_job()
    first = decide(job, {}, seen(), settings=DRA_ON)
    assert [o["kind"] for o in first.create] == ["ResourceClaimTemplate", "Pod", "Pod"]
    assert first.create[0]["metadata"]["ownerReferences"][0]["kind"] == "TrainingJob"

    gang = [pod_view(job, r, gated=True) for r in range(2)]
    again = decide(job, first.status, seen(*gang), settings=DRA_ON)
    assert not again.create


def test_an_operator_without_dra_creates_nothing_for_a_dra_job_and_says_which_value() -> None:
    decision = decide(dra_job(), {}, seen(), settings=PassSettings(kueue=True))
    assert not decision.create
    assert decision.status["reason"] == "DRANotEnabled"
    assert "chart value dra.enabled" in decision.status["message"]


def test_an_admitted_pod_the_scheduler_cannot_place_is_named_with_the_schedulers_words() -> None:
    job = dra_job()
    said = "0/4 nodes are available: 4 cannot allocate all claims."
    gang = [pod_view(job, r, unschedulable=said) for r in range(2)]
    workload = WorkloadView("bert-train-0", quota_reserved=True, admitted=True, cluster_queue="cq")
    status = {"phase": "Pending", "attempt": 0, "training": {"firstAttempt": 0}}
    decision = decide(job, status, seen(*gang, workloads=(workload,)), settings=DRA_ON)
    assert decision.status["reason"] == "Unschedulable"
    assert decision.status["message"] == (
        "train stage: admitted by Kueue ClusterQueue cq, but 2/2 pods cannot be placed; "
        f"bert-train-0-0: {said}"
    )


# -- the dev cluster's simulation --------------------------------------------------------------


def test_a_dra_dev_node_publishes_its_devices_in_slices_and_advertises_no_plugin_resource() -> None:
    from trainium_devcluster import objects

    shape = INSTANCE_TYPES[TRN2]
    node = objects.dra_fake_node("trn2-48xlarge-dra-0", shape)
    assert not PLUGIN_RESOURCES & set(node["status"]["allocatable"])
    assert node["metadata"]["labels"]["eks.amazonaws.com/nodegroup"] == "trn2-48xlarge-dra-ng"

    neuron, efa = objects.resource_slices("trn2-48xlarge-dra-0", shape)
    assert neuron["spec"]["driver"] == "neuron.aws.com"
    assert neuron["spec"]["pool"] == {
        "name": "trn2-48xlarge-dra-0",
        "generation": 1,
        "resourceSliceCount": 1,
    }
    assert [d["name"] for d in neuron["spec"]["devices"]] == [f"neurondevice{i}" for i in range(16)]
    first = neuron["spec"]["devices"][0]["attributes"]
    assert first["instanceType"] == {"string": TRN2}
    assert first["resourceType"] == {"string": "neuron_device"}
    group16 = {d["attributes"]["resource.aws.com/devicegroup16_id"]["string"]
               for d in neuron["spec"]["devices"] + efa["spec"]["devices"]}  # fmt: skip
    assert len(group16) == 1, "the devices and EFA interfaces of one instance share a group"
    assert efa["spec"]["driver"] == "dra.net"
    assert len(efa["spec"]["devices"]) == 16


def test_a_split_dev_node_publishes_no_connected_group_of_16() -> None:
    from trainium_devcluster import objects

    (neuron, _) = objects.resource_slices("n", INSTANCE_TYPES[TRN2], group_limit=8)
    group16 = {d["attributes"]["resource.aws.com/devicegroup16_id"]["string"]
               for d in neuron["spec"]["devices"]}  # fmt: skip
    assert len(group16) == 2


def test_kueues_quota_counts_the_devices_dra_nodes_publish_under_the_plugin_names() -> None:
    from trainium_devcluster import kueue as dev_kueue
    from trainium_devcluster import objects

    shape = INSTANCE_TYPES[TRN2]
    nodes = [objects.dra_fake_node(f"d{i}", shape) for i in range(2)]
    slices = [s for i in range(2) for s in objects.resource_slices(f"d{i}", shape)]
    quota = dev_kueue.node_quota(nodes, slices)[TRN2]
    assert quota["aws.amazon.com/neuron"] == "32"
    assert quota["vpc.amazonaws.com/efa"] == "32"
    config = dev_kueue.configuration(
        webhook_port=1, cert_dir=Path("/c"), health_port=2, metrics_port=3
    )
    assert config["resources"]["deviceClassMappings"] == [
        {"name": "aws.amazon.com/neuron", "deviceClassNames": ["neuron.aws.com"]},
        {"name": "vpc.amazonaws.com/efa", "deviceClassNames": ["efa.networking.k8s.aws"]},
    ]


def test_a_pod_behind_a_scheduling_gate_is_waiting_not_refused() -> None:
    from trainium_operator.lifecycle.observed import pod_view as observe_pod

    gated = {
        "metadata": {
            "name": "bert-train-0-0",
            "labels": {"trainium.dev/stage": "train", "trainium.dev/attempt": "0",
                       "trainium.dev/node-rank": "0"},
        },
        "status": {
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                 "message": "Scheduling is blocked due to non-empty scheduling gates"}
            ]
        },
    }  # fmt: skip
    view = observe_pod(gated)
    assert view is not None
    assert view.unschedulable is None
    gated["status"]["conditions"][0].update(reason="Unschedulable", message="no claim fits")
    refused = observe_pod(gated)
    assert refused is not None
    assert refused.unschedulable == "no claim fits"
