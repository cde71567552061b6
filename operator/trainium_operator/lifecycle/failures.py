"""Which pods of the current gang failed, and why: the failure policy's detection half.

A failure is charged to a budget (application: backoffLimit; infrastructure:
infrastructureBackoffLimit) by its class; `restarts` decides what a failure leads to.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from datetime import datetime

from trainium_operator.api.status import FailureClass, LastFailure
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.observed import Observed, PodView
from trainium_operator.lifecycle.status_edit import StatusEdit, timestamp

# Container waiting reasons a restart cannot fix: the image or the pod's configuration.
CANNOT_START_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)

# A container ended by the signals a pod's deletion sends (SIGTERM, then SIGKILL after the grace
# period): a kubelet marks a pod deleted while it ran Failed with one of these before it goes.
DELETION_EXIT_CODES = frozenset({128 + signal.SIGTERM, 128 + signal.SIGKILL})

CLAIM_NOT_FOUND = "ClaimNotFound"
_CLAIM_NOT_FOUND_MESSAGE = re.compile(r'persistentvolumeclaim "([^"]+)" not found')


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a gang restarts or the job fails: the only source of status.lastFailure."""

    klass: FailureClass
    stage: Stage
    reason: str
    message: str
    pod: str | None = None
    node: str | None = None
    rank: int | None = None
    exit_code: int | None = None

    @classmethod
    def of(
        cls,
        pod: PodView,
        klass: FailureClass,
        reason: str,
        message: str,
        exit_code: int | None = None,
    ) -> Failure:
        return cls(
            klass,
            pod.stage,
            reason,
            message,
            pod=pod.name,
            node=pod.node,
            rank=pod.rank,
            exit_code=exit_code,
        )

    def as_status(self, now: datetime) -> LastFailure:
        """status.lastFailure: this failure, at `now`."""
        fields: dict[str, object] = {"class_": self.klass, "stage": self.stage.value}
        if self.pod:
            fields["pod"] = self.pod
        if self.rank is not None:
            fields["rank"] = self.rank
        fields.update(reason=self.reason, message=self.message, time=timestamp(now))
        if self.node:
            fields["node"] = self.node
        if self.exit_code is not None:
            fields["exit_code"] = self.exit_code
        return LastFailure.model_validate(fields)


def failure_of(pod: PodView, observed: Observed, grace: float) -> Failure | None:
    """Why this pod of the current gang counts as failed, if it does."""
    if pod.stopped_by_kueue is not None and (pod.deleting or pod.terminal):
        # Kueue took the gang's admission back (a preemption, a pods-ready timeout, a stopped
        # queue) and deletes every pod of it: the platform's doing, in Kueue's words.
        reason, said = pod.stopped_by_kueue
        return Failure.of(
            pod,
            FailureClass.INFRASTRUCTURE,
            reason,
            f"Kueue stopped pod {pod.name} (rank {pod.rank}): {said or reason}",
        )
    node = observed.nodes.get(pod.node) if pod.node else None
    if pod.node and not pod.terminal:
        node_gone = node is None and observed.nodes_known
        lost_for = (
            (observed.now - node.not_ready_since).total_seconds()
            if node is not None and not node.ready and node.not_ready_since is not None
            else None
        )
        if node_gone or (lost_for is not None and lost_for >= grace):
            return Failure.of(
                pod,
                FailureClass.INFRASTRUCTURE,
                "NodeLost",
                f"node {pod.node} is {'gone' if node_gone else 'NotReady'}; "
                f"pod {pod.name} (rank {pod.rank}) lost",
            )
    if pod.deleting and (not pod.terminal or _ended_by_its_deletion(pod)):
        return Failure.of(
            pod,
            FailureClass.INFRASTRUCTURE,
            "PodDeleted",
            f"pod {pod.name} (rank {pod.rank}) was deleted while running",
            pod.exit_code,
        )
    if pod.phase == "Failed":
        klass = (
            FailureClass.INFRASTRUCTURE if pod.infrastructure_failure else FailureClass.APPLICATION
        )
        reason = pod.reason or ("Error" if klass is FailureClass.APPLICATION else "Disrupted")
        detail = f"exit code {pod.exit_code}" if pod.exit_code is not None else reason
        message = f"pod {pod.name} (rank {pod.rank}) on {pod.node or 'no node'} failed: {detail}"
        if pod.message:
            message += f": {pod.message}"
        return Failure.of(pod, klass, reason, message, pod.exit_code)
    return None


def _ended_by_its_deletion(pod: PodView) -> bool:
    """Failed by the deletion's own signal, as a kubelet reports a pod deleted while it ran:
    seen so when the pass that would have seen it terminating never ran (an operator restart,
    coalesced events). An OOMKilled 137 is the kernel's kill, not the delete's."""
    return (
        pod.phase == "Failed"
        and not pod.infrastructure_failure
        and pod.exit_code in DELETION_EXIT_CODES
        and pod.reason in (None, "Error")
    )


