"""The TrainingJob state machine: (job, status, observed cluster) -> Decision. Pure.

Pending -> Compiling -> Training -> Succeeded | Failed, with Restarting between gangs and
Suspended on request. Everything the operator does follows from this function's output, so
a reconcile repeated after an operator restart computes the same decision from the same
observations (children have deterministic names; counters live in the status).

`decide` runs the policies in turn, each in a module of its own: deadlines (the spec's time
limits), failures (what failed in the current gang), restarts (what a failure leads to),
admission (why a gang waits), cleanup (deleting pods so nothing hangs); blockers and
profile_upload are applied by the reconciler beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from trainium_operator.api.spec import NeuronStack
from trainium_operator.api.status import ConditionType, FailureClass, Phase
from trainium_operator.builders import pods as pod_builders
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.lifecycle.admission import waiting_reason
from trainium_operator.lifecycle.cleanup import (
    cleanup_on_finish,
    delete_gang,
    is_lost,
    is_overdue,
    stuck_bound,
)
from trainium_operator.lifecycle.compile_cache import compile_cache_view
from trainium_operator.lifecycle.deadlines import finished, past_deadline
from trainium_operator.lifecycle.decision import Decision, EventRecord, Obj
from trainium_operator.lifecycle.failures import (
    failure_of,
    gang_was_whole,
    node_lost_requeue,
    start_blocker,
    startup_overdue,
    vanished,
)
from trainium_operator.lifecycle.observed import Observed, PodView
from trainium_operator.lifecycle.restarts import handle_failures
from trainium_operator.lifecycle.status_edit import StatusEdit, timestamp, workers_view

STAGE_PHASE = {Stage.COMPILE: Phase.COMPILING, Stage.TRAIN: Phase.TRAINING}
COMPILED_MESSAGES = {
    NeuronStack.XLA: "neuron_parallel_compile filled the compile cache",
    NeuronStack.NATIVE: "the compile steps filled the persistent NEFF cache",
}
# An old pod that survives its force deletion (a finalizer holds it) fails the job this many
# stuck bounds after its deletion was due, instead of holding the next attempt forever.
OLD_GANG_GIVE_UP_BOUNDS = 3


SPEC_REFUSED_AFTER_UPGRADE = "SpecRefusedAfterUpgrade"


def _accepted_before(status: StatusEdit, generation: int) -> bool:
    """An operator already ran this very spec (this generation) and the job has not ended: a
    refusal now comes from the operator's rules having changed (an upgrade), not the spec."""
    return status.phase not in (None, Phase.SUCCEEDED, Phase.FAILED) and (
        status.data.get("observedGeneration") == generation
    )


def invalid(current_status: Obj, generation: int, problems: list[str], now: datetime) -> Decision:
    """The job's spec cannot be run: fail it once, with every problem named. A job an earlier
    operator already ran under this same spec is held instead: its pods are left alone,
    nothing new is created, and a Blocked condition (one Warning) names the fields to edit."""
    decision = Decision()
    status = StatusEdit(current_status, generation, now, decision)
    if _accepted_before(status, generation):
        message = (
            "this spec was accepted by an earlier operator version and is refused now: "
            + "; ".join(problems)
            + "; its pods are left alone and nothing new is created until the spec is edited"
        )
        held = status.find_condition(ConditionType.BLOCKED)
        if not (held and held["status"] == "True" and held["reason"] == SPEC_REFUSED_AFTER_UPGRADE):
            decision.events.append(EventRecord("Warning", SPEC_REFUSED_AFTER_UPGRADE, message))
        status.condition(ConditionType.BLOCKED, True, SPEC_REFUSED_AFTER_UPGRADE, message)
        decision.status = status.validated()
        return decision
    message = "invalid spec: " + "; ".join(problems)
    if status.phase is not Phase.FAILED or status.data.get("message") != message:
        status.finish(Phase.FAILED, "InvalidSpec", message)
    status.data["observedGeneration"] = generation
    decision.status = status.validated()
    return decision


@dataclass(slots=True)
class _Pass:
    """One decision in the making: what each policy below reads and writes."""

    job: JobRef
    status: StatusEdit
    decision: Decision
    observed: Observed

    def done(self) -> Decision:
        self.decision.status = self.status.validated()
        return self.decision


