"""What a failure of the current gang leads to: a gang restart within its budget, or the end.

torchrun ranks cannot rejoin alone, so a failure restarts the whole gang as a new attempt;
application failures spend spec.runPolicy.backoffLimit, infrastructure failures (a lost node,
an eviction, a vanished pod) infrastructureBackoffLimit. A compile-stage application failure
ends the job at once (the same compiler run would fail again).
"""

from __future__ import annotations

from typing import Any

from trainium_operator.api.status import ConditionType, FailureClass, Phase
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.lifecycle.cleanup import cleanup_on_finish, delete_gang, stuck_bound
from trainium_operator.lifecycle.decision import Decision, EventRecord
from trainium_operator.lifecycle.failures import CANNOT_START_REASONS, CLAIM_NOT_FOUND, Failure
from trainium_operator.lifecycle.observed import Observed
from trainium_operator.lifecycle.status_edit import StatusEdit, workers_view

Obj = dict[str, Any]


def handle_failures(
    job: JobRef,
    *,
    status: StatusEdit,
    decision: Decision,
    observed: Observed,
    stage: Stage,
    attempt: int,
    failures: list[Failure],
) -> None:
    # An application failure explains more than the infrastructure noise it causes.
    failures.sort(
        key=lambda f: (
            f.reason not in CANNOT_START_REASONS and f.reason != CLAIM_NOT_FOUND,
            f.klass is not FailureClass.APPLICATION,
            f.rank,
        )
    )
    first = failures[0]
    status.record_failure(first)
    for failure in failures:
        decision.events.append(EventRecord("Warning", failure.reason, failure.message))
    policy = job.spec.run_policy
    restarts = restart_counts(status.data)
    if first.klass is FailureClass.APPLICATION:
        used, limit, budget = restarts.get("application", 0), policy.backoff_limit, "backoffLimit"
    else:
        used, limit = restarts.get("infrastructure", 0), policy.infrastructure_backoff_limit
        budget = "infrastructureBackoffLimit"

    if stage is Stage.COMPILE and first.klass is FailureClass.APPLICATION:
        status.condition(ConditionType.COMPILED, False, "CompileFailed", first.message)
        status.finish(Phase.FAILED, "CompileFailed", f"compile stage failed: {first.message}")
        cleanup_on_finish(job, decision, observed)
        return
    if used >= limit:
        reason = (
            "BackoffLimitExceeded"
            if first.klass is FailureClass.APPLICATION
            else "InfrastructureBackoffLimitExceeded"
        )
        status.finish(
            Phase.FAILED,
            reason,
            f"{first.message}; spec.runPolicy.{budget} ({limit}) exhausted",
        )
        cleanup_on_finish(job, decision, observed)
        return

    count_restart(
        status, "application" if first.klass is FailureClass.APPLICATION else "infrastructure"
    )
    restart_gang(
        job,
        status=status,
        decision=decision,
        observed=observed,
        stage=stage,
        attempt=attempt,
        reason=first.reason,
        message=first.message,
    )


def restart_counts(status: Obj) -> Obj:
    """A copy of status.restarts, with the counts a job that never restarted has."""
    return dict(status.get("restarts") or {"total": 0, "application": 0, "infrastructure": 0})


def count_restart(status: StatusEdit, kind: str) -> None:
    """One more restart of `kind` in status.restarts (restart_gang adds it to the total)."""
    restarts = restart_counts(status.data)
    restarts[kind] = int(restarts.get(kind, 0)) + 1
    status.data["restarts"] = restarts


def restart_gang(
    job: JobRef,
    *,
    status: StatusEdit,
    decision: Decision,
    observed: Observed,
    stage: Stage,
    attempt: int,
    reason: str,
    message: str,
) -> None:
    """Stops the whole gang and records the next attempt, before any of it happens. The
    caller has counted the restart by its kind in status.restarts; this adds it to the total."""
    count_restart(status, "total")
    new_attempt = attempt + 1
    status.data["attempt"] = new_attempt
    # torchrun ranks cannot rejoin alone: stop the whole gang. Keep this attempt's failed
    # pods for their logs; drop failed pods of older attempts.
    old = [
        p
        for p in observed.pods
        if p.attempt <= attempt and (not p.terminal or (p.stage is stage and p.attempt < attempt))
    ]
    delete_gang(decision, old, observed, stuck_bound(job))
    status.transition(
        Phase.RESTARTING,
        "GangRestart",
        f"restarting all {job.spec.nodes} {stage.value} pods as attempt {new_attempt} after "
        f"{reason}: {message}",
        warning=True,
    )
    status.condition(ConditionType.RESTARTING, True, reason, message)
    status.condition(ConditionType.RUNNING, False, "GangRestart", f"attempt {new_attempt} starting")
    # The new gang is created by a later pass, once this status is stored and the old pods
    # are gone (their deletion events wake the job).
    decision.status_first = True
    decision.requeue(1.0)
    status.data["workers"] = workers_view({}, job.spec.nodes)
    if stage is Stage.TRAIN and job.spec.profile.enabled:
        status.data["profile"] = {
            "path": job.profile_dir(new_attempt),
            "claimName": job.spec.storage.claim_name,
        }
