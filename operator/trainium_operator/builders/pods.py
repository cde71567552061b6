"""Pure builders for the job's children: PodGroup, headless Service, compile and training pods."""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from decimal import Decimal

from trainium_operator.api import kueue, topology
from trainium_operator.api.instance_types import (
    EFA_RESOURCE,
    INSTANCE_TYPE_LABEL,
    INSTANCE_TYPES,
    LNC_COMPILER_FLAG,
    LNC_ENV,
    NEURON_RESOURCE,
)
from trainium_operator.api.objects import Obj
from trainium_operator.api.spec import (
    QUANTITY_PATTERN,
    TRAINING_CONTAINER,
    NeuronStack,
    PodTemplate,
    Precision,
    RendezvousBackend,
)
from trainium_operator.api.topology import Placement
from trainium_operator.builders import claims
from trainium_operator.builders.job import (
    LABEL_ATTEMPT,
    LABEL_JOB_NAME,
    LABEL_NODE_RANK,
    VOLCANO_GROUP,
    VOLCANO_GROUP_ANNOTATION,
    VOLCANO_VERSION,
    JobRef,
    Stage,
)
from trainium_operator.contract import channel as channel_contract
from trainium_operator.contract import neff_cache, preflight, workload_env
from trainium_operator.contract.channel import channel_env, stacks_dir
from trainium_operator.contract.neuron_env import neuron_inspect_env, torch_capture_env
from trainium_operator.contract.profiler_env import profiling_env

