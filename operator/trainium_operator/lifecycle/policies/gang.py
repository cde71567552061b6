"""Gang: the stage's gang exists and runs. Its NetworkPolicy, Service and PodGroup first; while
Volcano has not admitted the PodGroup, no pods (the reason for the wait is the status; a
restart's next gang, whose group Volcano is about to admit again, excepted); then every missing
rank's pod. A gang Kueue queues has no PodGroup: its pods are created at once,
held by Kueue's admission gate until Kueue admits the whole group (api/kueue.py). The next
attempt starts only once every older pod has stopped (bounded: a pod stuck Terminating is
force-deleted, and one that survives that fails the job)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from trainium_operator.api.status import ConditionType, Phase
from trainium_operator.builders import claims
from trainium_operator.builders import pods as pod_builders
from trainium_operator.builders.job import Stage
from trainium_operator.lifecycle.admission import (
    kueue_queue_status,
    volcano_queue_status,
    waiting_reason,
)
from trainium_operator.lifecycle.cleanup import delete_gang, is_lost, is_overdue, stuck_bound
from trainium_operator.lifecycle.failures import node_lost_requeue
from trainium_operator.lifecycle.observed import PodGroupView, PodView
from trainium_operator.lifecycle.status_edit import (
    profile_view,
    timestamp,
    with_stage_records,
    workers_view,
)

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass

STAGE_PHASE = {Stage.COMPILE: Phase.COMPILING, Stage.TRAIN: Phase.TRAINING}
# An old pod that survives its force deletion (a finalizer holds it) fails the job this many
# stuck bounds after its deletion was due, instead of holding the next attempt forever.
OLD_GANG_GIVE_UP_BOUNDS = 3


def gang(p: Pass) -> None:
    job, status, observed, plan = p.job, p.status, p.observed, p.plan
    stage, attempt = p.stage, p.attempt
    gang = observed.gang(stage, attempt)
    status.clear(ConditionType.BLOCKED, "Unblocked", "nothing is in the job's way")
    status.data.setdefault("startTime", timestamp(p.now))
    status.data.setdefault("attempt", attempt)
    if "restarts" not in status.data:
        status.restarts = status.restarts  # the three counts at 0
    status.mark_stage(stage, "startTime")
    if observed.network_policy_missing:
        plan.create.append(pod_builders.network_policy(job))
    if not observed.service_exists:
        plan.create.append(pod_builders.headless_service(job))
    if job.queued_by_kueue and not p.snapshot.settings.kueue:
        status.workers = workers_view(gang, job.spec.nodes)
        status.transition(
            Phase.PENDING,
            "KueueNotEnabled",
            "label kueue.x-k8s.io/queue-name: this operator runs without Kueue (chart value "
            "kueue.enabled, flag --kueue); the job waits, nothing is created, until it does or "
            "the label is removed (then Volcano queues it)",
            warning=True,
        )
        return
    if claims.uses_dra(job) and not p.snapshot.settings.dra:
        status.workers = workers_view(gang, job.spec.nodes)
        status.transition(
            Phase.PENDING,
            "DRANotEnabled",
            "spec.deviceAllocation: dra, and this operator does not create ResourceClaimTemplates "
            "(chart value dra.enabled, flag --dra); the job waits, nothing more is created, until "
            "it does",
            warning=True,
        )
        return
    if not job.queued_by_kueue and job.podgroup_name(stage) not in observed.podgroups:
        placement = job.placement(p.snapshot.settings.topology)
        plan.create.append(pod_builders.podgroup(job, stage, placement))
    _run_gang(p, gang)
    grace = float(job.spec.run_policy.node_lost_grace_period_seconds)
    wait = node_lost_requeue(gang, observed, grace)
    if wait is not None:
        plan.requeue(wait)


def _run_gang(p: Pass, gang: dict[int, PodView]) -> None:
    """The stage's pods, once the older attempt's are gone and Volcano admitted the gang; the
    phase that says where the gang is."""
    job, status, decision, observed = p.job, p.status, p.plan, p.observed
    stage, attempt = p.stage, p.attempt
    older = [pod for pod in observed.pods if pod.attempt < attempt and not pod.terminal]
    if older:
        _wait_for_old_gang(p, older)
        status.workers = workers_view(gang, job.spec.nodes)
        return
    if job.queued_by_kueue:
        # Kueue builds the gang's Workload from its pods: they are created now and wait behind
        # Kueue's admission gate, holding no node, until the whole group is admitted.
        name = job.kueue_group_name(stage, attempt)
        status.queue = kueue_queue_status(job, observed.workloads.get(name), name)
        group = None
    else:
        group = observed.podgroups.get(job.podgroup_name(stage))
        status.queue = volcano_queue_status(job, group, job.podgroup_name(stage))
    # A restarting gang's PodGroup goes back to Pending once the old pods are gone (Volcano
    # counts only placed pods), and Volcano admits it again a session later. The next attempt's
    # pods are created meanwhile, so that session admits and places the gang together rather
    # than admitting it for the one after (a second scheduling period, 1 s by default). The
    # group held the room a moment ago; should another gang take it, the pods wait unplaced,
    # which startupTimeoutSeconds does not count.
    readmitting = status.phase is Phase.RESTARTING and group is not None
    if not job.queued_by_kueue and not gang and not readmitting and not _admitted(group):
        # As Kubeflow's operator does under Volcano: a gang waiting in its queue holds one
        # PodGroup (with minResources, all Volcano's enqueue needs), not Pending pods in etcd.
        # The PodGroup's watch event wakes the job once Volcano lets it in.
        status.workers = workers_view(gang, job.spec.nodes)
        if status.phase is not Phase.RESTARTING:
            reason, message, warning = waiting_reason(job, stage, gang, observed, attempt)
            status.transition(Phase.PENDING, reason, message, warning=warning)
        return
    missing = [rank for rank in range(job.spec.nodes) if rank not in gang]
    first_attempt = status.stage_int(stage, "firstAttempt")
    if first_attempt is None:
        first_attempt = attempt
        status.set_stage(stage, "firstAttempt", attempt)
    if missing and status.stage_int(stage, "createdAttempt") != attempt:
        # Stored before the pods, with the stage's first attempt: a gang whose pods all vanish
        # before a pass sees them (the operator down, its status write lost) restarts rather
        # than being created again, and a crash after the creates still leaves the next
        # attempt resuming.
        status.set_stage(stage, "createdAttempt", attempt)
        decision.status_before_pods = with_stage_records(
            p.snapshot.status, stage, firstAttempt=first_attempt, createdAttempt=attempt
        )
    # Resume only when an earlier training gang ran: a compile-stage restart or a suspend
    # before training raises the attempt too, and must not pick up an older run's checkpoints.
    resume = stage is Stage.TRAIN and attempt > first_attempt
    restarts = status.restarts.total
    if missing and claims.uses_dra(job):
        # Before the pods (the reconciler creates other kinds first): Kueue reads it to count
        # the gang's devices, and a pod whose template is missing cannot be placed. An existing
        # one (an earlier pass's) is left as it is: its spec comes from immutable fields.
        decision.create.append(claims.device_claim_template(job))
    placement = job.placement(p.snapshot.settings.topology)
    preflighted = job.spec.preflight_on(p.snapshot.settings.preflight_multi_node)
    record = status.preflight
    excluded = record.excluded_nodes if record is not None else []
    for rank in missing:
        decision.create.append(
            pod_builders.pod(
                job,
                stage,
                attempt,
                rank,
                resume=resume,
                restarts=restarts,
                placement=placement,
                preflighted=preflighted,
                excluded_nodes=excluded,
            )
        )
    if len(gang) == job.spec.nodes:
        status.set_stage(stage, "fullGangAttempt", attempt)
        if status.find_condition(ConditionType.ADMITTED) is not None:
            status.condition(
                ConditionType.ADMITTED, True, "PodsCreated", f"all {stage.value} pods exist"
            )
    if stage is Stage.TRAIN and job.spec.profile.enabled:
        status.profile = profile_view(job, attempt)
    workers = workers_view(gang, job.spec.nodes)
    status.workers = workers
    # A rank that already finished (its pod Succeeded while the others still run) has started:
    # the job is still in its stage, not waiting for the gang again. Nor is a gang that ran and
    # whose pods all still run while their readiness blinks (a kubelet or API server restart).
    ran = (
        status.phase is STAGE_PHASE[stage]
        and status.reason == "GangRunning"
        and len(gang) == job.spec.nodes
        and all(pod.phase in ("Running", "Succeeded") and not pod.deleting for pod in gang.values())
    )
    if ran or workers.ready + workers.succeeded == job.spec.nodes:
        alive = job.spec.nodes - workers.succeeded
        running = (
            f"all {job.spec.nodes} {stage.value} pods running"
            if not workers.succeeded
            else f"{alive} {stage.value} pods running, {workers.succeeded} finished"
        )
        if workers.ready < alive:
            running += f" ({workers.ready}/{alive} ready)"
        status.transition(STAGE_PHASE[stage], "GangRunning", f"{running} (attempt {attempt})")
        status.condition(ConditionType.RUNNING, True, "GangRunning", f"{stage.value} stage running")
        status.condition(
            ConditionType.RESTARTING, False, "GangRunning", f"attempt {attempt} running"
        )
    elif status.phase is not Phase.RESTARTING or _queued_again(p):
        reason, message, warning = waiting_reason(job, stage, gang, observed, attempt)
        status.transition(Phase.PENDING, reason, message, warning=warning)


def _admitted(group: PodGroupView | None) -> bool:
    return group is not None and group.admitted


def _queued_again(p: Pass) -> bool:
    """A restarted gang Kueue has not admitted: the new attempt is a new Workload that waits in
    its queue like any other (a preempted job, for as long as the gang that took its place runs),
    so the status says it waits in the queue rather than that it is restarting."""
    if not p.job.queued_by_kueue:
        return False
    workload = p.observed.workloads.get(p.job.kueue_group_name(p.stage, p.attempt))
    return workload is None or not workload.admitted


def _wait_for_old_gang(p: Pass, older: list[PodView]) -> None:
    """The restart protocol: the next gang starts only once every older pod has stopped, so two
    attempts never run (or rendezvous) at once. The wait is bounded: a pod still Terminating a
    bound after its grace period is force-deleted, and one that outlives that fails the job."""
    job, status, decision, observed, attempt = p.job, p.status, p.plan, p.observed, p.attempt
    bound = stuck_bound(job)
    delete_gang(decision, older, observed, bound)
    stuck = [o for o in older if is_overdue(o, observed, bound) and not is_lost(o, observed)]
    give_up = timedelta(seconds=OLD_GANG_GIVE_UP_BOUNDS * bound)
    hopeless = [o for o in stuck if o.deletion_due and observed.now >= o.deletion_due + give_up]
    names = ", ".join(sorted(o.name for o in older))
    if hopeless:
        pod = sorted(hopeless, key=lambda o: o.name)[0]
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
            f"{o.name} on {o.node or 'no node'}" for o in sorted(stuck, key=lambda o: o.name)
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
    due = [o.deletion_due + timedelta(seconds=bound) for o in older if o.deletion_due]
    decision.requeue(min([5.0, *((d - observed.now).total_seconds() for d in due)]))
