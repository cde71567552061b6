"""A TrainingJob body -> its identity and validated spec (`JobRef`), or every problem with it.

The reconciler parses each job it reconciles this way, and `render` and the TorchX backend parse
a manifest the same way, so a spec the operator would refuse is refused by the dry run too.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from trainium_operator.api.spec import TrainingJobSpec
from trainium_operator.builders.job import JobRef

Obj = dict[str, Any]


def validation_problems(error: ValidationError) -> list[str]:
    """Pydantic errors as `spec.<camelCase path>: <message>` lines."""
    problems = []
    for item in error.errors():
        path = ".".join(str(part) for part in ("spec", *item["loc"]))
        message = item["msg"].removeprefix("Value error, ")
        problems.append(f"{path}: {message}" if item["loc"] else message)
    return problems


def parse_job(body: Obj, health_url: str | None = None) -> JobRef | list[str]:
    """The job's identity and validated spec, or the list of problems with its spec."""
    meta = body["metadata"]
    try:
        spec = TrainingJobSpec.model_validate(body.get("spec") or {})
    except ValidationError as error:
        return validation_problems(error)
    except (TypeError, AttributeError, KeyError) as error:
        # Pass-through content (spec.podTemplate) of a shape no check foresaw: the job fails
        # with a status instead of the operator retrying a traceback forever.
        return [
            f"spec.podTemplate: content of an unexpected type ({type(error).__name__}: {error})"
        ]
    return JobRef(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta["uid"],
        generation=int(meta.get("generation", 1)),
        spec=spec,
        health_url=health_url,
    )
