"""The policies that decide a job's course, as tables (one row per case, as KubeRay's and
JobSet's reconcile tests are written): a snapshot in, the pass's outcome out, through the whole
pipeline (`machine.decide`). Each table names the policy it is about; test_lifecycle.py drives
whole job histories through the same function."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from trainium_operator.builders.job import Stage
from trainium_operator.lifecycle import machine
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.observed import Observed, PodGroupView, PodView
from unit.jobs import decide, job_ref
from unit.test_lifecycle import NODES, T0, pod

TRAINING: dict[str, Any] = {
    "phase": "Training",
    "reason": "GangRunning",
    "attempt": 0,
    "startTime": "2026-11-30T11:00:00Z",
    "training": {"startTime": "2026-11-30T11:00:00Z", "firstAttempt": 0, "fullGangAttempt": 0},
    "restarts": {"total": 0, "application": 0, "infrastructure": 0},
}
ADMITTED = {name: PodGroupView(name, "Running", None) for name in ("bert-compile", "bert-train")}


@dataclass(frozen=True)
class Case:
    """One row: a job (spec overrides), its stored status, its pods; what the pass decides."""

    name: str
    spec: dict[str, Any]
    status: dict[str, Any]
    pods: tuple[tuple[Stage, int, int, str, dict[str, Any]], ...]
    phase: str | None
    reason: str | None = None
    created: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    events: tuple[str, ...] | None = None  # reasons, in order; None: not checked
    delete_job: bool = False
    later: float = 0.0  # seconds after T0
    podgroups: dict[str, PodGroupView] = field(default_factory=lambda: dict(ADMITTED))


def run(case: Case) -> Decision:
    job = job_ref(**case.spec)
    pods: list[PodView] = [
        pod(job, stage, attempt, rank, phase, **extra)
        for stage, attempt, rank, phase, extra in case.pods
    ]
    seen = Observed(tuple(pods), case.podgroups, True, NODES, T0 + timedelta(seconds=case.later))
    return decide(job, case.status, seen)


def check(case: Case) -> None:
    plan = run(case)
    assert plan.status.get("phase") == case.phase, plan.status.get("message")
    if case.reason is not None:
        assert plan.status.get("reason") == case.reason, plan.status.get("message")
    assert tuple(o["metadata"]["name"] for o in plan.create) == case.created
    assert tuple(sorted(d.name for d in plan.delete_pods)) == case.deleted
    assert plan.delete_job is case.delete_job
    if case.events is not None:
        assert tuple(e.reason for e in plan.events) == case.events


def running(
    attempt: int = 0, *phases: str
) -> tuple[tuple[Stage, int, int, str, dict[str, Any]], ...]:
    """The training gang of `attempt`, rank r in phases[r] (Running by default)."""
    wanted = phases or ("Running", "Running")
    return tuple((Stage.TRAIN, attempt, r, phase, {}) for r, phase in enumerate(wanted))


NO_COMPILE: dict[str, Any] = {"compile": {"enabled": False}}


def policy(**run_policy: Any) -> dict[str, Any]:
    """A job without a compile stage, with these spec.runPolicy fields."""
    return {**NO_COMPILE, "runPolicy": run_policy}


FAILED_1 = {"exit_code": 1, "reason": "Error"}
SUCCEEDED = {**TRAINING, "phase": "Succeeded", "reason": "TrainingSucceeded",
             "completionTime": "2026-11-30T11:30:00Z"}  # fmt: skip

FINISHED = [
    Case("cleanPodPolicy Running keeps ended pods", {**NO_COMPILE}, SUCCEEDED,
         running(0, "Succeeded", "Succeeded"), "Succeeded", "TrainingSucceeded"),
    Case("cleanPodPolicy All deletes every pod", policy(cleanPodPolicy="All"),
         SUCCEEDED, running(0, "Succeeded", "Succeeded"), "Succeeded",
         deleted=("bert-train-0-0", "bert-train-0-1")),
    Case("ttl not yet elapsed keeps the job", policy(ttlSecondsAfterFinished=3600),
         SUCCEEDED, (), "Succeeded"),
    Case("ttl elapsed deletes the job", policy(ttlSecondsAfterFinished=60),
         SUCCEEDED, (), "Succeeded", delete_job=True),
]  # fmt: skip

SUSPENSION = [
    Case("suspend deletes the running gang", policy(suspend=True),
         TRAINING, running(), "Suspended", "Suspended",
         deleted=("bert-train-0-0", "bert-train-0-1"), events=("Suspended",)),
    Case("resume starts a new attempt", {**NO_COMPILE},
         {**TRAINING, "phase": "Suspended", "reason": "Suspended"}, (), "Pending", "WaitingForGang",
         created=("bert-train-1-0", "bert-train-1-1"), events=("Resumed", "WaitingForGang")),
]  # fmt: skip

DEADLINE = [
    Case("within activeDeadlineSeconds nothing changes", policy(activeDeadlineSeconds=7200),
         TRAINING, running(), "Training", "GangRunning", events=()),
    Case("past activeDeadlineSeconds fails the job", policy(activeDeadlineSeconds=600),
         TRAINING, running(), "Failed", "DeadlineExceeded",
         deleted=("bert-train-0-0", "bert-train-0-1")),
]  # fmt: skip

FAILURES = [
    Case("an application failure within backoffLimit restarts the gang", {**NO_COMPILE},
         TRAINING, ((Stage.TRAIN, 0, 0, "Failed", FAILED_1), (Stage.TRAIN, 0, 1, "Running", {})),
         "Restarting", "GangRestart", deleted=("bert-train-0-1",)),  # the failed pod stays
    Case("past backoffLimit the job fails", policy(backoffLimit=0),
         TRAINING, ((Stage.TRAIN, 0, 0, "Failed", FAILED_1), (Stage.TRAIN, 0, 1, "Running", {})),
         "Failed", "BackoffLimitExceeded", deleted=("bert-train-0-1",)),
    Case("a compile failure fails the job at once", {},
         {**TRAINING, "phase": "Compiling", "training": None, "compile": {"firstAttempt": 0}},
         ((Stage.COMPILE, 0, 0, "Failed", FAILED_1), (Stage.COMPILE, 0, 1, "Running", {})),
         "Failed", "CompileFailed", deleted=("bert-compile-0-1",)),
    Case("a vanished rank of a whole gang restarts it", {**NO_COMPILE}, TRAINING,
         running(0, "Running"), "Restarting", "GangRestart", deleted=("bert-train-0-0",)),
    Case("a pod carrying a higher attempt raises the status's", {**NO_COMPILE}, TRAINING,
         running(1), "Training", "GangRunning"),
]  # fmt: skip

STAGE_SUCCESS = [
    Case("a compile gang that succeeded starts training", {},
         {"phase": "Compiling", "reason": "GangRunning", "attempt": 0,
          "compile": {"firstAttempt": 0, "fullGangAttempt": 0}},
         tuple((Stage.COMPILE, 0, r, "Succeeded", {}) for r in range(2)),
         "Pending", created=("bert-train-0-0", "bert-train-0-1")),
    Case("a training gang that succeeded ends the job", {**NO_COMPILE}, TRAINING,
         running(0, "Succeeded", "Succeeded"), "Succeeded", "TrainingSucceeded"),
]  # fmt: skip

GANG = [
    Case("a new job gets its PodGroup and no pods until Volcano admits it", {**NO_COMPILE}, {},
         (), "Pending", "Queued", created=("bert-train",), podgroups={}),
    Case("an admitted gang gets every missing pod", {**NO_COMPILE}, {}, (), "Pending",
         created=("bert-train-0-0", "bert-train-0-1")),
    Case("all pods running means Training", {**NO_COMPILE}, {**TRAINING, "phase": "Pending",
         "reason": "Scheduling"}, running(), "Training", "GangRunning"),
    Case("the next attempt waits for the old gang to stop", {**NO_COMPILE},
         {**TRAINING, "attempt": 1, "phase": "Restarting", "reason": "GangRestart"},
         ((Stage.TRAIN, 0, 1, "Running", {"deleting": True}),), "Restarting", "WaitingForOldGang"),
]  # fmt: skip


TABLES = {
    "Finished": FINISHED,
    "Suspension": SUSPENSION,
    "Deadline": DEADLINE,
    "Failures": FAILURES,
    "StageSuccess": STAGE_SUCCESS,
    "Gang": GANG,
}
ROWS = [(policy, case) for policy, cases in TABLES.items() for case in cases]


@pytest.mark.parametrize(("policy", "case"), ROWS, ids=[f"{p}: {c.name}" for p, c in ROWS])
def test_policy_table(policy: str, case: Case) -> None:
    check(case)


def test_every_table_names_a_policy_of_the_pipeline_and_rows_are_distinct() -> None:
    assert set(TABLES) <= {policy.name for policy in machine.PIPELINE}
    assert len({c.name for _, c in ROWS}) == len(ROWS)
