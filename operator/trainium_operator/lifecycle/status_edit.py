"""A job's status being edited by one pass: transitions and conditions recorded once each."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from trainium_operator.api.status import (
    ConditionType,
    Phase,
    known_fields,
    validated_status,
)
from trainium_operator.builders.job import Stage
from trainium_operator.lifecycle.decision import Decision, EventRecord, Obj
from trainium_operator.lifecycle.observed import PodView

if TYPE_CHECKING:
    from trainium_operator.lifecycle.failures import Failure


def timestamp(moment: datetime) -> str:
    """RFC 3339 to the second, UTC, as every status time is written."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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

    def validated(self) -> Obj:
        return validated_status(self.data)

    def stage_time(self, stage: Stage, key: str) -> str | None:
        value = self.data.get(_section(stage), {}).get(key)
        return str(value) if value else None

    def stage_int(self, stage: Stage, key: str) -> int | None:
        value = self.data.get(_section(stage), {}).get(key)
        return int(value) if value is not None else None

    def set_stage(self, stage: Stage, key: str, value: int) -> None:
        self.data.setdefault(_section(stage), {})[key] = value

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
        self.data["lastFailure"] = failure.as_status(self.now)

    def finish(self, phase: Phase, reason: str, message: str) -> None:
        self.transition(phase, reason, message, warning=phase is Phase.FAILED)
        self.data.setdefault("completionTime", timestamp(self.now))
        succeeded = phase is Phase.SUCCEEDED
        self.condition(
            ConditionType.SUCCEEDED if succeeded else ConditionType.FAILED, True, reason, message
        )
        self.condition(ConditionType.RUNNING, False, reason, message)
        self.condition(ConditionType.RESTARTING, False, reason, message)


def workers_view(gang: dict[int, PodView], total: int) -> Obj:
    """status.workers of the current stage's gang."""
    ready = sum(1 for p in gang.values() if p.phase == "Running" and p.ready and not p.deleting)
    return {
        "ready": ready,
        "total": total,
        "succeeded": sum(1 for p in gang.values() if p.phase == "Succeeded"),
        "failed": sum(1 for p in gang.values() if p.phase == "Failed"),
        "summary": f"{ready}/{total}",
    }
