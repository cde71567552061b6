"""Devices through DRA on the dev cluster: the real Kueue counts a gang's claimed devices in its
quota (deviceClassMappings), the real kube-scheduler allocates each pod's claim from a node's
ResourceSlices, and a claim no node's connected group can satisfy leaves the gang unplaced with
the scheduler's words in the job's status. The nodes are KWOK's, their slices the shape the
Neuron DRA driver and DRANET publish (trainium_devcluster/objects.py): allocation is real,
nothing here touches a device (docs/neuron-stacks.md, "Devices through DRA")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.operator_harness import (
    OperatorProcess,
    create_job,
    events_with_reason,
    finish_job,
    get_job,
    job_manifest,
    job_pods,
    supervised,
    wait_for,
    wait_gang_running,
    wait_reason,
)
from trainium_devcluster import kueue as dev_kueue
from trainium_devcluster import testing
from trainium_operator.api import dra, kueue

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]

QUEUE = dev_kueue.LOCAL_QUEUE
TRN2 = "trn2.48xlarge"


@pytest.fixture(scope="module")
def dra_operator(dev_cluster: Any, crds: None, tmp_path_factory: Any) -> Iterator[OperatorProcess]:
    """One operator with Kueue and DRA on, watching the module's `td-*` namespaces."""
    proc = OperatorProcess(
        kubeconfig=Path(dev_cluster.kubeconfig),
        namespace="td-*",
        log_path=tmp_path_factory.mktemp("dra-operator") / "operator.log",
        extra_args=("--kueue", "--dra"),
    )
    with supervised(proc):
        yield proc


@pytest.fixture
def namespace(dev_cluster: Any, dra_operator: OperatorProcess) -> Iterator[str]:
    from integration.operator_harness import ensure_shared_claim

    with testing.fresh_namespace(dev_cluster, prefix="td-") as name:
        ensure_shared_claim(dev_cluster.clients, name)
        dev_kueue.ensure_local_queue(dev_cluster.clients, name, QUEUE)
        yield name
    assert "Traceback" not in dra_operator.log(), dra_operator.log()[-4000:]


def dra_manifest(name: str, **spec: Any) -> dict[str, Any]:
    manifest = job_manifest(
        name,
        **{"compile": {"enabled": False}, "instanceType": TRN2, "deviceAllocation": "dra", **spec},
    )
    manifest["spec"].pop("scheduling", None)
    manifest["metadata"]["labels"] = {kueue.QUEUE_NAME_LABEL: QUEUE}
    return manifest


def pod_claim(clients: Any, namespace: str, pod: Any) -> Any:
    statuses = pod.status.resource_claim_statuses or []
    (status,) = [s for s in statuses if s.name == dra.POD_CLAIM_NAME]
    return clients.resource.read_namespaced_resource_claim(status.resource_claim_name, namespace)


def test_a_dra_gang_is_counted_by_kueue_and_its_claims_allocated_by_the_kube_scheduler(
    dev_cluster: Any, namespace: str
) -> None:
    clients = dev_cluster.clients
    with testing.extra_dra_nodes(dev_cluster, 2, instance_type=TRN2) as nodes:
        create_job(clients, namespace, dra_manifest("dra-gang", lnc=1))
        gang = wait_gang_running(clients, namespace, "dra-gang", "train", 0)

        assert sorted(p.spec.node_name for p in gang) == sorted(nodes)
        for pod in gang:
            limits = pod.spec.containers[0].resources.limits or {}
            assert not {"aws.amazon.com/neuron", "vpc.amazonaws.com/efa"} & set(limits)
            claim = pod_claim(clients, namespace, pod)
            results = claim.status.allocation.devices.results
            neurons = [r for r in results if r.request == dra.NEURON_REQUEST]
            efas = [r for r in results if r.request == dra.EFA_REQUEST]
            # The whole instance, from the pod's own node: its 16 devices and 16 EFA interfaces.
            assert sorted(r.device for r in neurons) == sorted(
                f"neurondevice{i}" for i in range(16)
            )
            assert {(r.driver, r.pool) for r in neurons} == {
                (dra.NEURON_DRIVER, pod.spec.node_name)
            }
            assert len(efas) == 16
            assert {r.driver for r in efas} == {dra.EFA_DRIVER}
            config = claim.status.allocation.devices.config[0].opaque.parameters
            assert config["logicalNeuronCore"] == 1
            assert claim.metadata.owner_references[0].name == pod.metadata.name

        workload = dev_kueue.read_workload(clients.custom, namespace, "dra-gang-train-0")
        usage = workload["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]
        assert usage["aws.amazon.com/neuron"] == "32", "Kueue counted the gang's claimed devices"
        assert usage["vpc.amazonaws.com/efa"] == "32"

        template = clients.resource.read_namespaced_resource_claim_template(
            "dra-gang-devices", namespace
        )
        assert template.metadata.owner_references[0].kind == "TrainingJob"
        finish_job(clients, namespace, "dra-gang", gang)


def test_a_gang_beyond_the_published_devices_waits_in_kueue_for_quota(
    dev_cluster: Any, namespace: str
) -> None:
    clients = dev_cluster.clients
    with testing.extra_dra_nodes(dev_cluster, 2, instance_type=TRN2):
        create_job(clients, namespace, dra_manifest("dra-three", nodes=3))
        job = wait_for(
            lambda: get_job(clients, namespace, "dra-three"),
            until=lambda j: "insufficient quota" in (j.get("status") or {}).get("message", ""),
            timeout=60,
            description="the job waiting for quota in Kueue's words",
        )
        assert job["status"]["reason"] == "Queued"
        assert "aws.amazon.com/neuron" in job["status"]["message"]
        assert all(p.spec.node_name is None for p in job_pods(clients, namespace, "dra-three"))


def test_a_claim_no_nodes_connected_group_can_hold_is_unschedulable_and_the_status_says_why(
    dev_cluster: Any, namespace: str
) -> None:
    """Nodes whose 16 devices are published as two connected groups of 8: the quota (32) admits
    a one-node job, and no node has a devicegroup16 of 16, so the kube-scheduler refuses."""
    clients = dev_cluster.clients
    with testing.extra_dra_nodes(dev_cluster, 2, instance_type=TRN2, group_limit=8):
        create_job(clients, namespace, dra_manifest("dra-split", nodes=1))
        job = wait_reason(clients, namespace, "dra-split", "Unschedulable", timeout=90)
        message = job["status"]["message"]
        assert message.startswith("train stage: admitted by Kueue ClusterQueue trainium, but 1/1")
        assert "cannot allocate all claims" in message, message
        # The event follows the status write it reports.
        assert events_with_reason(clients, namespace, "dra-split", "Unschedulable")
