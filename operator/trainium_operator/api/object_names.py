"""Names of Kubernetes objects inside the spec, checked as the API server checks them.

A name the TrainingJob's schema would take but no object can have (a Secret "Bad_Name", a
volume "a.b") only fails later, at pod creation, far from the field that caused it. Each rule
here is both a CRD schema fragment (pattern and maxLength: refused at admission, naming the
field, at no CEL cost however long the lists are) and the operator's own check (the same
refusal, in words, from `trainium-operator render` and the job's status).

`Fields` and `ListOf` describe the named fields inside pass-through pod content
(spec.podTemplate, spec.env[].valueFrom). An open `Fields` declares only those fields and keeps
x-kubernetes-preserve-unknown-fields, so its other content passes through unchanged; a closed
one is an allowlist (api/pod_fields.py): the schema declares every field it takes and nothing
else, and `problems` names any other. `Passed` is content taken as it is (the API server checks
it in the pod). `ListOf` may carry a bound: no tenant list sizes what the operator builds.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

JsonSchema = dict[str, Any]
# A refusal names at most this many unknown fields, each cut to this many characters: the
# author chose them, and the refusal lands in the job's status.
MAX_NAMED_FIELDS = 8
MAX_NAMED = 63

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
    """Pass-through object content of which these fields are checked. `refusal` set: an
    allowlist, and any other field is refused with it (why, and where the list is)."""

    known: Mapping[str, tuple[str, Node]]  # field -> (its description, what it holds)
    refusal: str | None = None
    # Refused fields that have a place elsewhere: field -> what to use instead.
    reserved: Mapping[str, str] | None = None


@dataclass(frozen=True)
class ListOf:
    item: Node
    max_items: int | None = None


@dataclass(frozen=True)
class Passed:
    """Content taken as it is, of one JSON type: "object", "string", "integer", "boolean",
    "strings" (a list of strings) or "objects" (a list of objects). An integer has a range
    (every number a tenant gives is bounded)."""

    kind: str
    minimum: int = 0
    maximum: int = 2**31 - 1


Node = NameRule | Fields | ListOf | Passed

_PASSED_SCHEMAS: Mapping[str, JsonSchema] = {
    "object": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    "string": {"type": "string"},
    "integer": {"type": "integer"},
    "boolean": {"type": "boolean"},
    "strings": {"type": "array", "items": {"type": "string"}},
    "objects": {
        "type": "array",
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    },
}
_PASSED_TYPES: Mapping[str, type | tuple[type, ...]] = {
    "object": dict,
    "string": str,
    "integer": int,
    "boolean": bool,
    "strings": list,
    "objects": list,
}


def schema(node: Node) -> JsonSchema:
    """The node as a structural schema fragment: an open object passes unknown fields
    through, a closed one declares all it takes (the API server drops or, for a strict client
    such as kubectl, refuses anything else, naming it)."""
    if isinstance(node, NameRule):
        return node.schema()
    if isinstance(node, Passed):
        passed = copy.deepcopy(dict(_PASSED_SCHEMAS[node.kind]))
        if node.kind == "integer":
            passed.update(minimum=node.minimum, maximum=node.maximum)
        return passed
    if isinstance(node, ListOf):
        bound = {} if node.max_items is None else {"maxItems": node.max_items}
        return {"type": "array", "items": schema(node.item), **bound}
    opened = {} if node.refusal else {"x-kubernetes-preserve-unknown-fields": True}
    return {
        "type": "object",
        **opened,
        "properties": {
            name: {**schema(sub), "description": description}
            for name, (description, sub) in node.known.items()
        },
    }


def _field_name(name: object) -> str:
    """A field name as a refusal shows it: as it is when it looks like one, else quoted."""
    text = str(name)
    if re.fullmatch(r"[A-Za-z][A-Za-z0-9]{0,62}", text):
        return text
    return json.dumps(text[:MAX_NAMED])


def problems(where: str, value: object, node: Node) -> list[str]:
    """What is wrong with the names in `value`, each naming its field; never raises on content
    of an unexpected shape (that is a problem too, as the schema's type would refuse it)."""
    if value is None:  # absent (the API server prunes a null it has no nullable for)
        return []
    if isinstance(node, NameRule):
        found = node.problem(where, value)
        return [found] if found else []
    if isinstance(node, Passed):
        wanted = _PASSED_TYPES[node.kind]
        plain = not (isinstance(value, bool) and node.kind == "integer")
        if not (isinstance(value, wanted) and plain):
            return [f"{where} must be {node.kind}"]
        if node.kind == "integer" and not node.minimum <= int(str(value)) <= node.maximum:
            return [f"{where} must be between {node.minimum} and {node.maximum}"]
        return []
    if isinstance(node, ListOf):
        if not isinstance(value, list):
            return [f"{where} must be a list"]
        if node.max_items is not None and len(value) > node.max_items:
            # Not item by item: a huge list is one problem, not one per item.
            return [f"{where} has {len(value)} items, at most {node.max_items} are allowed"]
        return [
            p for i, item in enumerate(value) for p in problems(f"{where}[{i}]", item, node.item)
        ]
    if not isinstance(value, dict):
        return [f"{where} must be an object"]
    listed = [
        p
        for name, (_, sub) in node.known.items()
        for p in problems(f"{where}.{name}", value.get(name), sub)
    ]
    if node.refusal is not None:
        reserved = node.reserved or {}
        unknown = [name for name in value if name not in node.known]
        listed += [
            f"{where}.{name} is set by the operator ({reserved[name]})"
            if name in reserved
            else f"{where}.{_field_name(name)} is not allowed: {node.refusal}"
            for name in unknown[:MAX_NAMED_FIELDS]
        ]
        if len(unknown) > MAX_NAMED_FIELDS:
            listed.append(f"{where}: {len(unknown) - MAX_NAMED_FIELDS} more fields not allowed")
    return listed


def split_allowed(where: str, value: object, node: Node) -> tuple[object, list[str]]:
    """`value` without what a closed `Fields` at any depth of `node` refuses (unknown and
    reserved fields), and where each removed field was."""
    if isinstance(node, ListOf) and isinstance(value, list):
        kept_items: list[object] = []
        dropped: list[str] = []
        for index, item in enumerate(value):
            kept, more = split_allowed(f"{where}[{index}]", item, node.item)
            kept_items.append(kept)
            dropped += more
        return kept_items, dropped
    if isinstance(node, Fields) and isinstance(value, dict):
        kept_fields: dict[str, object] = {}
        dropped = []
        for name, sub in value.items():
            if name in node.known:
                kept_fields[name], more = split_allowed(f"{where}.{name}", sub, node.known[name][1])
                dropped += more
            elif node.refusal is None:
                kept_fields[name] = sub
            else:
                dropped.append(f"{where}.{_field_name(name)}")
        return kept_fields, dropped
    return value, []


SECRET = subdomain("Secret")
CONFIG_MAP = subdomain("ConfigMap")
VOLUME = label("volume")

SECRET_REFERENCE = Fields({"name": ("Name of the Secret (in the job's namespace).", SECRET)})
CONFIG_MAP_REFERENCE = Fields(
    {"name": ("Name of the ConfigMap (in the job's namespace).", CONFIG_MAP)}
)
