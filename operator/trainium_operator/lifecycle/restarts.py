"""What a failure of the current gang leads to: a gang restart within its budget, or the end.

torchrun ranks cannot rejoin alone, so a failure restarts the whole gang as a new attempt;
application failures spend spec.runPolicy.backoffLimit, infrastructure failures (a lost node,
an eviction, a vanished pod) infrastructureBackoffLimit. A compile-stage application failure
ends the job at once (the same compiler run would fail again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainium_operator.api import kueue
from trainium_operator.api.status import ConditionType, FailureClass, Phase
from trainium_operator.builders.job import Stage
from trainium_operator.lifecycle.cleanup import cleanup_on_finish, delete_gang, stuck_bound
from trainium_operator.lifecycle.decision import EventRecord
from trainium_operator.lifecycle.failures import CANNOT_START_REASONS, CLAIM_NOT_FOUND, Failure
from trainium_operator.lifecycle.status_edit import StatusEdit, profile_view, workers_view

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass


def handle_failures(p: Pass, failures: list[Failure]) -> None:
    """Failures of the current gang: the job fails, or the gang restarts within its budget."""
    job, status, stage = p.job, p.status, p.stage
    # An application failure explains more than the infrastructure noise it causes.
    failures.sort(
        key=lambda f: (
            f.reason not in CANNOT_START_REASONS and f.reason != CLAIM_NOT_FOUND,
            f.klass is not FailureClass.APPLICATION,
            f.rank if f.rank is not None else -1,
        )
    )
    first = failures[0]
    status.record_failure(first)
    for failure in failures:
        p.plan.events.append(EventRecord("Warning", failure.reason, failure.message))
    policy = job.spec.run_policy
    restarts = status.restarts
    if first.klass is FailureClass.APPLICATION:
        used, limit, budget = restarts.application, policy.backoff_limit, "backoffLimit"
    else:
        # A preemption by the queue is charged to no budget: the job waits in its queue again
        # however often a higher-priority gang takes its place, as Kueue's own job types do;
        # nor is a gang found missing after an operator restart (skip_unseen_gang).
        used = restarts.infrastructure - restarts.preempted - restarts.unseen_gang
        limit, budget = policy.infrastructure_backoff_limit, "infrastructureBackoffLimit"

    if stage is Stage.COMPILE and first.klass is FailureClass.APPLICATION:
        status.condition(ConditionType.COMPILED, False, "CompileFailed", first.message)
        status.finish(Phase.FAILED, "CompileFailed", f"compile stage failed: {first.message}")
        cleanup_on_finish(job, p.plan, p.observed)
        return
    if used >= limit and not is_preemption(first):
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
        cleanup_on_finish(job, p.plan, p.observed)
        return
    count_restart(
        status, "application" if first.klass is FailureClass.APPLICATION else "infrastructure"
    )
    if is_preemption(first):
        count_restart(status, "preempted")
    restart_gang(p, stage=stage, attempt=p.attempt, reason=first.reason, message=first.message)


def is_preemption(failure: Failure) -> bool:
    """Kueue evicted the gang to admit a higher-priority one (not a pods-ready timeout or a
    stopped queue, which spend infrastructureBackoffLimit)."""
    return failure.reason == kueue.EVICTED_REASON_PREFIX + kueue.PREEMPTED


def restart_for(
    p: Pass, failure: Failure, kind: str, *, attempt: int, reason: str | None = None
) -> None:
    """A restart the health policies decide (a stall, a straggler's node replaced): counted by
    `kind`, recorded as status.lastFailure, the training gang restarted."""
    count_restart(p.status, kind)
    p.status.record_failure(failure)
    restart_gang(
        p,
        stage=failure.stage,
        attempt=attempt,
        reason=reason or failure.reason,
        message=failure.message,
    )


def count_restart(status: StatusEdit, kind: str) -> None:
    """One more restart of `kind` in status.restarts (restart_gang adds it to the total)."""
    restarts = status.restarts
    status.restarts = restarts.model_copy(update={kind: getattr(restarts, kind) + 1})


def restart_gang(p: Pass, *, stage: Stage, attempt: int, reason: str, message: str) -> None:
    """Stops the whole gang and records the next attempt, before any of it happens. The
    caller has counted the restart by its kind in status.restarts; this adds it to the total."""
    job, status, observed = p.job, p.status, p.observed
    new_attempt = _next_attempt(p, stage, attempt)
    # torchrun ranks cannot rejoin alone: stop the whole gang. Keep this attempt's failed
    # pods for their logs; drop failed pods of older attempts.
    old = [
        pod
        for pod in observed.pods
        if pod.attempt <= attempt
        and (not pod.terminal or (pod.stage is stage and pod.attempt < attempt))
    ]
    delete_gang(p.plan, old, observed, stuck_bound(job))
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
    p.plan.status_first = True
    p.plan.requeue(1.0)


def _next_attempt(p: Pass, stage: Stage, attempt: int) -> int:
    """Records the attempt after `attempt` in the status, counted in status.restarts.total, with
    no worker of it yet and (profiled training) its profile to come; returns it."""
    job, status = p.job, p.status
    count_restart(status, "total")
    new_attempt = status.attempt = attempt + 1
    status.workers = workers_view({}, job.spec.nodes)
    if stage is Stage.TRAIN and job.spec.profile.enabled:
        status.profile = profile_view(job, new_attempt)
    return new_attempt


def skip_unseen_gang(p: Pass) -> None:
    """A gang recorded by an earlier operator process of which no pod exists or was seen
    (lifecycle.failures.gang_never_seen): most likely that process stopped between the
    record and the creates. The attempt is not reused all the same: had its pods been placed
    and force-deleted while no operator ran, their processes may still run on their nodes, and
    a second gang of one attempt would share its rendezvous. So the gang starts as the next
    attempt: counted as a restart (status.restarts.total stays the attempt number), of the
    infrastructure, charged to no budget and with no failure recorded or Warning posted, since
    nothing says one happened. The gang policy creates it in the same pass, after the status
    that records it."""
    job, status, stage, attempt = p.job, p.status, p.stage, p.attempt
    count_restart(status, "infrastructure")
    count_restart(status, "unseen_gang")
    new_attempt = p.attempt = _next_attempt(p, stage, attempt)
    if status.stage_int(stage, "firstAttempt") == attempt:
        # It was the stage's first gang and nothing of it was seen to run: the next one
        # starts afresh rather than resuming (lifecycle.policies.gang).
        status.set_stage(stage, "firstAttempt", new_attempt)
    if status.phase is Phase.RESTARTING:
        # The restart's message names the attempt it starts; its reason (and so no new event)
        # stays.
        status.transition(
            Phase.RESTARTING,
            str(status.data.get("reason") or "GangRestart"),
            f"restarting all {job.spec.nodes} {stage.value} pods as attempt {new_attempt} (no "
            f"pod of attempt {attempt} was found after an operator restart)",
        )
    p.plan.status_first = True
    p.plan.events.append(
        EventRecord(
            "Normal",
            "GangNotFound",
            f"no pod of {stage.value} attempt {attempt} exists and this operator instance did "
            "not create it (the operator restarted after recording the gang, before or while "
            f"creating it); creating the gang as attempt {new_attempt}",
        )
    )
