"""Pure builders of the objects `dev up` creates: fake Trainium nodes, Volcano queues, FSx volume.

Each returns a plain dict (the JSON the API server receives), so tests can check shapes without a
cluster and `dev up` serialises nothing by hand.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

from trainium_operator.api import dra, instance_types, topology
from trainium_operator.api.instance_types import InstanceType
from trainium_operator.builders.job import VOLCANO_GROUP, VOLCANO_VERSION

# KWOK manages nodes carrying this annotation (kwokctl's default manage-nodes selector).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE = "fake"
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"
DEV_NODE_LABEL = "trainium.dev/dev-cluster-node"
NEURON_TAINT_KEY = "aws.amazon.com/neuron"
DEFAULT_REGION = "us-west-2"
DEFAULT_ZONE = "us-west-2d"  # a zone where trn1 capacity exists

PODS_PER_NODE = 250
FSX_CSI_DRIVER = "fsx.csi.aws.com"
FSX_PV_NAME = "fsx-pv"
FSX_CLAIM_NAME = "fsx-claim"
FSX_CLAIM_NAMESPACE = "default"
FSX_CAPACITY = "1200Gi"  # the smallest FSx for Lustre SCRATCH_2/PERSISTENT file system
FSX_FILE_SYSTEM_ID = "fs-0123456789abcdef0"
FSX_MOUNT_NAME = "fsxdev01"

TUTORIAL_QUEUE = "test"
DEFAULT_QUEUE = "default"


def _object(
    api_version: str, kind: str, metadata: dict[str, Any], spec: dict[str, Any]
) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec}


def _node_prefix(instance_type: str) -> str:
    return f"{instance_type.replace('.', '-')}-"


def node_name(instance_type: str, index: int) -> str:
    return f"{_node_prefix(instance_type)}{index}"


def node_resources(shape: InstanceType) -> dict[str, str]:
    """Capacity (= allocatable: no system reservations are simulated) advertised by a fake node:
    what the Neuron device plugin of the chart (Neuron 2.20 and later) advertises, devices as
    aws.amazon.com/neuron and cores as aws.amazon.com/neuroncore. aws.amazon.com/neurondevice,
    which plugins dropped in Neuron 2.20, is not simulated on any type."""
    resources = {
        "cpu": str(shape.cpu),
        "memory": f"{shape.memory_gib}Gi",
        "pods": str(PODS_PER_NODE),
        "ephemeral-storage": "500Gi",
        instance_types.NEURON_RESOURCE: str(shape.neuron_devices),
        instance_types.NEURON_CORE_RESOURCE: str(shape.neuron_cores),
    }
    if shape.efa_interfaces:
        resources[instance_types.EFA_RESOURCE] = str(shape.efa_interfaces)
    return resources


def fake_node(
    name: str,
    shape: InstanceType,
    *,
    zone: str = DEFAULT_ZONE,
    nodegroup: str | None = None,
    neuron_taint: bool = False,
    extra_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Node that KWOK keeps alive, labelled and sized like an EKS node of that instance type."""
    resources = node_resources(shape)
    labels = {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "kubernetes.io/hostname": name,
        instance_types.INSTANCE_TYPE_LABEL: shape.name,
        "beta.kubernetes.io/instance-type": shape.name,
        ZONE_LABEL: zone,
        REGION_LABEL: DEFAULT_REGION,
        NODEGROUP_LABEL: nodegroup or f"{shape.name.replace('.', '-')}-ng",
        "eks.amazonaws.com/capacityType": "ON_DEMAND",
        DEV_NODE_LABEL: "true",
        **(extra_labels or {}),
    }
    spec: dict[str, Any] = {}
    if neuron_taint:
        spec["taints"] = [{"key": NEURON_TAINT_KEY, "value": "present", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE,
                "node.alpha.kubernetes.io/ttl": "0",
            },
        },
        "spec": spec,
        # Status is accepted on create (not on update); KWOK's node-initialize stage keeps it.
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": "Amazon Linux 2023 (simulated by KWOK)",
            },
        },
    }