def decide(job: JobRef, current_status: Obj, observed: Observed) -> Decision:
    """The whole lifecycle as one pass through small policies, each of which may end it."""
    decision = Decision()
    status = StatusEdit(current_status, job.generation, observed.now, decision)
    status.data["observedGeneration"] = job.generation
    p = _Pass(job, status, decision, observed)
    if finished(job, status, decision, observed):
        return p.done()
    compile_done = not job.spec.compile.enabled or status.stage_time(
        Stage.COMPILE, "completionTime"
    )
    stage = Stage.TRAIN if compile_done else Stage.COMPILE
    if _suspended(p):
        return p.done()
    attempt = _resumed(p, stage)
    if past_deadline(job, status, decision, observed):
        return p.done()
    attempt = _attempt_floor(p, attempt)
    if _failed(p, stage, attempt):
        return p.done()
    next_stage = _stage_succeeded(p, stage, attempt)
    if next_stage is None:
        return p.done()
    status.clear(ConditionType.BLOCKED, "Unblocked", "nothing is in the job's way")
    _ensure_gang(
        job,
        status=status,
        decision=decision,
        observed=observed,
        stage=next_stage,
        attempt=attempt,
        gang=observed.gang(next_stage, attempt),
    )
    grace = float(job.spec.run_policy.node_lost_grace_period_seconds)
    wait = node_lost_requeue(observed.gang(next_stage, attempt), observed, grace)
    if wait is not None:
        decision.requeue(wait)
    return p.done()


def _suspended(p: _Pass) -> bool:
    """spec.runPolicy.suspend: no pods, no PodGroups."""
    if not p.job.spec.run_policy.suspend:
        return False
    status = p.status
    if status.phase is not Phase.SUSPENDED:
        status.transition(Phase.SUSPENDED, "Suspended", "job suspended: pods deleted")
        status.condition(
            ConditionType.SUSPENDED, True, "Suspended", "spec.runPolicy.suspend is true"
        )
        status.condition(ConditionType.RUNNING, False, "Suspended", "job suspended")
    live = [pod for pod in p.observed.pods if not pod.terminal]
    delete_gang(p.decision, live, p.observed, stuck_bound(p.job))
    p.decision.delete_podgroups.extend(sorted(p.observed.podgroups))
    for section in ("compile", "training"):
        # Suspend removes the pods on purpose: their absence is not a vanished pod.
        status.data.get(section, {}).pop("fullGangAttempt", None)
    status.data["workers"] = workers_view({}, p.job.spec.nodes)
    return True


def _resumed(p: _Pass, stage: Stage) -> int:
    """Leaving Suspended: a new gang (a new attempt once the job had started)."""
    status = p.status
    attempt = status.attempt
    if status.phase is Phase.SUSPENDED:
        if status.data.get("startTime"):
            attempt += 1
            status.data["attempt"] = attempt
        status.data["startTime"] = timestamp(p.observed.now)
        status.condition(
            ConditionType.SUSPENDED, False, "Resumed", "spec.runPolicy.suspend is false"
        )
        status.transition(Phase.PENDING, "Resumed", f"resuming the {stage.value} stage")
    return attempt


def _attempt_floor(p: _Pass, attempt: int) -> int:
    """Never go below an attempt a pod already carries (a status write that was lost)."""
    highest = max((pod.attempt for pod in p.observed.pods), default=attempt)
    if highest > attempt:
        p.status.data["attempt"] = highest
        return highest
    return attempt


def _failed(p: _Pass, stage: Stage, attempt: int) -> bool:
    """Failures of the current gang (including pods that vanished or never start): a restart,
    or the end of the job."""
    job, observed, run_policy = p.job, p.observed, p.job.spec.run_policy
    gang = observed.gang(stage, attempt)
    grace = float(run_policy.node_lost_grace_period_seconds)
    failures = [f for f in (failure_of(pod, observed, grace) for pod in gang.values()) if f]
    if gang_was_whole(p.status, gang, stage, attempt):
        failures += [
            vanished(job, stage, attempt, rank)
            for rank in range(job.spec.nodes)
            if rank not in gang
        ]
    blocker = start_blocker(job, gang)
    if failures and blocker is not None:
        # A healthy rank timing out in rendezvous is not the cause: the rank that never
        # started is.
        failures.insert(0, blocker)
    if not failures:
        overdue = startup_overdue(job, gang, observed, p.decision)
        if overdue is not None and overdue.klass is FailureClass.APPLICATION:
            p.status.data["lastFailure"] = overdue.as_status(observed.now)
            p.status.finish(
                Phase.FAILED,
                overdue.reason,
                f"{overdue.message}; gave up after spec.runPolicy.startupTimeoutSeconds "
                f"({run_policy.startup_timeout_seconds}s)",
            )
            cleanup_on_finish(job, p.decision, observed)
            return True
        if overdue is not None:
            failures = [overdue]
    if not failures:
        return False
    handle_failures(
        job,
        status=p.status,
        decision=p.decision,
        observed=observed,
        stage=stage,
        attempt=attempt,
        failures=failures,
    )
    return True