CONTAINER_NAME = TRAINING_CONTAINER
DEFAULT_SERVICE_ACCOUNT = "default"
SHM_VOLUME = "dshm"
DATA_VOLUME = "shared-data"
NEURON_PARALLEL_COMPILE = "neuron_parallel_compile"
MAX_PORT = 65535
# Taints used on Trainium node groups (Neuron device plugin and EFA docs); tolerating a
# taint a node does not have is harmless.
TRAINIUM_TOLERATIONS: tuple[Obj, ...] = (
    {"key": NEURON_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
    {"key": EFA_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
)

# The tightest security context Neuron and EFA allow; the pods pass Pod Security `baseline`.
# What keeps them from `restricted`:
# - runAsNonRoot: the Neuron DLC images (and the tutorial's, reference/trainium-eks.md §6) have
#   no USER and run as root; the device nodes the Neuron and EFA device plugins hand over
#   (/dev/neuron*, /dev/infiniband/uverbs*) are root-owned on the host, and the Neuron runtime
#   and libfabric open them as that user. The operator cannot know an image's UID; a job whose
#   image runs as a non-root user sets runAsNonRoot/runAsUser in spec.podTemplate.
# - IPC_LOCK, where a node needs it: EFA registers (pins) the collectives' buffers, which the
#   kernel charges against RLIMIT_MEMLOCK unless the process holds CAP_IPC_LOCK
#   (ib_umem_get, drivers/infiniband/core/umem.c). A container cannot raise its own ulimit
#   (AWS, "Install the EFA software in a container": the installer runs with
#   --skip-limit-conf, the limit is set when the container is created; the tutorial's image
#   does the same, reference §6), so it comes from the node's container runtime: EKS AMIs set
#   memlock unlimited (amazon-eks-ami changelog, "Update ulimit for memlock to unlimited").
#   IPC_LOCK is not in baseline's capability list, so it is not added by default; on a node
#   with a finite memlock limit a job adds it in spec.podTemplate (trainer container
#   securityContext.capabilities.add), where the admin allows it.
# Every other capability is dropped: torchrun, the Neuron runtime and libfabric need none of
# the runtime's defaults (NET_RAW, CHOWN, SETUID...) as the file owner of what they open.
TRAINING_POD_SECURITY_CONTEXT: Obj = {"seccompProfile": {"type": "RuntimeDefault"}}
TRAINING_CONTAINER_SECURITY_CONTEXT: Obj = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
}

_QUANTITY = re.compile(QUANTITY_PATTERN)


def scale_quantity(quantity: str, factor: int) -> str:
    """A Kubernetes quantity times a whole number, in the same unit ("64Gi" x 2 = "128Gi")."""
    match = _QUANTITY.match(quantity.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {quantity!r}")
    number, _, suffix = match.groups()
    suffix = suffix or ""
    scaled = Decimal(number) * factor
    text = format(scaled.normalize(), "f") if scaled != scaled.to_integral() else str(int(scaled))
    return f"{text}{suffix}"


def pod_requests(job: JobRef) -> dict[str, str]:
    """What the scheduler charges for one pod: requests, defaulting to limits as the API does."""
    resources = container_resources(job)
    return {**resources.get("limits", {}), **resources.get("requests", {})}


def podgroup(job: JobRef, stage: Stage, placement: Placement | None = None) -> Obj:
    # minResources is what Volcano's enqueue action checks against the cluster and the queue's
    # capability, so a job that cannot fit waits as a PodGroup instead of as pending pods.
    # networkTopology: where in the network Volcano may (hard) or should (soft) place the gang.
    spec: Obj = {
        "minMember": job.spec.nodes,
        "queue": job.spec.scheduling.queue,
        "minResources": {
            name: scale_quantity(value, job.spec.nodes)
            for name, value in sorted(pod_requests(job).items())
        },
    }
    if job.spec.scheduling.priority_class_name:
        spec["priorityClassName"] = job.spec.scheduling.priority_class_name
    network = topology.volcano_network_topology(placement)
    if network is not None:
        spec["networkTopology"] = network
    return {
        "apiVersion": f"{VOLCANO_GROUP}/{VOLCANO_VERSION}",
        "kind": "PodGroup",
        "metadata": job.metadata(job.podgroup_name(stage), stage),
        "spec": spec,
    }


def headless_service(job: JobRef) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": job.metadata(job.service_name),
        "spec": {
            "clusterIP": "None",
            # Rendezvous happens before any pod is Ready.
            "publishNotReadyAddresses": True,
            "selector": job.labels(),
            "ports": [
                {
                    "name": "rendezvous",
                    "port": job.spec.rendezvous.port,
                    "targetPort": job.spec.rendezvous.port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def network_policy(job: JobRef) -> Obj:
    """Isolates the job's pods (every stage's, and its upload pods) from other pods: they take
    connections only from each other (rendezvous, the collectives' TCP bootstrap, torchrun's
    store). Egress stays open: training reads S3 and other data sources, resolves DNS and
    reaches the rendezvous; the Lustre client runs in the node's kernel and EFA traffic
    bypasses the kernel network, so no NetworkPolicy applies to either."""

    def own_pods() -> Obj:  # a fresh dict each: YAML dumps a shared one as an anchor
        return {"matchLabels": {LABEL_JOB_NAME: job.name}}

    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": job.metadata(job.network_policy_name),
        "spec": {
            "podSelector": own_pods(),
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": own_pods()}]}],
        },
    }


def rendezvous_endpoint(job: JobRef, stage: Stage) -> str:
    rdzv = job.spec.rendezvous
    if rdzv.backend is RendezvousBackend.ETCD:
        assert rdzv.endpoint is not None  # guaranteed by spec validation
        return rdzv.endpoint
    host = f"{job.pod_hostname(stage, 0)}.{job.service_name}.{job.namespace}.svc"
    return f"{host}:{rdzv.port}"


def preflight_endpoint(job: JobRef, stage: Stage) -> str:
    """The preflight's rendezvous: on c10d, the rank-0 pod's port next to the stage's (the
    preflight's store may still be closing on rank 0 while a faster node's stage torchrun
    already reaches for its own); on etcd, the same server (the run ids keep them apart)."""
    rdzv = job.spec.rendezvous
    if rdzv.backend is RendezvousBackend.ETCD:
        return rendezvous_endpoint(job, stage)
    host = rendezvous_endpoint(job, stage).rsplit(":", 1)[0]
    port = rdzv.port + 1 if rdzv.port < MAX_PORT else rdzv.port - 1
    return f"{host}:{port}"


def script_args(job: JobRef, stage: Stage, attempt: int, *, resume: bool) -> list[str]:
    """The script's arguments: the user's, plus only what the spec opted into.

    The compile stage's arguments match training's except for the step limit and the
    compile-only extras, as neuron_parallel_compile needs (same graphs, fewer steps).
    """
    spec = job.spec
    command = spec.command
    args = list(command.args)
    if command.data_dir_arg:
        args += [command.data_dir_arg, job.data_dir]
    if command.output_dir_arg:
        args += [command.output_dir_arg, job.output_dir(stage, attempt)]
    if stage is Stage.COMPILE:
        if spec.compile.steps_arg:
            args += [spec.compile.steps_arg, str(spec.compile.steps)]
        return [*args, *spec.compile.extra_args]
    args += command.train_args
    if resume:
        args += command.resume_args
    return args


def should_resume(stage: Stage, attempt: int, resume: bool | None) -> bool:
    # The lifecycle says whether an earlier training gang ran (a compile-stage restart or a
    # suspend before training also raises the attempt); alone, any later attempt resumes.
    if stage is Stage.COMPILE:
        return False
    return resume if resume is not None else attempt > 0


def torchrun_command(
    job: JobRef, stage: Stage, attempt: int, *, resume: bool | None = None
) -> list[str]:
    """The torchrun argv. The XLA stack's compile stage wraps the same command in
    neuron_parallel_compile; the native stack's runs it as it is (for spec.compile.steps
    steps, through stepsArg or TRAINIUM_COMPILE_STEPS), compiling into the NEFF cache."""
    spec = job.spec
    argv = [
        "torchrun",
        f"--nnodes={spec.nodes}",
        f"--nproc_per_node={spec.effective_processes_per_node}",
        f"--rdzv_backend={spec.rendezvous.backend.value}",
        f"--rdzv_endpoint={rendezvous_endpoint(job, stage)}",
        f"--rdzv_id={job.rendezvous_id(stage, attempt)}",
        f"--rdzv_conf=timeout={spec.rendezvous.timeout_seconds}",
        # The operator restarts the whole gang; torchrun restarting ranks alone hangs
        # the collectives of the others.
        "--max_restarts=0",
        spec.command.script,
        *script_args(job, stage, attempt, resume=should_resume(stage, attempt, resume)),
    ]
    if stage is Stage.COMPILE and job.spec.effective_neuron_stack is NeuronStack.XLA:
        return [NEURON_PARALLEL_COMPILE, *argv]
    return argv


# After torchrun exits, fold each rank's Neuron runtime profile into its profile file; the
# job's exit code stays torchrun's. "$@" keeps the argv exact (no word splitting).
# The shell is PID 1 and ignores SIGTERM: it passes the signal on to torchrun (which stops its
# workers, whose profilers flush), waits for it, then merges the device profile and exits with
# torchrun's code. A second `wait` collects the exit code after the trap cut the first one short.
NEURON_PROFILE_MERGE_SCRIPT = (
    "term=0; "
    "trap 'term=1; kill -TERM \"$child\" 2>/dev/null' TERM INT; "
    '"$@" & child=$!; '
    'wait "$child"; rc=$?; '
    'if [ "$term" = 1 ]; then wait "$child"; rc=$?; fi; '
    "python3 -m trainium_operator.profiler.sources.neuron "
    '"$TRAINIUM_PROFILE_DIR" --node "$TRAINIUM_NODE_NAME" || true; exit $rc'
)


def preflight_command(job: JobRef, stage: Stage, attempt: int) -> list[str]:
    """The gang preflight (contract/preflight.py) before the stage's command: it meets the
    gang through the stage's rendezvous mechanism (`preflight_endpoint`), under a run id of
    its own."""
    spec = job.spec
    return preflight.argv(
        nodes=spec.nodes,
        rdzv_backend=spec.rendezvous.backend.value,
        rdzv_endpoint=preflight_endpoint(job, stage),
        rdzv_id=f"{job.rendezvous_id(stage, attempt)}-preflight",
        timeout_seconds=spec.preflight.timeout_seconds,
        threshold=spec.preflight.threshold,
        devices=preflight.DEVICES_NEURON,
        expected_devices=INSTANCE_TYPES[spec.instance_type.value].neuron_devices,
    )


def container_command(
    job: JobRef,
    stage: Stage,
    attempt: int,
    *,
    resume: bool | None = None,
    preflighted: bool = False,
) -> list[str]:
    """The trainer container's command: torchrun (wrapped for the device-profile merge or the
    native compile cache summary), after the gang preflight when `preflighted`, which execs it
    once the gang passed."""
    command = torchrun_command(job, stage, attempt, resume=resume)
    if stage is Stage.TRAIN and job.spec.profile.enabled and job.spec.profile.neuron_device_profile:
        command = ["/bin/sh", "-c", NEURON_PROFILE_MERGE_SCRIPT, "sh", *command]
    elif stage is Stage.COMPILE and job.spec.effective_neuron_stack is NeuronStack.NATIVE:
        # The pod's termination message then says what the cache holds (status.compile.cache).
        command = ["/bin/sh", "-c", neff_cache.SUMMARY_SCRIPT, "sh", *command]
    if preflighted:
        return [*preflight_command(job, stage, attempt), preflight.COMMAND_SEPARATOR, *command]
    return command


def avoid_nodes(pod_spec: Obj, nodes: Sequence[str]) -> None:
    """Keeps the pod off `nodes` (the job's preflight exclusions): a required node affinity on
    the node's name (`matchFields metadata.name NotIn`: the name itself, not a label that may
    differ from it), added to every term the pod's own affinity has (terms are alternatives;
    a requirement added to each holds for all of them)."""
    if not nodes:
        return
    requirement = {"key": "metadata.name", "operator": "NotIn", "values": list(nodes)}
    affinity = pod_spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term["matchFields"] = [*term.get("matchFields", []), dict(requirement)]


def _cache_env(job: JobRef, stage: Stage, rank: int) -> list[Obj]:
    """Where the stack's compiler caches, and the compiler's logical-core flag."""
    spec = job.spec
    lnc_flag = [f"{LNC_COMPILER_FLAG}={spec.effective_lnc}"] if spec.effective_lnc else []
    if spec.effective_neuron_stack is NeuronStack.XLA:
        flags = [f"--cache_dir={job.neuron_cache_dir(rank)}", *lnc_flag]
        return [
            {"name": "XLA_TRANSFER_SEED_ASYNC", "value": "1"},
            {"name": "NEURON_CC_FLAGS", "value": " ".join(flags)},
        ]
    cache_dir = job.native_cache_dir(rank)
    env: list[Obj] = [
        {"name": neff_cache.NEFF_CACHE_DIR_ENV, "value": neff_cache.neff_dir(cache_dir)},
    ]
    if lnc_flag:
        env.append({"name": "NEURON_CC_FLAGS", "value": " ".join(lnc_flag)})
    if spec.neuron.hlo_cache:
        env += [
            {"name": neff_cache.HLO_CACHE_DIR_ENV, "value": neff_cache.hlo_dir(cache_dir)},
            {"name": neff_cache.HLO_COMPILE_CACHE_ENV, "value": "1"},
        ]
    if stage is Stage.COMPILE and spec.neuron.compile_only:
        env.append({"name": neff_cache.COMPILE_ONLY_ENV, "value": "1"})
    return env


def _operator_env(
    job: JobRef, stage: Stage, attempt: int, rank: int, *, resume: bool, restarts: int
) -> list[Obj]:
    spec = job.spec
    env: list[Obj] = [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        # EFA and Neuron collectives settings from the AWS Trainium EKS sample.
        {"name": "FI_PROVIDER", "value": "efa"},
        {"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"},
        {"name": "FI_EFA_FORK_SAFE", "value": "1"},
        {"name": "CCOM_SOCKET_IFNAME", "value": "eth0"},
        {"name": "NEURON_RT_RESET_CORES", "value": "1"},
        *_cache_env(job, stage, rank),
        {"name": "HF_HOME", "value": job.transformers_cache_dir(rank)},
        # The workload contract (contract/workload_env.py): what the script may read.
        {"name": workload_env.JOB_NAME, "value": job.name},
        {"name": workload_env.JOB_NAMESPACE, "value": job.namespace},
        {"name": workload_env.JOB_UID, "value": job.uid},
        {"name": workload_env.STAGE, "value": stage.value},
        # Before the user's env, so a user value may refer to it as $(TRAINIUM_NODE_RANK).
        {"name": workload_env.NODE_RANK, "value": str(rank)},
        {"name": workload_env.ATTEMPT, "value": str(attempt)},
        {"name": workload_env.RESTART_COUNT, "value": str(restarts)},
        {"name": workload_env.RESUME, "value": "1" if resume else "0"},
        {"name": workload_env.OUTPUT_DIR, "value": job.output_dir(stage, attempt)},
        {"name": workload_env.OUTPUT_ROOT, "value": job.output_root},
        {"name": workload_env.DATA_DIR, "value": job.data_dir},
        {"name": workload_env.PRECISION, "value": spec.precision.value},
        # Absent reads as xla (workload_env), so XLA-stack pods stay as they were before it.
        *(
            [{"name": workload_env.NEURON_STACK, "value": NeuronStack.NATIVE.value}]
            if spec.effective_neuron_stack is NeuronStack.NATIVE
            else []
        ),
        {
            "name": workload_env.NODE_NAME,
            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
        },
    ]
    if stage is Stage.COMPILE:
        env.append({"name": workload_env.COMPILE_STEPS, "value": str(spec.compile.steps)})
    if spec.effective_lnc is not None:
        # Trainium2: the LNC the gang is sized for, in the runtime's documented variable, next
        # to the compiler flag of the same value (the two must agree). It states the job's LNC;
        # the node's own setting (boot-time file or DRA claim) is what the EKS docs say sets
        # it, and it must match: this variable is not documented to override it.
        env.append({"name": LNC_ENV, "value": str(spec.effective_lnc)})
    if spec.precision is Precision.BF16:
        # XLA_DOWNCAST_BF16 is deprecated since torch-xla 2.4; the script casts the model
        # to bf16 (TRAINIUM_PRECISION) and the runtime rounds stochastically.
        env.append({"name": "NEURON_RT_STOCHASTIC_ROUNDING_EN", "value": "1"})
    if stage is Stage.TRAIN and job.health_channel:
        assert job.health_url is not None
        channel = channel_env(
            job.health_url,
            spec.health.report_interval_seconds,
            stacks_dir(job.profile_dir(attempt)),
        )
        env += [{"name": name, "value": value} for name, value in channel.items()]
    if stage is Stage.TRAIN and spec.profile.enabled:
        profile_dir = job.profile_dir(attempt)
        profiling = profiling_env(profile_dir, spec.profile.start_step, spec.profile.end_step)
        env += [{"name": name, "value": value} for name, value in profiling.items()]
        if spec.profile.neuron_device_profile:
            # XLA: the runtime's environment capture. Native: torch.profiler with TorchNeuron's
            # NeuronConfig, which the profiler opens and closes at the step window (the
            # environment capture would record every step of the run; contract/neuron_env.py).
            if spec.effective_neuron_stack is NeuronStack.NATIVE:
                capture = torch_capture_env()
            else:
                capture = neuron_inspect_env(profile_dir, device_profile=True)
            env += [{"name": name, "value": value} for name, value in capture.items()]
    return env


def container_env(job: JobRef, operator_env: list[Obj]) -> list[Obj]:
    """Operator defaults, then the user's env; a user name replaces the default of that name."""
    user = [e.model_dump(by_alias=True, exclude_none=True) for e in job.spec.env]
    user_names = {e["name"] for e in user}
    defaults = [e for e in operator_env if e["name"] not in user_names]
    return defaults + user


def container_resources(job: JobRef) -> Obj:
    shape = INSTANCE_TYPES[job.spec.instance_type.value]
    limits: dict[str, str] = {}
    if not claims.uses_dra(job):
        # Extended resources must be in limits (requests default to them).
        limits[job.spec.neuron_resource_name.value] = str(shape.neuron_devices)
        if shape.efa_interfaces:
            limits[EFA_RESOURCE] = str(shape.efa_interfaces)
    limits.update(job.spec.resources.limits)
    resources: Obj = {"limits": limits} if limits else {}
    if job.spec.resources.requests:
        resources["requests"] = dict(job.spec.resources.requests)
    if claims.uses_dra(job):
        # DRA: the devices come from the pod's claim (builders/claims.py), none from limits.
        resources["claims"] = claims.container_claims()
    return resources


def gang_labels(job: JobRef, stage: Stage, attempt: int) -> dict[str, str]:
    """What puts a pod in its gang's queue: Kueue's queue, pod group and priority labels for a
    job Kueue queues; nothing for Volcano (its PodGroup names the queue)."""
    if job.kueue_queue is None:
        return {}
    group = job.kueue_group_name(stage, attempt)
    return kueue.pod_labels(job.kueue_queue, group, job.kueue_priority_class)


def gang_annotations(
    job: JobRef, stage: Stage, placement: Placement | None = None
) -> dict[str, str]:
    """Volcano's PodGroup annotation (the PodGroup carries the placement), or Kueue's group
    size and no-single-pod-retry marks, and with a placement its pod-set topology annotation and
    the label holding each pod's rank."""
    if job.kueue_queue is None:
        return {VOLCANO_GROUP_ANNOTATION: job.podgroup_name(stage)}
    annotations = {**kueue.pod_annotations(job.spec.nodes), **topology.kueue_annotations(placement)}
    if placement is not None:
        # Domains in rank order: neighbouring ranks (which exchange most in a ring) share one.
        annotations[kueue.POD_INDEX_LABEL_ANNOTATION] = LABEL_NODE_RANK
    return annotations


def pod(
    job: JobRef,
    stage: Stage,
    attempt: int,
    rank: int,
    *,
    resume: bool | None = None,
    restarts: int = 0,
    placement: Placement | None = None,
    preflighted: bool = False,
    excluded_nodes: Sequence[str] = (),
) -> Obj:
    spec = job.spec
    name = job.pod_name(stage, attempt, rank)
    operator_env = _operator_env(
        job, stage, attempt, rank, resume=should_resume(stage, attempt, resume), restarts=restarts
    )
    metadata = job.metadata(name, stage)
    metadata["labels"] = {
        **spec.pod_metadata.labels,
        **metadata["labels"],
        LABEL_NODE_RANK: str(rank),
        LABEL_ATTEMPT: str(attempt),
        **gang_labels(job, stage, attempt),
    }
    metadata["annotations"] = {
        **spec.pod_metadata.annotations,
        **gang_annotations(job, stage, placement),
    }
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "schedulerName": job.scheduler_name,
        "hostname": job.pod_hostname(stage, rank),
        "subdomain": job.service_name,
        "nodeSelector": {**spec.node_selector, INSTANCE_TYPE_LABEL: spec.instance_type.value},
        "tolerations": [*TRAINIUM_TOLERATIONS, *spec.tolerations],
        # Nothing in a training pod calls the Kubernetes API; S3 or other AWS access comes from
        # the IRSA / Pod Identity webhook's own projected, audience-bound token. A job that
        # needs the API sets automountServiceAccountToken in spec.podTemplate.
        "automountServiceAccountToken": False,
        "securityContext": copy.deepcopy(TRAINING_POD_SECURITY_CONTEXT),
        "containers": [
            {
                "name": CONTAINER_NAME,
                "image": spec.image,
                "imagePullPolicy": spec.image_pull_policy,
                "command": container_command(
                    job, stage, attempt, resume=resume, preflighted=preflighted
                ),
                "env": container_env(job, operator_env),
                "resources": container_resources(job),
                "securityContext": copy.deepcopy(TRAINING_CONTAINER_SECURITY_CONTEXT),
                "volumeMounts": [
                    {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
                    {"name": DATA_VOLUME, "mountPath": job.mount_path},
                ],
            }
        ],
        "volumes": [
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
            {"name": DATA_VOLUME, "persistentVolumeClaim": {"claimName": spec.storage.claim_name}},
        ],
    }
    if stage is Stage.TRAIN and job.health_channel:
        add_health_token(pod_spec)
    if spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = spec.scheduling.priority_class_name
    # Always written: left empty, the API server would copy a deprecated `serviceAccount` into
    # it, and an admission policy reading serviceAccountName would see "default".
    pod_spec["serviceAccountName"] = spec.service_account_name or DEFAULT_SERVICE_ACCOUNT
    if spec.affinity:
        pod_spec["affinity"] = spec.affinity
    if claims.uses_dra(job):
        pod_spec["resourceClaims"] = claims.pod_resource_claims(job)
    built = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
    merged = merge_pod_template(built, spec.pod_template)
    avoid_nodes(merged["spec"], excluded_nodes)
    return merged


def health_token_volume() -> Obj:
    """The health channel's token: issued by the API server for the pod's ServiceAccount,
    bound to this pod (invalid once it is deleted), for our audience only (useless as an API
    credential) and rotated by the kubelet. The pod still mounts no API token."""
    return {
        "name": channel_contract.TOKEN_VOLUME,
        "projected": {
            "sources": [
                {
                    "serviceAccountToken": {
                        "audience": channel_contract.AUDIENCE,
                        "expirationSeconds": channel_contract.TOKEN_EXPIRATION_SECONDS,
                        "path": channel_contract.TOKEN_NAME,
                    }
                }
            ]
        },
    }


def add_health_token(pod_spec: Obj) -> None:
    pod_spec["volumes"].append(health_token_volume())
    pod_spec["containers"][0]["volumeMounts"].append(
        {
            "name": channel_contract.TOKEN_VOLUME,
            "mountPath": channel_contract.TOKEN_DIR,
            "readOnly": True,
        }
    )


def merge_security_context(default: Obj, override: Obj) -> Obj:
    """`override` over `default`, field by field: nested objects (capabilities, seccompProfile,
    seLinuxOptions...) merge, any other value (a list included) is the override's. So a
    podTemplate that sets runAsUser keeps the operator's seccomp profile, and one that adds a
    capability keeps `drop: [ALL]`; dropping fewer is an explicit `drop` list."""
    merged = copy.deepcopy(default)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_security_context(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def hardened(container: Obj) -> Obj:
    """A sidecar or init container with the training container's hardened security context
    under its own (merged field by field): what it needs more it asks for, and a privileged
    container or an added capability needs its author's grant (the tenancy policy)."""
    own = container.get("securityContext")
    return {
        **copy.deepcopy(container),
        "securityContext": container_security_context(own if isinstance(own, dict) else {}),
    }


def container_security_context(own: Obj) -> Obj:
    """`own` over the hardened default. The API server refuses allowPrivilegeEscalation false
    beside privileged or an added SYS_ADMIN, so a (granted) container asking for either keeps
    the default only if it sets it itself."""
    default = copy.deepcopy(TRAINING_CONTAINER_SECURITY_CONTEXT)
    capabilities = own.get("capabilities")
    added = capabilities.get("add") if isinstance(capabilities, dict) else None
    escalates = own.get("privileged") is True or (
        isinstance(added, list) and bool({"SYS_ADMIN", "CAP_SYS_ADMIN"} & set(map(str, added)))
    )
    if escalates:
        default.pop("allowPrivilegeEscalation")
    return merge_security_context(default, own)


def merge_pod_template(built: Obj, template: PodTemplate) -> Obj:
    """spec.podTemplate over the pod the operator built: lists are added to (volumes, init
    and sidecar containers, pull secrets, the trainer container's volumeMounts), security
    contexts are merged field by field (`merge_security_context`), other fields are set. The
    spec model has refused every field the operator owns, so nothing of the operator's is
    replaced here; what an author may loosen is the admission policies' business."""
    pod = copy.deepcopy(built)
    metadata, pod_spec = pod["metadata"], pod["spec"]
    metadata["labels"] = {**template.metadata.labels, **metadata["labels"]}
    metadata["annotations"] = {**template.metadata.annotations, **metadata["annotations"]}
    extra = template.spec.model_dump(by_alias=True, exclude_none=True)
    for key in ("volumes", "initContainers", "containers", "imagePullSecrets", "securityContext"):
        extra.pop(key, None)
    pod_spec.update(copy.deepcopy(extra))
    if template.spec.security_context:
        pod_spec["securityContext"] = merge_security_context(
            pod_spec.get("securityContext") or {}, template.spec.security_context
        )
    pod_spec["volumes"] = [*pod_spec["volumes"], *copy.deepcopy(template.spec.volumes)]
    if template.spec.init_containers:
        pod_spec["initContainers"] = [hardened(c) for c in template.spec.init_containers]
    if template.spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = copy.deepcopy(template.spec.image_pull_secrets)
    trainer = pod_spec["containers"][0]
    for container in copy.deepcopy(template.spec.containers):
        if container.get("name") != TRAINING_CONTAINER:
            pod_spec["containers"].append(hardened(container))
            continue
        mounts = container.pop("volumeMounts", [])
        security = container.pop("securityContext", None)
        trainer.update({k: v for k, v in container.items() if k != "name"})
        if isinstance(security, dict):
            trainer["securityContext"] = container_security_context(security)
        trainer["volumeMounts"] = [*trainer["volumeMounts"], *mounts]
    return pod


def stage_pods(
    job: JobRef,
    stage: Stage,
    attempt: int,
    placement: Placement | None = None,
    *,
    preflighted: bool = False,
    excluded_nodes: Sequence[str] = (),
) -> list[Obj]:
    return [
        pod(
            job,
            stage,
            attempt,
            rank,
            placement=placement,
            preflighted=preflighted,
            excluded_nodes=excluded_nodes,
        )
        for rank in range(job.spec.nodes)
    ]
