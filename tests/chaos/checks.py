"""What the chaos suite checks, as functions of what it observed: pod and job snapshots from its
polls and the jobs' events at the end. Kept apart from the cluster so every check can be shown to
fail on hand-made data (test_chaos_checks.py).

Each check appends to `Ledger.violations`; the suite fails on any.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

JOB_LABEL = "trainium.dev/job-name"
STAGE_LABEL = "trainium.dev/stage"
ATTEMPT_LABEL = "trainium.dev/attempt"
RANK_LABEL = "trainium.dev/node-rank"
OUTCOME_ANNOTATION = "sim.trainium.dev/outcome"
UPLOAD_STAGE = "profile-upload"
# Events about the profile upload describe the upload's own state, not the job's phase.
UPLOAD_REASONS = frozenset({"ProfileUploaded", "ProfileUploadFailed", "NoProfile"})
TERMINAL = frozenset({"Succeeded", "Failed"})

GangKey = tuple[str, str, int, int]  # job, stage, attempt, rank


@dataclass(frozen=True)
class PodSeen:
    """One pod of a job as a poll saw it."""

    name: str
    uid: str
    job: str
    stage: str
    attempt: int | None  # None: an upload pod (one per profiled attempt, no gang)
    rank: int | None
    node: str | None
    phase: str
    deleting: bool
    outcome: str | None = None  # the simulated ending asked of KWOK (sim.trainium.dev/outcome)
    ready: bool = False  # the Ready condition (the node lifecycle controller clears it)

    @property
    def gang_key(self) -> GangKey | None:
        if self.attempt is None or self.rank is None:
            return None
        return (self.job, self.stage, self.attempt, self.rank)

    @property
    def live(self) -> bool:
        return self.phase not in TERMINAL

    @classmethod
    def of(cls, pod: Any) -> PodSeen | None:
        """From a kubernetes-client V1Pod; None for a pod that belongs to no job."""
        labels = pod.metadata.labels or {}
        if JOB_LABEL not in labels:
            return None
        attempt, rank = labels.get(ATTEMPT_LABEL), labels.get(RANK_LABEL)
        return cls(
            name=pod.metadata.name,
            uid=pod.metadata.uid,
            job=labels[JOB_LABEL],
            stage=labels.get(STAGE_LABEL, ""),
            attempt=int(attempt) if attempt is not None else None,
            rank=int(rank) if rank is not None else None,
            node=pod.spec.node_name,
            phase=(pod.status.phase if pod.status else None) or "Pending",
            deleting=pod.metadata.deletion_timestamp is not None,
            outcome=(pod.metadata.annotations or {}).get(OUTCOME_ANNOTATION),
            ready=any(
                c.type == "Ready" and c.status == "True"
                for c in (pod.status.conditions if pod.status else None) or []
            ),
        )


@dataclass(frozen=True)
class EventSeen:
    type: str
    reason: str
    message: str
    time: datetime | None  # as kubectl sorts: series.lastObservedTime, lastTimestamp, eventTime

    @classmethod
    def of(cls, event: Any) -> EventSeen:
        """From a kubernetes-client CoreV1Event."""
        series = getattr(event, "series", None)
        time = (
            (series.last_observed_time if series is not None else None)
            or event.last_timestamp
            or event.event_time
        )
        return cls(event.type or "", event.reason or "", event.message or "", time)


@dataclass
class Ledger:
    """What the suite has seen so far, to check that things only move forward."""

    attempts: dict[str, int] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    phases: dict[str, tuple[int, str]] = field(default_factory=dict)  # job -> (attempt, phase)
    # The pod that held each (job, stage, attempt, rank) once it was scheduled on a node.
    scheduled: dict[GangKey, tuple[str, str]] = field(default_factory=dict)  # uid, pod@node
    recreated: set[str] = field(default_factory=set)  # uids already reported
    # Multi-node gangs seen with every rank Running at once: (job, stage, attempt) -> nodes.
    full_gangs: dict[tuple[str, str, int], int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    step: str = "start"

    def violation(self, text: str) -> None:
        self.violations.append(f"[{self.step}] {text}")


def check_pods(pods: Iterable[PodSeen], nodes_of: Mapping[str, int], ledger: Ledger) -> None:
    """One poll's pods: no (job, stage, attempt, rank) that was ever scheduled is re-created as
    another pod (two gangs would write to one attempt), and never two attempts alive at once."""
    alive: dict[str, set[int]] = {}
    running: Counter[tuple[str, str, int]] = Counter()
    for pod in pods:
        key = pod.gang_key
        if key is None:
            continue
        if pod.live:
            alive.setdefault(pod.job, set()).add(key[2])
        if pod.phase == "Running" and not pod.deleting:
            running[(pod.job, pod.stage, key[2])] += 1
        first = ledger.scheduled.get(key)
        if first is not None and first[0] != pod.uid and pod.uid not in ledger.recreated:
            ledger.recreated.add(pod.uid)
            ledger.violation(
                f"{pod.job}: {pod.stage} attempt {key[2]} rank {key[3]} was scheduled as "
                f"{first[1]} (uid {first[0]}) and exists again as uid {pod.uid} on "
                f"{pod.node or 'no node yet'}: two gangs write to attempt {key[2]}"
            )
        elif first is None and pod.node:
            ledger.scheduled[key] = (pod.uid, f"{pod.name}@{pod.node}")
    for job, attempts in alive.items():
        if len(attempts) > 1:
            ledger.violation(f"{job}: pods of attempts {sorted(attempts)} alive at once")
    for (job, stage, attempt), count in running.items():
        nodes = nodes_of.get(job, 1)
        if nodes > 1 and count == nodes:
            ledger.full_gangs[(job, stage, attempt)] = nodes


def live_attempts(pods: Iterable[PodSeen], job: str) -> set[int]:
    return {p.attempt for p in pods if p.job == job and p.live and p.attempt is not None}


def check_status(name: str, status: Mapping[str, Any], alive: set[int], ledger: Ledger) -> None:
    """One poll's status of a job that is never suspended: the attempt and the restart counts
    only grow, every restart was counted exactly once (restarts.total == attempt, split into
    application + infrastructure), no pod outlives its attempt, and a training gang that ran
    never sends the job back to Pending within the same attempt."""
    attempt = int(status.get("attempt", 0))
    restarts = status.get("restarts") or {}
    total = int(restarts.get("total", 0))
    if attempt < ledger.attempts.get(name, 0):
        ledger.violation(f"{name}: attempt went down {ledger.attempts[name]} -> {attempt}")
    if total < ledger.restarts.get(name, 0):
        ledger.violation(f"{name}: restarts went down {ledger.restarts[name]} -> {total}")
    if "attempt" in status and total != attempt:
        ledger.violation(f"{name}: attempt {attempt} but {total} restarts counted")
    split = int(restarts.get("application", 0)) + int(restarts.get("infrastructure", 0))
    if restarts and split != total:
        ledger.violation(f"{name}: restarts {dict(restarts)} do not add up to the total")
    if alive and max(alive) < attempt and status.get("phase") not in ("Restarting", None):
        ledger.violation(f"{name}: live pods of attempt {max(alive)} below status {attempt}")
    phase = status.get("phase")
    before = ledger.phases.get(name)
    if before == (attempt, "Training") and phase == "Pending":
        ledger.violation(
            f"{name}: went back from Training to Pending in attempt {attempt} "
            f"({status.get('reason')}: {status.get('message')})"
        )
    if phase is not None:
        ledger.phases[name] = (attempt, str(phase))
    ledger.attempts[name] = max(attempt, ledger.attempts.get(name, 0))
    ledger.restarts[name] = max(total, ledger.restarts.get(name, 0))


def _describe(events: Iterable[EventSeen]) -> str:
    return "; ".join(f"{e.type} {e.reason} at {e.time}: {e.message[:160]}" for e in events)


def newest(events: Iterable[EventSeen]) -> list[EventSeen]:
    """The events kubectl may list last: all that share the newest time (their order among
    themselves is not defined, so each of them is what a user may read as the latest)."""
    timed = [e for e in events if e.time is not None]
    if not timed:
        return []
    latest = max(e.time for e in timed if e.time is not None)
    return [e for e in timed if e.time == latest]


def final_event_violations(
    name: str, status: Mapping[str, Any], events: list[EventSeen]
) -> list[str]:
    """No event newer than the final state describes an older one: the newest events about
    the job's lifecycle carry its final reason, and the newest upload event matches
    `status.profile.upload`."""
    phase, reason = status.get("phase"), status.get("reason")
    lifecycle = [e for e in events if e.reason not in UPLOAD_REASONS]
    found: list[str] = []
    last = newest(lifecycle)
    if not last:
        found.append(f"{name}: ended {phase}/{reason} without any event about it")
    else:
        stale = [e for e in last if e.reason != reason]
        if stale:
            tied = len(last) > 1 and any(e.reason == reason for e in last)
            found.append(
                f"{name}: ended {phase}/{reason} but its newest event"
                f"{'s (tied to the second, kubectl may list either last)' if tied else ''} "
                f"describe an older state: {_describe(last)}"
            )
    upload = ((status.get("profile") or {}).get("upload") or {}).get("state")
    wanted = {"Failed": "ProfileUploadFailed", "Succeeded": "ProfileUploaded"}.get(str(upload))
    if wanted is not None:
        uploads = newest(e for e in events if e.reason in UPLOAD_REASONS)
        if not any(e.reason == wanted for e in uploads):
            found.append(
                f"{name}: status.profile.upload is {upload} but the newest upload event is "
                f"{_describe(uploads) or 'missing'}"
            )
    return found


def warning_violations(
    name: str, events: list[EventSeen], lapsed_nodes: frozenset[str] = frozenset()
) -> list[str]:
    """A job no fault targeted (only operator and API server crashes, which must not show)
    has no Warning at all, but the true report of a node that went NotReady on its own during
    the run (`lapsed_nodes`, seen NotReady by the suite with no partition on them: KWOK's
    lease renewals stalled after an API server restart), which a healthy job would report too."""
    warnings = [
        e
        for e in events
        if e.type == "Warning"
        and not any(f"node {node} is NotReady" in e.message for node in lapsed_nodes)
    ]
    if not warnings:
        return []
    return [f"{name} (a control job no fault targeted) has Warning events: {_describe(warnings)}"]


def refused_uploads(status: Mapping[str, Any]) -> list[int]:
    """Attempts whose upload pod the API server refused, as the job's status records them."""
    return [
        int(record["attempt"])
        for record in status.get("profileUploads") or []
        if record.get("state") == "Failed" and record.get("reason") == "PodRefused"
    ]


