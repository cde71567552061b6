"""The TrainingJob spec model: one source for validation, defaults and the CRD schema.

Field names mirror Kubeflow's PyTorchJob/TrainJob where they fit (`runPolicy`,
`cleanPodPolicy`, `backoffLimit`, `nprocPerNode` -> `processesPerNode`) so users feel at home.
Descriptions here become the CRD's OpenAPI descriptions, so `kubectl explain` teaches the API.
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import ConfigDict, Field, JsonValue, ValidationInfo, model_validator

from trainium_operator.api import kueue, object_names, pod_fields
from trainium_operator.api import topology as topology_model
from trainium_operator.api.instance_types import (
    DEFAULT_INSTANCE_TYPE,
    EFA_RESOURCE,
    INSTANCE_TYPES,
    NATIVE_STACK,
    NEURON_CORE_RESOURCE,
    NEURON_DEVICE_RESOURCE,
    NEURON_RESOURCE,
    XLA_STACK,
    InstanceType,
)
from trainium_operator.api.model_base import ApiModel
from trainium_operator.contract.workload_env import NEURON_STACKS

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
# Upper bounds of the spec's numbers: no tenant number is unbounded (restart counts size the
# status' history, deadlines and timeouts feed timers).
DAY = 86_400
YEAR = 365 * DAY
MAX_RESTARTS = 1000
MAX_STEP = 10**12
# s3://<bucket>[/<prefix>]: S3 bucket naming rules (3-63 lowercase letters, digits, dots, dashes).
S3_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^*?]*)?$"
# Job names become Service names and pod hostnames' subdomain: DNS-1035, short enough that
# "<name>-compile-<rank>" stays within 63 characters.
MAX_JOB_NAME_LENGTH = 40
JOB_NAME_PATTERN = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


# The validation context key for the ServiceAccount names no TrainingJob may run as (the
# chart's own accounts, which `trainium-operator run` is given; none outside the chart). The
# chart's admission policy refuses them too; this is the operator's own check for when it is
# not there.
RESERVED_SERVICE_ACCOUNTS = "reservedServiceAccounts"


def validation_context(reserved_service_accounts: Iterable[str] = ()) -> dict[str, Any]:
    """The context `TrainingJobSpec.model_validate` takes: what the operator was configured with."""
    return {RESERVED_SERVICE_ACCOUNTS: frozenset(reserved_service_accounts)}


def _reserved_service_accounts(info: ValidationInfo) -> frozenset[str]:
    context = info.context if isinstance(info.context, dict) else {}
    return frozenset(context.get(RESERVED_SERVICE_ACCOUNTS) or ())


# Changing these under a running gang would mix two different jobs; runPolicy, profile and
# pod metadata stay mutable (suspend/resume, deadlines, the next attempt's profile window).
IMMUTABLE_SPEC_FIELDS = (
    "image",
    "command",
    "nodes",
    "processesPerNode",
    "instanceType",
    "neuronResourceName",
    "deviceAllocation",
    "storage",
    "compile",
    "rendezvous",
    "precision",
    "dataDir",
    "outputDir",
    "lnc",
    "neuron",
)


class InstanceTypeName(enum.StrEnum):
    TRN1_2XLARGE = "trn1.2xlarge"
    TRN1_32XLARGE = "trn1.32xlarge"
    TRN1N_32XLARGE = "trn1n.32xlarge"
    TRN2_48XLARGE = "trn2.48xlarge"
    TRN2U_48XLARGE = "trn2u.48xlarge"


assert {t.value for t in InstanceTypeName} == set(INSTANCE_TYPES), "enum follows the table"


class NeuronResourceName(enum.StrEnum):
    NEURON = NEURON_RESOURCE
    NEURON_DEVICE = NEURON_DEVICE_RESOURCE


class DeviceAllocation(enum.StrEnum):
    DEVICE_PLUGIN = "devicePlugin"
    DRA = "dra"


class NeuronStack(enum.StrEnum):
    XLA = XLA_STACK
    NATIVE = NATIVE_STACK


assert tuple(s.value for s in NeuronStack) == NEURON_STACKS, "enum follows the contract"


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


# A command-line option name the operator passes a value to ("--data_dir", "-o").
FLAG_PATTERN = r"^-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*$"
Flag = Annotated[str, Field(pattern=FLAG_PATTERN)]
# The name of a Kubernetes or Volcano object (a PersistentVolumeClaim, PriorityClass,
# ServiceAccount, Volcano Queue): a DNS-1123 subdomain, as the API server requires of them. A
# name nothing could be created under is refused at admission, naming the field.
ObjectName = Annotated[str, Field(pattern=object_names.SUBDOMAIN_PATTERN, max_length=253)]


def _declares_names(node: object_names.Node) -> Any:
    """Pass-through content whose schema declares the object names inside it (and nothing
    else), so the API server refuses a name no object can have."""
    return Field(json_schema_extra=object_names.schema(node))


# Lists a job passes to its processes: bounded like every tenant input (the operator copies
# them into each of the gang's pods).
MAX_ARGS = 512
MAX_ARG_LENGTH = 16384
MAX_TOLERATIONS = 64
ArgList = Annotated[
    list[Annotated[str, Field(max_length=MAX_ARG_LENGTH)]], Field(max_length=MAX_ARGS)
]


class TrainingCommand(ApiModel):
    script: Annotated[str, Field(min_length=1)]
    """Path of the training script inside the image, run by torchrun on every node
    (for example /opt/trainium/trainium_training/pretrain.py)."""
    args: ArgList = []
    """Arguments passed to the script in both stages, exactly as given. The operator adds
    no argument of its own unless a field below asks for it; every container also gets
    TRAINIUM_* environment variables (attempt, restart count, resume, output and data
    directories) the script may read instead."""
    train_args: ArgList = []
    """Arguments added after args in the training stage only (compile-only arguments are
    spec.compile.extraArgs)."""
    resume_args: ArgList = []
    """Arguments added to a training gang that should continue from the last checkpoint
    (every training attempt after the first), e.g. ["--resume"]. TRAINIUM_RESUME=1 says
    the same in the environment."""
    data_dir_arg: Flag | None = None
    """Option the script takes its data directory from (e.g. --data_dir): the operator then
    adds it with spec.dataDir as its value. Unset: nothing is added."""
    output_dir_arg: Flag | None = None
    """Option the script takes its output directory from (e.g. --output_dir): the operator
    then adds it with the gang's own attempt directory, <outputDir>/attempt-<N> (compile:
    <outputDir>/compile-<N>). Unset: nothing is added."""


# Where a claim may be mounted: one of these directories or below it. An allowlist, not a list
# of system directories to avoid: a tenant-writable volume over an image's code or
# configuration (/usr, /etc, /opt/conda, a site-packages) is a way to run code in whatever
# runs that image. Segments are names (no ".", "..", empty or hidden ones).
STORAGE_MOUNT_ROOTS = ("data", "fsx", "mnt", "shared", "scratch", "home", "workspace")
_PATH_SEGMENTS = r"(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$"
MOUNT_PATH_PATTERN = "^/(" + "|".join(STORAGE_MOUNT_ROOTS) + ")" + _PATH_SEGMENTS
MAX_PATH_LENGTH = 255
_PYTHON_PACKAGES = r"/(site|dist)-packages(/|$)"
MOUNT_PATH_FIX = (
    "mount the claim at /data (the default) or below one of "
    + ", ".join(f"/{root}" for root in STORAGE_MOUNT_ROOTS)
    + ", with no '.', '..', empty or hidden path segment and no site-packages or dist-packages"
)


def mount_path_problem(path: str) -> str | None:
    """Why `path` may not be spec.storage.mountPath, or None."""
    if len(path) > MAX_PATH_LENGTH or not re.match(MOUNT_PATH_PATTERN, path):
        return f"{path[:MAX_PATH_LENGTH]!r} is refused: {MOUNT_PATH_FIX}"
    if re.search(_PYTHON_PACKAGES, path):
        return f"{path!r} is refused: it is a Python package directory; {MOUNT_PATH_FIX}"
    return None


def _mount_path_schema() -> Any:
    """The CRD's copy of mount_path_problem: pattern, length and a CEL rule."""
    return Field(
        json_schema_extra={
            "pattern": MOUNT_PATH_PATTERN,
            "maxLength": MAX_PATH_LENGTH,
            "x-kubernetes-validations": [
                {
                    "rule": f"!self.matches('{_PYTHON_PACKAGES}')",
                    "message": f"spec.storage.mountPath: {MOUNT_PATH_FIX}",
                }
            ],
        }
    )


