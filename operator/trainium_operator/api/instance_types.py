"""The one table of Trainium instance shapes: devices, cores, EFA interfaces, host size.

Everything that depends on the instance type (resource requests, default processes per
node, fake dev-cluster nodes, validation) reads this table, so adding a type is one line.
Figures: AWS trn1 instance specs (shared/reference/trainium-eks.md section 1).
"""

from __future__ import annotations

from dataclasses import dataclass

NEURON_RESOURCE = "aws.amazon.com/neuron"
NEURON_DEVICE_RESOURCE = "aws.amazon.com/neurondevice"
NEURON_CORE_RESOURCE = "aws.amazon.com/neuroncore"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


@dataclass(frozen=True, slots=True)
class InstanceType:
    name: str
    neuron_devices: int  # Trainium chips, advertised as aws.amazon.com/neuron(device)
    neuron_cores: int  # NeuronCore-v2 count, two per Trainium chip
    efa_interfaces: int  # vpc.amazonaws.com/efa
    cpu: int  # vCPUs
    memory_gib: int
    default_processes_per_node: int  # one torchrun worker per NeuronCore


INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
        InstanceType("trn1.2xlarge", 1, 2, 0, 8, 32, 2),
        InstanceType("trn1.32xlarge", 16, 32, 8, 128, 512, 32),
        InstanceType("trn1n.32xlarge", 16, 32, 16, 128, 512, 32),
    )
}

DEFAULT_INSTANCE_TYPE = "trn1.32xlarge"
