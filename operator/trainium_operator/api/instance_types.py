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
  The DRA page's trn2.48xlarge pod requests `vpc.amazonaws.com/efa: "16"` next to
  `aws.amazon.com/neuron: "16"` (Neuron docs, deploy/eks/dra.html).
- Neuron stacks: TorchNeuron, the native backend, is "supported on Trainium 2 (trn2) and
  Trainium 3 (trn3)", with no Trn1 support (Neuron docs, torch/about-pytorch-neuron.rst and
  release-notes/components/torchneuron.rst); PyTorch/XLA training (torch-neuronx 2.9, the last
  in Neuron 2.31) is what trn1 keeps, and it also ran on Trn2.
- Trn3 (Trainium3, 8 NeuronCore-v4 per chip, 144 GiB per chip; a Gen1 server has 16 chips, a
  Gen2 server 4: Neuron docs, trn3-arch.html and trainium3.html) is in `UNCONFIRMED_SHAPES`,
  not in `INSTANCE_TYPES`: no source gave its EC2 size names (the EKS docs say only "Trn3pds
  instance type"), its EFA interface count, vCPUs or host memory, so a job cannot ask for it
  until those are known. Its per-node ranks below are derived, not documented.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainium_operator.contract.workload_env import NEURON_STACKS

NEURON_RESOURCE = "aws.amazon.com/neuron"
# The device plugin's old name for the same devices. Neuron 2.20 dropped it ("Starting with
# Neuron release 2.20, Neuron no longer supports resource name 'neurondevice'": Neuron docs,
# about-neuron/announcements/neuron2.x/announce-no-support-device-version.rst), and Trn2
# support came with Neuron 2.21, so no plugin that runs on a Trainium2 node ever advertised it.
NEURON_DEVICE_RESOURCE = "aws.amazon.com/neurondevice"
NEURON_CORE_RESOURCE = "aws.amazon.com/neuroncore"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# The Neuron runtime's logical NeuronCore setting (Trainium2 and later), as the LNC page names
# it. On EKS the documented places to set it are the node (a file written at boot,
# /opt/aws/neuron/logical_nc_config: Neuron docs, deploy/eks/prerequisites.rst) and, with the
# Neuron DRA driver, the claim (NeuronConfig.logicalNeuronCore: deploy/eks/dra.rst, "Earlier,
# overriding LNC on a Node required a node template"). The docs do not say that the variable
# in a pod's environment alone changes the LNC of a node set otherwise.
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
# The compiler's spelling of the same setting; it "must" equal the runtime's (Neuron docs,
# "Logical NeuronCore configuration").
LNC_COMPILER_FLAG = "--logical-nc-config"

XLA_STACK, NATIVE_STACK = NEURON_STACKS
TRN1_STACKS = (XLA_STACK,)  # TorchNeuron does not support Trn1
TRN2_STACKS = (NATIVE_STACK, XLA_STACK)  # native is the default; XLA is frozen at Neuron 2.31


@dataclass(frozen=True, slots=True)
class InstanceType:
    name: str
    neuron_devices: int  # Trainium chips, advertised as aws.amazon.com/neuron
    physical_cores_per_device: int  # NeuronCore-v2: 2 per Trainium; NeuronCore-v3: 8 per Trn2
    efa_interfaces: int  # vpc.amazonaws.com/efa
    cpu: int  # vCPUs
    memory_gib: int
    lnc_options: tuple[int, ...] = (1,)  # logical NeuronCore configs the runtime accepts
    default_lnc: int = 1
    # The Neuron PyTorch stacks that run on it (contract/workload_env.NEURON_STACKS), default first.
    neuron_stacks: tuple[str, ...] = TRN1_STACKS
    # Instances joined by NeuronLink into one UltraServer (trn2u: 4, the Trn2 architecture page
    # above); 0: the type is not sold as UltraServers. api/topology.py's ultraserver level.
    ultraserver_nodes: int = 0
    # A Neuron device plugin that runs on this type ever advertised aws.amazon.com/neurondevice
    # (plugins of Neuron 2.19 and earlier, which predate Trainium2).
    legacy_device_resource: bool = True
    # Facts of this row no source confirmed (field names), shown by the docs and `unconfirmed`.
    unconfirmed: tuple[str, ...] = field(default=())

    @property
    def default_stack(self) -> str:
        return self.neuron_stacks[0]

    @property
    def supports_lnc(self) -> bool:
        """The runtime has a logical-core setting (Trainium2 and later): pods get LNC_ENV and the
        compiler flag with the job's value, which must equal the node's."""
        return len(self.lnc_options) > 1

    def logical_cores(self, lnc: int | None = None) -> int:
        """NeuronCores the runtime exposes at that LNC: one torchrun worker each."""
        return self.neuron_devices * self.physical_cores_per_device // (lnc or self.default_lnc)

    @property
    def neuron_cores(self) -> int:
        """Logical NeuronCores at the default LNC (what aws.amazon.com/neuroncore counts)."""
        return self.logical_cores()


def _trn2(name: str, ultraserver_nodes: int = 0) -> InstanceType:
    return InstanceType(
        name,
        16,
        8,
        16,
        192,
        2048,
        lnc_options=(1, 2),
        default_lnc=2,
        neuron_stacks=TRN2_STACKS,
        ultraserver_nodes=ultraserver_nodes,
        legacy_device_resource=False,
    )


INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
        InstanceType("trn1.2xlarge", 1, 2, 0, 8, 32),
        InstanceType("trn1.32xlarge", 16, 2, 8, 128, 512),
        InstanceType("trn1n.32xlarge", 16, 2, 16, 128, 512),
        _trn2("trn2.48xlarge"),
        _trn2("trn2u.48xlarge", ultraserver_nodes=4),
    )
}

# Trainium3 servers as far as the sources go: chips and cores are documented, everything a pod
# spec needs to be right is not (0 = unknown). Native stack only: TorchNeuron is the training
# path since Neuron 2.33, after the XLA stack's last release. The default LNC is not stated
# either; 2 here mirrors Trn2 and is marked.
_TRN3_UNKNOWN = ("name", "efa_interfaces", "cpu", "memory_gib", "default_lnc")
UNCONFIRMED_SHAPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
        InstanceType(
            "trn3-gen1-server",
            16,
            8,
            0,
            0,
            0,
            lnc_options=(1, 2),
            default_lnc=2,
            neuron_stacks=(NATIVE_STACK,),
            legacy_device_resource=False,
            unconfirmed=_TRN3_UNKNOWN,
        ),
        InstanceType(
            "trn3-gen2-server",
            4,
            8,
            0,
            0,
            0,
            lnc_options=(1, 2),
            default_lnc=2,
            neuron_stacks=(NATIVE_STACK,),
            legacy_device_resource=False,
            unconfirmed=_TRN3_UNKNOWN,
        ),
    )
}

DEFAULT_INSTANCE_TYPE = "trn1.32xlarge"