class StorageSpec(ApiModel):
    claim_name: ObjectName = "fsx-claim"
    """PersistentVolumeClaim (ReadWriteMany, e.g. FSx for Lustre) mounted in every pod;
    it holds the data, the compile cache, checkpoints and profiles."""
    mount_path: Annotated[str, _mount_path_schema()] = "/data"
    """Where the claim is mounted in the training and compile containers: /data or below one
    of /data, /fsx, /mnt, /shared, /scratch, /home, /workspace (never over a system or Python
    package directory). Profile upload pods never use it: they mount only the profile's own
    directory, read-only, at a path of the operator's."""

    @model_validator(mode="after")
    def _check_mount_path(self) -> StorageSpec:
        problem = mount_path_problem(self.mount_path)
        if problem:
            raise ValueError(f"spec.storage.mountPath: {problem}")
        return self


class CompileSpec(ApiModel):
    enabled: bool = True
    """Run a compile stage with the same torchrun command before training, so training
    starts with a warm Neuron compile cache instead of compiling just in time. XLA stack:
    neuron_parallel_compile wraps the command (graph extraction, then parallel compiles).
    Native stack: the same gang runs the command itself for `steps` steps, filling the
    persistent NEFF cache (TORCH_NEURONX_NEFF_CACHE_DIR) that training then reads."""
    steps: Annotated[int, Field(ge=1, le=1000)] = 10
    """Training steps the compile stage runs (XLA: in graph-extraction mode):
    TRAINIUM_COMPILE_STEPS in the compile containers, and the value of stepsArg when that is
    set."""
    steps_arg: Flag | None = None
    """Option the script limits its steps with (e.g. --steps_this_run): the compile stage
    then adds it with spec.compile.steps. Unset: nothing is added."""
    extra_args: ArgList = []
    """Extra script arguments used only in the compile stage."""
    cache_dir: str | None = None
    """Root of the Neuron compile cache on the shared volume; defaults to
    <mountPath>/neuron_cache."""
    cache_set: Annotated[str | None, Field(pattern=CACHE_SET_PATTERN)] = None
    """Cache name prefix; each node rank uses its own cache because the Neuron cache must not
    be shared by concurrent writers: <cacheDir>/<cacheSet>_<rank> (XLA) or
    <cacheDir>/native/<cacheSet>_<rank>/<compiler key>-lnc<N> (native, so two compiler
    versions or logical-core configs never share entries). Defaults to the job name. Never
    reuse a cache set in two jobs that run at the same time."""


# A compiler version or cache key: one path segment.
CACHE_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class NeuronSpec(ApiModel):
    stack: NeuronStack | None = None
    """The Neuron PyTorch stack of the job's containers (TRAINIUM_NEURON_STACK). xla:
    torch-neuronx with PyTorch/XLA (frozen at Neuron 2.31, PyTorch 2.9), the compile stage is
    neuron_parallel_compile, the cache is NEURON_CC_FLAGS --cache_dir; trn1 runs only this.
    native: TorchNeuron (Neuron 2.33+, device "neuron", torch.compile backend "neuron",
    process-group backend "neuron"), the compile stage runs the command itself for
    spec.compile.steps steps into the persistent NEFF cache on the shared volume; Trainium2
    and later only. Defaults by instance type: xla on trn1/trn1n, native on trn2/trn2u. A
    stack the instance type does not run is refused."""
    compiler_version: Annotated[str | None, Field(pattern=CACHE_KEY_PATTERN, max_length=63)] = None
    """Native stack: the neuronx-cc version of the image (e.g. 2.28.7631.0), the key of its
    NEFF cache directory so programs of two compilers never mix. Unset: a digest of
    spec.image stands in (a new image gets a new, cold cache)."""
    compile_only: bool = False
    """Native stack, compile stage only: TORCH_NEURONX_COMPILE_ONLY=1, asking TorchNeuron to
    compile graphs without executing them. Off by default: the mechanism is named in the
    TorchNeuron docs but not documented (only third-party code sets this variable), so the
    compile stage runs the steps for real unless you turn it on."""
    hlo_cache: bool = False
    """Native stack: also keep TorchNeuron's HLO cache on the shared volume, next to the NEFF
    cache (TORCH_NEURONX_HLO_CACHE_DIR, TORCH_NEURONX_HLO_COMPILE_CACHE=1). Off by default:
    the docs name the HLO cache but not its variables (only third-party code sets them)."""


class RendezvousSpec(ApiModel):
    backend: RendezvousBackend = RendezvousBackend.C10D
    """c10d: torchrun's rendezvous on the rank-0 pod through the job's headless Service.
    etcd: an external etcd (v2 API) server, as the AWS EKS tutorial uses."""
    endpoint: str | None = None
    """host:port of the etcd server; required when backend is etcd (e.g. etcd-server:2379)."""
    port: Annotated[int, Field(ge=1024, le=65535)] = 29400
    """c10d rendezvous port on the rank-0 pod."""
    timeout_seconds: Annotated[int, Field(ge=10, le=DAY)] = 900
    """How long workers wait for all nodes to join."""


# A Kubernetes resource quantity: a decimal number and one SI, binary or exponent suffix.
QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$"
Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN)]


class ResourceOverrides(ApiModel):
    requests: dict[str, Quantity] = {}
    """Extra requests per training/compile container, e.g. cpu and memory."""
    limits: dict[str, Quantity] = {}
    """Extra or overriding limits (Neuron and EFA counts default from the instance type)."""


