"""The one list of what spec.podTemplate may set, and of the pod fields the operator reserves.

An allowlist (docs/jobs.md lists it for users; docs/security.md, "Admission: what a job may
name", says why): a PodSpec field, container field, volume type or projected-volume source that
is not named here is refused, by the CRD's structural schema (it declares these fields and no
others) and by `parse_job` (defence in depth, and for `render`). So a field a new Kubernetes
release adds to pods is refused until someone decides it is safe and adds it here, with its
reason. Later work extends these tables (Kueue's labels and scheduling gates, DRA
resourceClaims), not copies of them.

Every list here is bounded: its length is the author's, and the chart's admission policy runs
an authorization check per Secret and claim a job names.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainium_operator.api import topology
from trainium_operator.api.object_names import (
    CONFIG_MAP,
    CONFIG_MAP_REFERENCE,
    SECRET,
    SECRET_REFERENCE,
    VOLUME,
    Fields,
    ListOf,
    Node,
    Passed,
    config_key,
    label,
    subdomain,
)

LISTED = "docs/jobs.md lists what spec.podTemplate may set"

MAX_VOLUMES = 64
MAX_CONTAINERS = 16
MAX_INIT_CONTAINERS = 16
MAX_PULL_SECRETS = 16
MAX_ENV = 256
MAX_ENV_FROM = 64
MAX_VOLUME_MOUNTS = 64
MAX_PORTS = 64
MAX_HOST_ALIASES = 32
MAX_PROJECTED_SOURCES = 32
MAX_GRACE_SECONDS = 3600
MAX_POD_SECONDS = 366 * 24 * 3600

ENV_VAR_SOURCE = Fields(
    {
        "secretKeyRef": (
            "A key of a Secret in the job's namespace (its author needs get on it).",
            Fields(
                {
                    "name": ("Name of the Secret.", SECRET),
                    "key": ("The key whose value is used.", config_key("Secret")),
                }
            ),
        ),
        "configMapKeyRef": (
            "A key of a ConfigMap in the job's namespace.",
            Fields(
                {
                    "name": ("Name of the ConfigMap.", CONFIG_MAP),
                    "key": ("The key whose value is used.", config_key("ConfigMap")),
                }
            ),
        ),
        "fieldRef": ("A field of the pod (Kubernetes ObjectFieldSelector).", Passed("object")),
        "resourceFieldRef": (
            "A resource of the container (Kubernetes ResourceFieldSelector).",
            Passed("object"),
        ),
    },
    refusal=f"an environment variable's value comes from a Secret, ConfigMap, pod field or "
    f"resource ({LISTED})",
)
ENV_VAR = Fields(
    {
        "name": ("Environment variable name.", Passed("string")),
        "value": ("Literal value.", Passed("string")),
        "valueFrom": ("Source of the variable's value.", ENV_VAR_SOURCE),
    },
    refusal=f"an environment variable has a name, value and valueFrom ({LISTED})",
)
ENV_FROM = Fields(
    {
        "prefix": ("Prefix of every variable's name.", Passed("string")),
        "secretRef": ("The Secret (its author needs get on it).", SECRET_REFERENCE),
        "configMapRef": ("The ConfigMap.", CONFIG_MAP_REFERENCE),
    },
    refusal=f"envFrom takes a Secret or a ConfigMap ({LISTED})",
)
VOLUME_MOUNT = Fields({"name": ("The volume mounted (a pod volume's name).", VOLUME)})

# A container of the pod: what a sidecar or init container needs, nothing that reaches the
# node (volumeDevices) or changes how the kubelet runs it beyond its own probes and hooks.
_CONTAINER_FIELDS: Mapping[str, tuple[str, Node]] = {
    "name": ("Container name (a DNS-1123 label).", label("container")),
    "image": ("Container image.", Passed("string")),
    "imagePullPolicy": ("Always, IfNotPresent or Never.", Passed("string")),
    "command": ("Entrypoint.", Passed("strings")),
    "args": ("Arguments to the entrypoint.", Passed("strings")),
    "workingDir": ("Working directory.", Passed("string")),
    "env": ("Environment variables (Kubernetes EnvVar).", ListOf(ENV_VAR, MAX_ENV)),
    "envFrom": (
        "Secrets and ConfigMaps whose keys become environment variables.",
        ListOf(ENV_FROM, MAX_ENV_FROM),
    ),
    "ports": ("Ports (Kubernetes ContainerPort).", ListOf(Passed("object"), MAX_PORTS)),
    "resources": ("Requests and limits (Kubernetes ResourceRequirements).", Passed("object")),
    "volumeMounts": (
        "Volumes mounted in the container (Kubernetes VolumeMount).",
        ListOf(VOLUME_MOUNT, MAX_VOLUME_MOUNTS),
    ),
    "securityContext": (
        "Merged over the operator's hardened default (all capabilities dropped, no privilege "
        "escalation); privileged and added capabilities need a grant (docs/eks.md).",
        Passed("object"),
    ),
    "livenessProbe": ("Kubernetes Probe.", Passed("object")),
    "readinessProbe": ("Kubernetes Probe.", Passed("object")),
    "startupProbe": ("Kubernetes Probe.", Passed("object")),
    "lifecycle": ("postStart and preStop hooks (Kubernetes Lifecycle).", Passed("object")),
    "terminationMessagePath": ("Where the termination message is read from.", Passed("string")),
    "terminationMessagePolicy": ("File or FallbackToLogsOnError.", Passed("string")),
}
_CONTAINER_REFUSAL = f"not a container field a TrainingJob may set ({LISTED})"
CONTAINER = Fields(_CONTAINER_FIELDS, refusal=_CONTAINER_REFUSAL)
INIT_CONTAINER = Fields(
    {
        **_CONTAINER_FIELDS,
        "restartPolicy": (
            "Always: a native sidecar, started before and running beside the containers.",
            Passed("string"),
        ),
    },
    refusal=_CONTAINER_REFUSAL,
)

PROJECTED_SOURCE = Fields(
    {
        "secret": ("A Secret's keys (its author needs get on it).", SECRET_REFERENCE),
        "configMap": ("A ConfigMap's keys.", CONFIG_MAP_REFERENCE),
        "downwardAPI": ("Fields of the pod (Kubernetes DownwardAPIProjection).", Passed("object")),
        "serviceAccountToken": (
            "A token of the pod's own ServiceAccount for an audience.",
            Passed("object"),
        ),
    },
    refusal="a projected volume takes secret, configMap, downwardAPI and serviceAccountToken "
    "sources",
)
# Volume types a job may use: objects of its own namespace, checked against its author's
# rights at admission (Secrets, claims), and scratch space. hostPath reaches the node and needs
# a grant (trainingjobs/hostpath). Everything else is refused: network and node-level types
# (nfs, iscsi, rbd, cephfs, glusterfs, fc, ...) mount what the node can reach with the node's
# identity, inline csi hands the author's attributes to a node driver, gitRepo runs git on the
# node, ephemeral creates a claim nobody's rights were checked for, image pulls with the node.
VOLUME_TYPES: Mapping[str, tuple[str, Node]] = {
    "persistentVolumeClaim": (
        "A PersistentVolumeClaim of the job's namespace (its author needs get on it).",
        Fields(
            {
                "claimName": (
                    "Name of the PersistentVolumeClaim (in the job's namespace).",
                    subdomain("PersistentVolumeClaim"),
                )
            }
        ),
    ),
    "configMap": ("A ConfigMap as a volume.", CONFIG_MAP_REFERENCE),
    "secret": (
        "A Secret as a volume (its author needs get on it).",
        Fields({"secretName": ("Name of the Secret (in the job's namespace).", SECRET)}),
    ),
    "emptyDir": ("Scratch space of the pod (Kubernetes EmptyDirVolumeSource).", Passed("object")),
    "downwardAPI": ("Fields of the pod as files.", Passed("object")),
    "projected": (
        "Several sources projected into one volume.",
        Fields(
            {
                "sources": (
                    "The projected sources.",
                    ListOf(PROJECTED_SOURCE, MAX_PROJECTED_SOURCES),
                ),
                "defaultMode": ("Mode bits of the files.", Passed("integer", maximum=0o777)),
            },
            refusal="a projected volume has sources and defaultMode",
        ),
    ),
    "hostPath": (
        "A directory of the node: its author needs verb use on trainingjobs/hostpath.",
        Passed("object"),
    ),
}
VOLUME_SOURCE = Fields(
    {"name": ("Volume name (a DNS-1123 label), unique in the pod.", VOLUME), **VOLUME_TYPES},
    refusal="not a volume type a TrainingJob may use (persistentVolumeClaim, configMap, "
    "secret, emptyDir, downwardAPI, projected, hostPath with a grant), not a network or "
    "node-level one (nfs, iscsi, rbd, cephfs, csi, gitRepo, ephemeral, ...)",
)

# Pod fields the operator sets from its own spec fields or owns outright: refused, saying what
# to use instead (the CRD declares them only to refuse them by name).
RESERVED_POD_FIELDS: Mapping[str, tuple[str, Node]] = {
    "restartPolicy": (
        "the operator sets Never: it restarts whole gangs itself",
        Passed("string"),
    ),
    "schedulerName": ("use spec.scheduling.schedulerName", Passed("string")),
    "priorityClassName": ("use spec.scheduling.priorityClassName", Passed("string")),
    "serviceAccountName": ("use spec.serviceAccountName", Passed("string")),
    # The deprecated alias: the API server copies it into an empty serviceAccountName.
    "serviceAccount": (
        "the deprecated alias of serviceAccountName: use spec.serviceAccountName",
        Passed("string"),
    ),
    "nodeSelector": ("use spec.nodeSelector", Passed("object")),
    "tolerations": ("use spec.tolerations", Passed("objects")),
    "affinity": ("use spec.affinity", Passed("object")),
    "hostname": ("the operator names pods for the rendezvous", Passed("string")),
    "subdomain": ("the operator names pods for the rendezvous", Passed("string")),
    "nodeName": ("Volcano places the gang", Passed("string")),
    # DRA: with spec.deviceAllocation dra the operator claims the instance type's devices
    # through its own ResourceClaimTemplate; a claim of the author's could name any DeviceClass
    # and count, beyond what the instance type has or the queue's quota counted.
    "resourceClaims": (
        "the operator claims the instance type's devices: use spec.deviceAllocation",
        Passed("objects"),
    ),
    "activeDeadlineSeconds": (
        "use spec.runPolicy.activeDeadlineSeconds",
        Passed("integer", minimum=1, maximum=MAX_POD_SECONDS),
    ),
}

# Pod annotations the operator owns: where in the network a gang is placed comes from
# spec.scheduling.topology alone. Kueue's TAS reads its two from a group's pods
# (api/topology.py); Volcano's PodGroup controller reads its two from pods it makes a PodGroup
# for (pkg/controllers/podgroup/pg_controller_handler.go, v1.15.1), so they are refused too.
TOPOLOGY_FIX = "use spec.scheduling.topology"
RESERVED_POD_ANNOTATIONS: Mapping[str, str] = {
    **dict.fromkeys(topology.TOPOLOGY_ANNOTATIONS, TOPOLOGY_FIX),
    **dict.fromkeys(topology.VOLCANO_TOPOLOGY_ANNOTATIONS, TOPOLOGY_FIX),
}

# Pod fields a job may set, beyond what spec.* owns.
POD_FIELDS: Mapping[str, tuple[str, Node]] = {
    "volumes": (
        "Volumes added to the pod's (the operator's are dshm, shared-data and "
        "trainium-health-token).",
        ListOf(VOLUME_SOURCE, MAX_VOLUMES),
    ),
    "initContainers": (
        "Init containers, run before the training container.",
        ListOf(INIT_CONTAINER, MAX_INIT_CONTAINERS),
    ),
    "containers": (
        "Sidecar containers; an entry named trainer is merged into the training container "
        "(volumeMounts, securityContext, ports, probes, workingDir, envFrom...), whose image, "
        "command, args, resources and env come from the TrainingJob spec.",
        ListOf(CONTAINER, MAX_CONTAINERS),
    ),
    "imagePullSecrets": (
        "Secrets for pulling the images.",
        ListOf(SECRET_REFERENCE, MAX_PULL_SECRETS),
    ),
    "securityContext": (
        "The pod's PodSecurityContext, merged over the operator's.",
        Passed("object"),
    ),
    "terminationGracePeriodSeconds": (
        "Seconds between SIGTERM and SIGKILL when a pod is deleted (at most an hour: a deleted "
        "pod holds its node that long).",
        Passed("integer", maximum=MAX_GRACE_SECONDS),
    ),
    "dnsPolicy": ("ClusterFirst, Default or None.", Passed("string")),
    "dnsConfig": ("Nameservers, searches and options (Kubernetes PodDNSConfig).", Passed("object")),
    "hostAliases": ("Extra /etc/hosts entries.", ListOf(Passed("object"), MAX_HOST_ALIASES)),
    "enableServiceLinks": ("Service environment variables in the containers.", Passed("boolean")),
    "shareProcessNamespace": ("One PID namespace for the pod's containers.", Passed("boolean")),
    "automountServiceAccountToken": (
        "Mount an API token of the pod's ServiceAccount (false by default).",
        Passed("boolean"),
    ),
    "hostNetwork": (
        "The node's network namespace: needs verb use on trainingjobs/hostnamespaces.",
        Passed("boolean"),
    ),
    "hostPID": (
        "The node's PID namespace: needs verb use on trainingjobs/hostnamespaces.",
        Passed("boolean"),
    ),
    "hostIPC": (
        "The node's IPC namespace: needs verb use on trainingjobs/hostnamespaces.",
        Passed("boolean"),
    ),
}
POD_SPEC = Fields(
    POD_FIELDS,
    refusal=f"not a pod field a TrainingJob may set ({LISTED})",
    reserved={name: fix for name, (fix, _) in RESERVED_POD_FIELDS.items()},
)
