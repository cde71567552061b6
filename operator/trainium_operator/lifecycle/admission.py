"""Admission: whether the gang may start, in Volcano's, Kueue's and the API server's own words.

Volcano admits a gang into its queue (the PodGroup's phase), then places it; Kueue admits a
gang's Workload against its ClusterQueue's quota and lifts its pods' gates, then the
kube-scheduler places them; the API server may
refuse a pod (quota, a missing PriorityClass or ServiceAccount, policy). A refusal only the spec
can fix fails the job; one the cluster can fix is a Warning on a Pending job, held until
something it depends on changes.
"""

from __future__ import annotations

import re

from trainium_operator.api import kueue
from trainium_operator.api.status import ConditionType, Phase, QueueingScheduler, QueueStatus
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.lifecycle.failures import start_blocker
from trainium_operator.lifecycle.observed import Observed, PodGroupView, PodView, WorkloadView
from trainium_operator.lifecycle.status_edit import StatusEdit


def admission_rejected(status: StatusEdit, reason: str, message: str, *, fatal: bool) -> None:
    """The API server refused a child for a reason only the spec (fatal) or the cluster (quota,
    a PriorityClass or ServiceAccount created later) can fix: say so once, do not spin."""
    status.condition(ConditionType.ADMITTED, False, reason, message)
    if fatal:
        status.finish(Phase.FAILED, reason, message)
    else:
        status.transition(Phase.PENDING, reason, message, warning=True)


_GANG_VERDICT = re.compile(r"(\d+)/(\d+) tasks in gang unschedulable")


# Volcano's histogram of why the pending tasks wait: "; Pending: <n> <reason>, ...".
_PENDING_REASONS = re.compile(r"; Pending: ([^.]*)")


def _verdict_names_a_reason(message: str) -> bool:
    """Whether Volcano's verdict says why the gang cannot be placed: an "Origin reason", or a
    pending task with a reason. A task Volcano's session has not evaluated yet (a pod added
    while it ran) is counted with an empty reason ("Pending: 1 "): no refusal, only a cycle
    that raced the pod's creation, and the next one places the gang."""
    if "Origin reason" in message:
        return True
    histogram = _PENDING_REASONS.search(message)
    if histogram is None:
        return True  # a message in another form is taken as it is
    return any(part.strip().partition(" ")[2].strip() for part in histogram.group(1).split(","))


def _verdict_covers(message: str, pods: int) -> bool:
    """Whether Volcano's "<unschedulable>/<tasks seen> tasks in gang unschedulable" saw at least
    `pods` tasks (a message in another form is taken as it is)."""
    match = _GANG_VERDICT.search(message)
    return match is None or int(match.group(2)) >= pods


def waiting_reason(
    job: JobRef, stage: Stage, gang: dict[int, PodView], observed: Observed, attempt: int
) -> tuple[str, str, bool]:
    """Why a stage's gang is not running yet, in its scheduler's own words where it gave some:
    (reason, message, is a warning)."""
    if job.queued_by_kueue:
        return kueue_waiting_reason(job, stage, attempt, gang, observed)
    queue = job.spec.scheduling.queue
    nodes = job.spec.nodes
    if observed.queue is not None and not observed.queue.exists:
        return (
            "QueueNotFound",
            f"spec.scheduling.queue: Volcano queue {queue!r} does not exist; create it "
            "(kubectl get queues lists them) or name an existing queue",
            True,
        )
    if observed.queue is not None and observed.queue.state not in (None, "Open"):
        return (
            "QueueClosed",
            f"spec.scheduling.queue: Volcano queue {queue!r} is {observed.queue.state}; "
            "it admits no new jobs until it is Open again",
            True,
        )
    blocker = start_blocker(job, gang)
    if blocker is not None:
        return blocker.reason, blocker.message, True
    group = observed.podgroups.get(job.podgroup_name(stage))
    scheduled = sum(1 for p in gang.values() if p.node)
    progress = _progress(gang, nodes)
    # Until all of the gang's pods exist, Volcano's "16/0 tasks in gang unschedulable" only
    # says that the pods being created are not there yet; a verdict on fewer tasks than the gang
    # now has was written before its pods existed and is no refusal either.
    if (
        group is not None
        and group.unschedulable
        and scheduled < nodes
        and len(gang) >= nodes
        and _verdict_covers(group.unschedulable, len(gang))
        and _verdict_names_a_reason(group.unschedulable)
    ):
        return (
            "Unschedulable",
            f"{stage.value} stage: Volcano cannot place the gang of {nodes} pods "
            f"(queue {queue}): {group.unschedulable}",
            True,
        )
    if group is None or not group.admitted:
        seen = f"{group.phase or 'not yet seen by the scheduler'}" if group else "being created"
        pods = f"{progress}" if gang else "its pods are created once Volcano admits it"
        message = (
            f"{stage.value} stage: waiting in Volcano queue {queue!r} "
            f"(PodGroup {job.podgroup_name(stage)} {seen}); {pods}"
        )
        kind = job.spec.instance_type.value
        fitting = sum(1 for n in observed.nodes.values() if n.ready and n.instance_type == kind)
        if group is not None and fitting < nodes:
            # Volcano's enqueue says only "resource in cluster is overused" (an Event on the
            # PodGroup); the count of nodes that could host a rank is the actionable part.
            message += (
                f"; the cluster has {fitting} Ready {kind} node(s) and the gang needs {nodes}: "
                "it is admitted once enough join (autoscaling) or spec.nodes is lowered"
            )
        return "Queued", message, fitting < nodes
    return "WaitingForGang", f"{stage.value} stage: {progress} (queue {queue})", False


