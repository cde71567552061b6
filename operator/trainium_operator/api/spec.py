"""The TrainingJob spec model: one source for validation, defaults and the CRD schema.

Field names mirror Kubeflow's PyTorchJob/TrainJob where they fit (`runPolicy`,
`cleanPodPolicy`, `backoffLimit`, `nprocPerNode` -> `processesPerNode`) so users feel at home.
Descriptions here become the CRD's OpenAPI descriptions, so `kubectl explain` teaches the API.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from trainium_operator.api.instance_types import (
    DEFAULT_INSTANCE_TYPE,
    INSTANCE_TYPES,
    NEURON_DEVICE_RESOURCE,
    NEURON_RESOURCE,
)

GROUP = "trainium.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainingJob"
PLURAL = "trainingjobs"
SINGULAR = "trainingjob"
SHORT_NAMES = ("tj",)

# torchrun derives these from its own arguments; a user value would silently fight it.
RESERVED_ENV_NAMES = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "NODE_RANK",
    }
)
RESERVED_ENV_PREFIXES = ("PET_", "TORCHELASTIC_")
CACHE_SET_PATTERN = r"^[A-Za-z0-9_-]+$"
# s3://<bucket>[/<prefix>]: S3 bucket naming rules (3-63 lowercase letters, digits, dots, dashes).
S3_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^*?]*)?$"
# Job names become Service names and pod hostnames' subdomain: DNS-1035, short enough that
# "<name>-compile-<rank>" stays within 63 characters.
MAX_JOB_NAME_LENGTH = 40
JOB_NAME_PATTERN = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


# Changing these under a running gang would mix two different jobs; runPolicy, profile and
# pod metadata stay mutable (suspend/resume, deadlines, the next attempt's profile window).
IMMUTABLE_SPEC_FIELDS = (
    "image",
    "command",
    "nodes",
    "processesPerNode",
    "instanceType",
    "neuronResourceName",
    "storage",
    "compile",
    "rendezvous",
    "precision",
    "dataDir",
    "outputDir",
)


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )


class InstanceTypeName(enum.StrEnum):
    TRN1_2XLARGE = "trn1.2xlarge"
    TRN1_32XLARGE = "trn1.32xlarge"
    TRN1N_32XLARGE = "trn1n.32xlarge"


assert {t.value for t in InstanceTypeName} == set(INSTANCE_TYPES), "enum follows the table"


class NeuronResourceName(enum.StrEnum):
    NEURON = NEURON_RESOURCE
    NEURON_DEVICE = NEURON_DEVICE_RESOURCE


class RendezvousBackend(enum.StrEnum):
    C10D = "c10d"
    ETCD = "etcd"


class Precision(enum.StrEnum):
    BF16 = "bf16"
    FP32 = "fp32"


class CleanPodPolicy(enum.StrEnum):
    ALL = "All"
    RUNNING = "Running"
    NONE = "None"


# Kubernetes types we pass through unchanged; the API server validates them in the pod.
KubeObject = Annotated[
    dict[str, Any], Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
]


class TrainingCommand(_Model):
    script: Annotated[str, Field(min_length=1)]
    """Path of the training script inside the image, run by torchrun on every node
    (for example /opt/trainium/trainium_training/pretrain.py)."""
    args: list[str] = []
    """Arguments passed to the script in both stages. The operator appends --data_dir,
    --output_dir, --steps_this_run (compile stage) and --resume (after a restart)."""


class StorageSpec(_Model):
    claim_name: str = "fsx-claim"
    """PersistentVolumeClaim (ReadWriteMany, e.g. FSx for Lustre) mounted in every pod;
    it holds the data, the compile cache, checkpoints and profiles."""
    mount_path: Annotated[str, Field(pattern=r"^/.*")] = "/data"
    """Where the claim is mounted in the containers."""


class CompileSpec(_Model):
    enabled: bool = True
    """Run neuron_parallel_compile with the same torchrun command before training, so
    training starts with a warm Neuron compile cache instead of compiling just in time."""
    steps: Annotated[int, Field(ge=1, le=1000)] = 10
    """Training steps run in graph-extraction mode (--steps_this_run)."""
    extra_args: list[str] = []
    """Extra script arguments used only in the compile stage."""
    cache_dir: str | None = None
    """Root of the Neuron compile cache on the shared volume; defaults to
    <mountPath>/neuron_cache."""
    cache_set: Annotated[str | None, Field(pattern=CACHE_SET_PATTERN)] = None
    """Cache name prefix; each node rank uses <cacheDir>/<cacheSet>_<rank> because the
    Neuron cache must not be shared by concurrent writers. Defaults to the job name.
    Never reuse a cache set in two jobs that run at the same time."""


class RendezvousSpec(_Model):
    backend: RendezvousBackend = RendezvousBackend.C10D
    """c10d: torchrun's rendezvous on the rank-0 pod through the job's headless Service.
    etcd: an external etcd (v2 API) server, as the AWS EKS tutorial uses."""
    endpoint: str | None = None
    """host:port of the etcd server; required when backend is etcd (e.g. etcd-server:2379)."""
    port: Annotated[int, Field(ge=1024, le=65535)] = 29400
    """c10d rendezvous port on the rank-0 pod."""
    timeout_seconds: Annotated[int, Field(ge=10)] = 900
    """How long workers wait for all nodes to join."""


# A Kubernetes resource quantity: a decimal number and one SI, binary or exponent suffix.
QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$"
Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN)]


class ResourceOverrides(_Model):
    requests: dict[str, Quantity] = {}
    """Extra requests per training/compile container, e.g. cpu and memory."""
    limits: dict[str, Quantity] = {}
    """Extra or overriding limits (Neuron and EFA counts default from the instance type)."""


class PodMetadata(_Model):
    labels: dict[str, str] = {}
    """Labels added to every pod."""
    annotations: dict[str, str] = {}
    """Annotations added to every pod."""


class RunPolicy(_Model):
    backoff_limit: Annotated[int, Field(ge=0)] = 3
    """Gang restarts allowed after training-process failures (non-zero exits) before the
    job fails."""
    infrastructure_backoff_limit: Annotated[int, Field(ge=0)] = 5
    """Gang restarts allowed after infrastructure failures (node lost, eviction,
    disruption, pod deleted); counted separately from backoffLimit."""
    active_deadline_seconds: Annotated[int | None, Field(ge=1)] = None
    """Fail the job when it has been active (not suspended) this long."""
    ttl_seconds_after_finished: Annotated[int | None, Field(ge=0)] = None
    """Delete the finished TrainingJob (and everything it owns) after this many seconds."""
    clean_pod_policy: CleanPodPolicy = CleanPodPolicy.RUNNING
    """Pods deleted when the job finishes: Running (default: stop what still runs, keep
    finished pods and their logs), All, or None."""
    suspend: bool = False
    """Suspend: delete the pods and the PodGroup; setting it back to false resumes from
    the last checkpoint with a new attempt."""
    node_lost_grace_period_seconds: Annotated[int, Field(ge=0)] = 30
    """How long a node may be NotReady before its pods are force-deleted and the gang
    restarts elsewhere."""
    startup_timeout_seconds: Annotated[int, Field(ge=1)] = 900
    """How long a gang's pods may take to start once one of them is placed on a node or cannot
    start (image pull, container config, a missing claim). Then the job fails with the pod's
    reason, or, when nothing names a cause, the gang restarts (infrastructureBackoffLimit).
    Waiting in the Volcano queue for capacity never times out."""


class SchedulingSpec(_Model):
    queue: str = "default"
    """Volcano queue of the job's PodGroups."""
    priority_class_name: str | None = None
    """PriorityClass of the pods and PodGroups."""
    scheduler_name: str = "volcano"
    """Scheduler of the pods; Volcano does gang scheduling through the PodGroup."""