class RunPolicy(ApiModel):
    backoff_limit: Annotated[int, Field(ge=0, le=MAX_RESTARTS)] = 3
    """Gang restarts allowed after training-process failures (non-zero exits) before the
    job fails."""
    infrastructure_backoff_limit: Annotated[int, Field(ge=0, le=MAX_RESTARTS)] = 5
    """Gang restarts allowed after infrastructure failures (node lost, eviction,
    disruption, pod deleted); counted separately from backoffLimit."""
    active_deadline_seconds: Annotated[int | None, Field(ge=1, le=YEAR)] = None
    """Fail the job when it has been active (not suspended) this long."""
    ttl_seconds_after_finished: Annotated[int | None, Field(ge=0, le=YEAR)] = None
    """Delete the finished TrainingJob (and everything it owns) after this many seconds."""
    clean_pod_policy: CleanPodPolicy = CleanPodPolicy.RUNNING
    """Pods deleted when the job finishes: Running (default: stop what still runs, keep
    finished pods and their logs), All, or None."""
    suspend: bool = False
    """Suspend: delete the pods and the PodGroup; setting it back to false resumes from
    the last checkpoint with a new attempt."""
    node_lost_grace_period_seconds: Annotated[int, Field(ge=0, le=DAY)] = 30
    """How long a node may be NotReady before its pods are force-deleted and the gang
    restarts elsewhere."""
    startup_timeout_seconds: Annotated[int, Field(ge=1, le=DAY)] = 900
    """How long a gang's pods may take to start once one of them is placed on a node or cannot
    start (image pull, container config, a missing claim). Then the job fails with the pod's
    reason, or, when nothing names a cause, the gang restarts (infrastructureBackoffLimit).
    Waiting in the Volcano queue for capacity never times out."""


class TopologySpec(ApiModel):
    level: topology_model.TopologyLevel
    """The network domain the gang's nodes sit in, smallest first: ultraserver (the four
    trn2u.48xlarge instances NeuronLink joins; trn2u only), block (one layer-3 network node,
    the label topology.k8s.aws/network-node-layer-3), spine (layer 2), layer-1 (layer 1, the
    broadest)."""
    mode: topology_model.TopologyMode = topology_model.TopologyMode.REQUIRED
    """Required: the gang waits until it fits in one domain of the level (a Kueue
    podset-required-topology, a Volcano hard networkTopology). Preferred: it fits in the
    smallest domain that has room and spreads only when none has (Kueue
    podset-preferred-topology from that level up, Volcano soft)."""


class SchedulingSpec(ApiModel):
    queue: ObjectName = "default"
    """Volcano queue of the job's PodGroups. A job labelled kueue.x-k8s.io/queue-name is
    queued by Kueue in that LocalQueue instead, and this field is not used."""
    priority_class_name: ObjectName | None = None
    """PriorityClass of the pods and PodGroups. Under Kueue the label
    kueue.x-k8s.io/priority-class (a WorkloadPriorityClass) orders and preempts whole gangs;
    a PriorityClass also lets the kube-scheduler preempt single pods."""
    scheduler_name: ObjectName | None = None
    """Scheduler of the pods: by default volcano, which gang-schedules through the PodGroup,
    and for a job Kueue queues the kube-scheduler (default-scheduler), which places the pods
    once Kueue admitted the whole gang."""
    topology: TopologySpec | None = None
    """Where in the AWS network the gang's nodes must or should sit (docs/topology.md): Kueue's
    pod-set topology annotation on each pod of a job Kueue queues, the PodGroup's
    networkTopology under Volcano. Needs the schedulers' topology objects (the chart's
    topology.enabled writes them from the nodes' labels). Unset: a trn2u.48xlarge job of at
    most 4 nodes prefers one UltraServer where the operator keeps topology for its
    scheduler; any other job, no placement."""


class ProfileSpec(ApiModel):
    enabled: bool = False
    """Turn on the trainium-operator profiler in every training process."""
    start_step: Annotated[int, Field(ge=0, le=MAX_STEP)] = 10
    """First step captured in detail (step markers are recorded for the whole run)."""
    end_step: Annotated[int, Field(ge=0, le=MAX_STEP)] = 20
    """Last step captured in detail."""
    output_dir: Annotated[
        str | None, Field(pattern="^" + _PATH_SEGMENTS, max_length=MAX_PATH_LENGTH)
    ] = None
    """Root of profiles on the shared volume, below spec.storage.mountPath; defaults to
    <mountPath>/profiles. Each attempt writes <outputDir>/<namespace>/<job>/<attempt>."""
    neuron_device_profile: bool = False
    """Also capture Neuron Explorer's runtime (system) and device profiles, merged into the
    profile after training. Native stack: TorchNeuron's torch.profiler capture of the step
    window only (device, runtime, host CPU and memory). XLA stack: the runtime's environment
    capture (NEURON_RT_INSPECT_*), which covers the whole process: the newest events of the
    system trace, and each program's first execution as its device profile."""
    s3_uri: Annotated[str | None, Field(pattern=S3_URI_PATTERN, max_length=1024)] = None
    """Upload each finished attempt's profile to <s3Uri>/<namespace>/<job>/<attempt>/ (for
    example s3://my-bucket/profiles), from a short pod of the operator's own image and upload
    ServiceAccount (IRSA or EKS Pod Identity: never static keys) that mounts only the
    attempt's profile directory, read-only. Defaults
    to the operator's chart value profileUpload.s3Uri. An upload failure never fails the job:
    it is a Warning event and the ProfileUploaded condition."""


class StallAction(enum.StrEnum):
    REPORT = "Report"
    RESTART = "Restart"
    FAIL = "Fail"


class StragglerAction(enum.StrEnum):
    REPORT = "Report"
    REPLACE = "Replace"


_REPLACE_NEEDS_CHANNEL = {
    "rule": "!has(self.onStraggler) || self.onStraggler != 'Replace' || "
    "((!has(self.enabled) || self.enabled) && has(self.stragglerThreshold))",
    "message": "spec.health.onStraggler: Replace needs the health channel (spec.health.enabled "
    "true) and a spec.health.stragglerThreshold: stragglers are found from the ranks' reports",
    "fieldPath": ".onStraggler",
}


class HealthSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [dict(_REPLACE_NEEDS_CHANNEL)]}
    )

    enabled: bool = True
    """Every training rank reports its progress to the operator through the profiler (a small
    message every reportIntervalSeconds, authenticated by a projected ServiceAccount token
    bound to its pod). False: no token is mounted and nothing is sent."""
    report_interval_seconds: Annotated[float, Field(ge=0.2, le=300)] = 5.0
    """Seconds between one rank's progress messages."""
    total_steps: Annotated[int | None, Field(ge=1, le=MAX_STEP)] = None
    """The steps the training runs in all, for status.progress.eta (the ETA column)."""
    stall_timeout_seconds: Annotated[float | None, Field(ge=1, le=604800)] = None
    """A gang none of whose ranks entered a new step for this long is Stalled. Default: max(3 x
    the recent median step time, 60 s). Never below 3 x reportIntervalSeconds (the operator
    hears of a step only that often). Raise it above the longest pause between two steps
    (a checkpoint save, an evaluation) where that exceeds the default."""
    on_stall: StallAction = StallAction.REPORT
    """What a stall leads to, once every rank's Python stacks are written (or their bound
    passed): Report (the Stalled condition and a Warning event, cleared when progress resumes),
    Restart (the gang restarts, counted in status.restarts.stall) or Fail (the job fails with
    reason StallTimeout)."""
    max_stall_restarts: Annotated[int, Field(ge=0, le=1000)] = 3
    """Stall restarts allowed (onStall: Restart); one more stall then fails the job."""
    straggler_threshold: Annotated[float | None, Field(ge=0.05, le=10)] = 0.2
    """A rank whose median step time over its latest 16 steps exceeds the median of the other
    ranks' by more than this fraction (0.2: 20 %) is a straggler: named in status.stragglers
    and a Warning event. Null: not checked."""
    on_straggler: StragglerAction = StragglerAction.REPORT
    """What a straggler leads to: Report (status.stragglers and a Warning event) or Replace
    (once it stayed a straggler for stragglerPersistenceSeconds and a whole new 16-step window,
    its node is cordoned, spec.unschedulable with trainium.dev/cordon-* annotations naming the
    job and why, and the gang restarts for the scheduler to place it elsewhere, counted in
    status.restarts.straggler). Never more than one node per replacement, and none when fewer
    than spec.nodes other schedulable Ready nodes of the instance type exist. Replace is the
    cluster admin's opt-in: off (the chart's health.stragglerReplacement.enabled: false, the
    default) it is refused at admission, or only reported by the operator; on, it needs verb
    use on trainingjobs/stragglerreplacement in the namespace, and the operator cordons at
    most its cluster-wide budget of nodes at once."""
    straggler_persistence_seconds: Annotated[float, Field(ge=1, le=604800)] = 600
    """onStraggler: Replace only: how long a rank must have been a straggler without a break
    (and at least 16 more steps) before its node is replaced."""
    max_straggler_replacements: Annotated[int, Field(ge=0, le=10)] = 2
    """onStraggler: Replace only: node replacements allowed for this job; past them stragglers
    are only reported."""

    @model_validator(mode="after")
    def _check_straggler_action(self) -> HealthSpec:
        # Mirrors _REPLACE_NEEDS_CHANNEL (the CRD's rule) for `render` and the operator.
        replace = self.on_straggler is StragglerAction.REPLACE
        if replace and (not self.enabled or self.straggler_threshold is None):
            raise ValueError(_REPLACE_NEEDS_CHANNEL["message"])
        return self


class PreflightAction(enum.StrEnum):
    EXCLUDE = "Exclude"
    CORDON = "Cordon"


class PreflightSpec(ApiModel):
    enabled: bool | None = None
    """Check each new gang before its compile or training command starts (docs/preflight.md):
    every node's devices (the count and state its instance type promises) and throughput, a
    short all-reduce across exactly the gang's nodes, and each node's bandwidth to its ring
    neighbours, judged against the other nodes' median. An unfit node is named in
    status.preflight and a Warning event, and the gang restarts without it (this job's pods
    avoid the node; nothing else changes on the node). Unset: the operator's default for
    multi-node jobs (the chart's preflight.multiNodeDefault, off unless the admin turns it on);
    single-node jobs are never checked unless this is true."""
    timeout_seconds: Annotated[int, Field(ge=30, le=3600)] = 300
    """How long the whole check may take on a node, the gang's rendezvous included. A gang that
    does not finish it in time restarts (counted against maxRetries)."""
    threshold: Annotated[float, Field(ge=0.05, le=0.9)] = 0.25
    """A node whose device throughput or network bandwidth is below (1 - threshold) x the other
    nodes' median is unfit (0.25: under 75 % of the median)."""
    max_retries: Annotated[int, Field(ge=0, le=10)] = 3
    """Gangs restarted after a failed preflight; one more failure fails the job with reason
    PreflightFailed."""
    on_unfit: PreflightAction = PreflightAction.EXCLUDE
    """What an unfit node leads to besides this job's restart without it. Exclude: this job's
    later pods avoid it (a required node affinity); nothing changes on the node. Cordon: it is
    also cordoned (spec.unschedulable, trainium.dev/cordon-* annotations naming the job and
    its figure), within the operator's cluster-wide cordon budget, which it shares with
    onStraggler: Replace. Cordon is the cluster admin's opt-in, as Replace is: off (the chart's
    health.stragglerReplacement.enabled: false, the default) it is refused at admission, and
    an operator without a budget only excludes; on, it needs verb use on
    trainingjobs/stragglerreplacement in the namespace."""


def _cores_expression(shape: InstanceType) -> str:
    """CEL: the logical NeuronCores of one instance type at the job's spec.lnc."""
    if not shape.supports_lnc:
        return str(shape.neuron_cores)
    others = [lnc for lnc in shape.lnc_options if lnc != shape.default_lnc]
    expression = str(shape.logical_cores())
    for lnc in others:
        expression = f"(has(self.lnc) && self.lnc == {lnc} ? {shape.logical_cores(lnc)} : " + (
            f"{expression})"
        )
    return expression


def _cores_summary() -> str:
    parts = []
    for shape in INSTANCE_TYPES.values():
        if shape.supports_lnc:
            per_lnc = ", ".join(f"{shape.logical_cores(n)} at lnc {n}" for n in shape.lnc_options)
            parts.append(f"{shape.name}: {per_lnc}")
        else:
            parts.append(f"{shape.name}: {shape.neuron_cores}")
    return "; ".join(parts)


_LNC_TYPES = [t for t in INSTANCE_TYPES.values() if t.supports_lnc]


def _types_running(stack: NeuronStack) -> list[str]:
    return [t.name for t in INSTANCE_TYPES.values() if stack.value in t.neuron_stacks]


def _effective_stack_expression() -> str:
    """CEL: spec.neuron.stack, or the instance type's default stack when it is unset."""
    by_default = [t.name for t in INSTANCE_TYPES.values() if t.default_stack == XLA_STACK]
    return (
        "(has(self.neuron) && has(self.neuron.stack) ? self.neuron.stack : "
        f"(self.instanceType in {by_default} ? '{XLA_STACK}' : '{NATIVE_STACK}'))"
    )


def _stack_support_summary() -> str:
    return "; ".join(f"{s.value}: {', '.join(_types_running(s))}" for s in NeuronStack)


# Nodes of one UltraServer (every UltraServer type of the table has the same).
_ULTRASERVER_NODES = min(
    t.ultraserver_nodes for t in INSTANCE_TYPES.values() if t.ultraserver_nodes
)
_NO_LEGACY_DEVICE_TYPES = [t.name for t in INSTANCE_TYPES.values() if not t.legacy_device_resource]
_LEGACY_DEVICE_REASON = (
    f"{NEURON_DEVICE_RESOURCE} has not been advertised since Neuron 2.20 and no device plugin "
    f"for {', '.join(_NO_LEGACY_DEVICE_TYPES)} ever advertised it, so no such node could run "
    "the pods"
)
_LEGACY_DEVICE_NAME_RULE = {
    "rule": "!has(self.neuronResourceName) || "
    f"self.neuronResourceName != '{NEURON_DEVICE_RESOURCE}' || "
    f"!(self.instanceType in {_NO_LEGACY_DEVICE_TYPES})",
    "message": f"spec.neuronResourceName: {_LEGACY_DEVICE_REASON}; remove spec.neuronResourceName "
    f"(the default, {NEURON_RESOURCE}, is what the plugin advertises)",
    "fieldPath": ".neuronResourceName",
}
_LEGACY_DEVICE_LIMIT_RULE = {
    "rule": "!has(self.resources) || !(self.instanceType in "
    f"{_NO_LEGACY_DEVICE_TYPES}) || ("
    f"(!has(self.resources.limits) || !('{NEURON_DEVICE_RESOURCE}' in self.resources.limits)) && "
    f"(!has(self.resources.requests) || !('{NEURON_DEVICE_RESOURCE}' in self.resources.requests)))",
    "message": f"spec.resources: {_LEGACY_DEVICE_REASON}; remove {NEURON_DEVICE_RESOURCE} from "
    f"spec.resources.limits and spec.resources.requests (the operator requests {NEURON_RESOURCE} "
    "for the instance type's devices)",
    "fieldPath": ".resources",
}