def _stage_succeeded(p: _Pass, stage: Stage, attempt: int) -> Stage | None:
    """The stage whose gang should run now; None once training succeeded (the job is done)."""
    job, status = p.job, p.status
    gang = p.observed.gang(stage, attempt)
    done = (
        gang
        and len(gang) == job.spec.nodes
        and all(pod.phase == "Succeeded" for pod in gang.values())
    )
    if not done:
        if stage is Stage.COMPILE:
            status.condition(ConditionType.COMPILED, False, "Compiling", "compile stage running")
        return stage
    status.mark_stage(stage, "completionTime")
    if stage is Stage.TRAIN:
        status.data["workers"] = workers_view(gang, job.spec.nodes)
        status.finish(
            Phase.SUCCEEDED, "TrainingSucceeded", f"all {job.spec.nodes} training pods succeeded"
        )
        cleanup_on_finish(job, p.decision, p.observed)
        return None
    message = COMPILED_MESSAGES[job.spec.effective_neuron_stack]
    if job.spec.effective_neuron_stack is NeuronStack.NATIVE:
        cache = compile_cache_view(job, gang)
        status.data.setdefault("compile", {})["cache"] = cache
        message += f": {cache.get('summary') or cache.get('message')}"
    status.condition(ConditionType.COMPILED, True, "CompileSucceeded", message)
    p.decision.events.append(
        EventRecord("Normal", "CompileSucceeded", "compile stage finished; starting training")
    )
    return Stage.TRAIN


def _ensure_gang(
    job: JobRef,
    *,
    status: StatusEdit,
    decision: Decision,
    observed: Observed,
    stage: Stage,
    attempt: int,
    gang: dict[int, PodView],
) -> None:
    status.data.setdefault("startTime", timestamp(observed.now))
    status.data.setdefault("attempt", attempt)
    status.data.setdefault("restarts", {"total": 0, "application": 0, "infrastructure": 0})
    status.mark_stage(stage, "startTime")
    if observed.network_policy_missing:
        decision.create.append(pod_builders.network_policy(job))
    if not observed.service_exists:
        decision.create.append(pod_builders.headless_service(job))
    if job.podgroup_name(stage) not in observed.podgroups:
        decision.create.append(pod_builders.podgroup(job, stage))
    older = [p for p in observed.pods if p.attempt < attempt and not p.terminal]
    if older:
        _wait_for_old_gang(
            job, status=status, decision=decision, observed=observed, attempt=attempt, older=older
        )
        status.data["workers"] = workers_view(gang, job.spec.nodes)
        return
    group = observed.podgroups.get(job.podgroup_name(stage))
    if not gang and (group is None or not group.admitted):
        # As Kubeflow's operator does under Volcano: a gang waiting in its queue holds one
        # PodGroup (with minResources, all Volcano's enqueue needs), not Pending pods in etcd.
        # The PodGroup's watch event wakes the job once Volcano lets it in.
        status.data["workers"] = workers_view(gang, job.spec.nodes)
        if status.phase is not Phase.RESTARTING:
            reason, message, warning = waiting_reason(job, stage, gang, observed)
            status.transition(Phase.PENDING, reason, message, warning=warning)
        return
    missing = [rank for rank in range(job.spec.nodes) if rank not in gang]
    first_attempt = status.stage_int(stage, "firstAttempt")
    if first_attempt is None:
        first_attempt = attempt
        status.set_stage(stage, "firstAttempt", attempt)
        if missing:
            # Recorded before the stage's first pods exist: a crash after the creates, and a
            # failure while the operator is down, must still leave the next attempt resuming.
            decision.status_first = True
    # Resume only when an earlier training gang ran: a compile-stage restart or a suspend
    # before training raises the attempt too, and must not pick up an older run's checkpoints.
    resume = stage is Stage.TRAIN and attempt > first_attempt
    restarts = int(status.data["restarts"].get("total", 0))
    for rank in missing:
        decision.create.append(
            pod_builders.pod(job, stage, attempt, rank, resume=resume, restarts=restarts)
        )
    if len(gang) == job.spec.nodes:
        status.set_stage(stage, "fullGangAttempt", attempt)
        if status.find_condition(ConditionType.ADMITTED) is not None:
            status.condition(
                ConditionType.ADMITTED, True, "PodsCreated", f"all {stage.value} pods exist"
            )
    if stage is Stage.TRAIN and job.spec.profile.enabled:
        status.data["profile"] = {
            "path": job.profile_dir(attempt),
            "claimName": job.spec.storage.claim_name,
        }
    workers = workers_view(gang, job.spec.nodes)
    status.data["workers"] = workers
    # A rank that already finished (its pod Succeeded while the others still run) has started:
    # the job is still in its stage, not waiting for the gang again. Nor is a gang that ran and
    # whose pods all still run while their readiness blinks (a kubelet or API server restart).
    ran = (
        status.phase is STAGE_PHASE[stage]
        and status.data.get("reason") == "GangRunning"
        and len(gang) == job.spec.nodes
        and all(p.phase in ("Running", "Succeeded") and not p.deleting for p in gang.values())
    )
    if ran or workers["ready"] + workers["succeeded"] == job.spec.nodes:
        alive = job.spec.nodes - workers["succeeded"]
        running = (
            f"all {job.spec.nodes} {stage.value} pods running"
            if not workers["succeeded"]
            else f"{alive} {stage.value} pods running, {workers['succeeded']} finished"
        )
        if workers["ready"] < alive:
            running += f" ({workers['ready']}/{alive} ready)"
        status.transition(STAGE_PHASE[stage], "GangRunning", f"{running} (attempt {attempt})")
        status.condition(ConditionType.RUNNING, True, "GangRunning", f"{stage.value} stage running")
        status.condition(
            ConditionType.RESTARTING, False, "GangRunning", f"attempt {attempt} running"
        )
    elif status.phase is not Phase.RESTARTING:
        reason, message, warning = waiting_reason(job, stage, gang, observed)
        status.transition(Phase.PENDING, reason, message, warning=warning)


