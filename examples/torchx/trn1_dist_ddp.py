"""A TorchX component shaped like the AWS Trainium EKS tutorial's `generateAppDef`
(aws-neuron-eks-samples dp_bert_hf_pretrain/lib/trn1_dist_ddp.py): the same arguments, the
same torchrun command inside `bash -c`, `neuron_parallel_compile` around it when
precompiling, the tutorial's EFA/Neuron environment and per-node caches, the FSx claim at
/data. Written for this project from the tutorial's description, so that its launch

    torchx run -s kubernetes -cfg queue=test lib/trn1_dist_ddp.py:generateAppDef ...

runs unchanged through the operator as

    torchx run -s trainium -cfg queue=test examples/torchx/trn1_dist_ddp.py:generateAppDef ...
"""

# No `from __future__ import annotations`: torchx decodes component arguments from the real
# annotation types.
from torchx import specs

EFA_INTERFACES = {"trn1.32xlarge": 8, "trn1n.32xlarge": 16}


def generateAppDef(  # noqa: N802, PLR0917 - the tutorial's name and signature
    script_args: str,
    nnodes: int,
    nproc_per_node: int,
    script: str,
    image: str,
    name: str,
    precompile: bool = False,
    bf16: bool = False,
    cacheset: str = "default",
    instance_type: str = "trn1.32xlarge",
) -> specs.AppDef:
    """BERT pretraining on Trainium nodes, launched by torchrun with an etcd rendezvous.

    Args:
        script_args: the training script's arguments, as one string
        nnodes: number of nodes
        nproc_per_node: torchrun workers per node
        script: the training script inside the image
        image: the training image
        name: the job's name
        precompile: run under neuron_parallel_compile (fill the Neuron cache)
        bf16: set XLA_DOWNCAST_BF16
        cacheset: prefix of the per-node Neuron and Transformers caches
        instance_type: trn1.32xlarge or trn1n.32xlarge
    """
    torchrun = (
        "python3 -m torch.distributed.run --rdzv_backend etcd --rdzv_endpoint etcd-server:2379"
        f" --rdzv_id {specs.macros.app_id} --nnodes {nnodes} --nproc_per_node {nproc_per_node}"
        f" --tee 3 --role '' {script} {script_args}"
    )
    if precompile:
        entrypoint, args = "neuron_parallel_compile", [torchrun]
    else:
        entrypoint, args = "bash", ["-c", torchrun]
    env = {
        "CCOM_SOCKET_IFNAME": "eth0",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "FI_PROVIDER": "efa",
        "FI_EFA_FORK_SAFE": "1",
        "NEURON_RT_RESET_CORES": "1",
        "XLA_TRANSFER_SEED_ASYNC": "1",
        "NEURON_CC_FLAGS": f"--cache_dir=/data/neuron_cache/{cacheset}_{specs.macros.replica_id}",
        "TRANSFORMERS_CACHE": f"/data/transformers_cache/{cacheset}_{specs.macros.replica_id}",
    }
    if bf16:
        env["XLA_DOWNCAST_BF16"] = "1"
    devices = {"aws.amazon.com/neuron": 16}
    if EFA_INTERFACES.get(instance_type):
        devices["vpc.amazonaws.com/efa"] = EFA_INTERFACES[instance_type]
    return specs.AppDef(
        name=name,
        roles=[
            specs.Role(
                name="role1",
                image=image,
                entrypoint=entrypoint,
                args=args,
                env=env,
                num_replicas=nnodes,
                max_retries=3,
                resource=specs.Resource(
                    cpu=0,
                    gpu=0,
                    memMB=0,
                    capabilities={"node.kubernetes.io/instance-type": instance_type},
                    devices=devices,
                ),
                mounts=[specs.VolumeMount(src="fsx-claim", dst_path="/data")],
            )
        ],
    )