class ProfileSpec(_Model):
    enabled: bool = False
    """Turn on the trainium-operator profiler in every training process."""
    start_step: Annotated[int, Field(ge=0)] = 10
    """First step captured in detail (step markers are recorded for the whole run)."""
    end_step: Annotated[int, Field(ge=0)] = 20
    """Last step captured in detail."""
    output_dir: str | None = None
    """Root of profiles on the shared volume; defaults to <mountPath>/profiles. Each
    attempt writes <outputDir>/<namespace>/<job>/<attempt>."""
    neuron_device_profile: bool = False
    """Also capture the Neuron runtime's system and device profiles (NEURON_RT_INSPECT_*)."""
    s3_uri: Annotated[str | None, Field(pattern=S3_URI_PATTERN, max_length=1024)] = None
    """Upload each finished attempt's profile to <s3Uri>/<namespace>/<job>/<attempt>/ (for
    example s3://my-bucket/profiles), from a short pod that mounts the claim read-only and
    runs with spec.serviceAccountName (IRSA or EKS Pod Identity: never static keys). Defaults
    to the operator's chart value profileUpload.s3Uri. An upload failure never fails the job:
    it is a Warning event and the ProfileUploaded condition."""


_CROSS_FIELD_RULES: list[dict[str, str]] = [
    {
        "rule": "self.rendezvous.backend != 'etcd' || has(self.rendezvous.endpoint)",
        "message": "spec.rendezvous.endpoint is required when spec.rendezvous.backend is etcd "
        "(for example etcd-server:2379)",
        "fieldPath": ".rendezvous.endpoint",
    },
    {
        "rule": "self.profile.endStep >= self.profile.startStep",
        "message": "spec.profile.endStep must be greater than or equal to spec.profile.startStep",
        "fieldPath": ".profile.endStep",
    },
    {
        "rule": "!has(self.processesPerNode) || self.processesPerNode <= ("
        + " : ".join(
            f"self.instanceType == '{t.name}' ? {t.neuron_cores}" for t in INSTANCE_TYPES.values()
        )
        + " : 0)",
        "message": "spec.processesPerNode cannot exceed the NeuronCores of spec.instanceType "
        "(trn1.2xlarge: 2, trn1.32xlarge and trn1n.32xlarge: 32)",
        "fieldPath": ".processesPerNode",
    },
    {
        "rule": "!has(self.env) || self.env.all(e, !(e.name in ["
        + ", ".join(f"'{n}'" for n in sorted(RESERVED_ENV_NAMES))
        + "]) && "
        + " && ".join(f"!e.name.startsWith('{p}')" for p in RESERVED_ENV_PREFIXES)
        + ")",
        "message": "spec.env must not set torchrun's reserved names (MASTER_ADDR, MASTER_PORT, "
        "RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE, ... or PET_*/TORCHELASTIC_*): the operator "
        "and torchrun set them",
        "fieldPath": ".env",
    },
]


