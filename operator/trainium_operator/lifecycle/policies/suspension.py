"""Suspension: spec.runPolicy.suspend deletes the gang and its PodGroups; leaving it starts a
new gang (a new attempt once the job had started). Also fixes the stage and attempt the
policies after it work on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainium_operator.api.status import ConditionType, Phase
from trainium_operator.builders.job import Stage
from trainium_operator.lifecycle.cleanup import delete_gang, stuck_bound
from trainium_operator.lifecycle.status_edit import timestamp, workers_view

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass


def suspension(p: Pass) -> None:
    job, status = p.job, p.status
    compile_done = not job.spec.compile.enabled or status.stage_time(
        Stage.COMPILE, "completionTime"
    )
    p.stage = Stage.TRAIN if compile_done else Stage.COMPILE
    p.attempt = status.attempt
    if job.spec.run_policy.suspend:
        _suspend(p)
        p.settle()
    elif status.phase is Phase.SUSPENDED:
        _resume(p)


def _suspend(p: Pass) -> None:
    status = p.status
    if status.phase is not Phase.SUSPENDED:
        status.transition(Phase.SUSPENDED, "Suspended", "job suspended: pods deleted")
        status.condition(
            ConditionType.SUSPENDED, True, "Suspended", "spec.runPolicy.suspend is true"
        )
        status.condition(ConditionType.RUNNING, False, "Suspended", "job suspended")
    live = [pod for pod in p.observed.pods if not pod.terminal]
    delete_gang(p.plan, live, p.observed, stuck_bound(p.job))
    p.plan.delete_podgroups.extend(sorted(p.observed.podgroups))
    # Suspend removes the pods on purpose: their absence is not a vanished pod.
    status.forget_stage_records("fullGangAttempt", "createdAttempt")
    status.workers = workers_view({}, p.job.spec.nodes)


def _resume(p: Pass) -> None:
    status = p.status
    if status.start_time:
        p.attempt += 1
        status.attempt = p.attempt
    status.start_time = timestamp(p.now)
    status.condition(ConditionType.SUSPENDED, False, "Resumed", "spec.runPolicy.suspend is false")
    status.transition(Phase.PENDING, "Resumed", f"resuming the {p.stage.value} stage")
