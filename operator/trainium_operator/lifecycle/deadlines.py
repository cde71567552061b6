"""Time limits the spec sets on a job: activeDeadlineSeconds and ttlSecondsAfterFinished."""

from __future__ import annotations

from trainium_operator.api.status import TERMINAL_PHASES, Phase
from trainium_operator.builders.job import JobRef
from trainium_operator.lifecycle.cleanup import cleanup_on_finish
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.observed import Observed, parse_time
from trainium_operator.lifecycle.status_edit import StatusEdit


def finished(job: JobRef, status: StatusEdit, decision: Decision, observed: Observed) -> bool:
    """Terminal: clean up per cleanPodPolicy and honour ttlSecondsAfterFinished."""
    if status.phase not in TERMINAL_PHASES:
        return False
    cleanup_on_finish(job, decision, observed)
    ttl = job.spec.run_policy.ttl_seconds_after_finished
    completed = parse_time(status.data.get("completionTime"))
    if ttl is not None and completed is not None:
        remaining = ttl - (observed.now - completed).total_seconds()
        if remaining <= 0:
            decision.delete_job = True
        else:
            decision.requeue(remaining)
    return True


def past_deadline(job: JobRef, status: StatusEdit, decision: Decision, observed: Observed) -> bool:
    """spec.runPolicy.activeDeadlineSeconds."""
    deadline = job.spec.run_policy.active_deadline_seconds
    started = parse_time(status.data.get("startTime"))
    if deadline is None or started is None:
        return False
    remaining = deadline - (observed.now - started).total_seconds()
    if remaining > 0:
        decision.requeue(remaining)
        return False
    status.finish(
        Phase.FAILED,
        "DeadlineExceeded",
        f"job was active longer than spec.runPolicy.activeDeadlineSeconds ({deadline}s)",
    )
    cleanup_on_finish(job, decision, observed)
    return True
