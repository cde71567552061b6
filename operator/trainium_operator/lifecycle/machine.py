"""The TrainingJob state machine: (job, status, observed cluster) -> Decision. Pure.

Pending -> Compiling -> Training -> Succeeded | Failed, with Restarting between gangs and
Suspended on request. Everything the operator does follows from this function's output, so
a reconcile repeated after an operator restart computes the same decision from the same
observations (children have deterministic names; counters live in the status).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from trainium_operator.api.spec import CleanPodPolicy
from trainium_operator.api.status import (
    TERMINAL_PHASES,
    FailureClass,
    Phase,
    known_fields,
    validated_status,
)
from trainium_operator.builders import pods as pod_builders
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.lifecycle.observed import Observed, PodView, parse_time

Obj = dict[str, Any]


STAGE_PHASE = {Stage.COMPILE: Phase.COMPILING, Stage.TRAIN: Phase.TRAINING}
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
CLAIM_NOT_FOUND = "ClaimNotFound"
_CLAIM_NOT_FOUND_MESSAGE = re.compile(r'persistentvolumeclaim "([^"]+)" not found')


@dataclass(frozen=True, slots=True)
class PodDeletion:
    name: str
    force: bool  # grace period 0: the pod's node is gone and will never confirm


@dataclass(frozen=True, slots=True)
class EventRecord:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(slots=True)
class Decision:
    create: list[Obj] = field(default_factory=list)
    # Objects beside the job (profile upload pods): created after the job's status is written,
    # and a refusal of one is that object's own outcome, never the job's.
    side_create: list[Obj] = field(default_factory=list)
    delete_pods: list[PodDeletion] = field(default_factory=list)
    delete_podgroups: list[str] = field(default_factory=list)
    delete_job: bool = False
    status: Obj = field(default_factory=dict)
    events: list[EventRecord] = field(default_factory=list)
    requeue_after: float | None = None
    # A restart: the new attempt and restart counts are written (guarded by resourceVersion)
    # before anything is deleted, so a crash in between neither loses the count nor lets a
    # later pass re-create the old attempt.
    status_first: bool = False

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 1.0)
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )


@dataclass(frozen=True, slots=True)
class Failure:
    klass: FailureClass
    stage: Stage
    pod: str
    node: str | None
    rank: int
    exit_code: int | None
    reason: str
    message: str

    @classmethod
    def of(
        cls,
        pod: PodView,
        klass: FailureClass,
        reason: str,
        message: str,
        exit_code: int | None = None,
    ) -> Failure:
        return cls(klass, pod.stage, pod.name, pod.node, pod.rank, exit_code, reason, message)

    def as_status(self, now: datetime) -> Obj:
        out: Obj = {
            "class": self.klass.value,
            "stage": self.stage.value,
            "pod": self.pod,
            "rank": self.rank,
            "reason": self.reason,
            "message": self.message,
            "time": _ts(now),
        }
        if self.node:
            out["node"] = self.node
        if self.exit_code is not None:
            out["exitCode"] = self.exit_code
        return out


def _ts(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Status:
    """A mutable copy of the job's status with helpers that record transitions once."""

    def __init__(self, current: Obj, generation: int, now: datetime, decision: Decision):
        self.data: Obj = copy.deepcopy(known_fields(current)) if current else {}
        self.generation = generation
        self.now = now
        self.decision = decision

    @property
    def phase(self) -> Phase | None:
        value = self.data.get("phase")
        return Phase(value) if value else None

    @property
    def attempt(self) -> int:
        return int(self.data.get("attempt", 0))

    def stage_time(self, stage: Stage, key: str) -> str | None:
        section = "compile" if stage is Stage.COMPILE else "training"
        value = self.data.get(section, {}).get(key)
        return str(value) if value else None

    def stage_int(self, stage: Stage, key: str) -> int | None:
        section = "compile" if stage is Stage.COMPILE else "training"
        value = self.data.get(section, {}).get(key)
        return int(value) if value is not None else None

    def set_stage(self, stage: Stage, key: str, value: int) -> None:
        section = "compile" if stage is Stage.COMPILE else "training"
        self.data.setdefault(section, {})[key] = value

    def mark_stage(self, stage: Stage, key: str) -> None:
        section = "compile" if stage is Stage.COMPILE else "training"
        self.data.setdefault(section, {}).setdefault(key, _ts(self.now))

    def transition(self, phase: Phase, reason: str, message: str, *, warning: bool = False) -> None:
        if self.phase is not phase or self.data.get("reason") != reason:
            self.decision.events.append(
                EventRecord("Warning" if warning else "Normal", reason, message)
            )
        self.data["phase"] = phase.value
        self.data["reason"] = reason
        self.data["message"] = message

    def condition(self, ctype: str, status: bool, reason: str, message: str) -> None:
        conditions: list[Obj] = self.data.setdefault("conditions", [])
        wanted = "True" if status else "False"
        for cond in conditions:
            if cond["type"] == ctype:
                if cond["status"] != wanted:
                    cond["lastTransitionTime"] = _ts(self.now)
                cond.update(
                    status=wanted,
                    reason=reason,
                    message=message,
                    observedGeneration=self.generation,
                )
                return
        conditions.append(
            {
                "type": ctype,
                "status": wanted,
                "reason": reason,
                "message": message,
                "lastTransitionTime": _ts(self.now),
                "observedGeneration": self.generation,
            }
        )

    def has_condition(self, ctype: str) -> bool:
        return any(
            c["type"] == ctype and c["status"] == "True" for c in self.data.get("conditions", [])
        )

    def finish(self, phase: Phase, reason: str, message: str) -> None:
        self.transition(phase, reason, message, warning=phase is Phase.FAILED)
        self.data.setdefault("completionTime", _ts(self.now))
        succeeded = phase is Phase.SUCCEEDED
        self.condition("Succeeded" if succeeded else "Failed", True, reason, message)
        self.condition("Running", False, reason, message)
        self.condition("Restarting", False, reason, message)


