"""Deadline: spec.runPolicy.activeDeadlineSeconds fails a job active longer than it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainium_operator.api.status import Phase
from trainium_operator.lifecycle.cleanup import cleanup_on_finish
from trainium_operator.lifecycle.observed import parse_time

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass


def deadline(p: Pass) -> None:
    limit = p.job.spec.run_policy.active_deadline_seconds
    started = parse_time(p.status.start_time)
    if limit is None or started is None:
        return
    remaining = limit - (p.now - started).total_seconds()
    if remaining > 0:
        p.plan.requeue(remaining)
        return
    p.status.finish(
        Phase.FAILED,
        "DeadlineExceeded",
        f"job was active longer than spec.runPolicy.activeDeadlineSeconds ({limit}s)",
    )
    cleanup_on_finish(p.job, p.plan, p.observed)
    p.settle()
