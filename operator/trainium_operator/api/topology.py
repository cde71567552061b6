"""The network topology model: where a node sits in the AWS network, as the levels a job asks
for, and what each level is to Kueue and to Volcano.

What is read (every key is written by AWS software on the node, never by a tenant):
- `topology.k8s.aws/network-node-layer-1` (the top) to `-3` (the bottom, the most selective):
  EKS labels each node with its network nodes (EKS user guide, "Place distributed AI/ML
  workloads with network topology labels", ml-workload-topology; values such as
  `nn-e50490a237cb0f01a`). EC2 instance topology returns 3 layers for every Trainium type
  (trn1.2xlarge, trn1.32xlarge, trn1n.32xlarge, trn2.48xlarge, trn2u.48xlarge: EC2 user guide,
  "Prerequisites for Amazon EC2 instance topology"); `-4` exists only on 4-layer types, none of
  them Trainium, so it is not read.
- `neuron.amazonaws.com/ultraserver-server-id-4`: the UltraServer of a trn2u node, the same
  value on the four instances NeuronLink joins. The Neuron device plugin (>= 2.26.26.0) labels
  UltraServer nodes with it (Neuron docs, "How to schedule MPI jobs to run on Neuron UltraServer
  on EKS", containers/how-to/how-to-ultraserver: `ultraserver-server-id-4` and `-2`,
  `ultraserver-node-id-4`, `ultraserver-mode`). EC2's DescribeInstanceTopology names the same
  domain by `capacityBlockId` ("identifies instances within the UltraServer domain"; it "might
  return a null value for capacityBlockId" right after launch: EC2 API reference,
  API_DescribeInstanceTopology and API_InstanceTopology); reading it would need the
  `ec2:DescribeInstanceTopology` permission and retries, the label needs neither, so the
  operator reads the label.

Levels, smallest first: `ultraserver` (trn2u only), `block` (layer 3), `spine` (layer 2),
`layer-1`. Each has one fixed Volcano tier, whatever the instance type: Volcano keeps one tier
per tierName cluster-wide ("Conflicting tiers for tierName", pkg/scheduler/api/hyper_node_info.go,
v1.14.1 and v1.15.1), so a block is tier 2 on trn1 (which has no tier 1) as on trn2u.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from trainium_operator.api.instance_types import INSTANCE_TYPES
from trainium_operator.api.kueue import KUEUE_GROUP
from trainium_operator.api.objects import Obj

LAYER_LABELS = {layer: f"topology.k8s.aws/network-node-layer-{layer}" for layer in (1, 2, 3)}
ULTRASERVER_LABEL = "neuron.amazonaws.com/ultraserver-server-id-4"
HOSTNAME_LABEL = "kubernetes.io/hostname"

# Kueue's pod-set topology annotations (apis/kueue/v1beta2/topology_types.go, v0.19.2: the
# pod integration reads them from a group's pods, pkg/controller/jobs/pod/pod_controller.go).
REQUIRED_TOPOLOGY_ANNOTATION = f"{KUEUE_GROUP}/podset-required-topology"
PREFERRED_TOPOLOGY_ANNOTATION = f"{KUEUE_GROUP}/podset-preferred-topology"
TOPOLOGY_ANNOTATIONS = (REQUIRED_TOPOLOGY_ANNOTATION, PREFERRED_TOPOLOGY_ANNOTATION)

# What Volcano's PodGroup controller reads from a pod it makes a PodGroup for
# (pkg/apis/topology/v1alpha1/labels.go, v1.15.1); the operator's pods have their PodGroup.
VOLCANO_TOPOLOGY_ANNOTATIONS = (
    "volcano.sh/network-topology-mode",
    "volcano.sh/network-topology-highest-tier",
)
# Volcano's network-topology API (staging/src/volcano.sh/apis, v1.15.1).
HYPERNODE_GROUP = "topology.volcano.sh"
HYPERNODE_VERSION = "v1alpha1"
HYPERNODES = "hypernodes"
# Kueue's kinds the topology reconciler writes (cluster-scoped).
KUEUE_TOPOLOGIES = "topologies"
RESOURCE_FLAVORS = "resourceflavors"

# Every topology object the operator writes carries both: it lists, changes and deletes only
# objects with them, never one an admin or another tool made.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "trainium-operator"
COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT = "network-topology"
MANAGED_LABELS = {MANAGED_BY_LABEL: MANAGED_BY, COMPONENT_LABEL: COMPONENT}
MANAGED_SELECTOR = ",".join(f"{key}={value}" for key, value in MANAGED_LABELS.items())
# The schedulers topology can be written for (`run --topology`, the chart's topology.*).
VOLCANO = "volcano"
KUEUE = "kueue"
SCHEDULERS = (VOLCANO, KUEUE)


class TopologyLevel(enum.StrEnum):
    ULTRASERVER = "ultraserver"
    BLOCK = "block"
    SPINE = "spine"
    LAYER_1 = "layer-1"


class TopologyMode(enum.StrEnum):
    REQUIRED = "Required"
    PREFERRED = "Preferred"


@dataclass(frozen=True, slots=True)
class Level:
    node_label: str
    tier: int  # Volcano's HyperNode tier, fixed per level
    what: str  # for users: what the level groups


LEVELS: dict[TopologyLevel, Level] = {
    TopologyLevel.ULTRASERVER: Level(
        ULTRASERVER_LABEL, 1, "the four trn2u.48xlarge instances NeuronLink joins"
    ),
    TopologyLevel.BLOCK: Level(LAYER_LABELS[3], 2, "nodes under one layer-3 network node"),
    TopologyLevel.SPINE: Level(LAYER_LABELS[2], 3, "nodes under one layer-2 network node"),
    TopologyLevel.LAYER_1: Level(LAYER_LABELS[1], 4, "nodes under one layer-1 network node"),
}
NETWORK_LEVELS = (TopologyLevel.LAYER_1, TopologyLevel.SPINE, TopologyLevel.BLOCK)  # top first


def ultraserver_types() -> list[str]:
    return [t.name for t in INSTANCE_TYPES.values() if t.ultraserver_nodes]


def levels_of(instance_type: str) -> tuple[TopologyLevel, ...]:
    """The levels a node of this type sits in, top first (the ultraserver last, on trn2u)."""
    if INSTANCE_TYPES[instance_type].ultraserver_nodes:
        return (*NETWORK_LEVELS, TopologyLevel.ULTRASERVER)
    return NETWORK_LEVELS


def kueue_levels(instance_type: str) -> list[str]:
    """A Kueue Topology's levels for the type: node labels top to bottom, the hostname last
    (Kueue allows it only there; a Required job of the hostname level is one node)."""
    return [*(LEVELS[level].node_label for level in levels_of(instance_type)), HOSTNAME_LABEL]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a gang's nodes must (Required) or should (Preferred) sit: within one domain of
    `level`."""

    level: TopologyLevel
    mode: TopologyMode

    @property
    def required(self) -> bool:
        return self.mode is TopologyMode.REQUIRED