def _failure_of(pod: PodView, observed: Observed, grace: float) -> Failure | None:
    """Why this pod of the current gang counts as failed, if it does."""
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
    if pod.deleting and not pod.terminal:
        return Failure.of(
            pod,
            FailureClass.INFRASTRUCTURE,
            "PodDeleted",
            f"pod {pod.name} (rank {pod.rank}) was deleted while running",
        )
    return None


def _start_blocker(job: JobRef, gang: dict[int, PodView]) -> Failure | None:
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


def _startup_overdue(
    job: JobRef, gang: dict[int, PodView], observed: Observed, decision: Decision
) -> Failure | None:
    """A gang that has had `startupTimeoutSeconds` to start since its first pod was placed (or
    said it cannot start) and is still not running; waiting in the queue never counts."""
    if len(gang) == job.spec.nodes and all(
        p.phase == "Running" or p.terminal for p in gang.values()
    ):
        return None  # started (ranks that already finished count as started)
    blocker = _start_blocker(job, gang)
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


def _vanished(job: JobRef, stage: Stage, attempt: int, rank: int) -> Failure:
    """A pod of a gang that had all its pods is gone (force delete, PodGC, a delete that
    completed between two passes): re-created alone it could not join the closed rendezvous."""
    name = job.pod_name(stage, attempt, rank)
    return Failure(
        FailureClass.INFRASTRUCTURE,
        stage,
        name,
        None,
        rank,
        None,
        "PodVanished",
        f"pod {name} (rank {rank}) disappeared from its running gang",
    )


def _node_lost_requeue(gang: dict[int, PodView], observed: Observed, grace: float) -> float | None:
    waits = []
    for pod in gang.values():
        node = observed.nodes.get(pod.node) if pod.node else None
        if node is not None and not node.ready and node.not_ready_since is not None:
            waits.append(grace - (observed.now - node.not_ready_since).total_seconds())
    return min(waits) if waits else None


def _is_lost(pod: PodView, observed: Observed) -> bool:
    node = observed.nodes.get(pod.node) if pod.node else None
    if node is None:
        return bool(pod.node) and observed.nodes_known
    return not node.ready


def _delete_gang(decision: Decision, pods: list[PodView], observed: Observed) -> None:
    for pod in pods:
        lost = _is_lost(pod, observed)
        if lost or not pod.deleting:
            # Force only where the kubelet cannot confirm, so nothing hangs in Terminating.
            decision.delete_pods.append(PodDeletion(pod.name, force=lost))


