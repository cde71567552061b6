"""Waiting behind an object in the way, with a bound: the policy for a child name that is taken.

A TrainingJob's children have deterministic names, so a job re-created under the same name can
meet its predecessor's pod, PodGroup or Service that garbage collection has not removed yet, or
an unrelated object that merely has the name. Each wait is bounded (`cleanup.stuck_bound`:
spec.runPolicy.nodeLostGracePeriodSeconds, at least 10 s) and escalates:

- a predecessor's pod on a lost node is force-deleted at once (its kubelet cannot confirm);
- a predecessor's pod still Terminating a bound after its grace period ended is force-deleted;
- a predecessor's child nobody deleted within a bound is deleted (its owner is gone);
- an object that no TrainingJob owns is not ours to delete: the job fails naming it;
- whatever is still in the way three bounds later (a finalizer holds it) fails the job, naming
  the object and its finalizers.

The status names the object, since when the job waits, and what happens next and when.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from trainium_operator.api import kueue
from trainium_operator.api.objects import Obj
from trainium_operator.api.status import TERMINAL_PHASES, ConditionType, Phase
from trainium_operator.lifecycle.decision import PodDeletion
from trainium_operator.lifecycle.observed import NodeView, parse_time
from trainium_operator.lifecycle.status_edit import StatusEdit, timestamp

TRAINING_JOB_KIND = "TrainingJob"
GIVE_UP_BOUNDS = 3


@dataclass(frozen=True, slots=True)
class Blocker:
    """The object whose name a child of the job needs."""

    kind: str  # Pod | PodGroup | Service | NetworkPolicy
    name: str
    namespace: str
    owners: tuple[str, ...]  # "<Kind> <uid>" of each owner reference
    predecessor: bool  # owned by a TrainingJob: a deleted job of this name
    deletion_due: datetime | None  # metadata.deletionTimestamp
    node: str | None
    node_lost: bool
    finalizers: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def blocker_view(obj: Obj, nodes: dict[str, NodeView], *, nodes_known: bool = True) -> Blocker:
    meta = obj.get("metadata") or {}
    refs = meta.get("ownerReferences") or []
    node = (obj.get("spec") or {}).get("nodeName") if obj.get("kind") == "Pod" else None
    seen = nodes.get(node) if node else None
    return Blocker(
        kind=str(obj.get("kind")),
        name=str(meta.get("name")),
        namespace=str(meta.get("namespace")),
        owners=tuple(f"{r.get('kind')} {r.get('uid')}" for r in refs),
        predecessor=any(r.get("kind") == TRAINING_JOB_KIND for r in refs),
        deletion_due=parse_time(meta.get("deletionTimestamp")),
        node=node,
        node_lost=bool(node) and ((seen is None and nodes_known) or not (seen and seen.ready)),
        finalizers=tuple(meta.get("finalizers") or ()),
    )


def _waiting_since(status: StatusEdit, now: datetime) -> datetime:
    cond = status.condition_of(ConditionType.BLOCKED)
    if cond is not None and cond.status == "True":
        return parse_time(cond.last_transition_time) or now
    return now


def blocked(status: StatusEdit, blocker: Blocker, *, bound_seconds: float) -> None:
    """What to do about `blocker`, and the status that says so."""
    decision, now = status.decision, status.now
    if status.phase in TERMINAL_PHASES:
        return
    since = _waiting_since(status, now)
    bound = timedelta(seconds=bound_seconds)
    owners = ", ".join(blocker.owners) or "no owner"
    waited = f"since {timestamp(since)}"
    give_up_at = max(since, blocker.deletion_due or since) + GIVE_UP_BOUNDS * bound

    if not blocker.predecessor:
        if now >= since + bound:
            message = (
                f"{blocker.label} exists and is not this job's ({owners}); a TrainingJob's "
                f"children are named after it: delete or rename that {blocker.kind}, or give "
                "the job another name"
            )
            status.condition(ConditionType.BLOCKED, True, "NameConflict", message)
            status.finish(Phase.FAILED, "NameConflict", message)
        else:
            message = (
                f"{blocker.label} exists and is not this job's ({owners}); waiting {waited} in "
                f"case it is being removed; the job fails at {timestamp(since + bound)}"
            )
            _wait(status, "WaitingForNameConflict", message)
            decision.requeue((since + bound - now).total_seconds())
        return

    if now >= give_up_at:
        held = f"; finalizers {list(blocker.finalizers)} hold it" if blocker.finalizers else ""
        message = (
            f"{blocker.label} of a deleted job of this name ({owners}) is still in the way "
            f"{waited} after it was deleted{held}; remove it, then re-create the job"
        )
        status.condition(ConditionType.BLOCKED, True, "PredecessorStuck", message)
        status.finish(Phase.FAILED, "PredecessorStuck", message)
        return

    overdue = blocker.deletion_due is not None and now >= blocker.deletion_due + bound
    if blocker.kind == "Pod" and (blocker.node_lost or overdue):
        why = (
            f"its node {blocker.node} is lost"
            if blocker.node_lost
            else f"it is still Terminating {bound_seconds:.0f}s after its grace period ended "
            f"(node {blocker.node or 'none'} does not confirm)"
        )
        kueue_held = kueue.MANAGED_FINALIZER in blocker.finalizers
        decision.delete_pods.append(
            PodDeletion(
                blocker.name,
                force=True,
                release_finalizer=kueue.MANAGED_FINALIZER if kueue_held else None,
            )
        )
        message = (
            f"{blocker.label} of a deleted job of this name ({owners}) is in the way and "
            f"{why}: force-deleted; waiting {waited} for it to go, the job fails at "
            f"{timestamp(give_up_at)}"
        )
        _wait(status, "ForceDeletingPredecessor", message, warning=True)
    elif blocker.deletion_due is None and now >= since + bound:
        decision.delete_foreign.append((blocker.kind, blocker.name))
        message = (
            f"{blocker.label} of a deleted job of this name ({owners}) was not removed by "
            f"garbage collection within {bound_seconds:.0f}s: deleted it; waiting {waited} for "
            f"it to go, the job fails at {timestamp(give_up_at)}"
        )
        _wait(status, "DeletingPredecessor", message)
    else:
        next_step = (
            blocker.deletion_due + bound if blocker.deletion_due is not None else since + bound
        )
        message = (
            f"{blocker.label} already exists and belongs to a deleted job of this name "
            f"({owners}), whose children are still terminating; waiting {waited} for it to go "
            f"(escalation at {timestamp(next_step)})"
        )
        _wait(status, "WaitingForPredecessor", message)
        decision.requeue((next_step - now).total_seconds())
    decision.requeue(min(bound_seconds, 5.0))


def _wait(status: StatusEdit, reason: str, message: str, *, warning: bool = False) -> None:
    status.condition(ConditionType.BLOCKED, True, reason, message)
    status.transition(status.phase or Phase.PENDING, reason, message, warning=warning)
