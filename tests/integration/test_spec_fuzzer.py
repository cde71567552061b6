"""Spec fuzzer: invalid and edge-case TrainingJobs, derived from the CRD schema the pydantic model
generates, sent to the real API server with the operator running.

Every example is one mutation of a valid job: a leaf of the schema given a value of the wrong type,
out of range, off its enum or pattern, far too large, or an unknown field; the cross-field rules
(etcd without an endpoint, an inverted profile window, too many processes, reserved env names);
or nested content inside a pass-through field (every field the CRD leaves untyped:
`x-kubernetes-preserve-unknown-fields` objects and free-form maps, found in the schema): volumes,
sidecar and init containers with env, envFrom, volumeMounts, resources, securityContext and
probes, tolerations, affinity, labels and annotations, unknown PodSpec fields, each either
well-formed or with a wrong type somewhere inside it (an int where a list goes, strings where an
object goes, None, a dict nested a hundred deep) or an unknown key.

Most examples are suspended (cheap: no pods). A few dozen that the model accepts are not: small
jobs (one node asking for no Neuron device or EFA, compile on or off) that go through the builders,
Volcano and real pod creates, at most IN_FLIGHT at a time, each deleted once it has a verdict
(a failed one holds no pods and stays for the final quiet check).

Each example must be refused by the API server naming the field; or be accepted and end
Failed/InvalidSpec naming the field; or, when it runs, get pods (phase Pending, Compiling or
Training with a reason), or have its pods refused by the API server with a status naming the
field (an admission reason such as InvalidPodSpec), or wait with a reason. Never no status, never
a retry loop. The operator must not crash, log a traceback, or keep reconciling once things
settle, and a valid job running beside the fuzzing keeps running untouched. Seeded (hypothesis
`derandomize`), so every run sends the same examples; the counts are printed.
TRAINIUM_FUZZ_EXAMPLES and TRAINIUM_FUZZ_RUNNING lower the counts while developing.
"""

from __future__ import annotations

import copy
import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from integration.operator_harness import (
    JOB_LABEL,
    OperatorProcess,
    create_job,
    delete_job_now,
    free_port,
    get_job,
    job_manifest,
    job_pods,
    metric,
    publish_report,
    running_operator,
    wait_gang_running,
    wait_phase,
)
from trainium_devcluster.sim import wait_for
from trainium_operator.api.crd import spec_schema
from trainium_operator.api.instance_types import EFA_RESOURCE, NEURON_RESOURCE
from trainium_operator.api.spec import TRAINING_CONTAINER, TrainingJobSpec
from trainium_operator.lifecycle.parse import spec_too_large

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]

EXAMPLES = int(os.environ.get("TRAINIUM_FUZZ_EXAMPLES", "1000"))
# Examples that are not suspended: each costs pod creates and a few seconds of a slot.
RUNNING = int(os.environ.get("TRAINIUM_FUZZ_RUNNING", "40"))
# One in this many examples the model accepts runs (spreads the running ones over the whole
# run), and every one that sets a PodSpec field the model does not declare: those show what they
# do only when a pod is created.
RUN_EVERY = 5
# Running jobs at a time. They ask for no Neuron device or EFA, so neither their pods nor their
# PodGroups (Volcano reserves an admitted group's minResources, and a failed job keeps its group)
# take capacity from the neighbour or from each other.
IN_FLIGHT = 8
SMALL_LIMITS = {NEURON_RESOURCE: "0", EFA_RESOURCE: "0"}
# A running job whose status has not changed for this long (and has a phase and reason) has
# reached its verdict, even without pods (a gang Volcano cannot place, a queue that is missing).
QUIET_SECONDS = 5.0
POLL_SECONDS = 1.0
RUNNING_LABEL = "fuzz.trainium.dev/running"  # selects the running examples in one LIST
VERDICT_TIMEOUT_SECONDS = 60.0
GROUP, VERSION, PLURAL = "trainium.dev", "v1alpha1", "trainingjobs"
PODGROUPS = ("scheduling.volcano.sh", "v1beta1", "podgroups")
# Fields the fuzzer leaves alone: whether a job is suspended is the fuzzer's choice.
SKIPPED = {"spec.runPolicy.suspend"}
# What the operator logs about a job whose pass raised (workqueue, handlers).
FAILED_PASS = re.compile(r"reconcile of (\S+?)/(\S+) failed|(\S+?)/(\S+): permission denied")


@dataclass(frozen=True)
class Leaf:
    path: tuple[str, ...]  # ("runPolicy", "backoffLimit")
    schema: dict[str, Any]

    @property
    def dotted(self) -> str:
        return ".".join(("spec", *self.path))


