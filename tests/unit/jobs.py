"""Shared builders of TrainingJob documents for unit tests."""

from __future__ import annotations

from typing import Any

from trainium_operator.builders.job import JobRef
from trainium_operator.lifecycle.parse import parse_job

UID = "1f0e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def job_document(**spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "image": "example.com/train:1",
        "command": {
            "script": "/opt/trainium/trainium_training/pretrain.py",
            "args": ["--lr", "1e-4"],
            # Our BERT script resumes with --resume; the operator adds it only when asked.
            "resumeArgs": ["--resume"],
        },
        "nodes": 2,
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": "trainium.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "bert", "namespace": "team-a", "uid": UID, "generation": 1},
        "spec": spec,
    }


def job_ref(**spec_overrides: Any) -> JobRef:
    parsed = parse_job(job_document(**spec_overrides))
    assert isinstance(parsed, JobRef), parsed
    return parsed