# The fake network, deterministic from a node's index: 4 nodes per layer-3 block (8 on trn2u: two
# UltraServers of 4), 2 blocks per layer-2 spine, 2 spines per layer-1 network node. So 16
# trn1.32xlarge nodes sit in 4 blocks under 2 spines under one layer-1 node.
NODES_PER_BLOCK = 4
BLOCKS_PER_SPINE = 2
SPINES_PER_LAYER1 = 2
# What the Neuron device plugin writes beside the UltraServer id (Neuron docs,
# how-to-ultraserver): the 2-node pair's id, each node's index in its server, the modes.
ULTRASERVER_MODE_LABEL = "neuron.amazonaws.com/ultraserver-mode"
ULTRASERVER_PAIR_LABEL = "neuron.amazonaws.com/ultraserver-server-id-2"
ULTRASERVER_NODE_LABEL = "neuron.amazonaws.com/ultraserver-node-id-4"
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("/".join(map(str, parts)).encode()).digest()


def network_node_id(instance_type: str, layer: int, group: int) -> str:
    """An id of the form EKS shows (`nn-` and 17 hex digits), fixed per type, layer and group."""
    return "nn-" + _digest(DEFAULT_ZONE, instance_type, layer, group).hex()[:17]


def ultraserver_id(instance_type: str, size: int, group: int) -> str:
    """An id of the form the Neuron docs show (16 lowercase letters and digits)."""
    return "".join(_BASE36[b % 36] for b in _digest(instance_type, "ultraserver", size, group)[:16])


def topology_labels(instance_type: str, index: int) -> dict[str, str]:
    """The network labels EKS (and on trn2u the Neuron device plugin) would give node `index` of
    the type: its layer-1, -2 and -3 network nodes and its UltraServer."""
    shape = instance_types.INSTANCE_TYPES[instance_type]
    per_block = max(NODES_PER_BLOCK, 2 * shape.ultraserver_nodes)
    block = index // per_block
    spine = block // BLOCKS_PER_SPINE
    layer1 = spine // SPINES_PER_LAYER1
    labels = {
        topology.LAYER_LABELS[1]: network_node_id(instance_type, 1, layer1),
        topology.LAYER_LABELS[2]: network_node_id(instance_type, 2, spine),
        topology.LAYER_LABELS[3]: network_node_id(instance_type, 3, block),
    }
    size = shape.ultraserver_nodes
    if size:
        labels |= {
            ULTRASERVER_MODE_LABEL: "1_2_4",
            topology.ULTRASERVER_LABEL: ultraserver_id(instance_type, size, index // size),
            ULTRASERVER_NODE_LABEL: str(index % size),
            ULTRASERVER_PAIR_LABEL: ultraserver_id(instance_type, 2, index // 2),
        }
    return labels


def fake_nodes(
    count: int, instance_type: str, *, neuron_taint: bool = False, first_index: int = 0
) -> list[dict[str, Any]]:
    """`count` nodes named `<instance-type>-<index>` from `first_index` on (a suite that adds
    nodes to a running cluster continues its numbering: see `next_node_index`), each with the
    network topology labels of its index (`topology_labels`)."""
    if count < 0:
        raise ValueError(f"--nodes must be >= 0, got {count}")
    try:
        shape = instance_types.INSTANCE_TYPES[instance_type]
    except KeyError:
        known = ", ".join(sorted(instance_types.INSTANCE_TYPES))
        raise ValueError(
            f"--instance-type {instance_type!r} is unknown; choose one of {known}"
        ) from None
    return [
        fake_node(
            node_name(instance_type, index),
            shape,
            neuron_taint=neuron_taint,
            extra_labels=topology_labels(instance_type, index),
        )
        for index in range(first_index, first_index + count)
    ]


def next_node_index(existing: Iterable[str], instance_type: str) -> int:
    """The first index after every existing `<instance-type>-<index>` node, so added nodes
    never take the name of a node that is there (or of one `dev up` would create)."""
    pattern = re.compile(re.escape(_node_prefix(instance_type)) + r"([0-9]+)$")
    indices = [int(m.group(1)) for name in existing if (m := pattern.match(name))]
    return max(indices, default=-1) + 1


def volcano_queue(
    name: str,
    *,
    weight: int = 1,
    reclaimable: bool,
    capability: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"weight": weight, "reclaimable": reclaimable}
    if capability:
        spec["capability"] = dict(capability)
    return _object(f"{VOLCANO_GROUP}/{VOLCANO_VERSION}", "Queue", {"name": name}, spec)


def volcano_queues() -> list[dict[str, Any]]:
    """`default` (vc-scheduler also creates it at start-up) and the tutorial's `test` queue,
    as its create_volcano_test_queue.sh declares it: weight 1, not reclaimable, no capability."""
    return [
        volcano_queue(DEFAULT_QUEUE, reclaimable=True),
        volcano_queue(TUTORIAL_QUEUE, reclaimable=False),
    ]


def fsx_csi_driver() -> dict[str, Any]:
    """The CSIDriver object the FSx driver installs: no attach step, so no VolumeAttachments."""
    spec = {
        "attachRequired": False,
        "podInfoOnMount": False,
        "fsGroupPolicy": "ReadWriteOnceWithFSType",
    }
    return _object("storage.k8s.io/v1", "CSIDriver", {"name": FSX_CSI_DRIVER}, spec)


def csi_node(node: dict[str, Any]) -> dict[str, Any]:
    """The CSINode the FSx CSI node plugin registers on every EKS node (through its kubelet).

    Volcano's predicates count a pod's CSI volumes against the node's CSINode driver entries;
    a node without one has no room for any pod that mounts the FSx claim.
    """
    name = node["metadata"]["name"]
    metadata = {
        "name": name,
        # As the kubelet creates it: owned by its Node, so it goes when the node goes.
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
        ],
    }
    driver = {"name": FSX_CSI_DRIVER, "nodeID": name, "topologyKeys": [ZONE_LABEL]}
    return _object("storage.k8s.io/v1", "CSINode", metadata, {"drivers": [driver]})


def fsx_persistent_volume() -> dict[str, Any]:
    """A statically provisioned FSx for Lustre volume, as the FSx CSI driver's examples show it."""
    csi = {
        "driver": FSX_CSI_DRIVER,
        "volumeHandle": FSX_FILE_SYSTEM_ID,
        "volumeAttributes": {
            "dnsname": f"{FSX_FILE_SYSTEM_ID}.fsx.{DEFAULT_REGION}.amazonaws.com",
            "mountname": FSX_MOUNT_NAME,
        },
    }
    spec = {
        "capacity": {"storage": FSX_CAPACITY},
        "volumeMode": "Filesystem",
        "accessModes": ["ReadWriteMany"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "",
        "mountOptions": ["flock"],
        "csi": csi,
    }
    return _object("v1", "PersistentVolume", {"name": FSX_PV_NAME}, spec)


def fsx_persistent_volume_claim() -> dict[str, Any]:
    spec = {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "",
        "resources": {"requests": {"storage": FSX_CAPACITY}},
        "volumeName": FSX_PV_NAME,
    }
    metadata = {"name": FSX_CLAIM_NAME, "namespace": FSX_CLAIM_NAMESPACE}
    return _object("v1", "PersistentVolumeClaim", metadata, spec)


# --- DRA: devices published the way the Neuron DRA driver and DRANET publish them -------------
# (api/dra.py has the sources.) AWS: never the DRA driver beside the device plugin on one node,
# so a DRA node advertises no aws.amazon.com/neuron, neuroncore or vpc.amazonaws.com/efa, and
# DRA nodes form their own node group, named apart from the device-plugin nodes.
DRA_NODE_INFIX = "dra"
DEVICE_ALLOCATION_LABEL = "trainium.dev/device-allocation"


def dra_node_name(instance_type: str, index: int) -> str:
    return f"{_node_prefix(instance_type)}{DRA_NODE_INFIX}-{index}"


def dra_fake_node(name: str, shape: InstanceType) -> dict[str, Any]:
    """A fake node of `shape` whose devices only its ResourceSlices publish."""
    node = fake_node(
        name,
        shape,
        nodegroup=f"{shape.name.replace('.', '-')}-{DRA_NODE_INFIX}-ng",
        extra_labels={DEVICE_ALLOCATION_LABEL: "dra"},
    )
    device_plugin = {
        instance_types.NEURON_RESOURCE,
        instance_types.NEURON_CORE_RESOURCE,
        instance_types.EFA_RESOURCE,
    }
    for key in ("capacity", "allocatable"):
        node["status"][key] = {
            k: v for k, v in node["status"][key].items() if k not in device_plugin
        }
    return node


def device_class(name: str, driver: str) -> dict[str, Any]:
    """A DeviceClass selecting every device of `driver` (as the drivers' charts install them)."""
    selector = {"cel": {"expression": f"device.driver == '{driver}'"}}
    return _object(dra.API_VERSION, "DeviceClass", {"name": name}, {"selectors": [selector]})


def device_classes() -> list[dict[str, Any]]:
    return [
        device_class(dra.NEURON_DEVICE_CLASS, dra.NEURON_DRIVER),
        device_class(dra.EFA_DEVICE_CLASS, dra.EFA_DRIVER),
    ]


def _group_ids(node: str, device: int, group_limit: int) -> dict[str, Any]:
    """The devicegroup ids of one device: devices of one connected group share each id (a hash
    in the driver; the group's name here). `group_limit` caps the largest connected group the
    node publishes (16 on a healthy trn1/trn2; less simulates a node whose devices are not
    all connected)."""
    ids: dict[str, Any] = {}
    for size in dra.DEVICE_GROUP_SIZES:
        span = min(size, group_limit)
        ids[dra.device_group_attribute(size)] = {"string": f"{node}-g{size}-{device // span}"}
    return ids


def _slice(node: str, driver: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    spec = {
        "driver": driver,
        "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "devices": devices,
    }
    name = f"{node}-{driver.replace('.', '-')}"
    return _object(dra.API_VERSION, "ResourceSlice", {"name": name}, spec)


def neuron_resource_slice(
    node: str, shape: InstanceType, *, group_limit: int = 16
) -> dict[str, Any]:
    """The Neuron DRA driver's ResourceSlice of one node: a pool named for the node, devices
    neurondevice<N> with the documented attributes; the devicegroup ids only on an
    EFA-enabled instance (trn1.2xlarge has none)."""
    devices = []
    for index in range(shape.neuron_devices):
        attributes: dict[str, Any] = {
            "deviceId": {"int": index},
            "instanceType": {"string": shape.name},
            "resourceType": {"string": "neuron_device"},
        }
        if shape.efa_interfaces:
            attributes.update(_group_ids(node, index, group_limit))
        devices.append({"name": f"neurondevice{index}", "attributes": attributes})
    return _slice(node, dra.NEURON_DRIVER, devices)


def efa_resource_slice(node: str, shape: InstanceType, *, group_limit: int = 16) -> dict[str, Any]:
    """DRANET's ResourceSlice of one node's EFA interfaces, each carrying the devicegroup ids of
    the Neuron devices it is aligned with (what lets one claim's matchAttribute cover both)."""
    per_efa = max(1, shape.neuron_devices // max(1, shape.efa_interfaces))
    devices = [
        {
            "name": f"efa{index}",
            "attributes": _group_ids(node, index * per_efa, group_limit),
        }
        for index in range(shape.efa_interfaces)
    ]
    return _slice(node, dra.EFA_DRIVER, devices)


def resource_slices(
    node: str, shape: InstanceType, *, group_limit: int = 16
) -> list[dict[str, Any]]:
    slices = [neuron_resource_slice(node, shape, group_limit=group_limit)]
    if shape.efa_interfaces:
        slices.append(efa_resource_slice(node, shape, group_limit=group_limit))
    return slices
