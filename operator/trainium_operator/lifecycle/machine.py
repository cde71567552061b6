"""The TrainingJob state machine: one pass's snapshot -> its plan (a `Decision`). Pure.

Pending -> Compiling -> Training -> Succeeded | Failed, with Restarting between gangs and
Suspended on request. Everything the operator does follows from this function's output, so
a pass repeated after an operator restart computes the same plan from the same snapshot
(children have deterministic names; counters live in the status).

`PIPELINE` is every policy a pass runs, in order, each a module of `lifecycle.policies` with
one signature, `(p: Pass) -> None`, editing the one status and plan of the pass. The first
decide the job's course (as JobSet's reconcile does: finished, suspended, past its deadline,
failed, succeeded, else its gang); one that settles it stops the gang policies after it. The
rest run on every pass of a valid job: they read the ranks' reports and the side objects
(profiles and their uploads), and the last two bring progress and goodput up to date.
The reconciler gathers the snapshot and applies the plan; the dry run calls the same `decide`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from trainium_operator.api.objects import Obj
from trainium_operator.api.status import validated_status
from trainium_operator.lifecycle.admission import admission_rejected
from trainium_operator.lifecycle.blockers import Blocker, blocked
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.policies.deadline import deadline
from trainium_operator.lifecycle.policies.failures import failures
from trainium_operator.lifecycle.policies.finished import finished
from trainium_operator.lifecycle.policies.gang import gang
from trainium_operator.lifecycle.policies.goodput import goodput, with_goodput
from trainium_operator.lifecycle.policies.on_demand_profile import on_demand_profile
from trainium_operator.lifecycle.policies.on_demand_upload import (
    on_demand_upload,
    on_demand_upload_refused,
)
from trainium_operator.lifecycle.policies.pod_fields import dropped_pod_fields
from trainium_operator.lifecycle.policies.preflight import preflight
from trainium_operator.lifecycle.policies.profile_upload import profile_upload, upload_refused
from trainium_operator.lifecycle.policies.progress import progress
from trainium_operator.lifecycle.policies.spec import spec
from trainium_operator.lifecycle.policies.stage_success import stage_success
from trainium_operator.lifecycle.policies.stalls import stall
from trainium_operator.lifecycle.policies.stragglers import stragglers
from trainium_operator.lifecycle.policies.suspension import suspension
from trainium_operator.lifecycle.snapshot import Pass, Snapshot
from trainium_operator.lifecycle.status_edit import StatusEdit


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    run: Callable[[Pass], None]
    # Runs after an earlier policy settled the job's course for this pass.
    always: bool = False
    # Runs for a spec the operator refuses (there is no parsed job then).
    on_refused_spec: bool = False

    def runs(self, p: Pass) -> bool:
        if p.snapshot.job is None:
            return self.on_refused_spec
        return self.always or not p.settled


PIPELINE: tuple[Policy, ...] = (
    Policy("Spec", spec, always=True, on_refused_spec=True),
    Policy("Finished", finished),
    Policy("Suspension", suspension),
    Policy("Deadline", deadline),
    Policy("Preflight", preflight),
    Policy("Failures", failures),
    Policy("StageSuccess", stage_success),
    Policy("Gang", gang),
    Policy("DroppedPodFields", dropped_pod_fields, always=True),
    Policy("Stall", stall, always=True),
    Policy("Stragglers", stragglers, always=True),
    Policy("OnDemandProfile", on_demand_profile, always=True),
    Policy("ProfileUpload", profile_upload, always=True),
    Policy("OnDemandUpload", on_demand_upload, always=True),
    Policy("Progress", progress, always=True),
    Policy("Goodput", goodput, always=True, on_refused_spec=True),
)


def decide(snapshot: Snapshot) -> Decision:
    """One pass: every policy of PIPELINE that applies, in order, over the same pass; the status
    is checked against its model once, at the end."""
    plan = Decision()
    status = StatusEdit(snapshot.status, snapshot.generation, snapshot.now, plan)
    p = Pass(snapshot, status, plan)
    for policy in PIPELINE:
        if policy.runs(p):
            policy.run(p)
    plan.status = status.validated()
    return plan


@dataclass(frozen=True, slots=True)
class ChildRefused:
    """The API server refused a child of the job (admission: quota, policy, a missing
    PriorityClass or ServiceAccount); `fatal`: only a spec change can help. `pods_created`:
    whether any of the pass's pods was created before the refusal."""

    reason: str
    message: str
    fatal: bool
    pods_created: bool = False


@dataclass(frozen=True, slots=True)
class ChildNameTaken:
    """A child's name is taken by an object the job does not own (lifecycle.blockers)."""

    blocker: Blocker
    bound_seconds: float
    pods_created: bool = False


@dataclass(frozen=True, slots=True)
class UploadPodRefused:
    """The API server refused a profile upload pod: the upload's own outcome, never the job's.
    `attempt`: an attempt's upload; None: the on-demand profile's."""

    pod: str
    reason: str
    attempt: int | None = None


Finding = ChildRefused | ChildNameTaken | UploadPodRefused


def decide_finding(
    status: Obj, generation: int, now: datetime, created: datetime | None, finding: Finding
) -> Decision:
    """What applying a pass found out (the pass's own writes were cut short), recorded on the
    job's status as it is now (`status`), with goodput as on every status write."""
    plan = Decision()
    edit = StatusEdit(status, generation, now, plan)
    if isinstance(finding, ChildRefused | ChildNameTaken) and not finding.pods_created:
        # The pass's creates were cut short before any pod: an empty gang is then not one
        # whose pods vanished (lifecycle.failures.gang_was_whole).
        edit.forget_stage_records("createdAttempt")
    match finding:
        case ChildRefused(reason, message, fatal):
            admission_rejected(edit, reason, message, fatal=fatal)
        case ChildNameTaken(blocker, bound_seconds):
            blocked(edit, blocker, bound_seconds=bound_seconds)
        case UploadPodRefused(pod, reason, None):
            on_demand_upload_refused(edit, pod, reason)
        case UploadPodRefused(pod, reason, int(attempt)):
            upload_refused(edit, attempt, pod, reason)
    plan.status = validated_status(with_goodput(status, edit.data, now, created))
    return plan
