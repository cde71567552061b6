"""A job's status being edited by one pass: the one editor every policy uses.

Transitions and conditions are recorded once each (`transition`, `condition`: the one setter
of every condition type), `lastFailure` only from a `Failure` (`record_failure`), and each
section of the status is read and written as its typed model (`section`, `set_section`, or the
properties named after the sections). The mapping underneath is the status as the API server
stores it; `validated` checks it against the model once, at the end of a pass.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Generic, TypeVar

from pydantic import ValidationError

from trainium_operator.api.model_base import ApiModel
from trainium_operator.api.objects import Obj
from trainium_operator.api.status import (
    CompileStageStatus,
    Condition,
    ConditionType,
    GoodputStatus,
    LastFailure,
    OnDemandProfile,
    Phase,
    PreflightStatus,
    ProfileStatus,
    ProfileUpload,
    ProfileUploadCounts,
    ProgressStatus,
    QueueStatus,
    Restarts,
    StageStatus,
    StallStatus,
    StragglersStatus,
    Workers,
    known_fields,
    validated_status,
)
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.lifecycle.decision import Decision, EventRecord
from trainium_operator.lifecycle.observed import PodView

if TYPE_CHECKING:
    from trainium_operator.lifecycle.failures import Failure


Section = TypeVar("Section", bound=ApiModel)


def dump(model: ApiModel) -> Obj:
    """A status section as stored: camelCase, only the fields it was given (a read-modify-write
    round-trips byte for byte)."""
    return model.model_dump(by_alias=True, exclude_unset=True, mode="json")


Value = TypeVar("Value", str, int)


class FieldOf(Generic[Value]):
    """A top-level scalar of the status (reason, message, observedGeneration, the start and
    completion times) as an attribute of the editor; None when absent."""

    def __init__(self, key: str):
        self.key = key

    def __get__(self, edit: StatusEdit, owner: type[StatusEdit]) -> Value | None:
        value: Value | None = edit.data.get(self.key)
        return value

    def __set__(self, edit: StatusEdit, value: Value | None) -> None:
        if value is None:
            edit.data.pop(self.key, None)
        else:
            edit.data[self.key] = value


class SectionOf(Generic[Section]):
    """A status section as an attribute of the editor: read as its model (None when absent),
    assigned a model (or None, which removes it)."""

    def __init__(self, key: str, model: type[Section]):
        self.key = key
        self.model = model

    def __get__(self, edit: StatusEdit, owner: type[StatusEdit]) -> Section | None:
        return edit.section(self.key, self.model)

    def __set__(self, edit: StatusEdit, value: Section | None) -> None:
        edit.set_section(self.key, value)


def readable_section(status: object, key: str, model: type[Section]) -> Section | None:
    """status.<key> of a status as the API server returned it (not this pass's), as its model;
    None when there is none or none this operator can read (fields of another version dropped)."""
    raw = status.get(key) if isinstance(status, dict) else None
    if not isinstance(raw, dict):
        return None
    try:
        return model.model_validate(known_fields(raw, model))
    except ValidationError:
        return None


def timestamp(moment: datetime) -> str:
    """RFC 3339 to the second, UTC, as every status time is written."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def with_stage_records(status: Obj, stage: Stage, **records: int) -> Obj:
    """A copy of a stored `status` with `records` set in its stage's section."""
    section = _section(stage)
    return {**status, section: {**(status.get(section) or {}), **records}}


def _section(stage: Stage) -> str:
    return "compile" if stage is Stage.COMPILE else "training"


class StatusEdit:
    """A mutable copy of the job's status; a phase change or a new reason posts its event, and
    a condition's lastTransitionTime moves only when its status flips."""

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

    @attempt.setter
    def attempt(self, value: int) -> None:
        self.data["attempt"] = value

    reason = FieldOf[str]("reason")
    message = FieldOf[str]("message")
    observed_generation = FieldOf[int]("observedGeneration")
    start_time = FieldOf[str]("startTime")
    completion_time = FieldOf[str]("completionTime")

    def condition_of(self, ctype: ConditionType) -> Condition | None:
        """The condition of `ctype` as its model; None when the status has none."""
        found = self.find_condition(ctype)
        return Condition.model_validate(found) if found is not None else None

    def validated(self) -> Obj:
        return validated_status(self.data)

    # -- typed sections ----------------------------------------------------------------------
    def section(self, key: str, model: type[Section]) -> Section | None:
        """status.<key> as its model; None when the status has none."""
        value = self.data.get(key)
        return model.model_validate(value) if value is not None else None

    def set_section(self, key: str, value: ApiModel | None) -> None:
        """status.<key> replaced by `value` (None removes it)."""
        if value is None:
            self.data.pop(key, None)
        else:
            self.data[key] = dump(value)

    def sections(self, key: str, model: type[Section]) -> list[Section]:
        """A list section (status.profileUploads) as its models."""
        return [model.model_validate(v) for v in self.data.get(key) or []]

    def set_sections(self, key: str, values: list[Section]) -> None:
        self.data[key] = [dump(v) for v in values]

    stall = SectionOf("stall", StallStatus)
    stragglers = SectionOf("stragglers", StragglersStatus)
    preflight = SectionOf("preflight", PreflightStatus)
    progress = SectionOf("progress", ProgressStatus)
    goodput = SectionOf("goodput", GoodputStatus)
    on_demand_profile = SectionOf("onDemandProfile", OnDemandProfile)
    profile = SectionOf("profile", ProfileStatus)
    profile_uploads_older = SectionOf("profileUploadsOlder", ProfileUploadCounts)
    workers = SectionOf("workers", Workers)
    queue = SectionOf("queue", QueueStatus)
    compile = SectionOf("compile", CompileStageStatus)
    training = SectionOf("training", StageStatus)

    @property
    def profile_uploads(self) -> list[ProfileUpload]:
        return self.sections("profileUploads", ProfileUpload)

    @profile_uploads.setter
    def profile_uploads(self, values: list[ProfileUpload]) -> None:
        self.set_sections("profileUploads", values)

    @property
    def restarts(self) -> Restarts:
        """status.restarts; a job that never restarted has these three counts at 0."""
        return self.section("restarts", Restarts) or Restarts(
            total=0, application=0, infrastructure=0
        )

    @restarts.setter
    def restarts(self, value: Restarts) -> None:
        self.set_section("restarts", value)

    @property
    def last_failure(self) -> LastFailure | None:
        """Written only by `record_failure`."""
        return self.section("lastFailure", LastFailure)

    # -- stages ------------------------------------------------------------------------------
    def stage_time(self, stage: Stage, key: str) -> str | None:
        value = self.data.get(_section(stage), {}).get(key)
        return str(value) if value else None

    def stage_int(self, stage: Stage, key: str) -> int | None:
        value = self.data.get(_section(stage), {}).get(key)
        return int(value) if value is not None else None

    def set_stage(self, stage: Stage, key: str, value: int) -> None:
        self.data.setdefault(_section(stage), {})[key] = value

    def forget_stage_records(self, *keys: str) -> None:
        """Drops `keys` (records of a gang, as createdAttempt) from both stages' sections."""
        for stage in Stage:
            section = self.data.get(_section(stage), {})
            for key in keys:
                section.pop(key, None)

    def mark_stage(self, stage: Stage, key: str) -> None:
        self.data.setdefault(_section(stage), {}).setdefault(key, timestamp(self.now))

    def transition(self, phase: Phase, reason: str, message: str, *, warning: bool = False) -> None:
        if self.phase is not phase or self.data.get("reason") != reason:
            self.decision.events.append(
                EventRecord("Warning" if warning else "Normal", reason, message)
            )
        self.data["phase"] = phase.value
        self.data["reason"] = reason
        self.data["message"] = message

    def find_condition(self, ctype: ConditionType) -> Obj | None:
        return next((c for c in self.data.get("conditions", []) if c["type"] == ctype), None)

    def condition(self, ctype: ConditionType, status: bool, reason: str, message: str) -> None:
        """The one setter of conditions."""
        wanted = "True" if status else "False"
        cond = self.find_condition(ctype)
        if cond is None:
            self.data.setdefault("conditions", []).append(
                {"type": ctype.value, "lastTransitionTime": timestamp(self.now)}
            )
            cond = self.data["conditions"][-1]
        elif cond["status"] != wanted:
            cond["lastTransitionTime"] = timestamp(self.now)
        cond.update(
            status=wanted, reason=reason, message=message, observedGeneration=self.generation
        )

    def clear(self, ctype: ConditionType, reason: str, message: str) -> None:
        """Sets a condition False only where it was ever set (no noise on jobs it never had)."""
        if self.find_condition(ctype) is not None:
            self.condition(ctype, False, reason, message)

    def record_failure(self, failure: Failure) -> None:
        """status.lastFailure: only ever from a `Failure`."""
        self.set_section("lastFailure", failure.as_status(self.now))

    def finish(self, phase: Phase, reason: str, message: str) -> None:
        self.transition(phase, reason, message, warning=phase is Phase.FAILED)
        self.data.setdefault("completionTime", timestamp(self.now))
        succeeded = phase is Phase.SUCCEEDED
        self.condition(
            ConditionType.SUCCEEDED if succeeded else ConditionType.FAILED, True, reason, message
        )
        self.condition(ConditionType.RUNNING, False, reason, message)
        self.condition(ConditionType.RESTARTING, False, reason, message)


def workers_view(gang: dict[int, PodView], total: int) -> Workers:
    """status.workers of the current stage's gang."""
    ready = sum(1 for p in gang.values() if p.phase == "Running" and p.ready and not p.deleting)
    return Workers(
        ready=ready,
        total=total,
        succeeded=sum(1 for p in gang.values() if p.phase == "Succeeded"),
        failed=sum(1 for p in gang.values() if p.phase == "Failed"),
        summary=f"{ready}/{total}",
    )


def profile_view(job: JobRef, attempt: int) -> ProfileStatus:
    """status.profile of a profiled training attempt: where its ranks write."""
    return ProfileStatus(path=job.profile_dir(attempt), claim_name=job.spec.storage.claim_name)
