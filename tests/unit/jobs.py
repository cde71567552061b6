"""Shared builders of TrainingJob documents for unit tests."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from trainium_operator.builders.job import JobRef
from trainium_operator.lifecycle import machine
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.observed import Observed
from trainium_operator.lifecycle.parse import parse_job
from trainium_operator.lifecycle.snapshot import Pass, Snapshot
from trainium_operator.lifecycle.status_edit import StatusEdit

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


def decide(job: JobRef, status: dict[str, Any], observed: Observed, **snapshot: Any) -> Decision:
    """One pass of the whole pipeline (`machine.decide`) over a snapshot of `job`."""
    return machine.decide(Snapshot(job, job.generation, status, observed, **snapshot))


def refused(
    status: dict[str, Any], generation: int, problems: list[str], now: datetime
) -> Decision:
    """One pass over a job whose stored spec the operator refuses."""
    seen = Observed((), {}, False, {}, now)
    return machine.decide(Snapshot(None, generation, status, seen, problems=tuple(problems)))


def run_policy(
    policy: Callable[[Pass], None] | tuple[Callable[[Pass], None], ...],
    job: JobRef,
    status: dict[str, Any],
    observed: Observed,
    **snapshot: Any,
) -> Decision:
    """One policy of the pipeline (or a few, in turn) alone over a snapshot (the table tests of
    a policy): its plan, with the status it left checked against the model."""
    snap = Snapshot(job, job.generation, status, observed, **snapshot)
    plan = Decision()
    edit = StatusEdit(status, job.generation, observed.now, plan)
    for each in policy if isinstance(policy, tuple) else (policy,):
        each(Pass(snap, edit, plan))
    plan.status = edit.validated()
    return plan


def continue_with(
    policy: Callable[[Pass], None],
    job: JobRef,
    decision: Decision,
    now: datetime,
    **snapshot: Any,
) -> None:
    """`policy` run on a plan the pipeline's earlier policies left (`decision`, edited in
    place), over a snapshot with no pods and `snapshot`'s fields."""
    seen = Observed((), {}, True, {}, now)
    plan = run_policy(policy, job, decision.status, seen, **snapshot)
    decision.status = plan.status
    decision.side_create += plan.side_create
    decision.delete_pods += plan.delete_pods
    decision.remove_annotations += plan.remove_annotations
    decision.events += plan.events
    if plan.requeue_after is not None:
        decision.requeue(plan.requeue_after, minimum=0)
