"""What one reconcile pass decided: the objects to create and delete, the status, the events.

Every policy of the lifecycle writes into one `Decision`; the reconciler applies it in a safe
order (a restart's status before its deletes, events after the status they describe, side
objects last).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainium_operator.api.objects import Obj


@dataclass(frozen=True, slots=True)
class PodDeletion:
    name: str
    force: bool  # grace period 0: the pod's node is gone and will never confirm
    # A finalizer the operator removes after a forced delete: Kueue's, which its controller
    # lifts only once the kubelet reports the pod ended (never, on a lost node).
    release_finalizer: str | None = None


@dataclass(frozen=True, slots=True)
class EventRecord:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class NodePatch:
    """A change to a node (a straggler's cordon): applied after a restart's status is stored
    and before any pod is deleted or created."""

    name: str
    body: Obj  # a JSON merge patch


@dataclass(slots=True)
class Decision:
    create: list[Obj] = field(default_factory=list)
    # Objects beside the job (profile upload pods): created after the job's status is written,
    # and a refusal of one is that object's own outcome, never the job's.
    side_create: list[Obj] = field(default_factory=list)
    delete_pods: list[PodDeletion] = field(default_factory=list)
    delete_podgroups: list[str] = field(default_factory=list)
    # (kind, name) of a deleted predecessor's child that garbage collection left in the way.
    delete_foreign: list[tuple[str, str]] = field(default_factory=list)
    delete_job: bool = False
    # (key, value) of the job's annotations to remove once its status is written, each only
    # while it still has that value (a consumed request: lifecycle/profile_on_demand.py).
    remove_annotations: list[tuple[str, str]] = field(default_factory=list)
    patch_nodes: list[NodePatch] = field(default_factory=list)
    status: Obj = field(default_factory=dict)
    events: list[EventRecord] = field(default_factory=list)
    requeue_after: float | None = None
    # Written (guarded by resourceVersion) before anything is created as well: a restart's
    # new attempt and counts. A crash in between then neither loses the count nor lets a later
    # pass re-create the old attempt. (Before any delete or node patch the applier stores the
    # status whatever this says.)
    status_first: bool = False
    # The stored status plus the record of the pods about to be created (their stage's
    # firstAttempt and createdAttempt): written after the other children exist and before the
    # first pod, unless the whole status was written first. Only the record: if the creates are
    # cut short (a refusal, a name a predecessor holds), the status still says what the last
    # finding said (a bounded wait keeps its start).
    status_before_pods: Obj | None = None

    def requeue(self, seconds: float, *, minimum: float = 1.0) -> None:
        """Another pass within `seconds`; `minimum` keeps a policy from spinning (a deadline that
        must be met to the tenth of a second, as a stall's, asks for less)."""
        seconds = max(seconds, minimum)
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )
