"""Neuron and EFA devices through Dynamic Resource Allocation (resource.k8s.io/v1): the names
AWS documents, shared by the claim builder, the Kueue mapping and the dev cluster's simulation.

Sources (each fact below is from one of these):
- NEURON_DRA: Neuron docs, deploy/eks/dra.rst ("AWS Neuron Dynamic Resource Allocation"): the
  DeviceClass and driver `neuron.aws.com`, devices named `neurondevice<N>` in a pool per node,
  the attributes (`instanceType`, `deviceId`, `resourceType` = `neuron_device`, ... under the
  driver's domain; `resource.aws.com/devicegroup{1,4,8,16}_id` on EFA-enabled instances, a hash
  shared by the devices of one connected group), the opaque `NeuronConfig` with
  `logicalNeuronCore` (apiVersion `neuron.aws.com/v1`), Kubernetes 1.34+, and that the DRA
  driver and the device plugin coexist in a cluster "but not for the same node".
- EKS_NEURON: EKS user guide, latest/ug/ml/device-management-neuron.adoc: the DRA driver is
  recommended on 1.34+ (managed and self-managed node groups, Karpenter static capacity; not
  Auto Mode); "Choose the matchAttribute that matches the device count"; never beside the
  device plugin on one node ("silent oversubscription").
- EKS_EFA: EKS user guide, latest/ug/ml/device-management-efa.adoc: EFA through the DRANET driver
  (driver `dra.net`, DeviceClass `efa.networking.k8s.aws`), and Neuron devices and EFA
  interfaces aligned in one claim by one `matchAttribute: resource.aws.com/devicegroup<N>_id`
  constraint over both requests.
"""

from __future__ import annotations

from trainium_operator.api.instance_types import EFA_RESOURCE, NEURON_RESOURCE

API_VERSION = "resource.k8s.io/v1"  # GA in Kubernetes 1.34
NEURON_DRIVER = "neuron.aws.com"
NEURON_DEVICE_CLASS = "neuron.aws.com"
EFA_DRIVER = "dra.net"
EFA_DEVICE_CLASS = "efa.networking.k8s.aws"
# The connected-group sizes the driver publishes an id for, smallest first.
DEVICE_GROUP_SIZES = (1, 4, 8, 16)
NEURON_CONFIG_API_VERSION = "neuron.aws.com/v1"
NEURON_CONFIG_KIND = "NeuronConfig"
# The names of the claim's requests (the container's resources.claims name the pod's claim).
NEURON_REQUEST = "neurons"
EFA_REQUEST = "efas"
# The pod's one claim (pod.spec.resourceClaims[].name and the trainer's resources.claims).
POD_CLAIM_NAME = "trainium-devices"


def device_group_attribute(size: int) -> str:
    """The qualified attribute shared by the devices of one connected group of `size`."""
    if size not in DEVICE_GROUP_SIZES:
        raise ValueError(f"no connected group of {size} devices (sizes {DEVICE_GROUP_SIZES})")
    return f"resource.aws.com/devicegroup{size}_id"


def connected_group_size(devices: int) -> int | None:
    """The smallest documented connected group that holds `devices`, None when none does."""
    return next((size for size in DEVICE_GROUP_SIZES if size >= devices), None)


# Kueue's quota resource of each DeviceClass (its `resources.deviceClassMappings`): the device
# plugin's resource names, so a ClusterQueue's quota counts devices whichever way a node
# publishes them (docs/neuron-stacks.md, "Devices through DRA").
DRA_QUOTA_RESOURCES = {NEURON_RESOURCE: NEURON_DEVICE_CLASS, EFA_RESOURCE: EFA_DEVICE_CLASS}
# The dev cluster's: which quota resource a ResourceSlice's devices add to, by driver.
DRIVER_QUOTA_RESOURCES = {NEURON_DRIVER: NEURON_RESOURCE, EFA_DRIVER: EFA_RESOURCE}