def leaves(schema: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[Leaf]:
    if schema.get("type") == "object" and "properties" in schema:
        for name, child in schema["properties"].items():
            yield from leaves(child, (*path, name))
    elif path:
        yield Leaf(path, schema)


def pass_through_fields(
    schema: dict[str, Any], path: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """Fields whose content the CRD does not type: objects that preserve unknown fields and
    free-form maps (an array of those is named by the array's path)."""
    untyped = schema.get("type") == "object" and (
        schema.get("x-kubernetes-preserve-unknown-fields") or "properties" not in schema
    )
    if untyped and path:
        yield path
    for name, child in (schema.get("properties") or {}).items():
        yield from pass_through_fields(child, (*path, name))
    if isinstance(schema.get("items"), dict):
        yield from pass_through_fields(schema["items"], path)


LEAVES = [leaf for leaf in leaves(spec_schema()) if leaf.dotted not in SKIPPED]
OBJECTS = sorted({leaf.path[:-1] for leaf in LEAVES if len(leaf.path) > 1} | {()}, key=len)
PASS_THROUGH = sorted(set(pass_through_fields(spec_schema())))


@dataclass(frozen=True)
class Mutation:
    kind: str  # how the value is wrong (or edgy)
    path: tuple[str, ...]
    value: Any
    field: str  # the field an error must name
    compile: bool = False  # the compile stage of a job that runs

    @property
    def pod_field(self) -> bool:
        """Sets a PodSpec field the model does not declare (podTemplate.spec passes it on)."""
        return self.path[:-1] == POD_TEMPLATE_SPEC and self.path[-1] in OTHER_POD_FIELDS

    def apply(self, spec: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(spec)
        target = out
        for part in self.path[:-1]:
            target = target.setdefault(part, {})
        target[self.path[-1]] = self.value
        return out


def wrong_type(leaf: Leaf) -> st.SearchStrategy[Any]:
    kind = leaf.schema.get("type")
    others: dict[str, st.SearchStrategy[Any]] = {
        "string": st.one_of(st.integers(), st.booleans(), st.lists(st.integers(), max_size=2)),
        "integer": st.one_of(st.text(max_size=5), st.floats(0.5, 9.5), st.booleans()),
        "boolean": st.one_of(st.integers(2, 9), st.text(min_size=1, max_size=4)),
        "array": st.one_of(st.text(max_size=4), st.integers()),
        "object": st.one_of(st.text(max_size=4), st.integers(), st.lists(st.text(), max_size=2)),
    }
    return others.get(str(kind), st.integers())


def out_of_range(leaf: Leaf) -> st.SearchStrategy[Any] | None:
    schema = leaf.schema
    if schema.get("type") == "integer":
        options = []
        if "minimum" in schema:
            options.append(st.integers(schema["minimum"] - 10**6, schema["minimum"] - 1))
        if "maximum" in schema:
            options.append(st.integers(schema["maximum"] + 1, schema["maximum"] + 10**6))
        options.append(st.just(2**63))  # past int64
        return st.one_of(*options)
    if "enum" in schema:
        return st.text(min_size=1, max_size=12).filter(lambda v: v not in schema["enum"])
    if "pattern" in schema:
        return st.sampled_from(["has space", "semi;colon", "", "x" * 300, "ünïcödé"])
    if schema.get("minLength"):
        return st.just("")
    return None


# Enum values valid only beside something the mutation does not set, so not an edge alone:
# spec.deviceAllocation dra needs the job's Kueue queue label (metadata; tests/unit/test_dra.py
# and tests/integration/test_dra.py hold both sides of that rule); a topology's mode needs its
# level, and level ultraserver an UltraServer instance type (tests/unit/test_topology.py).
NOT_EDGES_ALONE = {
    ("deviceAllocation",): {"dra"},
    ("scheduling", "topology", "mode"): {"Required", "Preferred"},
    ("scheduling", "topology", "level"): {"ultraserver"},
}


def edge_valid(leaf: Leaf) -> st.SearchStrategy[Any] | None:
    schema = leaf.schema
    if schema.get("type") == "integer":
        bounds = [schema[k] for k in ("minimum", "maximum") if k in schema]
        return st.sampled_from(bounds) if bounds else None
    if "enum" in schema:
        values = [v for v in schema["enum"] if v not in NOT_EDGES_ALONE.get(leaf.path, set())]
        return st.sampled_from(values) if values else None
    return None


# --- Nested content for the pass-through fields -------------------------------------------------

SCALARS: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)


def nested_dict(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for level in range(depth):
        value = {f"k{level % 3}": value}
    return value


# A value of the wrong shape for wherever it lands.
JUNK: st.SearchStrategy[Any] = st.one_of(
    SCALARS,
    st.integers(0, 9),  # an int where a list or object goes
    st.lists(st.text(max_size=6), min_size=1, max_size=3),  # strings where objects go
    st.integers(5, 100).map(nested_dict),
    st.recursive(
        SCALARS,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
        ),
        max_leaves=8,
    ),
)
UNKNOWN_KEYS = st.sampled_from(["x-unknown", "typo", "volumeMount", "Name", "nested"])


def spots(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every position inside a JSON value (dict keys, list indexes), the value itself first."""
    yield path
    if isinstance(value, dict):
        for key, child in value.items():
            yield from spots(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from spots(child, (*path, index))


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    out = copy.deepcopy(value)
    target = out
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = new
    return out


@st.composite
def corrupted(draw: st.DrawFn, valid: st.SearchStrategy[Any]) -> Any:
    """A well-formed value with one thing wrong somewhere inside it: a value of the wrong shape,
    or an unknown key in one of its objects."""
    value = draw(valid)
    places = list(spots(value))
    objects = [p for p in places if isinstance(replaced_get(value, p), dict)]
    add_key: bool = draw(st.booleans())
    if objects and add_key:
        where = draw(st.sampled_from(objects))
        inner = copy.deepcopy(replaced_get(value, where))
        inner[draw(UNKNOWN_KEYS)] = draw(JUNK)
        return replaced(value, where, inner)
    return replaced(value, draw(st.sampled_from(places)), draw(JUNK))


def replaced_get(value: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


def well_formed_or_corrupted(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(valid, corrupted(valid))


OBJECT_NAMES = ["scratch", "logs", "x" * 63, "Bad_Name", "", "x" * 64, "has space"]
QUANTITIES = ["1", "100m", "1Gi", "0", "1e3", ".5", "512Mi", "lots", "-1", "1 Gi", ""]
RESOURCE_NAMES = [
    "cpu",
    "memory",
    "ephemeral-storage",
    "hugepages-2Mi",
    "example.com/widget",
    NEURON_RESOURCE,
    "foo",
    "bad name",
]
resource_map = st.dictionaries(
    st.sampled_from(RESOURCE_NAMES), st.sampled_from(QUANTITIES), min_size=1, max_size=3
)
LABEL_KEYS = [
    "team",
    "example.com/owner",
    "a" * 63,
    "a" * 64,
    "bad key",
    "-lead",
    "x/y/z",
    "",
    "trainium.dev/x",
    "app.kubernetes.io/part-of",
    "kueue.x-k8s.io/queue-name",
]
label_maps = st.dictionaries(
    st.sampled_from(LABEL_KEYS),
    st.sampled_from(["v", "", "a" * 63, "a" * 64, "has space", "ünï"]),
    min_size=1,
    max_size=3,
)
annotation_maps = st.dictionaries(
    st.sampled_from(
        [*LABEL_KEYS[:3], "bad key", "scheduling.k8s.io/group-name", "kueue.x-k8s.io/x"]
    ),
    # Now and then past the 256 KiB the API server allows a pod's annotations altogether (rare:
    # every such job is a quarter of a megabyte through the API server and the operator).
    st.sampled_from(["", "v", "has space", "a" * 64, "x" * 270_000]),
    min_size=1,
    max_size=2,
)
node_selector = st.dictionaries(
    st.sampled_from(
        [
            "topology.kubernetes.io/zone",
            "node.kubernetes.io/instance-type",
            "example.com/pool",
            "bad key",
        ]
    ),
    st.sampled_from(["us-west-2d", "trn1.32xlarge", "nowhere", "has space"]),
    min_size=1,
    max_size=2,
)
VALUE_FROM = [
    {"fieldRef": {"fieldPath": "metadata.name"}},
    {"fieldRef": {"fieldPath": "status.podIP"}},
    {"fieldRef": {"fieldPath": "no.such.field"}},
    {"secretKeyRef": {"name": "creds", "key": "token", "optional": True}},
    {"configMapKeyRef": {"name": "settings", "key": "mode", "optional": True}},
    {"resourceFieldRef": {"resource": "limits.cpu", "containerName": TRAINING_CONTAINER}},
    {},  # no source
    {"fieldRef": {"fieldPath": "metadata.name"}, "secretKeyRef": {"name": "s", "key": "k"}},
]
ENV_NAMES = st.sampled_from(["FOO", "CCOM_SOCKET_IFNAME", "my.var", "1BAD", "has space", "A" * 200])
# spec.env's items are typed (name, value, valueFrom); valueFrom passes through.
spec_env_var = st.one_of(
    st.fixed_dictionaries({"name": ENV_NAMES, "value": st.text(max_size=10)}),
    st.fixed_dictionaries(
        {"name": ENV_NAMES, "valueFrom": well_formed_or_corrupted(st.sampled_from(VALUE_FROM))}
    ),
)
container_env_var = st.one_of(
    st.fixed_dictionaries({"name": ENV_NAMES, "value": st.text(max_size=10)}),
    st.fixed_dictionaries({"name": ENV_NAMES, "valueFrom": st.sampled_from(VALUE_FROM)}),
)
env_from = st.sampled_from(
    [
        {"configMapRef": {"name": "settings", "optional": True}},
        {"secretRef": {"name": "creds", "optional": True}, "prefix": "S_"},
        {"prefix": "P_"},
    ]
)
volume_mount = st.fixed_dictionaries(
    {
        "name": st.sampled_from(OBJECT_NAMES[:3]),
        "mountPath": st.sampled_from(
            ["/mnt/scratch", "/var/log/app", "/data", "/dev/shm", "relative"]
        ),
    },
    optional={"readOnly": st.booleans(), "subPath": st.sampled_from(["part", "../escape"])},
)
container_security = st.sampled_from(
    [
        {"runAsUser": 1000, "runAsNonRoot": True},
        {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        {"readOnlyRootFilesystem": True, "privileged": False},
        {"privileged": True, "allowPrivilegeEscalation": False},  # contradictory
        {"runAsUser": -1},
    ]
)
probe = st.sampled_from(
    [
        {"exec": {"command": ["true"]}, "periodSeconds": 5},
        {"tcpSocket": {"port": 8080}},
        {"httpGet": {"path": "/healthz", "port": "http"}},
        {"periodSeconds": 5},  # no handler
    ]
)
ports = st.lists(
    st.fixed_dictionaries(
        {"containerPort": st.sampled_from([8080, 29400, 0, 70000])},
        optional={"name": st.sampled_from(["http", "metrics", "BAD_NAME"])},
    ),
    min_size=1,
    max_size=2,
)
container_fields: dict[str, st.SearchStrategy[Any]] = {
    "env": st.lists(container_env_var, max_size=3),
    "envFrom": st.lists(env_from, max_size=2),
    "volumeMounts": st.lists(volume_mount, max_size=2),
    "resources": st.fixed_dictionaries(
        {}, optional={"limits": resource_map, "requests": resource_map}
    ),
    "securityContext": container_security,
    "ports": ports,
    "readinessProbe": probe,
    "workingDir": st.sampled_from(["/work", "relative"]),
    "command": st.lists(st.text(max_size=5), max_size=2),
}
IMAGES = st.sampled_from(["busybox:1.36", "example.com/sidecar:1", "", "UPPER/Case", "x" * 300])
sidecar = st.fixed_dictionaries(
    {"name": st.sampled_from(["side", "log-shipper", "Bad_Name", "x" * 64]), "image": IMAGES},
    optional=container_fields,
)
# The training container's entry: merged into the container the operator builds. Its env,
# resources and command are the operator's (refused); the rest passes through.
trainer_entry = st.fixed_dictionaries(
    {"name": st.just(TRAINING_CONTAINER)}, optional=container_fields
)
init_container = st.fixed_dictionaries(
    {"name": st.sampled_from(["init", "fetch", TRAINING_CONTAINER, "Bad_Name"]), "image": IMAGES},
    optional=container_fields,
)
volume = st.fixed_dictionaries(
    {"name": st.sampled_from([*OBJECT_NAMES, "dshm", "shared-data"])},
    optional={
        "emptyDir": st.sampled_from([{}, {"medium": "Memory"}, {"sizeLimit": "1Gi"}]),
        "configMap": st.just({"name": "settings", "optional": True}),
        "secret": st.just({"secretName": "creds", "optional": True}),
        "hostPath": st.sampled_from([{"path": "/tmp/x"}, {"path": "relative"}]),
        "projected": st.just(
            {
                "sources": [
                    {
                        "downwardAPI": {
                            "items": [
                                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}
                            ]
                        }
                    }
                ]
            }
        ),
    },
)
toleration = st.sampled_from(
    [
        {"key": "example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"},
        {
            "key": "k",
            "operator": "Equal",
            "value": "v",
            "effect": "NoExecute",
            "tolerationSeconds": 30,
        },
        {"operator": "Exists"},
        {"key": "k", "operator": "Sometimes"},
        {"effect": "Never"},
    ]
)
ZONE_TERM = {
    "matchExpressions": [
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2d"]}
    ]
}
affinity = st.sampled_from(
    [
        {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "preference": ZONE_TERM}
                ]
            }
        },
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [ZONE_TERM]}
            }
        },
        {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 1,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"a": "b"}},
                        },
                    }
                ]
            }
        },
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}
            }
        },
        {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": ""}]}},
        {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1000, "preference": {}}
                ]
            }
        },
    ]
)
pod_security = st.sampled_from(
    [
        {"runAsUser": 1000, "fsGroup": 2000},
        {"seccompProfile": {"type": "RuntimeDefault"}},
        {"sysctls": [{"name": "net.core.somaxconn", "value": "1024"}]},
        {"supplementalGroups": [1, 2]},
        {"runAsGroup": -5},
        {"seccompProfile": {"type": "Bogus"}},
    ]
)
# PodSpec fields the model does not declare: podTemplate.spec passes them to the pods.
OTHER_POD_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "dnsPolicy": st.sampled_from(["ClusterFirst", "Default", "Bogus"]),
    "hostNetwork": st.booleans(),
    "shareProcessNamespace": st.booleans(),
    "terminationGracePeriodSeconds": st.sampled_from([0, 5, -5]),
    "activeDeadlineSeconds": st.sampled_from([3600, 0]),
    "enableServiceLinks": st.booleans(),
    "dnsConfig": st.sampled_from(
        [
            {"nameservers": ["1.1.1.1"]},
            {"options": [{"name": "ndots", "value": "2"}]},
            {"nameservers": ["not-an-ip"]},
        ]
    ),
    "hostAliases": st.sampled_from([[{"ip": "127.0.0.1", "hostnames": ["x"]}], [{"ip": "bad"}]]),
    "topologySpreadConstraints": st.sampled_from(
        [
            [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": {"a": "b"}},
                }
            ],
            [{"maxSkew": 0}],
        ]
    ),
    "runtimeClassName": st.sampled_from(["neuron", "Bad_Name"]),
    "preemptionPolicy": st.sampled_from(["Never", "Sometimes"]),
    "os": st.sampled_from([{"name": "linux"}, {"name": "plan9"}]),
    "overhead": st.just({"cpu": "100m"}),
    "setHostnameAsFQDN": st.booleans(),
    "x-unknown": JUNK,
}


@st.composite
def other_pod_field(draw: st.DrawFn) -> tuple[tuple[str, ...], Any, str]:
    name = draw(st.sampled_from(sorted(OTHER_POD_FIELDS)))
    value = draw(well_formed_or_corrupted(OTHER_POD_FIELDS[name]))
    return ("podTemplate", "spec", name), value, name


def at(
    path: tuple[str, ...], valid: st.SearchStrategy[Any], names: str
) -> st.SearchStrategy[tuple[tuple[str, ...], Any, str]]:
    """Content for the field at `path`, well-formed or corrupted; `names` is what an error
    about it must mention (the pod's own field name, for a refused pod)."""
    return well_formed_or_corrupted(valid).map(lambda value: (path, value, names))


POD_TEMPLATE_SPEC = ("podTemplate", "spec")
# Every pass-through field of the schema and its content: (mutated path, value, field named).
NESTED: dict[tuple[str, ...], st.SearchStrategy[tuple[tuple[str, ...], Any, str]]] = {
    ("env", "valueFrom"): st.lists(spec_env_var, min_size=1, max_size=3).map(
        lambda value: (("env",), value, "env")
    ),
    ("resources", "requests"): at(("resources", "requests"), resource_map, "resources"),
    ("resources", "limits"): at(("resources", "limits"), resource_map, "resources"),
    ("nodeSelector",): at(("nodeSelector",), node_selector, "nodeSelector"),
    ("tolerations",): at(
        ("tolerations",), st.lists(toleration, min_size=1, max_size=3), "tolerations"
    ),
    ("affinity",): at(("affinity",), affinity, "affinity"),
    ("podMetadata", "labels"): at(("podMetadata", "labels"), label_maps, "labels"),
    ("podMetadata", "annotations"): at(
        ("podMetadata", "annotations"), annotation_maps, "annotations"
    ),
    ("podTemplate", "metadata", "labels"): at(
        ("podTemplate", "metadata", "labels"), label_maps, "labels"
    ),
    ("podTemplate", "metadata", "annotations"): at(
        ("podTemplate", "metadata", "annotations"), annotation_maps, "annotations"
    ),
    POD_TEMPLATE_SPEC: other_pod_field(),
    (*POD_TEMPLATE_SPEC, "volumes"): at(
        (*POD_TEMPLATE_SPEC, "volumes"), st.lists(volume, min_size=1, max_size=3), "volumes"
    ),
    (*POD_TEMPLATE_SPEC, "containers"): at(
        (*POD_TEMPLATE_SPEC, "containers"),
        st.lists(st.one_of(sidecar, trainer_entry), min_size=1, max_size=3),
        "containers",
    ),
    (*POD_TEMPLATE_SPEC, "initContainers"): at(
        (*POD_TEMPLATE_SPEC, "initContainers"),
        st.lists(init_container, min_size=1, max_size=2),
        "initContainers",
    ),
    (*POD_TEMPLATE_SPEC, "imagePullSecrets"): at(
        (*POD_TEMPLATE_SPEC, "imagePullSecrets"),
        st.lists(
            st.fixed_dictionaries({"name": st.sampled_from(["regcred", "", "Bad_Name"])}),
            min_size=1,
            max_size=2,
        ),
        "imagePullSecrets",
    ),
    (*POD_TEMPLATE_SPEC, "securityContext"): at(
        (*POD_TEMPLATE_SPEC, "securityContext"), pod_security, "securityContext"
    ),
    # The operator's own pod fields: refused at admission, whatever their content.
    (*POD_TEMPLATE_SPEC, "nodeSelector"): at(
        (*POD_TEMPLATE_SPEC, "nodeSelector"), node_selector, "nodeSelector"
    ),
    (*POD_TEMPLATE_SPEC, "tolerations"): at(
        (*POD_TEMPLATE_SPEC, "tolerations"),
        st.lists(toleration, min_size=1, max_size=2),
        "tolerations",
    ),
    (*POD_TEMPLATE_SPEC, "affinity"): at((*POD_TEMPLATE_SPEC, "affinity"), affinity, "affinity"),
}


@st.composite
def nested(draw: st.DrawFn) -> Mutation:
    # podTemplate.spec stands for every PodSpec field the model does not declare: more draws.
    root = draw(st.sampled_from([*sorted(NESTED), *[POD_TEMPLATE_SPEC] * 2]))
    path, value, names = draw(NESTED[root])
    return Mutation("nested", path, value, names, compile=draw(st.booleans()))


@st.composite
def mutations(draw: st.DrawFn) -> Mutation:
    # About a third of the examples (hypothesis draws small integers more often than others).
    if draw(st.integers(0, 99)) < 20:
        return draw(nested())
    leaf = draw(st.sampled_from(LEAVES))
    choices = ["wrong-type", "unknown-field", "cross-field"]
    if out_of_range(leaf) is not None:
        choices += ["out-of-range"] * 3
    if edge_valid(leaf) is not None:
        choices.append("edge-valid")
    kind = draw(st.sampled_from(choices))
    if kind == "wrong-type":
        return Mutation(kind, leaf.path, draw(wrong_type(leaf)), leaf.dotted)
    if kind == "out-of-range":
        strategy = out_of_range(leaf)
        assert strategy is not None
        return Mutation(kind, leaf.path, draw(strategy), leaf.dotted)
    if kind == "edge-valid":
        strategy = edge_valid(leaf)
        assert strategy is not None
        return Mutation(kind, leaf.path, draw(strategy), leaf.dotted, compile=draw(st.booleans()))
    if kind == "unknown-field":
        parent = draw(st.sampled_from(OBJECTS))
        name = draw(st.sampled_from(["typo", "nodez", "backofLimit", "x-extra", "Nodes"]))
        return Mutation(kind, (*parent, name), draw(st.integers(0, 3)), name)
    return draw(
        st.sampled_from(
            [
                Mutation(kind, ("rendezvous",), {"backend": "etcd"}, "spec.rendezvous.endpoint"),
                Mutation(kind, ("profile",), {"startStep": 9, "endStep": 2}, "endStep"),
                Mutation(kind, ("processesPerNode",), 64, "spec.processesPerNode"),
                Mutation(kind, ("env",), [{"name": "RANK", "value": "0"}], "reserved"),
                Mutation(kind, ("env",), [{"name": "PET_X", "value": "0"}], "reserved"),
                Mutation(kind, ("env",), [{"name": ""}], "spec.env"),
                Mutation(kind, ("resources",), {"limits": {"memory": "lots"}}, "spec.resources"),
            ]
        )
    )


def base_spec() -> dict[str, Any]:
    spec: dict[str, Any] = job_manifest("base", compile={"enabled": False})["spec"]
    spec["runPolicy"] = {**spec["runPolicy"], "suspend": True}
    return spec


def running_base_spec(compile_stage: bool) -> dict[str, Any]:
    """A job that takes no capacity: 1 node, no Neuron device, no EFA."""
    spec: dict[str, Any] = job_manifest(
        "base", nodes=1, compile={"enabled": compile_stage}, resources={"limits": SMALL_LIMITS}
    )["spec"]
    return spec


def running_spec(mutation: Mutation) -> dict[str, Any]:
    """The mutation applied to a small job that runs; it stays small unless the mutation itself
    asks for Neuron devices or EFA (a job as large as a node would hold up the others)."""
    spec = mutation.apply(running_base_spec(mutation.compile))
    limits = (spec.get("resources") or {}).get("limits")
    if isinstance(limits, dict):
        spec["resources"]["limits"] = {**SMALL_LIMITS, **limits}
    return spec


def model_problems(spec: dict[str, Any]) -> str | None:
    """Why the operator refuses this spec as stored (the model, and the spec's size bound)."""
    too_large = spec_too_large(spec)
    if too_large:
        return too_large[0]
    try:
        TrainingJobSpec.model_validate(spec)
    except ValidationError as error:
        return str(error)
    return None


class FailedPasses:
    """The jobs whose reconcile pass raised, read from the operator's log as it grows."""

    def __init__(self, operator: OperatorProcess) -> None:
        self._path = operator.log_path
        self._offset = 0
        self._pending = ""
        self.jobs: dict[str, str] = {}  # job name -> the log line saying so

    def update(self) -> dict[str, str]:
        with self._path.open("rb") as log:
            log.seek(self._offset)
            chunk = log.read().decode(errors="replace")
            self._offset = log.tell()
        *lines, self._pending = (self._pending + chunk).split("\n")
        for line in lines:
            match = FAILED_PASS.search(line)
            if match:
                name = match.group(2) or match.group(4)
                self.jobs.setdefault(name, line.strip()[:300])
        return self.jobs


@dataclass
class Run:
    """A fuzzed job that is not suspended, until its verdict."""

    mutation: Mutation
    invalid: str | None  # the model's problems with the spec, or None
    started: float
    version: str = ""
    quiet_since: float = 0.0
    pods: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Verdict:
    outcome: str  # ran | pods refused | InvalidSpec | failed | waiting | no verdict
    phase: str
    reason: str
    message: str


class RunningExamples:
    """The fuzzed jobs that run: at most IN_FLIGHT at a time, each judged from its status and
    pods, and deleted once judged unless it failed (a failed job holds no capacity, and stays
    for the final check that the operator has gone quiet)."""

    def __init__(self, clients: Any, namespace: str, operator: OperatorProcess) -> None:
        self.clients = clients
        self.namespace = namespace
        self.failed_passes = FailedPasses(operator)
        self.in_flight: dict[str, Run] = {}
        self.verdicts: dict[str, tuple[Mutation, Verdict]] = {}
        self.problems: list[str] = []
        self.looping: set[str] = set()  # jobs already reported for a pass that raised
        self.started = 0
        self._polled = 0.0

    def add(self, name: str, mutation: Mutation, invalid: str | None) -> None:
        self.started += 1
        now = time.monotonic()
        self.in_flight[name] = Run(mutation, invalid, started=now, quiet_since=now)

    def wait(self, at_most: int) -> None:
        """Judges running jobs until at most `at_most` are still in flight."""
        while len(self.in_flight) > at_most:
            self.poll()
            if len(self.in_flight) > at_most:
                time.sleep(POLL_SECONDS / 2)

    def poll_now_and_then(self) -> None:
        if self.in_flight and time.monotonic() - self._polled > POLL_SECONDS:
            self.poll()

    def poll(self) -> None:
        self._polled = now = time.monotonic()
        pods: dict[str, set[str]] = {}
        for pod in self.clients.core.list_namespaced_pod(
            self.namespace, label_selector=JOB_LABEL
        ).items:
            pods.setdefault(pod.metadata.labels[JOB_LABEL], set()).add(pod.metadata.name)
        groups: dict[str, list[dict[str, Any]]] = {}
        for group in self.clients.custom.list_namespaced_custom_object(
            *PODGROUPS[:2], self.namespace, PODGROUPS[2], label_selector=JOB_LABEL
        )["items"]:
            groups.setdefault(group["metadata"]["labels"][JOB_LABEL], []).append(group)
        jobs = {
            job["metadata"]["name"]: job
            for job in self.clients.custom.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, label_selector=RUNNING_LABEL
            )["items"]
        }
        for name, run in list(self.in_flight.items()):
            job = jobs[name]
            # Quiet means nothing about the job changed: its status, its PodGroups (Volcano
            # admitting one wakes the operator), its pods.
            group_versions = sorted(g["metadata"]["resourceVersion"] for g in groups.get(name, []))
            version = json.dumps(
                [job["metadata"]["resourceVersion"], sorted(pods.get(name, set())), group_versions]
            )
            if version != run.version:
                run.version, run.quiet_since = version, now
            run.pods |= pods.get(name, set())
            status = job.get("status") or {}
            verdict = judge(status, run, quiet=now - run.quiet_since >= QUIET_SECONDS)
            if verdict is None and now - run.started > VERDICT_TIMEOUT_SECONDS:
                verdict = Verdict(
                    "no verdict", status.get("phase", ""), status.get("reason", ""), ""
                )
            if verdict is not None:
                self._finish(name, run, verdict, groups.get(name, []))

    def _finish(self, name: str, run: Run, verdict: Verdict, groups: list[dict[str, Any]]) -> None:
        del self.in_flight[name]
        self.verdicts[name] = (run.mutation, verdict)
        mutation = run.mutation
        found = [check(verdict, run, groups)]
        failed_pass = self.failed_passes.update().get(name)
        if failed_pass is not None:
            self.looping.add(name)
            found.append(f"a pass raised and is retried (a loop): {failed_pass}")
        for problem in filter(None, found):
            self.problems.append(
                f"{name} (running, {verdict.phase}/{verdict.reason}): {problem}; {mutation}"
            )
        if verdict.phase != "Failed":
            delete_job_now(self.clients, self.namespace, name)


def judge(status: dict[str, Any], run: Run, *, quiet: bool) -> Verdict | None:
    phase, reason = status.get("phase", ""), status.get("reason", "")
    message = status.get("message", "")
    # The operator's answer to the API server refusing a child: condition Admitted False, and
    # its reason as the job's (Failed when only a spec change helps, else Pending and held).
    refused = any(
        c.get("type") == "Admitted" and c.get("status") == "False" and c.get("reason") == reason
        for c in status.get("conditions") or []
    )
    if refused and phase in ("Failed", "Pending"):
        return Verdict("pods refused", phase, reason, message)
    if phase == "Failed":
        if reason == "InvalidSpec":
            return Verdict("InvalidSpec", phase, reason, message)
        return Verdict("failed", phase, reason, message)
    if run.pods and phase in ("Compiling", "Training"):
        return Verdict("ran", phase, reason, message)
    if quiet and phase and reason:
        return Verdict("ran" if run.pods else "waiting", phase, reason, message)
    return None


def names_field(message: str, field_name: str) -> bool:
    """Whether the API server's message about a refused pod names the pod field: by its name
    in any case (PreemptionPolicy), or by the kind of object it names (RuntimeClass "x")."""
    lowered = message.lower()
    return any(name.lower() in lowered for name in (field_name, field_name.removesuffix("Name")))


def check(verdict: Verdict, run: Run, groups: list[dict[str, Any]]) -> str | None:
    """What is wrong with a running job's verdict, or None."""
    field_name = run.mutation.field.split(".")[-1]
    if verdict.outcome == "no verdict":
        seen = f"{verdict.phase!r}/{verdict.reason!r}"
        return f"no verdict in {VERDICT_TIMEOUT_SECONDS:.0f} s (status {seen})"
    if run.invalid is not None:
        if verdict.outcome != "InvalidSpec":
            return (
                f"the model refuses the spec ({run.invalid[:200]}) but the job is {verdict.outcome}"
            )
        if field_name not in verdict.message:
            return f"InvalidSpec without the field: {verdict.message[:300]}"
        return None
    if verdict.outcome == "InvalidSpec":
        return f"a spec the model accepts failed InvalidSpec: {verdict.message[:300]}"
    if verdict.outcome == "pods refused" and not names_field(verdict.message, field_name):
        return f"the pods' refusal does not name {field_name}: {verdict.message[:300]}"
    if verdict.outcome == "failed" and not verdict.message:
        return "failed without a message"
    if verdict.outcome == "waiting":
        admitted = [
            g["metadata"]["name"]
            for g in groups
            if (g.get("status") or {}).get("phase") in ("Inqueue", "Running")
        ]
        if admitted:
            return f"Volcano admitted {', '.join(admitted)} but the operator created no pods"
    return None


def test_a_thousand_bad_specs_are_refused_or_failed_naming_the_field(
    dev_cluster: Any, namespace: str, tmp_path: Path
) -> None:
    # Every pass-through field has nested content, its own or its enclosing field's (the CRD
    # types podTemplate.spec, its containers and volumes as an allowlist, api/pod_fields.py,
    # whose allowed fields pass their content through); a new untyped field needs a generator,
    # and a generator's root holds untyped content (an allowlist's unknown keys are refused).
    uncovered = [f for f in PASS_THROUGH if not any(f[: len(r)] == r for r in NESTED)]
    assert not uncovered, f"pass-through fields without nested content: {uncovered}"
    typed = [r for r in NESTED if not any(f[: len(r)] == r for f in PASS_THROUGH)]
    assert not typed, f"a generator for a typed field: {typed}"
    clients = dev_cluster.clients
    port = free_port()
    with running_operator(
        dev_cluster, namespace, tmp_path, extra_args=("--metrics-port", str(port))
    ) as operator:
        # A valid neighbour, running throughout on both nodes (the fuzzed jobs that run take
        # no Neuron devices).
        create_job(clients, namespace, job_manifest("neighbour", compile={"enabled": False}))
        neighbour = wait_gang_running(clients, namespace, "neighbour", "train", 0)
        fuzz(clients, namespace, operator, port)
        job = get_job(clients, namespace, "neighbour")
        assert job["status"]["phase"] == "Training"
        assert job["status"]["restarts"]["total"] == 0
        assert {p.metadata.uid for p in job_pods(clients, namespace, "neighbour")} == {
            p.metadata.uid for p in neighbour
        }
        operator.assert_alive()
        assert "Traceback" not in operator.log()
        wait_phase(clients, namespace, "neighbour", "Training")


def fuzz(clients: Any, namespace: str, operator: OperatorProcess, port: int) -> None:
    outcomes: Counter[str] = Counter()
    accepted: dict[str, tuple[Mutation, str | None]] = {}
    problems: list[str] = []
    running = RunningExamples(clients, namespace, operator)
    sent = 0
    run_candidates = 0
    ran: set[str] = set()
    started = time.monotonic()

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(mutation=mutations())
    def send(mutation: Mutation) -> None:
        nonlocal sent, run_candidates
        sent += 1
        name = f"fz-{sent}"
        spec = mutation.apply(base_spec())
        invalid = model_problems(spec)
        runs = False
        if (
            mutation.kind in ("nested", "edge-valid")
            and invalid is None
            and running.started < RUNNING
        ):
            run_candidates += 1
            # Hypothesis sends near repeats; running one of them says all it can.
            seen = json.dumps([mutation.path, mutation.value, mutation.compile], default=str)
            runs = (mutation.pod_field or run_candidates % RUN_EVERY == 0) and seen not in ran
            ran.add(seen)
        if runs:
            running.wait(at_most=IN_FLIGHT - 1)
            spec = running_spec(mutation)
            invalid = model_problems(spec)
        else:
            running.poll_now_and_then()
        metadata = {"name": name, "labels": {RUNNING_LABEL: "true"} if runs else {}}
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingJob",
                "metadata": metadata, "spec": spec}  # fmt: skip
        try:
            # kubectl's default: unknown fields are an error, not silently dropped.
            created = clients.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict"
            )
        except Exception as error:
            status = getattr(error, "status", None)
            message = json.loads(getattr(error, "body", "{}") or "{}").get("message", str(error))
            outcomes[f"refused {status} ({mutation.kind})"] += 1
            if runs:
                outcomes["running: refused at admission"] += 1
            if status not in (400, 422) or mutation.field not in message:
                problems.append(f"{mutation}: {status} {message[:300]}")
            return
        outcomes[f"accepted ({mutation.kind})"] += 1
        # The spec as stored is what the operator reads: the API server drops nulls (a label
        # whose value is None) and fills in defaults.
        invalid = model_problems(created["spec"])
        if runs:
            running.add(name, mutation, invalid)
        else:
            accepted[name] = (mutation, invalid)

    send()
    assert sent >= EXAMPLES
    running.wait(at_most=0)
    running_seconds = time.monotonic() - started

    def statuses() -> dict[str, dict[str, Any]]:
        listed = clients.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        return {j["metadata"]["name"]: j.get("status") or {} for j in listed["items"]}

    def settled(seen: dict[str, dict[str, Any]]) -> bool:
        return all(
            seen.get(name, {}).get("observedGeneration") == 1 and seen[name].get("phase")
            for name in accepted
        )

    final = wait_for(statuses, until=settled, timeout=300, description="accepted jobs seen")
    for name, (mutation, invalid) in accepted.items():
        status = final[name]
        if not status.get("reason"):
            problems.append(f"{mutation}: phase {status['phase']} without a reason")
        if invalid is not None:
            outcomes["accepted -> Failed/InvalidSpec"] += 1
            if (status["phase"], status.get("reason")) != ("Failed", "InvalidSpec"):
                problems.append(f"{mutation}: expected InvalidSpec, got {status['phase']}")
            elif mutation.field.split(".")[-1] not in status["message"]:
                problems.append(f"{mutation}: InvalidSpec without the field: {status['message']}")
        else:
            outcomes["accepted -> valid"] += 1
            if status["phase"] == "Failed":
                problems.append(f"{mutation}: a valid spec failed: {status.get('message')}")
    for name, (mutation, verdict) in running.verdicts.items():
        print(f"{name}: {verdict.outcome} {verdict.phase}/{verdict.reason}: {mutation}"[:400])
        outcomes[f"running: {verdict.outcome}"] += 1
        outcomes[f"running: {verdict.outcome} ({verdict.phase}/{verdict.reason})"] += 1
    problems += running.problems
    # A pass that raised on any fuzzed job (suspended ones too) is retried with backoff forever.
    for name, line in running.failed_passes.update().items():
        if name not in running.looping:
            known = {**accepted, **running.verdicts}.get(name)
            culprit = known[0] if known else None
            problems.append(f"{name}: a pass raised and is retried (a loop): {line}; {culprit}")
    # Never loops: once settled, reconciles stop (only the neighbour's pods may wake it); the
    # running examples that failed are still there.
    before = metric(port, "trainium_operator_reconciles_total")
    time.sleep(10)
    spun = metric(port, "trainium_operator_reconciles_total") - before
    errors = metric(port, "trainium_operator_reconcile_errors_total")
    tracebacks = operator.log().count("Traceback")
    report: list[str] = []
    report.append(f"spec fuzzer: {sent} examples, {running.started} of them not suspended")
    for outcome, count in sorted(outcomes.items()):
        report.append(f"  {outcome:<56} {count}")
    report.append(f"  {'time to send and judge every example':<56} {running_seconds:.0f} s")
    report.append(f"  {'reconciles in 10 s once settled':<56} {spun:.0f}")
    report.append(f"  {'reconcile errors':<56} {errors:.0f}")
    report.append(f"  {'tracebacks in the operator log':<56} {tracebacks}")
    report.append(f"  {'violations':<56} {len(problems)}")
    publish_report("spec-fuzzer", report)
    assert not problems, "\n".join(problems[:20])
    assert spun <= 5, f"{spun} reconciles in 10 s of quiet: the operator loops"
    assert errors == 0
    assert tracebacks == 0
    operator.assert_alive()
