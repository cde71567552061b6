"""Profiling on demand: `kubectl annotate trainingjob X trainium.dev/profile-steps=+20` makes
every rank of the running attempt capture its next 20 steps in full, through the health
channel. Two policies of the pass (machine.PIPELINE): the request and its capture here, its
S3 upload in `on_demand_upload`.

What is decided here:
- **The annotation** is a request, consumed once: the pass that sees it records the request
  in `status.onDemandProfile` (with the annotation's value) and asks the reconciler to remove
  the annotation after that status is written (`Decision.remove_annotations`, a JSON patch
  that tests the value first, so a newer value written meanwhile stays). A pass that sees the
  value its status already holds knows its removal did not happen (a crash, a conflict) and
  only removes it again: the request is never served twice, and annotating again later (even
  the same value) is a new request.
- **A bad value** (not `+N` with 1 <= N <= 1000), a job that is not Training or whose health
  channel is off, or a capture still in progress: one Warning event naming the annotation and
  what to do, the annotation removed, nothing else (no retry, no status change beyond that).
- **The request** has an id (`p<attempt>-<time>`, a path component) and its directory,
  `<profile dir of the attempt>/on-demand/<id>`. The health channel's replies carry it to
  every rank of the attempt (`requests_for`) until the rank says it captured it; the endpoint
  reads it from the status, so a restarted operator asks for the same capture, never a new one.
- **Then**: Capturing once a rank says it is recording the window, Captured once every rank of
  the gang that has not ended says its files are complete (a Normal event with the path), and
  Incomplete if the attempt ends first (a restart, the job finishing) with the ranks that did.
- **Upload**: a Captured profile with an S3 URI configured (spec.profile.s3Uri, else the
  operator's --profile-s3-uri; spec.profile.enabled is not needed) gets its own upload pod, the
  attempt upload's pod with the request's directory and name (`builders.upload`), while the job
  trains; `onDemandProfile.upload` follows it, with one event per outcome.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from trainium_operator.api.objects import Obj
from trainium_operator.api.status import OnDemandProfile, OnDemandProfileState, Phase
from trainium_operator.builders.job import JobRef
from trainium_operator.contract import channel as contract
from trainium_operator.lifecycle.decision import Decision, EventRecord
from trainium_operator.lifecycle.ranks import RankSample
from trainium_operator.lifecycle.status_edit import readable_section, timestamp

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass

ANNOTATION = "trainium.dev/profile-steps"
STATUS_KEY = "onDemandProfile"
MAX_STEPS = contract.MAX_CAPTURE_STEPS
OPEN_STATES: frozenset[OnDemandProfileState | None] = frozenset({"Requested", "Capturing"})
LISTED_MISSING = 16
_VALUE = re.compile(r"^\+([0-9]{1,7})$")
FIX = f"set it to +N, the number of steps to capture (1 <= N <= {MAX_STEPS}), e.g. +20"


def annotation_value(steps: int) -> str:
    """What `profile now --steps N` writes."""
    return f"+{steps}"


def parse_profile_steps(value: str) -> int:
    """N of `+N`; ValueError says what is wrong and how to fix it."""
    match = _VALUE.match(value.strip())
    if match is None:
        raise ValueError(f"{ANNOTATION}={value!r} is not +N; {FIX}")
    steps = int(match.group(1))
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"{ANNOTATION}={value!r} asks for {steps} steps; {FIX}")
    return steps


def request_id(attempt: int, now: datetime) -> str:
    return f"p{attempt}-{now:%Y%m%dT%H%M%SZ}"


def capture_path(job: JobRef, attempt: int, request: str) -> str:
    """The request's directory, as the ranks derive it from their stacks directory."""
    stacks = contract.stacks_dir(job.profile_dir(attempt))
    return contract.on_demand_dir(stacks, request)


def capture_request(record: OnDemandProfile | None, attempt: int) -> contract.CaptureRequest | None:
    """The capture the operator's replies carry to this attempt's ranks, if any (from the
    job's status, its one source of truth)."""
    if record is None or record.attempt != attempt or record.state not in OPEN_STATES:
        return None
    return contract.CaptureRequest.from_json({"id": record.request_id, "steps": record.steps})


def capture_requests_for(job: Obj | None, attempt: int, captured: str) -> dict[str, Any]:
    """What the reply to a rank of `attempt` asks of it (`captured`: its last capture)."""
    record = readable_section((job or {}).get("status"), STATUS_KEY, OnDemandProfile)
    request = capture_request(record, attempt)
    if request is None or request.request_id == captured:
        return {}
    return {contract.REQUEST_CAPTURE_STEPS: request.to_json()}


@dataclass(frozen=True, slots=True)
class _Gang:
    world: set[int]  # every rank of the attempt
    expected: set[int]  # of those, the ranks that have not ended
    capturing: set[int]
    captured: set[int]


