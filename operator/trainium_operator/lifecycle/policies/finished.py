"""Finished: an ended job's pods go per cleanPodPolicy, its PodGroups are released, and it is
deleted ttlSecondsAfterFinished after its completion."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainium_operator.api.status import TERMINAL_PHASES
from trainium_operator.lifecycle.cleanup import cleanup_on_finish
from trainium_operator.lifecycle.observed import parse_time

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass


def finished(p: Pass) -> None:
    if p.status.phase not in TERMINAL_PHASES:
        return
    p.settle()
    cleanup_on_finish(p.job, p.plan, p.observed)
    ttl = p.job.spec.run_policy.ttl_seconds_after_finished
    completed = parse_time(p.status.completion_time)
    if ttl is not None and completed is not None:
        remaining = ttl - (p.now - completed).total_seconds()
        if remaining <= 0:
            p.plan.delete_job = True
        else:
            p.plan.requeue(remaining)