def side_pod_refusal_violations(
    name: str, status: Mapping[str, Any], events: list[EventSeen]
) -> list[str]:
    """A job whose upload pods were all refused still ends Succeeded/TrainingSucceeded; the
    refusal shows only as the upload's state and a ProfileUploadFailed Warning."""
    found = []
    if (status.get("phase"), status.get("reason")) != ("Succeeded", "TrainingSucceeded"):
        found.append(
            f"{name}: upload pods refused and the job ended {status.get('phase')}/"
            f"{status.get('reason')}: {status.get('message')}"
        )
    upload = (status.get("profile") or {}).get("upload") or {}
    if upload.get("state") != "Failed" or "refused" not in str(upload.get("message", "")):
        found.append(f"{name}: status.profile.upload is {upload or 'missing'}, expected Failed")
    if not refused_uploads(status):
        found.append(f"{name}: no refused upload recorded in status.profileUploads")
    if not any(e.type == "Warning" and e.reason == "ProfileUploadFailed" for e in events):
        found.append(f"{name}: no ProfileUploadFailed Warning event")
    # The refusal is the upload's own outcome: no other Warning names an upload pod.
    leaked = [
        e
        for e in events
        if e.type == "Warning" and e.reason not in UPLOAD_REASONS and "profile-upload" in e.message
    ]
    if leaked:
        found.append(f"{name}: an upload refusal reached the job's own events: {_describe(leaked)}")
    return found