def _gang(ranks: list[RankSample], attempt: int, request: str, world_size: int) -> _Gang:
    """`world_size`: the job's spec's (nodes x processes per node), never a rank's number."""
    current = [r for r in ranks if r.attempt == attempt and r.rank < world_size]
    ended = {r.rank for r in current if r.final}
    world = set(range(world_size))
    return _Gang(
        world=world,
        expected=world - ended,
        capturing={r.rank for r in current if r.profile_capturing == request},
        captured={r.rank for r in current if r.profile_captured == request},
    )


def on_demand_profile(p: Pass) -> None:
    """The annotation's request recorded (or refused), and the capture followed."""
    record = p.status.on_demand_profile
    value = p.snapshot.annotations.get(ANNOTATION)
    if value is None:
        if record is not None and "annotation" in record.model_fields_set:
            record = record.without("annotation")  # its removal happened
    elif record is not None and record.annotation == value:
        p.plan.remove_annotations.append((ANNOTATION, value))  # ours; removal retried
    else:
        record = _request(p, value, record) or record
    if record is not None and record.state in OPEN_STATES:
        record = _follow(p, record)
    if record is not None:
        p.status.on_demand_profile = record


def _refuse(decision: Decision, value: str, message: str) -> None:
    decision.events.append(EventRecord("Warning", "ProfileRequestRefused", message))
    decision.remove_annotations.append((ANNOTATION, value))


def _request(p: Pass, value: str, record: OnDemandProfile | None) -> OnDemandProfile | None:
    """The new request `value` asks for, or None when it is refused."""
    job, decision, now = p.job, p.plan, p.now
    try:
        steps = parse_profile_steps(value)
    except ValueError as error:
        _refuse(decision, value, f"{error}; the annotation was removed")
        return None
    attempt, phase = p.status.attempt, p.status.phase
    if phase is not Phase.TRAINING or not job.health_channel:
        why = (
            "spec.health.enabled is false (the ranks have no channel to hear it)"
            if not job.health_channel
            else f"the job is {phase or 'not started'}, not Training"
        )
        _refuse(
            decision,
            value,
            f"{ANNOTATION}={value} ignored: {why}; annotate again while the job is Training",
        )
        return None
    if record is not None and record.state in OPEN_STATES and record.attempt == attempt:
        _refuse(
            decision,
            value,
            f"{ANNOTATION}={value} ignored: capture {record.request_id} is still "
            f"{str(record.state).lower()}; annotate again once it is Captured",
        )
        return None
    request = request_id(attempt, now)
    path = capture_path(job, attempt, request)
    decision.remove_annotations.append((ANNOTATION, value))
    decision.events.append(
        EventRecord(
            "Normal",
            "ProfileRequested",
            f"every rank of attempt {attempt} captures its next {steps} steps in full "
            f"(request {request}, {path})",
        )
    )
    return OnDemandProfile(
        request_id=request,
        attempt=attempt,
        steps=steps,
        path=path,
        state="Requested",
        annotation=value,
        requested_time=timestamp(now),
    )


def _follow(p: Pass, record: OnDemandProfile) -> OnDemandProfile:
    """The open request as its attempt's ranks report it."""
    attempt = record.attempt if record.attempt is not None else -1
    ranks = list(p.snapshot.ranks or ())
    gang = _gang(ranks, attempt, record.request_id, p.job.spec.world_size)
    captured = gang.captured
    if attempt != p.status.attempt or p.status.phase is not Phase.TRAINING:
        # The attempt is over: a rank's last message may still have said it captured.
        state: OnDemandProfileState = (
            "Captured" if gang.world and gang.world <= captured else "Incomplete"
        )
        return _done(p, record, state, captured, gang.world | captured)
    if gang.expected and gang.expected <= captured:
        return _done(p, record, "Captured", captured, gang.expected)
    # Open means the state is set: writing it back unchanged keeps the same status.
    started = record.state == "Requested" and bool(gang.capturing or captured)
    return record.model_copy(
        update={
            "state": "Capturing" if started else record.state,
            "ranks_expected": len(gang.expected),
            "ranks_captured": len(captured & gang.expected),
        }
    )


def _done(
    p: Pass,
    record: OnDemandProfile,
    state: OnDemandProfileState,
    captured: set[int],
    expected: set[int],
) -> OnDemandProfile:
    missing = sorted(expected - captured)
    message = (
        f"{len(captured & expected)}/{len(expected)} ranks wrote their profile of "
        f"{record.steps} steps to {record.path} (request {record.request_id})"
    )
    if state == "Captured":
        p.plan.events.append(EventRecord("Normal", "ProfileCaptured", message))
    else:
        listed = ", ".join(map(str, missing[:LISTED_MISSING])) or "none"
        p.plan.events.append(
            EventRecord(
                "Warning",
                "ProfileIncomplete",
                f"{message}; attempt {record.attempt} ended first; missing rank {listed}",
            )
        )
    return record.model_copy(
        update={
            "state": state,
            "ranks_expected": len(expected),
            "ranks_captured": len(captured & expected),
            "missing_ranks": missing[:LISTED_MISSING],
            "complete_time": timestamp(p.now),
        }
    )