class EnvVar(_Model):
    model_config = ConfigDict(extra="allow")
    name: Annotated[str, Field(min_length=1)]
    """Environment variable name."""
    value: str | None = None
    """Literal value."""
    value_from: KubeObject | None = None
    """Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef...)."""


class TrainingJobSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": list[Any](_CROSS_FIELD_RULES)}
    )

    image: Annotated[str, Field(min_length=1)]
    """Training container image (e.g. the trainium-operator training image on the AWS
    Neuron PyTorch training base)."""
    image_pull_policy: str = "IfNotPresent"
    """Image pull policy of the training and compile containers."""
    command: TrainingCommand
    """The training script and its arguments; torchrun runs it on every node."""
    nodes: Annotated[int, Field(ge=1, le=512)] = 1
    """Number of nodes (one pod per node, gang-scheduled)."""
    processes_per_node: Annotated[int | None, Field(ge=1)] = None
    """torchrun --nproc_per_node; defaults to the NeuronCores of the instance type (32 on
    trn1.32xlarge and trn1n.32xlarge, 2 on trn1.2xlarge). Never 'auto'."""
    instance_type: InstanceTypeName = InstanceTypeName(DEFAULT_INSTANCE_TYPE)
    """EC2 instance type of the nodes; selects nodes by node.kubernetes.io/instance-type
    and sets Neuron and EFA requests."""
    neuron_resource_name: NeuronResourceName = NeuronResourceName.NEURON
    """Extended resource used to request Trainium devices (the Neuron device plugin
    advertises aws.amazon.com/neuron; older plugins also aws.amazon.com/neurondevice)."""
    data_dir: str | None = None
    """Passed as --data_dir; defaults to the tutorial's layout
    <mountPath>/bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128."""
    output_dir: str | None = None
    """Passed as --output_dir (checkpoints, metrics); defaults to
    <mountPath>/output/<namespace>/<job>."""
    precision: Precision = Precision.BF16
    """Training precision; bf16 enables stochastic rounding on Neuron."""
    storage: StorageSpec = StorageSpec()
    """The shared volume."""
    compile: CompileSpec = CompileSpec()
    """The compile stage."""
    rendezvous: RendezvousSpec = RendezvousSpec()
    """torchrun rendezvous."""
    scheduling: SchedulingSpec = SchedulingSpec()
    """Gang scheduling through Volcano."""
    run_policy: RunPolicy = RunPolicy()
    """Restarts, deadlines, cleanup, suspension."""
    profile: ProfileSpec = ProfileSpec()
    """Profiling of the training stage."""
    env: list[EnvVar] = []
    """Extra environment of the training and compile containers; a name the operator also
    sets (e.g. CCOM_SOCKET_IFNAME) replaces the operator's value."""
    resources: ResourceOverrides = ResourceOverrides()
    """Container resource overrides."""
    node_selector: dict[str, str] = {}
    """Extra node selector labels (added to the instance-type selector)."""
    tolerations: list[KubeObject] = []
    """Extra tolerations (the Neuron and EFA taints are always tolerated)."""
    affinity: KubeObject | None = None
    """Pod affinity (Kubernetes Affinity)."""
    service_account_name: str | None = None
    """ServiceAccount of the pods (e.g. one with IRSA for S3 access)."""
    pod_metadata: PodMetadata = PodMetadata()
    """Labels and annotations for every pod."""

    @model_validator(mode="after")
    def _check_cross_fields(self) -> TrainingJobSpec:
        # Mirrors _CROSS_FIELD_RULES so `render` and the operator reject what the API
        # server would, with the same messages.
        problems: list[str] = []
        if self.rendezvous.backend is RendezvousBackend.ETCD and not self.rendezvous.endpoint:
            problems.append(_CROSS_FIELD_RULES[0]["message"])
        if self.profile.end_step < self.profile.start_step:
            problems.append(_CROSS_FIELD_RULES[1]["message"])
        cores = INSTANCE_TYPES[self.instance_type.value].neuron_cores
        if self.processes_per_node is not None and self.processes_per_node > cores:
            problems.append(_CROSS_FIELD_RULES[2]["message"])
        reserved = [
            e.name
            for e in self.env
            if e.name in RESERVED_ENV_NAMES or e.name.startswith(RESERVED_ENV_PREFIXES)
        ]
        if reserved:
            problems.append(f"{_CROSS_FIELD_RULES[3]['message']} (got {', '.join(reserved)})")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def effective_processes_per_node(self) -> int:
        if self.processes_per_node is not None:
            return self.processes_per_node
        return INSTANCE_TYPES[self.instance_type.value].default_processes_per_node