def _wait_for_old_gang(
    job: JobRef,
    *,
    status: StatusEdit,
    decision: Decision,
    observed: Observed,
    attempt: int,
    older: list[PodView],
) -> None:
    """The restart protocol: the next gang starts only once every older pod has stopped, so two
    attempts never run (or rendezvous) at once. The wait is bounded: a pod still Terminating a
    bound after its grace period is force-deleted, and one that outlives that fails the job."""
    bound = stuck_bound(job)
    delete_gang(decision, older, observed, bound)
    stuck = [p for p in older if is_overdue(p, observed, bound) and not is_lost(p, observed)]
    give_up = timedelta(seconds=OLD_GANG_GIVE_UP_BOUNDS * bound)
    hopeless = [p for p in stuck if p.deletion_due and observed.now >= p.deletion_due + give_up]
    names = ", ".join(sorted(p.name for p in older))
    if hopeless:
        pod = sorted(hopeless, key=lambda p: p.name)[0]
        status.finish(
            Phase.FAILED,
            "OldGangStuck",
            f"pod {pod.name} of attempt {pod.attempt} on node {pod.node or 'none'} is still "
            f"there {OLD_GANG_GIVE_UP_BOUNDS * bound:.0f}s after it was force-deleted (a "
            f"finalizer or an API server that refuses the delete); attempt {attempt} cannot "
            "start beside it: remove the pod, then re-create the job",
        )
        return
    if stuck:
        stuck_names = ", ".join(
            f"{p.name} on {p.node or 'no node'}" for p in sorted(stuck, key=lambda p: p.name)
        )
        status.transition(
            Phase.RESTARTING,
            "ForceDeletingOldGang",
            f"attempt {attempt} starts once {len(older)} pod(s) of earlier attempts have "
            f"stopped: {names}; force-deleted {stuck_names}: still Terminating {bound:.0f}s "
            "after the grace period ended (spec.runPolicy.nodeLostGracePeriodSeconds)",
            warning=True,
        )
    else:
        status.transition(
            Phase.RESTARTING,
            "WaitingForOldGang",
            f"attempt {attempt} starts once {len(older)} pod(s) of earlier attempts have "
            f"stopped: {names}",
        )
    due = [p.deletion_due + timedelta(seconds=bound) for p in older if p.deletion_due]
    decision.requeue(min([5.0, *((d - observed.now).total_seconds() for d in due)]))
