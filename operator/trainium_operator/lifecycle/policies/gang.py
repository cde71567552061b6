"""Gang: the stage's gang exists and runs. Its NetworkPolicy, Service and PodGroup first; while
Volcano has not admitted the PodGroup, no pods (the reason for the wait is the status); then
every missing rank's pod. The next attempt starts only once every older pod has stopped
(bounded: a pod stuck Terminating is force-deleted, and one that survives that fails the job)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from trainium_operator.api.status import ConditionType, Phase
from trainium_operator.builders import pods as pod_builders
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.lifecycle.admission import waiting_reason
from trainium_operator.lifecycle.cleanup import delete_gang, is_lost, is_overdue, stuck_bound
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.failures import node_lost_requeue
from trainium_operator.lifecycle.observed import Observed, PodView
from trainium_operator.lifecycle.status_edit import StatusEdit, timestamp, workers_view

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass

STAGE_PHASE = {Stage.COMPILE: Phase.COMPILING, Stage.TRAIN: Phase.TRAINING}
# An old pod that survives its force deletion (a finalizer holds it) fails the job this many
# stuck bounds after its deletion was due, instead of holding the next attempt forever.
OLD_GANG_GIVE_UP_BOUNDS = 3


def gang(p: Pass) -> None:
    job, stage, attempt = p.job, p.stage, p.attempt
    p.status.clear(ConditionType.BLOCKED, "Unblocked", "nothing is in the job's way")
    _ensure_gang(
        job,
        status=p.status,
        decision=p.plan,
        observed=p.observed,
        stage=stage,
        attempt=attempt,
        gang=p.observed.gang(stage, attempt),
    )
    grace = float(job.spec.run_policy.node_lost_grace_period_seconds)
    wait = node_lost_requeue(p.observed.gang(stage, attempt), p.observed, grace)
    if wait is not None:
        p.plan.requeue(wait)


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