def _legacy_device_problems(spec: TrainingJobSpec) -> list[str]:
    """Mirrors the two rules above: aws.amazon.com/neurondevice on a type whose plugins never
    advertised it."""
    if INSTANCE_TYPES[spec.instance_type.value].legacy_device_resource:
        return []
    problems = []
    if spec.neuron_resource_name is NeuronResourceName.NEURON_DEVICE:
        problems.append(_LEGACY_DEVICE_NAME_RULE["message"])
    if NEURON_DEVICE_RESOURCE in {*spec.resources.limits, *spec.resources.requests}:
        problems.append(_LEGACY_DEVICE_LIMIT_RULE["message"])
    return problems


_DRA = DeviceAllocation.DRA.value
_PLUGIN_RESOURCES = [NEURON_RESOURCE, NEURON_DEVICE_RESOURCE, NEURON_CORE_RESOURCE, EFA_RESOURCE]
_DRA_NO_PLUGIN_RESOURCES_RULE = {
    # One `in` per name (constant cost): a comprehension over the author's map would be
    # costed by its unbounded size and exceed the API server's CEL budget.
    "rule": f"!has(self.deviceAllocation) || self.deviceAllocation != '{_DRA}' || "
    "!has(self.resources) || ("
    "(!has(self.resources.limits) || "
    + " && ".join(f"!('{r}' in self.resources.limits)" for r in _PLUGIN_RESOURCES)
    + ") && (!has(self.resources.requests) || "
    + " && ".join(f"!('{r}' in self.resources.requests)" for r in _PLUGIN_RESOURCES)
    + "))",
    "message": "spec.resources: with spec.deviceAllocation dra a node publishes its Neuron devices "
    "and EFA interfaces through DRA, not as " + ", ".join(_PLUGIN_RESOURCES) + " (AWS: never "
    "the DRA driver and the device plugin on one node), so a pod requesting them never "
    "schedules; remove them (the operator claims the instance type's devices)",
    "fieldPath": ".resources",
}


def _dra_problems(spec: TrainingJobSpec) -> list[str]:
    """Mirrors the rule above (spec.neuronResourceName, defaulted by the API server, is not
    used under dra)."""
    if spec.device_allocation is not DeviceAllocation.DRA:
        return []
    problems = []
    named = {*spec.resources.limits, *spec.resources.requests} & set(_PLUGIN_RESOURCES)
    if named:
        problems.append(
            f"{_DRA_NO_PLUGIN_RESOURCES_RULE['message']} (got {', '.join(sorted(named))})"
        )
    return problems


_PROFILE_ON_CLAIM = {
    "rule": "!has(self.profile.outputDir) || "
    "self.profile.outputDir.startsWith(self.storage.mountPath + '/')",
    "message": "spec.profile.outputDir must be below spec.storage.mountPath: the profile is "
    "on the claim, where its upload pod reads it",
    "fieldPath": ".profile.outputDir",
}


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
            f"self.instanceType == '{t.name}' ? {_cores_expression(t)}"
            for t in INSTANCE_TYPES.values()
        )
        + " : 0)",
        "message": "spec.processesPerNode cannot exceed the (logical) NeuronCores of "
        f"spec.instanceType ({_cores_summary()})",
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
    {
        "rule": "!has(self.lnc) || "
        + " || ".join(
            f"(self.instanceType == '{t.name}' && self.lnc in {list(t.lnc_options)})"
            for t in _LNC_TYPES
        ),
        "message": "spec.lnc (the logical NeuronCore config) applies only to Trainium2 instance "
        "types (" + ", ".join(t.name for t in _LNC_TYPES) + ", values 1 or 2); remove it for trn1",
        "fieldPath": ".lnc",
    },
    {
        "rule": "!has(self.neuron) || !has(self.neuron.stack) || "
        + " || ".join(
            f"(self.neuron.stack == '{s.value}' && self.instanceType in {_types_running(s)})"
            for s in NeuronStack
        ),
        "message": "spec.neuron.stack is not supported on spec.instanceType ("
        + _stack_support_summary()
        + "; TorchNeuron, the native stack, does not run on Trn1): remove spec.neuron.stack "
        "for the instance type's default or pick a type that runs the stack",
        "fieldPath": ".neuron.stack",
    },
    {
        "rule": "!has(self.neuron) || !((has(self.neuron.compileOnly) && self.neuron.compileOnly)"
        " || (has(self.neuron.hloCache) && self.neuron.hloCache)) || "
        f"{_effective_stack_expression()} == '{NATIVE_STACK}'",
        "message": "spec.neuron.compileOnly and spec.neuron.hloCache are native-stack controls: "
        "remove them, or set spec.neuron.stack to native on an instance type that runs it",
        "fieldPath": ".neuron",
    },
    _PROFILE_ON_CLAIM,
    {
        "rule": "!has(self.scheduling) || !has(self.scheduling.topology) || "
        f"self.scheduling.topology.level != '{topology_model.TopologyLevel.ULTRASERVER.value}' || "
        f"self.instanceType in {topology_model.ultraserver_types()}",
        "message": "spec.scheduling.topology.level: ultraserver applies only to UltraServer "
        f"instance types ({', '.join(topology_model.ultraserver_types())}); use block, spine "
        "or layer-1",
        "fieldPath": ".scheduling.topology.level",
    },
    {
        "rule": "!has(self.scheduling) || !has(self.scheduling.topology) || "
        f"self.scheduling.topology.level != '{topology_model.TopologyLevel.ULTRASERVER.value}' || "
        "(has(self.scheduling.topology.mode) && "
        f"self.scheduling.topology.mode == '{topology_model.TopologyMode.PREFERRED.value}') || "
        f"self.nodes <= {_ULTRASERVER_NODES}",
        "message": f"spec.scheduling.topology: an UltraServer holds {_ULTRASERVER_NODES} nodes, "
        "so a larger gang can never fit in one (Required would wait forever): use mode "
        "Preferred, or level block",
        "fieldPath": ".scheduling.topology",
    },
    _LEGACY_DEVICE_NAME_RULE,
    _LEGACY_DEVICE_LIMIT_RULE,
    _DRA_NO_PLUGIN_RESOURCES_RULE,
]


class EnvVar(ApiModel):
    model_config = ConfigDict(extra="allow")
    name: Annotated[str, Field(min_length=1)]
    """Environment variable name."""
    value: str | None = None
    """Literal value."""
    value_from: Annotated[KubeObject | None, _declares_names(pod_fields.ENV_VAR_SOURCE)] = None
    """Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef...)."""


