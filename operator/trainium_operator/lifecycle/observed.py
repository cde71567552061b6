"""What the state machine sees of the cluster, reduced from raw API objects by pure functions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from trainium_operator.api import kueue
from trainium_operator.api.objects import POD_ENDED_PHASES, Obj
from trainium_operator.api.spec import TRAINING_CONTAINER
from trainium_operator.builders.job import LABEL_ATTEMPT, LABEL_NODE_RANK, LABEL_STAGE, Stage

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# What a straggler replacement leaves on the node it cordons (lifecycle.policies.stragglers
# writes them, the node view reads them back): `kubectl get nodes -l trainium.dev/cordoned`
# lists them; `kubectl uncordon` gives one back (the annotations then only tell its history).
CORDONED_LABEL = "trainium.dev/cordoned"
CORDONED_BY_ANNOTATION = "trainium.dev/cordoned-by"
CORDON_REASON_ANNOTATION = "trainium.dev/cordon-reason"
CORDON_TIME_ANNOTATION = "trainium.dev/cordoned-at"

# Pod failure reasons that are the platform's doing, not the training script's.
INFRASTRUCTURE_POD_REASONS = frozenset(
    {
        "Evicted",
        "Preempting",
        "NodeLost",
        "NodeShutdown",
        "Terminated",
        "Shutdown",
        "UnexpectedAdmissionError",
        # The kubelet refused the pod at admission (the scheduler's view was stale): the node's
        # doing, not the script's. Resource shortfalls come as OutOf<resource>.
        "NodeAffinity",
        "NodePorts",
        "InvalidNodeInfo",
        "PodOSNotSupported",
    }
)
KUBELET_OUT_OF_RESOURCE_PREFIX = "OutOf"


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    stage: Stage
    attempt: int
    rank: int
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    ready: bool
    node: str | None
    deleting: bool
    exit_code: int | None
    reason: str | None
    message: str | None
    disrupted: bool  # DisruptionTarget condition: evicted, preempted, node drained
    created: datetime | None = None
    waiting_reason: str | None = None  # a container's waiting reason (ErrImagePull, ...)
    waiting_message: str | None = None
    unschedulable: str | None = None  # the PodScheduled=False message (scheduler's words)
    scheduled_at: datetime | None = None  # when PodScheduled turned True
    # metadata.deletionTimestamp: when the kubelet should have stopped the pod (its grace
    # period included); a pod still there well after it has a kubelet that does not confirm.
    deletion_due: datetime | None = None
    # The training container's termination message, once it ended (the native compile stage's
    # NEFF cache summary, contract/neff_cache.py).
    termination_message: str | None = None
    # When the training container ended (its terminated.finishedAt).
    finished_at: datetime | None = None
    # Kueue stopped the pod (its TerminationTarget condition, set before Kueue deletes it):
    # the reason (WorkloadEvictedDueTo<why>) and Kueue's message.
    stopped_by_kueue: tuple[str, str] | None = None
    # Held by Kueue's admission gate (not admitted yet), and Kueue's finalizer on it.
    gated: bool = False
    kueue_finalizer: bool = False

    @property
    def terminal(self) -> bool:
        return self.phase in POD_ENDED_PHASES

    @property
    def infrastructure_failure(self) -> bool:
        reason = self.reason or ""
        return (
            self.disrupted
            or self.stopped_by_kueue is not None
            or reason in INFRASTRUCTURE_POD_REASONS
            or reason.startswith(KUBELET_OUT_OF_RESOURCE_PREFIX)
        )


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    ready: bool
    not_ready_since: datetime | None
    instance_type: str | None = None  # node.kubernetes.io/instance-type
    unschedulable: bool = False  # spec.unschedulable: cordoned
    # The operator's last straggler cordon of the node (its annotations, kept after an
    # uncordon): the job ("<ns>/<name>") and the replacement's time; "" when none.
    cordoned_by: str = ""
    cordoned_at: str = ""


@dataclass(frozen=True, slots=True)
class PodGroupView:
    """What Volcano wrote on one PodGroup: its phase and why it cannot place the gang."""

    name: str
    phase: str | None  # Pending | Inqueue | Running | Completed | Unknown; None until scheduled
    unschedulable: str | None  # Volcano's message while its Unschedulable condition is True

    @property
    def admitted(self) -> bool:
        """Volcano's enqueue action let the group in (its queue and the cluster have room)."""
        return self.phase in ("Inqueue", "Running", "Completed", "Unknown")


@dataclass(frozen=True, slots=True)
class WorkloadView:
    """What Kueue wrote on the Workload of one gang (a plain pod group): whether it holds
    quota and is admitted, where, and Kueue's words while it is not."""

    name: str
    quota_reserved: bool
    admitted: bool
    cluster_queue: str | None
    # Kueue's reason and message while the Workload waits (QuotaReserved False) or was
    # evicted (Evicted True), else None.
    pending: tuple[str, str] | None = None
    evicted: tuple[str, str] | None = None
    finished: bool = False


