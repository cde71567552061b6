"""The TrainingJob CustomResourceDefinition, generated from the pydantic spec model.

One source of truth: the CRD's structural schema, defaults, descriptions and CEL rules come
from `spec.py`; `crds/trainium.dev_trainingjobs.yaml` is this function's output, checked
byte for byte by a test (regenerate with `trainium-operator render --crd`).
"""

from __future__ import annotations

import copy
from typing import Any

from trainium_operator.api import spec as spec_model
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


def _strip_object_defaults(schema: JsonSchema) -> JsonSchema:
    """Object defaults become `{}` so nested field defaults apply (the API server defaults
    recursively) and the schema states each default once, at its field."""
    if schema.get("type") == "object" and isinstance(schema.get("default"), dict):
        schema["default"] = {}
    for sub in schema.get("properties", {}).values():
        _strip_object_defaults(sub)
    if isinstance(schema.get("items"), dict):
        _strip_object_defaults(schema["items"])
    return schema


def spec_schema() -> JsonSchema:
    raw = spec_model.TrainingJobSpec.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    schema = _strip_object_defaults(_inline(raw, defs))
    for name in spec_model.IMMUTABLE_SPEC_FIELDS:
        schema["properties"][name].setdefault("x-kubernetes-validations", []).append(
            {"rule": "self == oldSelf", "message": f"spec.{name} is immutable"}
        )
    schema["description"] = "Desired state of a distributed training job on Trainium nodes."
    return schema


def _condition_schema() -> JsonSchema:
    return {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string", "description": "Condition type, e.g. Compiled."},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string", "description": "CamelCase reason."},
            "message": {"type": "string", "description": "Human-readable detail."},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer", "format": "int64"},
        },
    }


def _stage_times_schema(stage: str) -> JsonSchema:
    return {
        "type": "object",
        "description": f"When the {stage} stage started and completed.",
        "properties": {
            "startTime": {"type": "string", "format": "date-time"},
            "completionTime": {"type": "string", "format": "date-time"},
            "firstAttempt": {
                "type": "integer",
                "format": "int32",
                "description": f"Attempt of the {stage} stage's first gang; a training attempt "
                "after it resumes from the newest checkpoint.",
            },
            "fullGangAttempt": {
                "type": "integer",
                "format": "int32",
                "description": "Newest attempt all of whose pods existed at once; a pod of it "
                "that vanishes restarts the whole gang instead of being re-created alone.",
            },
        },
    }


def status_schema() -> JsonSchema:
    integer = {"type": "integer", "format": "int32"}
    return {
        "type": "object",
        "description": "Observed state, written by the operator.",
        "properties": {
            "phase": {
                "type": "string",
                "enum": list(PHASES),
                "description": "Where the job is: " + ", ".join(PHASES) + ".",
            },
            "reason": {"type": "string", "description": "Reason of the latest transition."},
            "message": {"type": "string", "description": "Detail of the latest transition."},
            "observedGeneration": {"type": "integer", "format": "int64"},
            "conditions": {
                "type": "array",
                "items": _condition_schema(),
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
            "attempt": {**integer, "description": "Training attempt, 0 for the first."},
            "startTime": {"type": "string", "format": "date-time"},
            "completionTime": {"type": "string", "format": "date-time"},
            "compile": _stage_times_schema("compile"),
            "training": _stage_times_schema("training"),
            "workers": {
                "type": "object",
                "description": "Pods of the current stage.",
                "properties": {
                    "ready": integer,
                    "total": integer,
                    "succeeded": integer,
                    "failed": integer,
                    "summary": {"type": "string", "description": "ready/total"},
                },
            },
            "restarts": {
                "type": "object",
                "description": "Gang restarts by cause.",
                "properties": {
                    "total": integer,
                    "application": integer,
                    "infrastructure": integer,
                },
            },
            "lastFailure": {
                "type": "object",
                "description": "The failure that caused the latest restart or the job failure.",
                "properties": {
                    "class": {"type": "string", "enum": ["Application", "Infrastructure"]},
                    "stage": {"type": "string"},
                    "pod": {"type": "string"},
                    "node": {"type": "string"},
                    "rank": integer,
                    "exitCode": integer,
                    "reason": {"type": "string"},
                    "message": {"type": "string"},
                    "time": {"type": "string", "format": "date-time"},
                },
            },
            "profileUploads": {
                "type": "array",
                "description": "The S3 upload of each ended training attempt's profile "
                "(spec.profile.s3Uri).",
                "items": {
                    "type": "object",
                    "required": ["attempt"],
                    "properties": {
                        "attempt": integer,
                        "state": {
                            "type": "string",
                            "enum": ["Pending", "Running", "Succeeded", "Failed", "NoProfile"],
                        },
                        "pod": {"type": "string"},
                        "destination": {"type": "string"},
                        "s3Uri": {
                            "type": "string",
                            "description": "Set once the manifest (the commit marker) is in S3.",
                        },
                        "message": {"type": "string"},
                    },
                },
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["attempt"],
            },
            "profile": {
                "type": "object",
                "description": "Where the profiler writes (when spec.profile.enabled), and "
                "where the profile is in S3 once its upload is complete.",
                "properties": {
                    "path": {"type": "string"},
                    "claimName": {"type": "string"},
                    "s3Uri": {
                        "type": "string",
                        "description": "The attempt's profile in S3; set once its manifest "
                        "(the commit marker) is uploaded.",
                    },
                    "upload": {
                        "type": "object",
                        "description": "The upload of the attempt's profile to S3.",
                        "properties": {
                            "state": {
                                "type": "string",
                                "enum": ["Pending", "Running", "Succeeded", "Failed", "NoProfile"],
                            },
                            "pod": {"type": "string"},
                            "attempt": integer,
                            "destination": {"type": "string"},
                            "message": {"type": "string"},
                        },
                    },
                },
            },
        },
    }


def _printer_columns() -> list[JsonSchema]:
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Nodes", "type": "integer", "jsonPath": ".spec.nodes"},
        {"name": "Workers", "type": "string", "jsonPath": ".status.workers.summary"},
        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts.total"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
        {"name": "Instance", "type": "string", "jsonPath": ".spec.instanceType", "priority": 1},
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
