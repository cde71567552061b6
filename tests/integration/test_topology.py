"""Network placement on the real schedulers of the dev cluster, by the operator's own topology
objects: one operator with --topology volcano,kueue and --kueue writes HyperNodes and a Kueue
Topology + ResourceFlavor from the fake nodes' labels (trainium_devcluster/objects.py: 4 nodes per
layer-3 block), and places gangs through Volcano's network-topology-aware plugin and Kueue's TAS.

Needs the HyperNode API (Volcano v1.12 or newer, with the network-topology-aware plugin in its
scheduler configuration) and Kueue's TAS (beta, on by default since Kueue 0.14). The session
cluster has two trn1.32xlarge nodes (indices 0 and 1, block 0); each test adds six, so block 0
holds nodes 0-3 and block 1 nodes 4-7. Each pod takes a whole node.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.operator_harness import (
    OperatorProcess,
    create_job,
    ensure_shared_claim,
    finish_pods,
    job_manifest,
    job_pods,
    supervised,
    wait_for,
    wait_gang_running,
)
from trainium_devcluster import kueue as dev_kueue
from trainium_devcluster import testing
from trainium_operator.api import kueue, topology
from trainium_operator.builders.topology import kueue_name

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]

HYPERNODES = (topology.HYPERNODE_GROUP, topology.HYPERNODE_VERSION, topology.HYPERNODES)
KUEUE_API = (kueue.KUEUE_GROUP, kueue.KUEUE_VERSION)
INSTANCE_TYPE = testing.INSTANCE_TYPE
TAS_QUEUE = "trainium-tas"
BLOCK_LABEL = topology.LAYER_LABELS[3]


def hypernode_api_installed(clients: Any) -> bool:
    try:
        clients.apiextensions.read_custom_resource_definition(
            f"{topology.HYPERNODES}.{topology.HYPERNODE_GROUP}"
        )
    except Exception:
        return False
    return True


@pytest.fixture(scope="module")
def topology_operator(
    dev_cluster: Any, crds: None, tmp_path_factory: Any
) -> Iterator[OperatorProcess]:
    """One operator for the module, keeping topology for both schedulers, watching `tt-*`."""
    if not hypernode_api_installed(dev_cluster.clients):
        pytest.fail("the dev cluster's Volcano serves no HyperNode API (Volcano v1.12 or newer)")
    if not dev_kueue.api_installed(dev_cluster.clients):
        pytest.fail("the dev cluster runs no Kueue (trainium-operator dev up starts it)")
    proc = OperatorProcess(
        kubeconfig=Path(dev_cluster.kubeconfig),
        namespace="tt-*",
        log_path=tmp_path_factory.mktemp("topology-operator") / "operator.log",
        extra_args=("--kueue", "--topology", "volcano,kueue"),
    )
    with supervised(proc):
        yield proc


@pytest.fixture
def eight_nodes(dev_cluster: Any) -> Iterator[list[str]]:
    with testing.extra_nodes(dev_cluster, 6) as added:
        yield added


@pytest.fixture
def placement_namespace(
    dev_cluster: Any, topology_operator: OperatorProcess, eight_nodes: list[str]
) -> Iterator[str]:
    with testing.fresh_namespace(dev_cluster, prefix="tt-") as name:
        ensure_shared_claim(dev_cluster.clients, name)
        yield name
    assert "Traceback" not in topology_operator.log(), topology_operator.log()[-4000:]


def managed_hypernodes(clients: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = clients.custom.list_cluster_custom_object(
        *HYPERNODES, label_selector=topology.MANAGED_SELECTOR
    )["items"]
    return items


def node_members(clients: Any) -> set[str]:
    return {
        member["selector"]["exactMatch"]["name"]
        for hypernode in managed_hypernodes(clients)
        for member in hypernode["spec"]["members"]
        if member["type"] == "Node"
    }


def tiers_of(clients: Any) -> dict[str, int]:
    return {h["spec"]["tierName"]: h["spec"]["tier"] for h in managed_hypernodes(clients)}


def blocks_of(clients: Any, pods: list[Any]) -> set[str]:
    return {clients.core.read_node(p.spec.node_name).metadata.labels[BLOCK_LABEL] for p in pods}


def train_only(name: str, **spec: Any) -> dict[str, Any]:
    scheduling = {"queue": "default", **spec.pop("scheduling", {})}
    return job_manifest(name, compile={"enabled": False}, scheduling=scheduling, **spec)


def placed(level: str, mode: str = "Required") -> dict[str, Any]:
    return {"topology": {"level": level, "mode": mode}}


def test_the_topology_objects_follow_nodes_added_and_removed(
    dev_cluster: Any, topology_operator: OperatorProcess
) -> None:
    clients = dev_cluster.clients
    with testing.extra_nodes(dev_cluster, 6) as added:
        wait_for(
            lambda: (node_members(clients), tiers_of(clients)),
            until=lambda seen: set(added) <= seen[0] and len(seen[1]) == 3,
            timeout=60,
            description="HyperNodes listing the added nodes, at every tier",
        )
        assert tiers_of(clients) == {"block": 2, "spine": 3, "layer-1": 4}
        blocks = [h for h in managed_hypernodes(clients) if h["spec"]["tierName"] == "block"]
        assert sorted(len(b["spec"]["members"]) for b in blocks) == [4, 4]
        flavor = clients.custom.get_cluster_custom_object(
            *KUEUE_API, topology.RESOURCE_FLAVORS, kueue_name(INSTANCE_TYPE)
        )
        assert flavor["spec"]["topologyName"] == kueue_name(INSTANCE_TYPE)
    wait_for(
        lambda: node_members(clients),
        until=lambda members: not set(added) & members,
        timeout=60,
        description="the removed nodes gone from every HyperNode",
    )
    blocks = [h for h in managed_hypernodes(clients) if h["spec"]["tierName"] == "block"]
    assert len(blocks) == 1, "the emptied block's HyperNode is deleted"


def test_a_required_block_gang_lands_inside_one_block_under_volcano(
    dev_cluster: Any, placement_namespace: str
) -> None:
    """Two nodes of block 0 are taken first: a 4-node gang that must sit in one block then takes
    block 1 whole instead of the two free nodes of block 0 and two of block 1."""
    clients, namespace = dev_cluster.clients, placement_namespace
    create_job(clients, namespace, train_only("small", nodes=2, scheduling=placed("block")))
    small = wait_gang_running(clients, namespace, "small", "train", 0, nodes=2)
    create_job(clients, namespace, train_only("wide", nodes=4, scheduling=placed("block")))
    wide = wait_gang_running(clients, namespace, "wide", "train", 0, nodes=4)

    assert len(blocks_of(clients, small)) == 1
    assert len(blocks_of(clients, wide)) == 1
    assert blocks_of(clients, wide) != blocks_of(clients, small)
    finish_pods(clients, namespace, small + wide)


def test_a_preferred_gang_spreads_over_blocks_only_when_it_must_under_volcano(
    dev_cluster: Any, placement_namespace: str
) -> None:
    clients, namespace = dev_cluster.clients, placement_namespace
    create_job(
        clients, namespace, train_only("fits", nodes=4, scheduling=placed("block", "Preferred"))
    )
    fits = wait_gang_running(clients, namespace, "fits", "train", 0, nodes=4)
    assert len(blocks_of(clients, fits)) == 1
    finish_pods(clients, namespace, fits)

    create_job(
        clients, namespace, train_only("big", nodes=6, scheduling=placed("block", "Preferred"))
    )
    big = wait_gang_running(clients, namespace, "big", "train", 0, nodes=6)
    assert len(blocks_of(clients, big)) == 2, "6 nodes cannot fit in a block of 4: it spreads"
    finish_pods(clients, namespace, big)


def tas_queue(clients: Any, namespace: str) -> None:
    """A ClusterQueue of the operator's TAS flavor and a LocalQueue to it (the dev cluster's own
    ClusterQueue lists its flavors without topology)."""
    resources = ["aws.amazon.com/neuron", "vpc.amazonaws.com/efa"]
    cluster_queue = {
        "apiVersion": f"{kueue.KUEUE_GROUP}/{kueue.KUEUE_VERSION}",
        "kind": "ClusterQueue",
        "metadata": {"name": TAS_QUEUE},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": resources,
                    "flavors": [
                        {
                            "name": kueue_name(INSTANCE_TYPE),
                            "resources": [{"name": r, "nominalQuota": "1000"} for r in resources],
                        }
                    ],
                }
            ],
        },
    }
    try:
        clients.custom.create_cluster_custom_object(*KUEUE_API, "clusterqueues", cluster_queue)
    except Exception as error:
        if getattr(error, "status", None) != 409:
            raise
    local = dev_kueue.local_queue(namespace, TAS_QUEUE, cluster_queue_name=TAS_QUEUE)
    clients.custom.create_namespaced_custom_object(*KUEUE_API, namespace, "localqueues", local)


def test_a_required_block_gang_lands_inside_one_block_under_kueue_tas(
    dev_cluster: Any, placement_namespace: str
) -> None:
    clients, namespace = dev_cluster.clients, placement_namespace
    tas_queue(clients, namespace)
    wait_for(
        lambda: clients.custom.get_cluster_custom_object(
            *KUEUE_API, topology.KUEUE_TOPOLOGIES, kueue_name(INSTANCE_TYPE)
        ),
        timeout=60,
        description="the operator's Kueue Topology",
    )
    manifest = train_only("tas", nodes=4, scheduling=placed("block"))
    manifest["metadata"]["labels"] = {kueue.QUEUE_NAME_LABEL: TAS_QUEUE}
    manifest["spec"]["scheduling"].pop("queue")
    create_job(clients, namespace, manifest)
    pods = wait_gang_running(clients, namespace, "tas", "train", 0, nodes=4)

    assert all(
        p.metadata.annotations[topology.REQUIRED_TOPOLOGY_ANNOTATION] == BLOCK_LABEL for p in pods
    )
    assert len(blocks_of(clients, pods)) == 1
    workload = dev_kueue.read_workload(clients.custom, namespace, "tas-train-0")
    assert workload["status"]["admission"]["podSetAssignments"][0].get("topologyAssignment")
    finish_pods(clients, namespace, job_pods(clients, namespace, "tas", "train"))
