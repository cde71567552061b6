"""Names of Kubernetes objects inside the spec, checked as the API server checks them.

A name the TrainingJob's schema would take but no object can have (a Secret "Bad_Name", a
volume "a.b") only fails later, at pod creation, far from the field that caused it. Each rule
here is both a CRD schema fragment (pattern and maxLength: refused at admission, naming the
field, at no CEL cost however long the lists are) and the operator's own check (the same
refusal, in words, from `trainium-operator render` and the job's status).

`Fields` and `ListOf` describe the named fields inside pass-through pod content
(spec.podTemplate, spec.env[].valueFrom): only those fields are declared, and every level keeps
x-kubernetes-preserve-unknown-fields, so any other pod field still passes through unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

JsonSchema = dict[str, Any]

# DNS-1123 subdomain: Secrets, ConfigMaps, PersistentVolumeClaims, PriorityClasses,
# ServiceAccounts, Volcano Queues.
SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# DNS-1123 label: volume and container names.
LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A Secret or ConfigMap key (Kubernetes' IsConfigMapKey); no lookahead in the API server's RE2,
# so "neither '.' nor starting with '..'" is spelled as "at most one leading dot".
CONFIG_KEY_PATTERN = r"^\.?[-_a-zA-Z0-9][-._a-zA-Z0-9]*$"


@dataclass(frozen=True)
class NameRule:
    """What a string naming one kind of thing must look like."""

    noun: str  # "Secret name"
    pattern: str
    max_length: int
    explained: str  # the rule in words: what to change the value to

    def problem(self, where: str, value: object) -> str | None:
        if not isinstance(value, str):
            return f"{where} must be a string (a {self.noun})"
        # fullmatch: Python's "$" would also match before a trailing newline.
        if len(value) > self.max_length or not re.fullmatch(self.pattern, value):
            return f"{where}: {json.dumps(value)} is not a valid {self.noun} ({self.explained})"
        return None

    def schema(self) -> JsonSchema:
        return {"type": "string", "pattern": self.pattern, "maxLength": self.max_length}


def subdomain(kind: str) -> NameRule:
    return NameRule(
        f"{kind} name",
        SUBDOMAIN_PATTERN,
        253,
        "lower-case alphanumerics, '-' or '.', starting and ending with an alphanumeric, "
        "at most 253 characters",
    )


def label(kind: str) -> NameRule:
    return NameRule(
        f"{kind} name",
        LABEL_PATTERN,
        63,
        "lower-case alphanumerics or '-', starting and ending with an alphanumeric, "
        "at most 63 characters",
    )


def config_key(kind: str) -> NameRule:
    return NameRule(
        f"{kind} key",
        CONFIG_KEY_PATTERN,
        253,
        "alphanumerics, '-', '_' or '.', at most 253 characters, neither '.' nor starting "
        "with '..'",
    )


@dataclass(frozen=True)
class Fields:
    """Pass-through object content of which only these fields are checked."""

    known: Mapping[str, tuple[str, Node]]  # field -> (its description, what it holds)


@dataclass(frozen=True)
class ListOf:
    item: Node


Node = NameRule | Fields | ListOf


def schema(node: Node) -> JsonSchema:
    """The node as a structural schema fragment that still passes unknown fields through."""
    if isinstance(node, NameRule):
        return node.schema()
    if isinstance(node, ListOf):
        return {"type": "array", "items": schema(node.item)}
    return {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            name: {**schema(sub), "description": description}
            for name, (description, sub) in node.known.items()
        },
    }


def problems(where: str, value: object, node: Node) -> list[str]:
    """What is wrong with the names in `value`, each naming its field; never raises on content
    of an unexpected shape (that is a problem too, as the schema's type would refuse it)."""
    if value is None:  # absent (the API server prunes a null it has no nullable for)
        return []
    if isinstance(node, NameRule):
        found = node.problem(where, value)
        return [found] if found else []
    if isinstance(node, ListOf):
        if not isinstance(value, list):
            return [f"{where} must be a list"]
        return [
            p for i, item in enumerate(value) for p in problems(f"{where}[{i}]", item, node.item)
        ]
    if not isinstance(value, dict):
        return [f"{where} must be an object"]
    return [
        p
        for name, (_, sub) in node.known.items()
        for p in problems(f"{where}.{name}", value.get(name), sub)
    ]


SECRET = subdomain("Secret")
CONFIG_MAP = subdomain("ConfigMap")
VOLUME = label("volume")

SECRET_REFERENCE = Fields({"name": ("Name of the Secret (in the job's namespace).", SECRET)})
CONFIG_MAP_REFERENCE = Fields(
    {"name": ("Name of the ConfigMap (in the job's namespace).", CONFIG_MAP)}
)
ENV_VAR_SOURCE = Fields(
    {
        "secretKeyRef": (
            "A key of a Secret in the job's namespace.",
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
    }
)
CONTAINER = Fields(
    {
        "name": ("Container name (a DNS-1123 label).", label("container")),
        "env": (
            "Environment variables (Kubernetes EnvVar).",
            ListOf(Fields({"valueFrom": ("Source of the variable's value.", ENV_VAR_SOURCE)})),
        ),
        "envFrom": (
            "Secrets and ConfigMaps whose keys become environment variables.",
            ListOf(
                Fields(
                    {
                        "secretRef": ("The Secret.", SECRET_REFERENCE),
                        "configMapRef": ("The ConfigMap.", CONFIG_MAP_REFERENCE),
                    }
                )
            ),
        ),
        "volumeMounts": (
            "Volumes mounted in the container (Kubernetes VolumeMount).",
            ListOf(Fields({"name": ("The volume mounted (a pod volume's name).", VOLUME)})),
        ),
    }
)
VOLUME_SOURCE = Fields(
    {
        "name": ("Volume name (a DNS-1123 label), unique in the pod.", VOLUME),
        "secret": (
            "A Secret as a volume.",
            Fields({"secretName": ("Name of the Secret (in the job's namespace).", SECRET)}),
        ),
        "configMap": ("A ConfigMap as a volume.", CONFIG_MAP_REFERENCE),
        "persistentVolumeClaim": (
            "A PersistentVolumeClaim as a volume.",
            Fields(
                {
                    "claimName": (
                        "Name of the PersistentVolumeClaim (in the job's namespace).",
                        subdomain("PersistentVolumeClaim"),
                    )
                }
            ),
        ),
        "projected": (
            "Several sources projected into one volume.",
            Fields(
                {
                    "sources": (
                        "The projected sources.",
                        ListOf(
                            Fields(
                                {
                                    "secret": ("A Secret's keys.", SECRET_REFERENCE),
                                    "configMap": ("A ConfigMap's keys.", CONFIG_MAP_REFERENCE),
                                }
                            )
                        ),
                    )
                }
            ),
        ),
    }
)
# The pass-through lists of spec.podTemplate.spec, by field, and what each item holds.
POD_SPEC_ITEMS: Mapping[str, Node] = {
    "volumes": VOLUME_SOURCE,
    "initContainers": CONTAINER,
    "containers": CONTAINER,
    "imagePullSecrets": SECRET_REFERENCE,
}