def _cleanup_on_finish(job: JobRef, decision: Decision, observed: Observed) -> None:
    policy = job.spec.run_policy.clean_pod_policy
    if policy is CleanPodPolicy.NONE:
        return
    doomed = [
        p
        for p in observed.pods
        if (policy is CleanPodPolicy.ALL or not p.terminal)
        and (not p.deleting or _is_lost(p, observed))
    ]
    _delete_gang(decision, doomed, observed)


def _workers(gang: dict[int, PodView], total: int) -> Obj:
    ready = sum(1 for p in gang.values() if p.phase == "Running" and p.ready and not p.deleting)
    return {
        "ready": ready,
        "total": total,
        "succeeded": sum(1 for p in gang.values() if p.phase == "Succeeded"),
        "failed": sum(1 for p in gang.values() if p.phase == "Failed"),
        "summary": f"{ready}/{total}",
    }


def invalid(current_status: Obj, generation: int, problems: list[str], now: datetime) -> Decision:
    """The job's spec cannot be run: fail it once, with every problem named."""
    decision = Decision()
    status = _Status(current_status, generation, now, decision)
    message = "invalid spec: " + "; ".join(problems)
    if status.phase is not Phase.FAILED or status.data.get("message") != message:
        status.finish(Phase.FAILED, "InvalidSpec", message)
    status.data["observedGeneration"] = generation
    decision.status = validated_status(status.data)
    return decision


def while_deleting(observed: Observed) -> list[PodDeletion]:
    """The job is being deleted (foreground deletion waits for its children): pods on a lost
    node would stay Terminating forever, so those are force-deleted."""
    return [
        PodDeletion(p.name, force=True)
        for p in observed.pods
        if p.deleting and not p.terminal and _is_lost(p, observed)
    ]


def blocked(
    status_after: Obj, generation: int, reason: str, message: str, *, now: datetime
) -> Decision:
    """Something outside the job must go first (a predecessor's child of the same name)."""
    decision = Decision()
    status = _Status(status_after, generation, now, decision)
    if status.phase not in TERMINAL_PHASES:
        status.transition(status.phase or Phase.PENDING, reason, message, warning=True)
    decision.status = validated_status(status.data)
    return decision


def admission_rejected(
    status_after: Obj, generation: int, reason: str, message: str, *, fatal: bool, now: datetime
) -> Decision:
    """The API server refused a child for a reason only the spec (fatal) or the cluster (quota,
    a PriorityClass or ServiceAccount created later) can fix: say so once, do not spin."""
    decision = Decision()
    status = _Status(status_after, generation, now, decision)
    status.condition("Admitted", False, reason, message)
    if fatal:
        status.finish(Phase.FAILED, reason, message)
    else:
        status.transition(Phase.PENDING, reason, message, warning=True)
    decision.status = validated_status(status.data)
    return decision


@dataclass(slots=True)
class _Pass:
    """One decision in the making: what each policy below reads and writes."""

    job: JobRef
    status: _Status
    decision: Decision
    observed: Observed

    def done(self) -> Decision:
        self.decision.status = validated_status(self.status.data)
        return self.decision


def decide(job: JobRef, current_status: Obj, observed: Observed) -> Decision:
    """The whole lifecycle as one pass through small policies, each of which may end it."""
    decision = Decision()
    status = _Status(current_status, job.generation, observed.now, decision)
    status.data["observedGeneration"] = job.generation
    p = _Pass(job, status, decision, observed)
    if _finished(p):
        return p.done()
    compile_done = not job.spec.compile.enabled or status.stage_time(
        Stage.COMPILE, "completionTime"
    )
    stage = Stage.TRAIN if compile_done else Stage.COMPILE
    if _suspended(p):
        return p.done()
    attempt = _resumed(p, stage)
    if _past_deadline(p):
        return p.done()
    attempt = _attempt_floor(p, attempt)
    if _failed(p, stage, attempt):
        return p.done()
    next_stage = _stage_succeeded(p, stage, attempt)
    if next_stage is None:
        return p.done()
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
    wait = _node_lost_requeue(observed.gang(next_stage, attempt), observed, grace)
    if wait is not None:
        decision.requeue(wait)
    return p.done()