# Pod fields the operator sets from its own spec fields or owns outright (api/pod_fields.py):
# a podTemplate that sets them is refused, saying what to use instead.
PROTECTED_POD_FIELDS: dict[str, str] = {
    name: fix for name, (fix, _) in pod_fields.RESERVED_POD_FIELDS.items()
}
TRAINING_CONTAINER = "trainer"
# Fields of the training container the operator computes.
PROTECTED_CONTAINER_FIELDS: dict[str, str] = {
    "image": "use spec.image",
    "imagePullPolicy": "use spec.imagePullPolicy",
    "command": "use spec.command",
    "args": "use spec.command.args",
    "resources": "use spec.resources",
    "env": "use spec.env",
}
# Label and annotation keys no job sets on its pods: the operator selects its pods on its own
# labels and writes Volcano's group annotation, and Kueue's keys decide which queue, group and
# priority a pod has (a pod handed to Kueue behind the operator's back would be held by both).
PROTECTED_LABEL_PREFIXES = ("trainium.dev/", "app.kubernetes.io/", kueue.RESERVED_PREFIX)
PROTECTED_ANNOTATION_PREFIXES = (kueue.RESERVED_PREFIX,)
PROTECTED_ANNOTATIONS = ("scheduling.k8s.io/group-name",)
# The health channel's token volume is contract/channel.TOKEN_VOLUME (api imports no
# profiler module; tests/unit/test_health_channel.py keeps the two equal).
HEALTH_TOKEN_VOLUME = "trainium-health-token"
HEALTH_TOKEN_DIR = "/var/run/secrets/trainium.dev/health"
OPERATOR_VOLUMES = ("dshm", "shared-data", HEALTH_TOKEN_VOLUME)


def _protected_pod_field_rules() -> list[dict[str, str]]:
    return [
        {
            "rule": f"!has(self.{name})",
            "message": f"spec.podTemplate.spec.{name} is set by the operator ({fix}); remove it",
            "fieldPath": f".{name}",
        }
        for name, fix in PROTECTED_POD_FIELDS.items()
    ]


def _metadata_rules(where: str) -> list[JsonValue]:
    """CEL rules refusing the protected label and annotation keys in `where` (a labels and
    annotations pair for the job's pods)."""
    label_checks = " && ".join(f"!k.startsWith('{p}')" for p in PROTECTED_LABEL_PREFIXES)
    annotation_checks = " && ".join(
        [f"k != '{a}'" for a in PROTECTED_ANNOTATIONS]
        + [f"!k.startsWith('{p}')" for p in PROTECTED_ANNOTATION_PREFIXES]
    )
    return [
        {
            "rule": f"!has(self.labels) || self.labels.all(k, {label_checks})",
            "message": f"{where}.labels must not set "
            + " or ".join(f"{p}*" for p in PROTECTED_LABEL_PREFIXES)
            + " labels: the operator selects its pods on its own, and Kueue's come from the "
            "TrainingJob's labels",
            "fieldPath": ".labels",
        },
        {
            "rule": "!has(self.annotations) || self.annotations.all(k, !(k in "
            f"{sorted(pod_fields.RESERVED_POD_ANNOTATIONS)}))",
            "message": f"{where}.annotations must not set "
            + ", ".join(sorted(pod_fields.RESERVED_POD_ANNOTATIONS))
            + f": {pod_fields.TOPOLOGY_FIX}",
            "fieldPath": ".annotations",
        },
        {
            "rule": f"!has(self.annotations) || self.annotations.all(k, {annotation_checks})",
            "message": f"{where}.annotations must not set "
            + ", ".join([*PROTECTED_ANNOTATIONS, *(f"{p}*" for p in PROTECTED_ANNOTATION_PREFIXES)])
            + ": the operator puts each pod in its stage's gang",
            "fieldPath": ".annotations",
        },
    ]


def metadata_problems(where: str, labels: dict[str, str], annotations: dict[str, str]) -> list[str]:
    """The protected keys among a pod metadata pair, each named with the fix (what the CEL
    rules of _metadata_rules refuse, for `render` and a job admitted before them)."""
    found: list[str] = []
    for label in labels:
        if label.startswith(PROTECTED_LABEL_PREFIXES):
            found.append(
                f"{where}.labels[{label}]: the operator selects its pods on trainium.dev/* and "
                "app.kubernetes.io/* labels, and sets Kueue's from the TrainingJob's own "
                f"{kueue.QUEUE_NAME_LABEL} and {kueue.PRIORITY_CLASS_LABEL} labels"
            )
    for annotation in annotations:
        if annotation in pod_fields.RESERVED_POD_ANNOTATIONS:
            found.append(
                f"{where}.annotations[{annotation}] is set by the operator: "
                f"{pod_fields.RESERVED_POD_ANNOTATIONS[annotation]}"
            )
        elif annotation in PROTECTED_ANNOTATIONS or annotation.startswith(
            PROTECTED_ANNOTATION_PREFIXES
        ):
            found.append(
                f"{where}.annotations[{annotation}] is set by the operator (the stage's gang: "
                "Volcano's PodGroup or Kueue's pod group)"
            )
    return found


class PodMetadata(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": _metadata_rules("spec.podMetadata")}
    )
    labels: dict[str, str] = {}
    """Labels added to every pod."""
    annotations: dict[str, str] = {}
    """Annotations added to every pod."""


class PodTemplateMetadata(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": _metadata_rules("spec.podTemplate.metadata")}
    )
    labels: dict[str, str] = {}
    """Labels added to every pod."""
    annotations: dict[str, str] = {}
    """Annotations added to every pod."""


def _pod_spec_schema(schema: dict[str, Any]) -> None:
    """The allowlist of api/pod_fields.py as the CRD's schema: the allowed fields and, to
    refuse them by name, the reserved ones; no others (the API server drops an unknown field,
    and refuses it, naming it, for a strict client such as kubectl)."""
    allowed = object_names.schema(pod_fields.POD_SPEC)
    reserved = {
        name: {**object_names.schema(node), "description": f"Refused: {fix}."}
        for name, (fix, node) in pod_fields.RESERVED_POD_FIELDS.items()
    }
    schema.pop("additionalProperties", None)
    schema["properties"] = {**allowed["properties"], **reserved}
    schema["x-kubernetes-validations"] = _protected_pod_field_rules()


class PodTemplatePodSpec(ApiModel):
    """A partial Kubernetes PodSpec merged over the pod the operator builds: only the fields
    api/pod_fields.py allows."""

    # Parsing keeps every field so that PodTemplate.problems can name each one it refuses.
    model_config = ConfigDict(extra="allow", json_schema_extra=_pod_spec_schema)
    volumes: list[KubeObject] = []
    """Volumes added to the pod's."""
    init_containers: list[KubeObject] = []
    """Init containers, run before the training container."""
    containers: list[KubeObject] = []
    """Sidecar containers, and the trainer entry merged into the training container."""
    image_pull_secrets: list[KubeObject] = []
    """Secrets for pulling the images."""
    security_context: KubeObject | None = None
    """The pod's PodSecurityContext."""


