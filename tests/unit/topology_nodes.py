"""Trainium nodes labelled as AWS documents, for the topology tests.

The label sets are AWS's own examples: EKS's network-node labels (EKS user guide,
ml-workload-topology: `nn-e50490a237cb0f01a` for layer 1; the other values have its form) and
the Neuron device plugin's UltraServer labels of four trn2u nodes (Neuron docs,
how-to-ultraserver: `bog79p1y8tetj5uu` shared by the four, node names ip-172-32-*)."""

from __future__ import annotations

from typing import Any

from trainium_operator.api import topology
from trainium_operator.api.instance_types import INSTANCE_TYPE_LABEL

Obj = dict[str, Any]
LAYER1 = "nn-e50490a237cb0f01a"  # the EKS user guide's example
LAYER2 = "nn-2c4f1a9e80d7b3365"
BLOCK_A = "nn-7b1e0c44d9a2f6e01"
BLOCK_B = "nn-0d93aa61c2e5b7f48"
ULTRASERVER = "bog79p1y8tetj5uu"  # the Neuron docs' four-node UltraServer
TRN2U_NODES = [
    "ip-172-32-11-17.ap-southeast-4.compute.internal",
    "ip-172-32-13-57.ap-southeast-4.compute.internal",
    "ip-172-32-5-227.ap-southeast-4.compute.internal",
    "ip-172-32-9-4.ap-southeast-4.compute.internal",
]
BOTH = frozenset(topology.SCHEDULERS)


def node(name: str, instance_type: str, *path: str, ultraserver: str | None = None) -> Obj:
    labels = {INSTANCE_TYPE_LABEL: instance_type, "kubernetes.io/hostname": name}
    labels |= {topology.LAYER_LABELS[i + 1]: value for i, value in enumerate(path)}
    if ultraserver is not None:
        # The device plugin's set (how-to-ultraserver): mode, 4- and 2-node server ids.
        labels |= {
            "neuron.amazonaws.com/ultraserver-mode": "1_2_4",
            topology.ULTRASERVER_LABEL: ultraserver,
            "neuron.amazonaws.com/ultraserver-server-id-2": "u5wy80u0o2saugxy",
        }
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def trn1_nodes() -> list[Obj]:
    return [
        node("trn1-a0", "trn1.32xlarge", LAYER1, LAYER2, BLOCK_A),
        node("trn1-a1", "trn1.32xlarge", LAYER1, LAYER2, BLOCK_A),
        node("trn1-b0", "trn1.32xlarge", LAYER1, LAYER2, BLOCK_B),
        node("trn1-b1", "trn1.32xlarge", LAYER1, LAYER2, BLOCK_B),
    ]