def start_blocker(job: JobRef, gang: dict[int, PodView]) -> Failure | None:
    """A pod of the gang that says why it cannot start (image, config, a missing claim)."""
    for pod in sorted(gang.values(), key=lambda p: p.rank):
        if pod.terminal or pod.deleting:
            continue
        if pod.waiting_reason in CANNOT_START_REASONS:
            message = (
                f"pod {pod.name} (rank {pod.rank}) cannot start: {pod.waiting_reason}: "
                f"{pod.waiting_message or 'no detail'}"
            )
            return Failure.of(pod, FailureClass.APPLICATION, pod.waiting_reason, message)
        claim = _CLAIM_NOT_FOUND_MESSAGE.search(pod.unschedulable or "")
        if claim:
            message = (
                f"spec.storage.claimName: PersistentVolumeClaim {claim.group(1)!r} does not exist "
                f"in namespace {job.namespace}; create it or name an existing claim "
                f"(pod {pod.name}: {pod.unschedulable})"
            )
            return Failure.of(pod, FailureClass.APPLICATION, CLAIM_NOT_FOUND, message)
    return None


def startup_overdue(
    job: JobRef, gang: dict[int, PodView], observed: Observed, decision: Decision
) -> Failure | None:
    """A gang that has had `startupTimeoutSeconds` to start since its first pod was placed (or
    said it cannot start) and is still not running; waiting in the queue never counts."""
    if len(gang) == job.spec.nodes and all(
        p.phase == "Running" or p.terminal for p in gang.values()
    ):
        return None  # started (ranks that already finished count as started)
    blocker = start_blocker(job, gang)
    clocks = [p.scheduled_at for p in gang.values() if p.scheduled_at and not p.terminal]
    if blocker is not None:
        clocks += [p.created for p in gang.values() if p.name == blocker.pod and p.created]
    if not clocks:
        return None
    timeout = float(job.spec.run_policy.startup_timeout_seconds)
    remaining = timeout - (observed.now - min(clocks)).total_seconds()
    if remaining > 0:
        decision.requeue(remaining)
        return None
    if blocker is not None:
        return blocker
    ranked = sorted(gang.values(), key=lambda p: p.rank)
    stuck = next((p for p in ranked if p.phase != "Running"), ranked[0])
    return Failure.of(
        stuck,
        FailureClass.INFRASTRUCTURE,
        "StartupTimeout",
        f"pod {stuck.name} (rank {stuck.rank}) of {len(gang)}/{job.spec.nodes} not running "
        f"{job.spec.run_policy.startup_timeout_seconds}s after the gang was placed "
        "(spec.runPolicy.startupTimeoutSeconds)",
    )


def vanished(job: JobRef, stage: Stage, attempt: int, rank: int) -> Failure:
    """A pod of a gang that had all its pods is gone (force delete, PodGC, a delete that
    completed between two passes): re-created alone it could not join the closed rendezvous."""
    name = job.pod_name(stage, attempt, rank)
    return Failure(
        FailureClass.INFRASTRUCTURE,
        stage,
        "PodVanished",
        f"pod {name} (rank {rank}) disappeared from its running gang",
        pod=name,
        rank=rank,
    )


def gang_never_seen(
    status: StatusEdit,
    gang: dict[int, PodView],
    stage: Stage,
    attempt: int,
    *,
    unsent: bool,
    known_here: bool,
) -> bool:
    """The status records this attempt's creates (createdAttempt) and nothing more: no pod of it
    exists, none was ever seen whole, and this operator process neither sent its creates nor
    saw a pod of it. An earlier process stored the record and may have been stopped before its
    creates (the record is written first), or the pods were created and removed while no
    operator ran; nothing tells the two apart."""
    return (
        not gang
        and not unsent
        and not known_here
        and status.stage_int(stage, "createdAttempt") == attempt
        and status.stage_int(stage, "fullGangAttempt") != attempt
    )


def gang_was_whole(
    status: StatusEdit,
    gang: dict[int, PodView],
    stage: Stage,
    attempt: int,
    *,
    unsent: bool = False,
) -> bool:
    """Whether all of this attempt's pods have existed at once, so a missing rank vanished
    (and cannot rejoin a closed rendezvous alone). The status records it once seen; a pod of the
    attempt that Volcano placed proves it too (the PodGroup's minMember is the whole gang, so
    nothing is bound before every pod exists), which covers a record lost to a crash. A gang of
    which no pod is left, after its creates were recorded, counts as whole: its pods may have
    been placed and deleted (a force delete leaves the process running on its node) before any
    pass saw them, and a second gang must not write to the same attempt. Unless this process
    knows (`unsent`) that its creates of the attempt never reached the API server (a gang this
    process never created or saw is `gang_never_seen`'s, which the Failures policy asks first)."""
    if status.stage_int(stage, "fullGangAttempt") == attempt:
        return True
    if not gang and not unsent and status.stage_int(stage, "createdAttempt") == attempt:
        return True
    return any(pod.node for pod in gang.values())


def node_lost_requeue(gang: dict[int, PodView], observed: Observed, grace: float) -> float | None:
    waits = []
    for pod in gang.values():
        node = observed.nodes.get(pod.node) if pod.node else None
        if node is not None and not node.ready and node.not_ready_since is not None:
            waits.append(grace - (observed.now - node.not_ready_since).total_seconds())
    return min(waits) if waits else None