@dataclass(frozen=True, slots=True)
class LocalQueueView:
    """A Kueue LocalQueue as the job's label names it: whether it exists and is active."""

    name: str
    exists: bool
    active: bool | None = None  # None until Kueue reported on it
    message: str | None = None  # Kueue's words while it is not active


@dataclass(frozen=True, slots=True)
class QueueView:
    name: str
    exists: bool
    state: str | None  # Open | Closed | Closing | Unknown; None until the queue controller runs


@dataclass(frozen=True, slots=True)
class Observed:
    pods: tuple[PodView, ...]
    podgroups: dict[str, PodGroupView]
    service_exists: bool
    nodes: dict[str, NodeView]
    now: datetime
    # None when the reconciler did not look (Volcano already admitted the job's gang).
    queue: QueueView | None = None
    # False until the node cache holds a full list: a node missing from it is then unknown,
    # not lost (right after an operator start, every node would look gone).
    nodes_known: bool = True
    # True when the operator isolates jobs (its default) and this job's NetworkPolicy is not
    # there: it is created before any other child, so no pod of the job runs unprotected.
    network_policy_missing: bool = False
    # Jobs Kueue queues: the Workloads of the job's pod groups by name, and its LocalQueue
    # (None when the reconciler did not look: the gang is admitted).
    workloads: dict[str, WorkloadView] = field(default_factory=dict)
    local_queue: LocalQueueView | None = None

    def gang(self, stage: Stage, attempt: int) -> dict[int, PodView]:
        return {p.rank: p for p in self.pods if p.stage is stage and p.attempt == attempt}


def _waiting_state(pod: Obj) -> Obj:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            return dict(waiting)
    return {}


def _terminated_state(pod: Obj) -> Obj:
    for status in pod.get("status", {}).get("containerStatuses") or []:
        state = status.get("state") or {}
        if "terminated" in state:
            return dict(state["terminated"])
        last = status.get("lastState") or {}
        if "terminated" in last:
            return dict(last["terminated"])
    return {}


def _trainer_termination_message(pod: Obj) -> str | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") != TRAINING_CONTAINER:
            continue
        terminated = (status.get("state") or {}).get("terminated") or {}
        message = terminated.get("message")
        return message if isinstance(message, str) else None
    return None


def pod_view(pod: Obj) -> PodView | None:
    """Reduce a pod to what the lifecycle needs; None for pods without our labels."""
    meta = pod.get("metadata", {})
    labels = meta.get("labels") or {}
    try:
        stage = Stage(labels[LABEL_STAGE])
        attempt = int(labels[LABEL_ATTEMPT])
        rank = int(labels[LABEL_NODE_RANK])
    except (KeyError, ValueError):
        return None
    status = pod.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    terminated = _terminated_state(pod)
    exit_code = terminated.get("exitCode")
    waiting = _waiting_state(pod)
    scheduled = conditions.get("PodScheduled") or {}
    return PodView(
        name=meta["name"],
        stage=stage,
        attempt=attempt,
        rank=rank,
        phase=status.get("phase") or "Pending",
        ready=(conditions.get("Ready") or {}).get("status") == "True",
        node=(pod.get("spec") or {}).get("nodeName"),
        deleting=bool(meta.get("deletionTimestamp")),
        deletion_due=parse_time(meta.get("deletionTimestamp")),
        exit_code=int(exit_code) if exit_code is not None else None,
        reason=status.get("reason") or terminated.get("reason"),
        message=status.get("message") or terminated.get("message"),
        disrupted=(conditions.get("DisruptionTarget") or {}).get("status") == "True",
        created=parse_time(meta.get("creationTimestamp")),
        waiting_reason=waiting.get("reason"),
        waiting_message=waiting.get("message"),
        # A scheduling gate (Kueue's, until it admits) is a wait, not the scheduler's refusal.
        unschedulable=(
            str(scheduled.get("message") or "")
            if scheduled.get("status") == "False" and scheduled.get("reason") != "SchedulingGated"
            else None
        ),
        scheduled_at=(
            parse_time(scheduled.get("lastTransitionTime"))
            if scheduled.get("status") == "True"
            else None
        ),
        termination_message=_trainer_termination_message(pod),
        finished_at=parse_time(terminated.get("finishedAt")),
        stopped_by_kueue=_kueue_stop(conditions.get(kueue.TERMINATION_TARGET_CONDITION)),
        gated=kueue.has_admission_gate(pod),
        kueue_finalizer=kueue.MANAGED_FINALIZER in (meta.get("finalizers") or ()),
    )


def _kueue_stop(condition: Obj | None) -> tuple[str, str] | None:
    if not condition or condition.get("status") != "True":
        return None
    reason = str(condition.get("reason") or "StoppedByKueue")
    return reason, str(condition.get("message") or "")


def _condition(conditions: list[Obj], kind: str) -> Obj | None:
    for condition in conditions:
        if isinstance(condition, dict) and condition.get("type") == kind:
            return condition
    return None


def _said(condition: Obj | None) -> tuple[str, str]:
    condition = condition or {}
    return str(condition.get("reason") or ""), str(condition.get("message") or "")


def workload_view(workload: Obj) -> WorkloadView:
    status = workload.get("status") or {}
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    reserved = _condition(conditions, "QuotaReserved")
    evicted = _condition(conditions, "Evicted")
    admission = status.get("admission") or {}
    quota_reserved = (reserved or {}).get("status") == "True"
    return WorkloadView(
        name=workload["metadata"]["name"],
        quota_reserved=quota_reserved,
        admitted=(_condition(conditions, "Admitted") or {}).get("status") == "True",
        cluster_queue=admission.get("clusterQueue") if isinstance(admission, dict) else None,
        pending=_said(reserved) if reserved is not None and not quota_reserved else None,
        evicted=_said(evicted) if (evicted or {}).get("status") == "True" else None,
        finished=(_condition(conditions, "Finished") or {}).get("status") == "True",
    )


def local_queue_view(name: str, queue: Obj | None) -> LocalQueueView:
    if queue is None:
        return LocalQueueView(name=name, exists=False)
    conditions = [c for c in (queue.get("status") or {}).get("conditions") or [] if c]
    active = _condition(conditions, "Active")
    if active is None:
        return LocalQueueView(name=name, exists=True)
    reason, message = _said(active)
    is_active = active.get("status") == "True"
    return LocalQueueView(
        name=name,
        exists=True,
        active=is_active,
        message=None if is_active else (message or reason),
    )


def node_view(node: Obj) -> NodeView:
    conditions = {c.get("type"): c for c in (node.get("status") or {}).get("conditions") or []}
    ready = conditions.get("Ready") or {}
    is_ready = ready.get("status") == "True"
    annotations = node["metadata"].get("annotations") or {}
    return NodeView(
        name=node["metadata"]["name"],
        ready=is_ready,
        not_ready_since=None if is_ready else parse_time(ready.get("lastTransitionTime")),
        instance_type=(node["metadata"].get("labels") or {}).get(INSTANCE_TYPE_LABEL),
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        cordoned_by=str(annotations.get(CORDONED_BY_ANNOTATION) or ""),
        cordoned_at=str(annotations.get(CORDON_TIME_ANNOTATION) or ""),
    )


def podgroup_view(podgroup: Obj) -> PodGroupView:
    status = podgroup.get("status") or {}
    latest: dict[str, Obj] = {
        str(c.get("type")): c for c in status.get("conditions") or [] if c.get("status") == "True"
    }
    unschedulable = None
    refused = latest.get("Unschedulable")
    placed = latest.get("Scheduled")
    # Volcano keeps both condition types; the newer one says how its last attempt went.
    if refused is not None and (
        placed is None
        or str(refused.get("lastTransitionTime") or "")
        >= str(placed.get("lastTransitionTime") or "")
    ):
        unschedulable = str(refused.get("message") or refused.get("reason") or "")
    return PodGroupView(
        name=podgroup["metadata"]["name"],
        phase=status.get("phase"),
        unschedulable=unschedulable,
    )


def queue_view(name: str, queue: Obj | None) -> QueueView:
    if queue is None:
        return QueueView(name=name, exists=False, state=None)
    return QueueView(name=name, exists=True, state=(queue.get("status") or {}).get("state"))


def observe(
    *,
    pods: list[Obj],
    podgroups: list[Obj],
    service_exists: bool,
    nodes: list[Obj],
    now: datetime,
    queue: QueueView | None = None,
    nodes_known: bool = True,
    network_policy_missing: bool = False,
    workloads: Sequence[Obj] = (),
    local_queue: LocalQueueView | None = None,
    pod_view: Callable[[Obj], PodView | None] = pod_view,
    node_view: Callable[[Obj], NodeView] = node_view,
) -> Observed:
    """What one pass sees. `pod_view` and `node_view` reduce each object (a caller may pass
    memoised ones: the reduction of an object version never changes)."""
    views = tuple(v for v in (pod_view(p) for p in pods) if v is not None)
    groups = (podgroup_view(o) for o in podgroups)
    return Observed(
        pods=views,
        podgroups={g.name: g for g in groups},
        service_exists=service_exists,
        nodes={n.name: n for n in (node_view(o) for o in nodes)},
        now=now,
        queue=queue,
        nodes_known=nodes_known,
        network_policy_missing=network_policy_missing,
        workloads={w.name: w for w in (workload_view(o) for o in workloads)},
        local_queue=local_queue,
    )
