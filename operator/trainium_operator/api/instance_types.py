"""The one table of Trainium instance shapes: devices, cores, EFA interfaces, host size.

Everything that depends on the instance type (resource requests, default processes per
node, the logical NeuronCore setting, fake dev-cluster nodes, validation) reads this table,
so adding a type is one line.

Sources:
- trn1: AWS Neuron docs, "Amazon EC2 Trn1/Trn1n Architecture" (trn1-arch.rst) and "Trainium
  Architecture" (2 NeuronCore-v2 per chip); 8 EFA devices on trn1.32xlarge, 16 on
  trn1n.32xlarge ("How to prepare trn1.32xlarge for multi-node execution").
- trn2.48xlarge / trn2u.48xlarge: AWS Neuron docs, "Amazon EC2 Trn2 Architecture"
  (trn2-arch.html: 16 Trainium2 chips, 192 vCPUs, 2,048 GiB host memory, the same figures for
  trn2u; a Trn2 UltraServer is four trn2u.48xlarge joined by NeuronLink-v3), "Trainium2
  Architecture" (8 physical NeuronCore-v3 per chip), "Logical NeuronCore configuration"
  (LNC: NEURON_LOGICAL_NC_CONFIG groups 1 or 2 physical cores, compiler and runtime must
  agree) and "Best practices for training on AWS Neuron" (default LNC=2: 4 logical cores per
  chip, 64 ranks per instance). EFA: 16 network cards with EFA (3.2 Tbps EFAv3), from the
  EC2 Trn2 instance page and the EC2 accelerated-computing network specifications.
- Trn3 (Trainium3, 8 NeuronCore-v4 per chip) is announced but not in this table yet: it runs
  only the native PyTorch backend (TorchNeuron), not the XLA stack our training image pins.
"""

from __future__ import annotations

from dataclasses import dataclass

NEURON_RESOURCE = "aws.amazon.com/neuron"
NEURON_DEVICE_RESOURCE = "aws.amazon.com/neurondevice"
NEURON_CORE_RESOURCE = "aws.amazon.com/neuroncore"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# The Neuron runtime's logical NeuronCore setting (Trainium2 and later).
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"


@dataclass(frozen=True, slots=True)
class InstanceType:
    name: str
    neuron_devices: int  # Trainium chips, advertised as aws.amazon.com/neuron(device)
    physical_cores_per_device: int  # NeuronCore-v2: 2 per Trainium; NeuronCore-v3: 8 per Trn2
    efa_interfaces: int  # vpc.amazonaws.com/efa
    cpu: int  # vCPUs
    memory_gib: int
    lnc_options: tuple[int, ...] = (1,)  # logical NeuronCore configs the runtime accepts
    default_lnc: int = 1

    @property
    def supports_lnc(self) -> bool:
        """The runtime has a logical-core setting (Trainium2 and later): pods get LNC_ENV."""
        return len(self.lnc_options) > 1

    def logical_cores(self, lnc: int | None = None) -> int:
        """NeuronCores the runtime exposes at that LNC: one torchrun worker each."""
        return self.neuron_devices * self.physical_cores_per_device // (lnc or self.default_lnc)

    @property
    def neuron_cores(self) -> int:
        """Logical NeuronCores at the default LNC (what aws.amazon.com/neuroncore counts)."""
        return self.logical_cores()


INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
        InstanceType("trn1.2xlarge", 1, 2, 0, 8, 32),
        InstanceType("trn1.32xlarge", 16, 2, 8, 128, 512),
        InstanceType("trn1n.32xlarge", 16, 2, 16, 128, 512),
        InstanceType("trn2.48xlarge", 16, 8, 16, 192, 2048, lnc_options=(1, 2), default_lnc=2),
        InstanceType("trn2u.48xlarge", 16, 8, 16, 192, 2048, lnc_options=(1, 2), default_lnc=2),
    )
}

DEFAULT_INSTANCE_TYPE = "trn1.32xlarge"