def _finished(p: _Pass) -> bool:
    """Terminal: clean up per cleanPodPolicy and honour ttlSecondsAfterFinished."""
    if p.status.phase not in TERMINAL_PHASES:
        return False
    _cleanup_on_finish(p.job, p.decision, p.observed)
    ttl = p.job.spec.run_policy.ttl_seconds_after_finished
    finished = parse_time(p.status.data.get("completionTime"))
    if ttl is not None and finished is not None:
        remaining = ttl - (p.observed.now - finished).total_seconds()
        if remaining <= 0:
            p.decision.delete_job = True
        else:
            p.decision.requeue(remaining)
    return True


def _suspended(p: _Pass) -> bool:
    """spec.runPolicy.suspend: no pods, no PodGroups."""
    if not p.job.spec.run_policy.suspend:
        return False
    status = p.status
    if status.phase is not Phase.SUSPENDED:
        status.transition(Phase.SUSPENDED, "Suspended", "job suspended: pods deleted")
        status.condition("Suspended", True, "Suspended", "spec.runPolicy.suspend is true")
        status.condition("Running", False, "Suspended", "job suspended")
    _delete_gang(p.decision, [pod for pod in p.observed.pods if not pod.terminal], p.observed)
    p.decision.delete_podgroups.extend(sorted(p.observed.podgroups))
    for section in ("compile", "training"):
        # Suspend removes the pods on purpose: their absence is not a vanished pod.
        status.data.get(section, {}).pop("fullGangAttempt", None)
    status.data["workers"] = _workers({}, p.job.spec.nodes)
    return True


def _resumed(p: _Pass, stage: Stage) -> int:
    """Leaving Suspended: a new gang (a new attempt once the job had started)."""
    status = p.status
    attempt = status.attempt
    if status.phase is Phase.SUSPENDED:
        if status.data.get("startTime"):
            attempt += 1
            status.data["attempt"] = attempt
        status.data["startTime"] = _ts(p.observed.now)
        status.condition("Suspended", False, "Resumed", "spec.runPolicy.suspend is false")
        status.transition(Phase.PENDING, "Resumed", f"resuming the {stage.value} stage")
    return attempt


def _past_deadline(p: _Pass) -> bool:
    """spec.runPolicy.activeDeadlineSeconds."""
    deadline = p.job.spec.run_policy.active_deadline_seconds
    started = parse_time(p.status.data.get("startTime"))
    if deadline is None or started is None:
        return False
    remaining = deadline - (p.observed.now - started).total_seconds()
    if remaining > 0:
        p.decision.requeue(remaining)
        return False
    p.status.finish(
        Phase.FAILED,
        "DeadlineExceeded",
        f"job was active longer than spec.runPolicy.activeDeadlineSeconds ({deadline}s)",
    )
    _cleanup_on_finish(p.job, p.decision, p.observed)
    return True


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
    failures = [f for f in (_failure_of(pod, observed, grace) for pod in gang.values()) if f]
    if _gang_was_whole(p.status, gang, stage, attempt):
        failures += [
            _vanished(job, stage, attempt, rank)
            for rank in range(job.spec.nodes)
            if rank not in gang
        ]
    blocker = _start_blocker(job, gang)
    if failures and blocker is not None:
        # A healthy rank timing out in rendezvous is not the cause: the rank that never
        # started is.
        failures.insert(0, blocker)
    if not failures:
        overdue = _startup_overdue(job, gang, observed, p.decision)
        if overdue is not None and overdue.klass is FailureClass.APPLICATION:
            p.status.data["lastFailure"] = overdue.as_status(observed.now)
            p.status.finish(
                Phase.FAILED,
                overdue.reason,
                f"{overdue.message}; gave up after spec.runPolicy.startupTimeoutSeconds "
                f"({run_policy.startup_timeout_seconds}s)",
            )
            _cleanup_on_finish(job, p.decision, observed)
            return True
        if overdue is not None:
            failures = [overdue]
    if not failures:
        return False
    _handle_failures(
        job,
        status=p.status,
        decision=p.decision,
        observed=observed,
        stage=stage,
        attempt=attempt,
        failures=failures,
    )
    return True


