"""A TrainingJob body -> its identity and validated spec (`JobRef`), or every problem with it.

The reconciler parses each job it reconciles this way, and `render` and the TorchX backend parse
a manifest the same way, so a spec the operator would refuse is refused by the dry run too.
"""

from __future__ import annotations

import json

from pydantic import ValidationError

from trainium_operator.api import kueue, object_names, pod_fields
from trainium_operator.api.objects import Obj
from trainium_operator.api.spec import DeviceAllocation, TrainingJobSpec, validation_context
from trainium_operator.builders.job import JobRef

# The operator copies a job's spec into each of its gang's pods (nodes x spec): a spec this
# large is refused before anything is built from it (the API server alone would take up to its
# 1.5 MiB object limit). Far above what a training job needs: the tutorial's is under 2 KiB.
MAX_SPEC_BYTES = 128 * 1024


def _json_size(value: object) -> int:
    return len(json.dumps(value, separators=(",", ":"), default=str))


def spec_too_large(spec: object) -> list[str]:
    """The refusal of a spec over MAX_SPEC_BYTES, naming the field that makes it so (the
    largest value, followed down while it is most of its parent)."""
    size = _json_size(spec)
    if size <= MAX_SPEC_BYTES:
        return []
    path, value = ["spec"], spec
    while isinstance(value, dict) and value:
        name, child = max(value.items(), key=lambda item: _json_size(item[1]))
        if _json_size(child) * 2 < _json_size(value):
            break
        path.append(str(name))
        value = child
    where = ".".join(path)
    return [
        f"{where}: the spec is {size} bytes as JSON ({_json_size(value)} of them in {where}), "
        f"at most {MAX_SPEC_BYTES} are allowed (the operator copies the spec into every pod of "
        "the gang): move large values into a ConfigMap or the claim"
    ]


def validation_problems(error: ValidationError) -> list[str]:
    """Pydantic errors as `spec.<camelCase path>: <message>` lines."""
    problems = []
    for item in error.errors():
        path = ".".join(str(part) for part in ("spec", *item["loc"]))
        message = item["msg"].removeprefix("Value error, ")
        problems.append(f"{path}: {message}" if item["loc"] else message)
    return problems


def without_refused_pod_fields(spec: Obj) -> tuple[Obj, list[str]]:
    """The spec without the spec.podTemplate.spec content the allowlist (api/pod_fields.py)
    refuses, and where each removed field was."""
    template = spec.get("podTemplate")
    if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        return spec, []
    pod_spec: Obj = template["spec"]
    kept, dropped = object_names.split_allowed(
        "spec.podTemplate.spec", pod_spec, pod_fields.POD_SPEC
    )
    assert isinstance(kept, dict)
    volumes = pod_spec.get("volumes")
    if isinstance(volumes, list) and isinstance(kept.get("volumes"), list):
        # A volume whose type was dropped goes whole: left with its name alone the API server
        # would make it an empty emptyDir, and a mount of it would silently read nothing.
        kept["volumes"] = [
            volume
            for volume, given in zip(kept["volumes"], volumes, strict=True)
            if not (isinstance(given, dict) and len(given) > 1 and volume.keys() <= {"name"})
        ]
    return {**spec, "podTemplate": {**template, "spec": kept}}, dropped


def parse_job(
    body: Obj,
    health_url: str | None = None,
    *,
    reserved_service_accounts: frozenset[str] = frozenset(),
) -> JobRef | list[str]:
    """The job's identity and validated spec, or the list of problems with its spec.
    `reserved_service_accounts`: the names no job may run as (the operator's settings).

    A job the operator ran before (it has a status phase) and that carries pod fields the
    allowlist now refuses (it was admitted by an older operator and CRD) is not failed for
    them: its running pods are left alone, and pods built from now on leave those fields out
    (`JobRef.dropped_pod_fields`, which the operator names in a Warning)."""
    meta = body["metadata"]
    spec_body: Obj = body.get("spec") or {}
    too_large = spec_too_large(spec_body)
    dropped: list[str] = []
    if isinstance(spec_body, dict) and (body.get("status") or {}).get("phase"):
        spec_body, dropped = without_refused_pod_fields(spec_body)
    try:
        spec = TrainingJobSpec.model_validate(
            spec_body, context=validation_context(reserved_service_accounts)
        )
    except ValidationError as error:
        return too_large + validation_problems(error)
    except (TypeError, AttributeError, KeyError) as error:
        # Pass-through content (spec.podTemplate) of a shape no check foresaw: the job fails
        # with a status instead of the operator retrying a traceback forever.
        return [
            f"spec.podTemplate: content of an unexpected type ({type(error).__name__}: {error})"
        ]
    labels = meta.get("labels") or {}
    refused = too_large + kueue.label_problems(labels, spec.scheduling.scheduler_name)
    refused += dra_scheduler_problems(spec, labels)
    if refused:
        return refused
    return JobRef(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta["uid"],
        generation=int(meta.get("generation", 1)),
        spec=spec,
        health_url=health_url,
        dropped_pod_fields=tuple(dropped),
        kueue_queue=labels.get(kueue.QUEUE_NAME_LABEL),
        kueue_priority_class=labels.get(kueue.PRIORITY_CLASS_LABEL),
    )


def dra_scheduler_problems(spec: TrainingJobSpec, labels: object) -> list[str]:
    """DRA jobs are Kueue's only: Volcano (v1.14.1) charges a queue and checks a PodGroup's
    minResources with the containers' requests alone (pkg/scheduler/api/pod_info.go,
    GetPodResourceRequest), so claimed devices count nowhere in its queues, and its DRA
    predicate is off unless its scheduler config sets predicate.DynamicResourceAllocationEnable.
    Kueue counts them through its deviceClassMappings (docs/neuron-stacks.md)."""
    if spec.device_allocation is not DeviceAllocation.DRA:
        return []
    if isinstance(labels, dict) and labels.get(kueue.QUEUE_NAME_LABEL) is not None:
        return []
    return [
        "spec.deviceAllocation: dra needs a job Kueue queues (label "
        f"{kueue.QUEUE_NAME_LABEL}: <LocalQueue>): Volcano's queues and PodGroup minResources "
        "do not count devices claimed through DRA; add the label or use devicePlugin"
    ]


# A Warning names at most this many dropped fields (an event message is at most 1 KiB).
MAX_NAMED_DROPPED = 8


def dropped_pod_fields_message(dropped: tuple[str, ...]) -> str:
    named = ", ".join(dropped[:MAX_NAMED_DROPPED])
    more = len(dropped) - MAX_NAMED_DROPPED
    return (
        f"{named}{f' and {more} more' if more > 0 else ''}: no longer allowed in "
        "spec.podTemplate (the operator's pod-field allowlist, docs/jobs.md); the running pods "
        "keep them, pods created from now on are built without them. Remove them from the spec."
    )
