"""Spec: a spec the operator refuses fails the job once, with every problem named; one an
earlier operator already ran under this generation is held instead (an upgrade tightened a
rule: its pods are left alone). A spec it accepts is observed (status.observedGeneration)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainium_operator.api.status import ConditionType, Phase
from trainium_operator.lifecycle.decision import EventRecord

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass

SPEC_REFUSED_AFTER_UPGRADE = "SpecRefusedAfterUpgrade"


def spec(p: Pass) -> None:
    status, generation = p.status, p.snapshot.generation
    if p.snapshot.job is not None:
        status.observed_generation = generation
        return
    p.settle()
    problems = p.snapshot.problems
    accepted_before = status.phase not in (None, Phase.SUCCEEDED, Phase.FAILED) and (
        status.observed_generation == generation
    )
    if accepted_before:
        message = (
            "this spec was accepted by an earlier operator version and is refused now: "
            + "; ".join(problems)
            + "; its pods are left alone and nothing new is created until the spec is edited"
        )
        held = status.condition_of(ConditionType.BLOCKED)
        if not (held and held.status == "True" and held.reason == SPEC_REFUSED_AFTER_UPGRADE):
            p.plan.events.append(EventRecord("Warning", SPEC_REFUSED_AFTER_UPGRADE, message))
        status.condition(ConditionType.BLOCKED, True, SPEC_REFUSED_AFTER_UPGRADE, message)
        return
    message = "invalid spec: " + "; ".join(problems)
    if status.phase is not Phase.FAILED or status.message != message:
        status.finish(Phase.FAILED, "InvalidSpec", message)
    status.observed_generation = generation