def _gang_was_whole(status: _Status, gang: dict[int, PodView], stage: Stage, attempt: int) -> bool:
    """Whether all of this attempt's pods have existed at once, so a missing rank vanished
    (and cannot rejoin a closed rendezvous alone). The status records it once seen; a pod of the
    attempt that Volcano placed proves it too (the PodGroup's minMember is the whole gang, so
    nothing is bound before every pod exists), which covers a record lost to a crash."""
    if status.stage_int(stage, "fullGangAttempt") == attempt:
        return True
    return any(pod.node for pod in gang.values())


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
            status.condition("Compiled", False, "Compiling", "compile stage running")
        return stage
    status.mark_stage(stage, "completionTime")
    if stage is Stage.TRAIN:
        status.data["workers"] = _workers(gang, job.spec.nodes)
        status.finish(
            Phase.SUCCEEDED, "TrainingSucceeded", f"all {job.spec.nodes} training pods succeeded"
        )
        _cleanup_on_finish(job, p.decision, p.observed)
        return None
    status.condition(
        "Compiled", True, "CompileSucceeded", "neuron_parallel_compile filled the compile cache"
    )
    p.decision.events.append(
        EventRecord("Normal", "CompileSucceeded", "compile stage finished; starting training")
    )
    return Stage.TRAIN


def _ensure_gang(
    job: JobRef,
    *,
    status: _Status,
    decision: Decision,
    observed: Observed,
    stage: Stage,
    attempt: int,
    gang: dict[int, PodView],
) -> None:
    status.data.setdefault("startTime", _ts(observed.now))
    status.data.setdefault("attempt", attempt)
    status.data.setdefault("restarts", {"total": 0, "application": 0, "infrastructure": 0})
    status.mark_stage(stage, "startTime")
    if not observed.service_exists:
        decision.create.append(pod_builders.headless_service(job))
    if job.podgroup_name(stage) not in observed.podgroups:
        decision.create.append(pod_builders.podgroup(job, stage))
    older = [p for p in observed.pods if p.attempt < attempt and not p.terminal]
    if older:
        # The restart protocol: the next gang starts only once every older pod has stopped,
        # so two attempts never run (or rendezvous) at once.
        _delete_gang(decision, older, observed)
        status.data["workers"] = _workers(gang, job.spec.nodes)
        status.transition(
            Phase.RESTARTING,
            "WaitingForOldGang",
            f"attempt {attempt} starts once {len(older)} pod(s) of earlier attempts have "
            f"stopped: {', '.join(sorted(p.name for p in older))}",
        )
        decision.requeue(5.0)
        return
    group = observed.podgroups.get(job.podgroup_name(stage))
    if not gang and (group is None or not group.admitted):
        # As Kubeflow's operator does under Volcano: a gang waiting in its queue holds one
        # PodGroup (with minResources, all Volcano's enqueue needs), not Pending pods in etcd.
        # The PodGroup's watch event wakes the job once Volcano lets it in.
        status.data["workers"] = _workers(gang, job.spec.nodes)
        if status.phase is not Phase.RESTARTING:
            reason, message, warning = _waiting_reason(job, stage, gang, observed)
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
        if any(c["type"] == "Admitted" for c in status.data.get("conditions", [])):
            status.condition("Admitted", True, "PodsCreated", f"all {stage.value} pods exist")
    if stage is Stage.TRAIN and job.spec.profile.enabled:
        status.data["profile"] = {
            "path": job.profile_dir(attempt),
            "claimName": job.spec.storage.claim_name,
        }
    workers = _workers(gang, job.spec.nodes)
    status.data["workers"] = workers
    all_running = workers["ready"] == job.spec.nodes
    if all_running:
        status.transition(
            STAGE_PHASE[stage],
            "GangRunning",
            f"all {job.spec.nodes} {stage.value} pods running (attempt {attempt})",
        )
        status.condition("Running", True, "GangRunning", f"{stage.value} stage running")
        status.condition("Restarting", False, "GangRunning", f"attempt {attempt} running")
    elif status.phase is not Phase.RESTARTING:
        reason, message, warning = _waiting_reason(job, stage, gang, observed)
        status.transition(Phase.PENDING, reason, message, warning=warning)


_GANG_VERDICT = re.compile(r"(\d+)/(\d+) tasks in gang unschedulable")


def _verdict_covers(message: str, pods: int) -> bool:
    """Whether Volcano's "<unschedulable>/<tasks seen> tasks in gang unschedulable" saw at least
    `pods` tasks (a message in another form is taken as it is)."""
    match = _GANG_VERDICT.search(message)
    return match is None or int(match.group(2)) >= pods


