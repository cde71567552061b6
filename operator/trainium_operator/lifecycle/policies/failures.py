"""Failures: what failed in the current gang (a pod that failed, vanished, never starts or is
on a lost node) restarts the gang within its budget or ends the job (lifecycle.restarts).
First the attempt is raised to the highest a pod carries (a status write that was lost)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainium_operator.api.status import FailureClass, Phase
from trainium_operator.lifecycle.cleanup import cleanup_on_finish
from trainium_operator.lifecycle.failures import (
    failure_of,
    gang_never_seen,
    gang_was_whole,
    start_blocker,
    startup_overdue,
    vanished,
)
from trainium_operator.lifecycle.restarts import handle_failures, skip_unseen_gang

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass


def failures(p: Pass) -> None:
    highest = max((pod.attempt for pod in p.observed.pods), default=p.attempt)
    if highest > p.attempt:
        p.attempt = highest
        p.status.attempt = highest
    job, observed, run_policy = p.job, p.observed, p.job.spec.run_policy
    stage, attempt = p.stage, p.attempt
    gang = observed.gang(stage, attempt)
    grace = float(run_policy.node_lost_grace_period_seconds)
    found = [f for f in (failure_of(pod, observed, grace) for pod in gang.values()) if f]
    unsent = p.snapshot.unsent_gang == (stage, attempt)
    known_here = p.snapshot.gangs_known_here.get(stage, -1) >= attempt
    if gang_never_seen(p.status, gang, stage, attempt, unsent=unsent, known_here=known_here):
        # Neither a failure nor this gang to create again: the next attempt, on no budget.
        skip_unseen_gang(p)
        return
    if gang_was_whole(p.status, gang, stage, attempt, unsent=unsent):
        missing = [rank for rank in range(job.spec.nodes) if rank not in gang]
        found += [vanished(job, stage, attempt, rank) for rank in missing]
    blocker = start_blocker(job, gang)
    if found and blocker is not None:
        # A healthy rank timing out in rendezvous is not the cause: the rank that never
        # started is.
        found.insert(0, blocker)
    if not found:
        overdue = startup_overdue(job, gang, observed, p.plan)
        if overdue is not None and overdue.klass is FailureClass.APPLICATION:
            p.status.record_failure(overdue)
            p.status.finish(
                Phase.FAILED,
                overdue.reason,
                f"{overdue.message}; gave up after spec.runPolicy.startupTimeoutSeconds "
                f"({run_policy.startup_timeout_seconds}s)",
            )
            cleanup_on_finish(job, p.plan, observed)
            p.settle()
            return
        if overdue is not None:
            found = [overdue]
    if not found:
        return
    handle_failures(p, found)
    p.settle()