def kueue_annotations(placement: Placement | None) -> dict[str, str]:
    """The pod annotation Kueue's TAS reads: required or preferred, naming the level's label."""
    if placement is None:
        return {}
    key = REQUIRED_TOPOLOGY_ANNOTATION if placement.required else PREFERRED_TOPOLOGY_ANNOTATION
    return {key: LEVELS[placement.level].node_label}


def volcano_network_topology(placement: Placement | None) -> Obj | None:
    """The PodGroup's spec.networkTopology. Required: hard, no higher than the level's tier.
    Preferred: soft. Volcano v1.15.1 turns it into hard up to its top tier and tries tier by
    tier from the smallest (adjustNetworkTopologySpec in pkg/scheduler/framework/session.go,
    hyperNodeGradientFn in the network-topology-aware plugin): the tightest domain that fits,
    at every level, then anywhere. On v1.14.1, which the dev cluster runs, a soft gang keeps to
    the HyperNode its first pods took where it can (allocate.go, getNewAllocatedHyperNode);
    tests/integration/test_topology.py shows a gang that fits one block staying in it and a
    larger one spreading."""
    if placement is None:
        return None
    if placement.required:
        return {"mode": "hard", "highestTierAllowed": LEVELS[placement.level].tier}
    return {"mode": "soft"}