def _progress(gang: dict[int, PodView], nodes: int) -> str:
    scheduled = sum(1 for p in gang.values() if p.node)
    ready = sum(1 for p in gang.values() if p.phase == "Running" and p.ready and not p.deleting)
    return f"{scheduled}/{nodes} pods scheduled, {ready}/{nodes} ready"


def kueue_waiting_reason(
    job: JobRef, stage: Stage, attempt: int, gang: dict[int, PodView], observed: Observed
) -> tuple[str, str, bool]:
    """Why a Kueue-queued gang is not running yet, in Kueue's words. Waiting for quota is what
    a queue is for (no Warning); a queue that does not exist or admits nothing is."""
    queue = job.kueue_queue
    nodes = job.spec.nodes
    local = observed.local_queue
    if local is not None and not local.exists:
        return (
            "QueueNotFound",
            f"metadata.labels[{kueue.QUEUE_NAME_LABEL}]: Kueue LocalQueue {queue!r} does not "
            f"exist in namespace {job.namespace}; create it (kubectl get localqueues lists "
            "them) or name an existing one",
            True,
        )
    if local is not None and local.active is False:
        return (
            "QueueInactive",
            f"Kueue LocalQueue {queue!r} admits nothing: {local.message}",
            True,
        )
    blocker = start_blocker(job, gang)
    if blocker is not None:
        return blocker.reason, blocker.message, True
    name = job.kueue_group_name(stage, attempt)
    workload = observed.workloads.get(name)
    if workload is None or not workload.admitted:
        if len(gang) < nodes:
            seen = f"{len(gang)}/{nodes} pods exist"
        elif workload is None:
            seen = "Kueue has not made its Workload yet"
        elif workload.pending is not None:
            reason, said = workload.pending
            seen = f"Workload {name}: {said or reason}"
        else:
            seen = f"Workload {name} not admitted yet"
        return (
            "Queued",
            f"{stage.value} stage: waiting in Kueue LocalQueue {queue!r} for the whole gang "
            f"of {nodes} pods to be admitted ({seen})",
            False,
        )
    refused = sorted(
        (p.name, p.unschedulable)
        for p in gang.values()
        if p.unschedulable and not p.node and not p.gated
    )
    if refused:
        # Admitted (the quota holds the gang) but the kube-scheduler finds no node for a pod: in
        # its own words, e.g. a DRA claim no node's devices satisfy ("cannot allocate all claims").
        name, said = refused[0]
        return (
            "Unschedulable",
            f"{stage.value} stage: admitted by Kueue ClusterQueue "
            f"{workload.cluster_queue or 'unknown'}, but {len(refused)}/{nodes} pods cannot be "
            f"placed; {name}: {said}",
            True,
        )
    return (
        "WaitingForGang",
        f"{stage.value} stage: {_progress(gang, nodes)} (admitted by Kueue ClusterQueue "
        f"{workload.cluster_queue or 'unknown'})",
        False,
    )


def _summary(scheduler: QueueingScheduler, name: str, admission: str) -> str:
    return f"{scheduler.value.lower()}/{name}:{admission}"


def kueue_queue_status(job: JobRef, workload: WorkloadView | None, name: str) -> QueueStatus:
    """status.queue of a Kueue-queued gang whose Workload is `name`."""
    if workload is None:
        admission = "Pending"
    elif workload.evicted is not None:
        admission = "Evicted"
    elif workload.admitted:
        admission = "Admitted"
    elif workload.quota_reserved:
        admission = "QuotaReserved"
    else:
        admission = "Pending"
    queue = job.kueue_queue or ""
    return QueueStatus(
        scheduler=QueueingScheduler.KUEUE,
        name=queue,
        admission=admission,
        workload=name,
        cluster_queue=workload.cluster_queue if workload is not None else None,
        summary=_summary(QueueingScheduler.KUEUE, queue, admission),
    )


def volcano_queue_status(job: JobRef, group: PodGroupView | None, name: str) -> QueueStatus:
    """status.queue of a Volcano-queued gang whose PodGroup is `name`."""
    admission = "Admitted" if group is not None and group.admitted else "Pending"
    queue = job.spec.scheduling.queue
    return QueueStatus(
        scheduler=QueueingScheduler.VOLCANO,
        name=queue,
        admission=admission,
        workload=name,
        summary=_summary(QueueingScheduler.VOLCANO, queue, admission),
    )
