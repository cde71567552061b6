"""The TrainingJob CustomResourceDefinition, generated from the pydantic spec model.

One source of truth: the CRD's structural schema, defaults, descriptions and CEL rules come
from `spec.py`; `crds/trainium.dev_trainingjobs.yaml` is this function's output, checked
byte for byte by a test (regenerate with `trainium-operator render --crd`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode

from trainium_operator.api import spec as spec_model
from trainium_operator.api import status as status_model
from trainium_operator.api.spec import JOB_NAME_PATTERN, MAX_JOB_NAME_LENGTH
from trainium_operator.api.status import Phase

JsonSchema = dict[str, Any]

PHASES = tuple(phase.value for phase in Phase)


def _inline(schema: JsonSchema, defs: dict[str, JsonSchema]) -> JsonSchema:
    """Turn pydantic's JSON schema into a Kubernetes structural schema.

    Structural schemas forbid $ref, anyOf-with-null for optional fields and titles.
    """
    if "$ref" in schema:
        target = copy.deepcopy(defs[schema["$ref"].rsplit("/", 1)[-1]])
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        target.update(rest)
        return _inline(target, defs)
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express union {schema['anyOf']} structurally")
        merged = {k: v for k, v in schema.items() if k != "anyOf"}
        merged.update(_inline(options[0], defs))
        if "description" in schema:
            merged["description"] = schema["description"]
        return _inline(merged, defs)
    out: JsonSchema = {}
    for key, value in schema.items():
        if key in ("title", "additionalProperties") and not isinstance(value, dict):
            continue
        if key == "default" and value is None:
            continue
        if key == "description":
            # Docstrings wrap lines; kubectl explain re-wraps text itself.
            out[key] = " ".join(value.split())
            continue
        if key == "properties":
            out[key] = {name: _inline(sub, defs) for name, sub in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = _inline(value, defs)
        else:
            out[key] = value
    if out.get("x-kubernetes-preserve-unknown-fields"):
        out["type"] = "object"
        out.pop("additionalProperties", None)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def _each_schema(schema: JsonSchema, edit: Callable[[JsonSchema], None]) -> JsonSchema:
    """Edits `schema` and every schema nested in its properties and items, outermost first."""
    edit(schema)
    for sub in schema.get("properties", {}).values():
        _each_schema(sub, edit)
    if isinstance(schema.get("items"), dict):
        _each_schema(schema["items"], edit)
    return schema


def _structural_schema(model: type[BaseModel], mode: JsonSchemaMode) -> JsonSchema:
    raw = model.model_json_schema(by_alias=True, mode=mode)
    defs = raw.pop("$defs", {})
    return _inline(raw, defs)


def _empty_object_default(schema: JsonSchema) -> None:
    """Object defaults become `{}` so nested field defaults apply (the API server defaults
    recursively) and the schema states each default once, at its field."""
    if schema.get("type") == "object" and isinstance(schema.get("default"), dict):
        schema["default"] = {}


def _no_default(schema: JsonSchema) -> None:
    """Status carries no defaults: the API server would otherwise write them into every stored
    status, and a status field's absence means "not observed yet"."""
    schema.pop("default", None)


def spec_schema() -> JsonSchema:
    schema = _each_schema(
        _structural_schema(spec_model.TrainingJobSpec, "validation"), _empty_object_default
    )
    for name in spec_model.IMMUTABLE_SPEC_FIELDS:
        schema["properties"][name].setdefault("x-kubernetes-validations", []).append(
            {"rule": "self == oldSelf", "message": f"spec.{name} is immutable"}
        )
        # A field's own rule runs only when it is there before and after: adding or removing
        # it (an outputDir set on a running job) is refused at the spec level.
        schema.setdefault("x-kubernetes-validations", []).append(
            {
                "rule": f"has(self.{name}) == has(oldSelf.{name})",
                "message": f"spec.{name} is immutable: it cannot be added or removed once the "
                "job exists",
            }
        )
    schema["description"] = "Desired state of a distributed training job on Trainium nodes."
    return schema


def status_schema() -> JsonSchema:
    schema = _each_schema(
        _structural_schema(status_model.TrainingJobStatus, "serialization"), _no_default
    )
    phase = schema["properties"]["phase"]
    phase["description"] = "Where the job is: " + ", ".join(PHASES) + "."
    return schema


def _printer_columns() -> list[JsonSchema]:
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Nodes", "type": "integer", "jsonPath": ".spec.nodes"},
        {"name": "Workers", "type": "string", "jsonPath": ".status.workers.summary"},
        {"name": "Queue", "type": "string", "jsonPath": ".status.queue.summary"},
        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts.total"},
        {"name": "Step", "type": "string", "jsonPath": ".status.progress.stepSummary"},
        {"name": "Rate", "type": "string", "jsonPath": ".status.progress.rateSummary"},
        {"name": "ETA", "type": "string", "jsonPath": ".status.progress.etaSummary"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
        {"name": "Instance", "type": "string", "jsonPath": ".spec.instanceType", "priority": 1},
        {"name": "Goodput", "type": "string", "jsonPath": ".status.goodput.summary", "priority": 1},
    ]


_NAME_RULE = f"self.metadata.name.matches('{JOB_NAME_PATTERN.pattern}')"
_METADATA_RULES: list[JsonSchema] = [
    {
        "rule": f"size(self.metadata.name) <= {MAX_JOB_NAME_LENGTH}",
        "message": f"metadata.name must be at most {MAX_JOB_NAME_LENGTH} characters: it names "
        "the job's Service and pods",
    },
    {
        "rule": _NAME_RULE,
        "message": "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', "
        "starting with a letter): it names the job's headless Service",
    },
]


def training_job_crd() -> JsonSchema:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{spec_model.PLURAL}.{spec_model.GROUP}",
            "labels": {"app.kubernetes.io/name": "trainium-operator"},
        },
        "spec": {
            "group": spec_model.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": spec_model.KIND,
                "listKind": f"{spec_model.KIND}List",
                "plural": spec_model.PLURAL,
                "singular": spec_model.SINGULAR,
                "shortNames": list(spec_model.SHORT_NAMES),
                "categories": ["all", "trainium"],
            },
            "versions": [
                {
                    "name": spec_model.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(),
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A distributed PyTorch training job on AWS Trainium: "
                            "compile with neuron_parallel_compile, train with torchrun on "
                            "gang-scheduled nodes, profile.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                            "x-kubernetes-validations": _METADATA_RULES,
                        }
                    },
                }
            ],
        },
    }