class PodTemplate(ApiModel):
    metadata: PodTemplateMetadata = PodTemplateMetadata()
    """Labels and annotations added to every pod."""
    spec: PodTemplatePodSpec = PodTemplatePodSpec()
    """Pod fields merged over what the operator builds, from an allowlist: volumes (of the
    allowed types), initContainers, sidecar containers, imagePullSecrets, securityContext,
    terminationGracePeriodSeconds, DNS settings and a few more (docs/jobs.md lists them); any
    other field is refused, naming it."""

    def problems(self, mount_path: str) -> list[str]:
        """What the schema cannot check: the training container entry and clashing names."""
        found: list[str] = []
        spec = self.spec.model_dump(by_alias=True, exclude_none=True)
        # The allowlist (fields, container fields, volume types, bounds) and the names in it.
        found += object_names.problems("spec.podTemplate.spec", spec, pod_fields.POD_SPEC)
        bounds = {
            "volumes": pod_fields.MAX_VOLUMES,
            "initContainers": pod_fields.MAX_INIT_CONTAINERS,
            "containers": pod_fields.MAX_CONTAINERS,
        }
        if any(len(spec.get(field) or []) > bound for field, bound in bounds.items()):
            return found  # the checks below walk these lists: not past their bounds
        found += metadata_problems(
            "spec.podTemplate.metadata", self.metadata.labels, self.metadata.annotations
        )
        for index, volume in enumerate(self.spec.volumes):
            if volume.get("name") in OPERATOR_VOLUMES:
                found.append(
                    f"spec.podTemplate.spec.volumes[{index}].name {volume.get('name')!r} is the "
                    f"operator's (it uses {', '.join(OPERATOR_VOLUMES)}); pick another name"
                )
        # Only string names can repeat; any other is a problem of its own above.
        names = [
            given
            for c in [*self.spec.init_containers, *self.spec.containers]
            if isinstance(given := c.get("name"), str)
        ]
        for index, container in enumerate(self.spec.containers):
            where = f"spec.podTemplate.spec.containers[{index}]"
            if container.get("name") is None:  # an invalid name is a problem of its own above
                found.append(f"{where}.name is required")
            if container.get("name") != TRAINING_CONTAINER:
                if not container.get("image"):
                    found.append(f"{where}.image is required for a sidecar container")
                continue
            for field, fix in PROTECTED_CONTAINER_FIELDS.items():
                if field in container:
                    found.append(
                        f"{where}.{field}: the {TRAINING_CONTAINER} container's {field} is set "
                        f"by the operator ({fix})"
                    )
            mounts = container.get("volumeMounts")
            if mounts is not None and not (
                isinstance(mounts, list) and all(isinstance(m, dict) for m in mounts)
            ):
                continue  # the names check above says what is wrong with its shape
            for mount in mounts or []:
                if mount.get("mountPath") in ("/dev/shm", mount_path, HEALTH_TOKEN_DIR):
                    found.append(
                        f"{where}.volumeMounts: {mount.get('mountPath')} is the operator's "
                        "mount (shared memory, spec.storage.mountPath or the health token)"
                    )
        for index, container in enumerate(self.spec.init_containers):
            if container.get("name") == TRAINING_CONTAINER:
                found.append(
                    f"spec.podTemplate.spec.initContainers[{index}].name {TRAINING_CONTAINER!r} "
                    "is the training container's name"
                )
        duplicates = sorted(n for n, count in Counter(names).items() if n and count > 1)
        if duplicates:
            found.append(
                "spec.podTemplate.spec.containers and initContainers: container names repeat: "
                + ", ".join(duplicates)
            )
        return found + _quantity_problems(spec)


# Any Kubernetes quantity the API server can decode (a negative one it then refuses by name).
_DECODABLE_QUANTITY = re.compile(r"^[+-]?" + QUANTITY_PATTERN.removeprefix("^"))


def _quantity_problems(pod_spec: dict[str, Any]) -> list[str]:
    """Malformed quantities in pass-through pod content: the API server cannot decode such a
    pod at all, and its 400 says "quantities must match the regular expression" without naming
    the field, so the spec check names it."""
    places: list[tuple[str, Any]] = []
    for field in ("initContainers", "containers"):
        for index, container in enumerate(pod_spec.get(field) or []):
            resources = container.get("resources")
            for kind in ("limits", "requests"):
                values = resources.get(kind) if isinstance(resources, dict) else None
                if isinstance(values, dict):
                    where = f"spec.podTemplate.spec.{field}[{index}].resources.{kind}"
                    places += [(f"{where}[{name}]", value) for name, value in values.items()]
    for index, volume in enumerate(pod_spec.get("volumes") or []):
        empty_dir = volume.get("emptyDir")
        if isinstance(empty_dir, dict) and "sizeLimit" in empty_dir:
            where = f"spec.podTemplate.spec.volumes[{index}].emptyDir.sizeLimit"
            places.append((where, empty_dir["sizeLimit"]))
    return [
        f"{where}: {value!r} is not a Kubernetes quantity (for example 500m, 2Gi)"
        for where, value in places
        if not (
            value is None  # null decodes as zero
            or (isinstance(value, int | float) and not isinstance(value, bool))
            or (isinstance(value, str) and _DECODABLE_QUANTITY.match(value))
        )
    ]