def _waiting_reason(
    job: JobRef, stage: Stage, gang: dict[int, PodView], observed: Observed
) -> tuple[str, str, bool]:
    """Why a stage's gang is not running yet, in Volcano's own words where it gave some:
    (reason, message, is a warning)."""
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
    blocker = _start_blocker(job, gang)
    if blocker is not None:
        return blocker.reason, blocker.message, True
    group = observed.podgroups.get(job.podgroup_name(stage))
    scheduled = sum(1 for p in gang.values() if p.node)
    ready = sum(1 for p in gang.values() if p.phase == "Running" and p.ready and not p.deleting)
    progress = f"{scheduled}/{nodes} pods scheduled, {ready}/{nodes} ready"
    # Until all of the gang's pods exist, Volcano's "16/0 tasks in gang unschedulable" only
    # says that the pods being created are not there yet; a verdict on fewer tasks than the gang
    # now has was written before its pods existed and is no refusal either.
    if (
        group is not None
        and group.unschedulable
        and scheduled < nodes
        and len(gang) >= nodes
        and _verdict_covers(group.unschedulable, len(gang))
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


def _handle_failures(
    job: JobRef,
    *,
    status: _Status,
    decision: Decision,
    observed: Observed,
    stage: Stage,
    attempt: int,
    failures: list[Failure],
) -> None:
    # An application failure explains more than the infrastructure noise it causes.
    failures.sort(
        key=lambda f: (
            f.reason not in CANNOT_START_REASONS and f.reason != CLAIM_NOT_FOUND,
            f.klass is not FailureClass.APPLICATION,
            f.rank,
        )
    )
    first = failures[0]
    status.data["lastFailure"] = first.as_status(observed.now)
    for failure in failures:
        decision.events.append(EventRecord("Warning", failure.reason, failure.message))
    policy = job.spec.run_policy
    restarts = dict(
        status.data.get("restarts") or {"total": 0, "application": 0, "infrastructure": 0}
    )
    if first.klass is FailureClass.APPLICATION:
        used, limit, budget = restarts.get("application", 0), policy.backoff_limit, "backoffLimit"
    else:
        used, limit = restarts.get("infrastructure", 0), policy.infrastructure_backoff_limit
        budget = "infrastructureBackoffLimit"

    if stage is Stage.COMPILE and first.klass is FailureClass.APPLICATION:
        status.condition("Compiled", False, "CompileFailed", first.message)
        status.finish(Phase.FAILED, "CompileFailed", f"compile stage failed: {first.message}")
        _cleanup_on_finish(job, decision, observed)
        return
    if used >= limit:
        reason = (
            "BackoffLimitExceeded"
            if first.klass is FailureClass.APPLICATION
            else "InfrastructureBackoffLimitExceeded"
        )
        status.finish(
            Phase.FAILED,
            reason,
            f"{first.message}; spec.runPolicy.{budget} ({limit}) exhausted",
        )
        _cleanup_on_finish(job, decision, observed)
        return

    key = "application" if first.klass is FailureClass.APPLICATION else "infrastructure"
    restarts[key] = used + 1
    restarts["total"] = restarts.get("total", 0) + 1
    status.data["restarts"] = restarts
    new_attempt = attempt + 1
    status.data["attempt"] = new_attempt
    # torchrun ranks cannot rejoin alone: stop the whole gang. Keep this attempt's failed
    # pods for their logs; drop failed pods of older attempts.
    old = [
        p
        for p in observed.pods
        if p.attempt <= attempt and (not p.terminal or (p.stage is stage and p.attempt < attempt))
    ]
    _delete_gang(decision, old, observed)
    status.transition(
        Phase.RESTARTING,
        "GangRestart",
        f"restarting all {job.spec.nodes} {stage.value} pods as attempt {new_attempt} after "
        f"{first.reason}: {first.message}",
        warning=True,
    )
    status.condition("Restarting", True, first.reason, first.message)
    status.condition("Running", False, "GangRestart", f"attempt {new_attempt} starting")
    # The new gang is created by a later pass, once this status is stored and the old pods
    # are gone (their deletion events wake the job).
    decision.status_first = True
    decision.requeue(1.0)
    status.data["workers"] = _workers({}, job.spec.nodes)
    if stage is Stage.TRAIN and job.spec.profile.enabled:
        status.data["profile"] = {
            "path": job.profile_dir(new_attempt),
            "claimName": job.spec.storage.claim_name,
        }