class TrainingJobSpec(ApiModel):
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
    processes_per_node: Annotated[int | None, Field(ge=1, le=128)] = None
    """torchrun --nproc_per_node; defaults to the (logical) NeuronCores of the instance type
    (32 on trn1.32xlarge and trn1n.32xlarge, 2 on trn1.2xlarge, 64 on trn2.48xlarge and
    trn2u.48xlarge at the default lnc 2). Never 'auto'."""
    instance_type: InstanceTypeName = InstanceTypeName(DEFAULT_INSTANCE_TYPE)
    """EC2 instance type of the nodes; selects nodes by node.kubernetes.io/instance-type
    and sets Neuron and EFA requests."""
    lnc: Annotated[int | None, Field(ge=1, le=2)] = None
    """Logical NeuronCore config on Trainium2 (trn2.48xlarge, trn2u.48xlarge): how many
    physical NeuronCores form one logical core. Defaults to 2 there (64 workers per node; 1
    gives 128). It sizes the gang and is passed to the pods' runtime (NEURON_LOGICAL_NC_CONFIG)
    and compiler (--logical-nc-config) so they agree; it does not change the nodes' setting.
    On EKS with the device plugin, LNC is set per node when it boots
    (/opt/aws/neuron/logical_nc_config in the launch template; Trn2 nodes default to 2),
    so a job with lnc 1 needs nodes configured for 1 (select them with spec.nodeSelector).
    Not allowed on trn1."""
    neuron_resource_name: NeuronResourceName = NeuronResourceName.NEURON
    """Extended resource used to request Trainium devices. aws.amazon.com/neuron is what the
    Neuron device plugin advertises. aws.amazon.com/neurondevice is the name plugins of Neuron
    2.19 and earlier also advertised (no longer since Neuron 2.20): only for trn1 nodes still
    running such a plugin; refused on Trainium2, whose plugins never had it. Not used with
    spec.deviceAllocation dra."""
    device_allocation: DeviceAllocation = DeviceAllocation.DEVICE_PLUGIN
    """How the pods get the instance type's Neuron devices and EFA interfaces. devicePlugin:
    extended resources in the trainer's limits (aws.amazon.com/neuron, vpc.amazonaws.com/efa),
    as the Neuron and EFA device plugins advertise them. dra: Dynamic Resource Allocation
    (Kubernetes 1.34+, the Neuron DRA driver and the EFA DRA driver DRANET on the nodes): each
    pod claims, through a ResourceClaimTemplate the operator owns, all of the instance type's
    devices as one connected group (DeviceClass neuron.aws.com, matchAttribute
    resource.aws.com/devicegroup16_id) with its EFA interfaces (DeviceClass
    efa.networking.k8s.aws), and on Trainium2 the job's LNC in the claim (NeuronConfig). dra
    needs the operator's chart value dra.enabled and a job Kueue queues (label
    kueue.x-k8s.io/queue-name): Volcano's queue and PodGroup accounting does not count claimed
    devices. Immutable."""
    data_dir: str | None = None
    """The training data (TRAINIUM_DATA_DIR, and the value of command.dataDirArg); defaults
    to the tutorial's layout <mountPath>/bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128."""
    output_dir: str | None = None
    """The root of the job's checkpoints and metrics (TRAINIUM_OUTPUT_ROOT); defaults to
    <mountPath>/output/<namespace>/<job>. Each gang writes only under its own attempt's
    directory, <outputDir>/attempt-<N> (compile: compile-<N>), passed as TRAINIUM_OUTPUT_DIR
    and as the value of command.outputDirArg; a resume reads earlier attempts' directories."""
    precision: Precision = Precision.BF16
    """Training precision; bf16 enables stochastic rounding on Neuron."""
    storage: StorageSpec = StorageSpec()
    """The shared volume."""
    neuron: NeuronSpec = NeuronSpec()
    """The Neuron PyTorch stack (xla or native) and the native stack's compile controls."""
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
    health: HealthSpec = HealthSpec()
    """Live health: the ranks' progress channel to the operator."""
    preflight: PreflightSpec = PreflightSpec()
    """A check of each new gang's nodes before it compiles or trains."""
    env: Annotated[list[EnvVar], Field(max_length=pod_fields.MAX_ENV)] = []
    """Extra environment of the training and compile containers; a name the operator also
    sets (e.g. CCOM_SOCKET_IFNAME) replaces the operator's value."""
    resources: ResourceOverrides = ResourceOverrides()
    """Container resource overrides."""
    node_selector: dict[str, str] = {}
    """Extra node selector labels (added to the instance-type selector)."""
    tolerations: Annotated[list[KubeObject], Field(max_length=MAX_TOLERATIONS)] = []
    """Extra tolerations (the Neuron and EFA taints are always tolerated)."""
    affinity: KubeObject | None = None
    """Pod affinity (Kubernetes Affinity)."""
    service_account_name: ObjectName | None = None
    """ServiceAccount of the pods (e.g. one with IRSA for S3 access)."""
    pod_metadata: PodMetadata = PodMetadata()
    """Labels and annotations for every pod."""
    pod_template: PodTemplate = PodTemplate()
    """A partial pod template merged over the pods the operator builds (volumes,
    volumeMounts of the trainer container, sidecars, initContainers, imagePullSecrets,
    securityContext, labels, annotations). Fields the operator owns (its resources,
    command, names, the labels it selects on) are refused with the field to use."""

    def preflight_on(self, multi_node_default: bool) -> bool:
        """Whether the job's gangs are preflighted: spec.preflight.enabled, else the operator's
        default for multi-node jobs."""
        if self.preflight.enabled is not None:
            return self.preflight.enabled
        return multi_node_default and self.nodes > 1

    @model_validator(mode="after")
    def _check_cross_fields(self, info: ValidationInfo) -> TrainingJobSpec:
        # Mirrors _CROSS_FIELD_RULES so `render` and the operator reject what the API
        # server would, with the same messages.
        problems: list[str] = []
        if self.rendezvous.backend is RendezvousBackend.ETCD and not self.rendezvous.endpoint:
            problems.append(_CROSS_FIELD_RULES[0]["message"])
        if self.profile.end_step < self.profile.start_step:
            problems.append(_CROSS_FIELD_RULES[1]["message"])
        shape = INSTANCE_TYPES[self.instance_type.value]
        if self.lnc is not None and (not shape.supports_lnc or self.lnc not in shape.lnc_options):
            problems.append(_CROSS_FIELD_RULES[4]["message"])
        cores = shape.logical_cores(self.lnc if shape.supports_lnc else None)
        if self.processes_per_node is not None and self.processes_per_node > cores:
            problems.append(_CROSS_FIELD_RULES[2]["message"])
        if self.neuron.stack is not None and self.neuron.stack.value not in shape.neuron_stacks:
            problems.append(f"{_CROSS_FIELD_RULES[5]['message']} (got {self.neuron.stack.value})")
        problems += _legacy_device_problems(self)
        problems += _dra_problems(self)
        native_controls = self.neuron.compile_only or self.neuron.hlo_cache
        if native_controls and self.effective_neuron_stack is not NeuronStack.NATIVE:
            problems.append(_CROSS_FIELD_RULES[6]["message"])
        reserved = [
            e.name
            for e in self.env
            if e.name in RESERVED_ENV_NAMES or e.name.startswith(RESERVED_ENV_PREFIXES)
        ]
        if reserved:
            problems.append(f"{_CROSS_FIELD_RULES[3]['message']} (got {', '.join(reserved)})")
        for index, variable in enumerate(self.env):
            problems += object_names.problems(
                f"spec.env[{index}].valueFrom", variable.value_from, pod_fields.ENV_VAR_SOURCE
            )
        problems += self.pod_template.problems(self.storage.mount_path.rstrip("/") or "/")
        problems += metadata_problems(
            "spec.podMetadata", self.pod_metadata.labels, self.pod_metadata.annotations
        )
        problems += self._topology_problems()
        output = self.profile.output_dir
        if output is not None and not output.startswith(self.storage.mount_path + "/"):
            problems.append(_PROFILE_ON_CLAIM["message"])
        if self.service_account_name in _reserved_service_accounts(info):
            problems.append(
                f"spec.serviceAccountName: {self.service_account_name} is an account of the "
                "trainium-operator itself (operator, profile UI or profile upload); no job may "
                "run as it"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _topology_problems(self) -> list[str]:
        """Mirrors the CRD's topology rules (_CROSS_FIELD_RULES 8 and 9)."""
        asked = self.scheduling.topology
        if asked is None or asked.level is not topology_model.TopologyLevel.ULTRASERVER:
            return []
        if not INSTANCE_TYPES[self.instance_type.value].ultraserver_nodes:
            return [_CROSS_FIELD_RULES[8]["message"]]
        if asked.mode is topology_model.TopologyMode.REQUIRED and self.nodes > _ULTRASERVER_NODES:
            return [_CROSS_FIELD_RULES[9]["message"]]
        return []

    @property
    def effective_processes_per_node(self) -> int:
        if self.processes_per_node is not None:
            return self.processes_per_node
        return self.logical_cores

    @property
    def world_size(self) -> int:
        """The gang's ranks: nodes x processes per node (what the health channel binds a rank's
        message to)."""
        return self.nodes * self.effective_processes_per_node

    @property
    def effective_lnc(self) -> int | None:
        """The logical NeuronCore config of the pods; None where the runtime has none (trn1)."""
        shape = INSTANCE_TYPES[self.instance_type.value]
        return (self.lnc or shape.default_lnc) if shape.supports_lnc else None

    @property
    def effective_neuron_stack(self) -> NeuronStack:
        """spec.neuron.stack, else the instance type's default (xla on trn1, native on trn2)."""
        if self.neuron.stack is not None:
            return self.neuron.stack
        return NeuronStack(INSTANCE_TYPES[self.instance_type.value].default_stack)

    @property
    def logical_cores(self) -> int:
        return INSTANCE_TYPES[self.instance_type.value].logical_cores(self.effective_lnc)
