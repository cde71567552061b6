"""Hang detection (lifecycle/policies/stalls.py), driven as the reconciler drives it: one pass of
the whole pipeline over a running training gang with the ranks' newest messages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from trainium_operator.api.spec import HealthSpec
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.contract import channel as contract
from trainium_operator.contract.channel import ProgressMessage
from trainium_operator.controller.health_server import ProgressStore, step_started
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.observed import NodeView, Observed, PodGroupView, PodView
from trainium_operator.lifecycle.policies.stalls import (
    requests_for,
    stack_wait_seconds,
    stall_bound,
    stopped_first,
)
from trainium_operator.lifecycle.ranks import RankSample
from unit.jobs import UID, decide, job_ref

T0 = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
NODES = {f"n{i}": NodeView(f"n{i}", True, None, "trn1.32xlarge") for i in range(2)}


def job(**health: Any) -> JobRef:
    # One process per node: the stall watch sizes the gang from the spec (2 ranks here).
    return job_ref(compile={"enabled": False}, processesPerNode=1, health=health)


def running(job: JobRef, stage: Stage, attempt: int, rank: int) -> PodView:
    name = job.pod_name(stage, attempt, rank)
    return PodView(
        name, stage, attempt, rank, "Running", True, "n0", False, None, None, None, False
    )


def observed(job: JobRef, now: datetime, attempt: int = 0) -> Observed:
    pods = tuple(running(job, Stage.TRAIN, attempt, r) for r in range(job.spec.nodes))
    return Observed(
        pods=pods,
        podgroups={"bert-train": PodGroupView("bert-train", "Running", None)},
        service_exists=True,
        nodes=NODES,
        now=now,
    )


def rank(
    number: int,
    step: int,
    started: datetime,
    *,
    now: datetime,
    attempt: int = 0,
    ms: float = 500.0,
    **more: Any,
) -> RankSample:
    return RankSample(
        rank=number,
        attempt=attempt,
        world_size=2,
        step=step,
        step_times_ms=(ms,) * 16 if step > 0 else (),
        received=now,
        node=f"n{number}",
        step_started=started,
        **more,
    )


def run(job: JobRef, status: dict[str, Any], ranks: list[RankSample], now: datetime) -> Decision:
    """One reconcile pass of the whole pipeline, with the ranks' messages."""
    attempt = int(status.get("attempt") or 0)
    seen = observed(job, now, attempt)
    return decide(job, status, seen, ranks=tuple(ranks))


def training(job: JobRef) -> dict[str, Any]:
    status = run(job, {}, [], T0).status
    assert status["phase"] == "Training", status
    return status


def stalled_condition(status: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions", []) if c["type"] == "Stalled"), None)


def frozen(now: datetime, since: datetime, **more: Any) -> list[RankSample]:
    """Rank 0 froze in step 40 at `since`; rank 1 waits for it in step 41 (a collective)."""
    return [
        rank(0, 40, since, now=now, **more),
        rank(1, 41, since + timedelta(milliseconds=500), now=now, **more),
    ]


# -- the bound ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("health", "p50_ms", "bound"),
    [
        ({}, 500.0, 60.0),  # the floor
        ({}, 30_000.0, 90.0),  # 3 x p50 above it
        ({"stallTimeoutSeconds": 20}, 30_000.0, 20.0),  # the override wins, even below 3 x p50
        ({"stallTimeoutSeconds": 2, "reportIntervalSeconds": 5}, 100.0, 15.0),  # 3 intervals
    ],
)
def test_the_bound_is_three_p50s_with_a_60s_floor_or_the_override_never_under_three_intervals(
    health: dict[str, Any], p50_ms: float, bound: float
) -> None:
    assert stall_bound(HealthSpec.model_validate(health), p50_ms) == bound


def test_a_stall_timeout_under_one_second_is_refused_by_the_spec() -> None:
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        HealthSpec.model_validate({"stallTimeoutSeconds": 0.5})


# -- when a gang is stalled ---------------------------------------------------------------------
def test_a_gang_that_advanced_within_the_bound_is_not_stalled_and_is_checked_again_at_it() -> None:
    j = job()
    status = training(j)
    now = T0 + timedelta(seconds=100)
    decision = run(j, status, frozen(now, now - timedelta(seconds=30)), now)
    assert stalled_condition(decision.status) is None
    assert "stall" not in decision.status
    # Due at 60 s minus the 1 s lead: the pass that decides it is planned, even with no message.
    assert decision.requeue_after == pytest.approx(29.0, abs=0.6)


def test_no_rank_advancing_past_the_bound_stalls_with_one_warning_naming_who_stopped() -> None:
    j = job()
    status = training(j)
    since = T0 + timedelta(seconds=10)
    now = since + timedelta(seconds=59.5)  # within the 1 s lead before the 60 s floor
    decision = run(j, status, frozen(now, since), now)
    condition = stalled_condition(decision.status)
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", "NoProgress")
    warnings = [e for e in decision.events if e.reason == "Stalled"]
    assert [w.type for w in warnings] == ["Warning"]
    assert "stopped first: rank 0 on n0 (step 40 since 2026-12-03T08:00:10Z)" in warnings[0].message
    assert "rank 1" not in warnings[0].message.split("stopped first:")[1]
    stall = decision.status["stall"]
    assert (stall["step"], stall["maxStep"], stall["boundSeconds"]) == (40, 41, 60.0)
    assert stall["stoppedRanks"] == [
        {"rank": 0, "node": "n0", "step": 40, "stepStartTime": "2026-12-03T08:00:10Z"}
    ]
    stacks = stall["stacks"]
    assert stacks["state"] == "Requested"
    assert stacks["path"] == f"/data/profiles/team-a/bert/0/stacks/{stacks['requestId']}"
    assert stacks["ranksExpected"] == 2
    assert decision.status["phase"] == "Training"  # nothing is killed before the stacks
    assert not decision.delete_pods

    # The next pass, still stalled and waiting for the stacks, posts no second Stalled event.
    later = now + timedelta(seconds=1)
    again = run(j, decision.status, frozen(later, since), later)
    assert not [e for e in again.events if e.reason == "Stalled"]
    assert stalled_condition(again.status) == condition


def test_the_ranks_at_the_lowest_step_stopped_first_oldest_start_first() -> None:
    now = T0 + timedelta(minutes=5)
    ranks = [
        rank(0, 41, T0 + timedelta(seconds=3), now=now),
        rank(1, 40, T0 + timedelta(seconds=2), now=now),
        rank(2, 40, T0 + timedelta(seconds=1), now=now),
    ]
    named, more = stopped_first(ranks)
    assert [r.rank for r in named] == [2, 1]
    assert more == 0


@pytest.mark.parametrize(
    "ranks",
    [
        # No rank has entered a step yet.
        [RankSample(0, 0, 2, -1, (), T0)],
        # In its first step (graphs compiling): no step time, no p50, not watched.
        [RankSample(0, 0, 2, 0, (), T0, step_started=T0)],
        # Every rank ended (its profiler stopped): a final checkpoint is not a stall.
        [RankSample(0, 0, 2, 99, (500.0,), T0, step_started=T0, final=True)],
        # Nothing heard at all.
        [],
    ],
)
def test_a_job_is_not_stalled_before_its_first_finished_step_nor_after_its_ranks_ended(
    ranks: list[RankSample],
) -> None:
    j = job()
    status = training(j)
    now = T0 + timedelta(hours=6)
    decision = run(j, status, ranks, now)
    assert stalled_condition(decision.status) is None
    assert "stall" not in decision.status


def test_a_compiling_job_is_never_stalled() -> None:
    j = job_ref(health={"stallTimeoutSeconds": 5})
    compile_pods = tuple(running(j, Stage.COMPILE, 0, r) for r in range(2))
    now = T0 + timedelta(hours=1)
    seen = Observed(
        compile_pods,
        {"bert-compile": PodGroupView("bert-compile", "Running", None)},
        True,
        NODES,
        now,
    )
    decision = decide(j, {}, seen, ranks=tuple(frozen(now, T0)))
    assert decision.status["phase"] == "Compiling"
    assert stalled_condition(decision.status) is None


def test_an_operator_restarted_mid_run_dates_steps_from_the_ranks_messages() -> None:
    """The store restarts empty: a healthy rank's first message shows a young step (no false
    stall), a frozen one's shows its real age; without an age, the first sight starts the clock."""
    clock = [T0]
    store = ProgressStore(clock=lambda: clock[0])

    def message(rank: int, step: int, age_ms: float | None) -> ProgressMessage:
        return ProgressMessage(
            "bert", "team-a", UID, 0, rank, rank, 2, step, (500.0,) * 16, step_age_ms=age_ms
        )

    store.put(message(0, 40, 90_000.0), "n0")  # frozen 90 s before
    store.put(message(1, 77, 120.0), "n1")
    started = {s.rank: s.started for s in store.samples(("team-a", "bert"))}
    assert started[0] == T0 - timedelta(seconds=90)
    assert started[1] == T0 - timedelta(milliseconds=120)
    j = job()
    decision = run(j, training(j), store.samples(("team-a", "bert")), T0)
    assert stalled_condition(decision.status) is None  # rank 1 advanced 0.12 s ago

    # An older profiler sends no age: the clock starts at the operator's first sight of a step
    # and keeps it while the rank stays in it.
    old = ProgressStore(clock=lambda: clock[0])
    first = message(0, 40, None)
    assert step_started(first, T0, None) == T0
    old.put(first, "n0")
    clock[0] = T0 + timedelta(seconds=30)
    old.put(first, "n0")
    assert old.ranks(("team-a", "bert"))[0].step_started == T0


# -- the stacks, then the action -----------------------------------------------------------------
def detected(j: JobRef) -> tuple[dict[str, Any], datetime, datetime]:
    since = T0 + timedelta(seconds=10)
    now = since + timedelta(seconds=j.spec.health.stall_timeout_seconds or 60)
    decision = run(j, training(j), frozen(now, since), now)
    assert decision.status["stall"]["stacks"]["state"] == "Requested"
    return decision.status, since, now


def test_the_operator_asks_each_rank_for_its_stacks_until_it_answered() -> None:
    j = job()
    status, _, _ = detected(j)
    request_id = status["stall"]["stacks"]["requestId"]
    body = {"status": status}
    assert requests_for(body, 0, "") == {contract.REQUEST_DUMP_STACKS: request_id}
    assert requests_for(body, 0, request_id) == {}  # answered: not asked again
    assert requests_for(body, 1, "") == {}  # another attempt's rank
    assert requests_for({"status": {}}, 0, "") == {}


def test_the_action_waits_for_all_stacks_then_report_keeps_the_condition_until_progress() -> None:
    j = job()
    status, since, now = detected(j)
    request_id = status["stall"]["stacks"]["requestId"]
    later = now + timedelta(seconds=1)
    one = [*frozen(later, since)[:1], *frozen(later, since, stacks_dumped=request_id)[1:]]
    waiting = run(j, status, one, later)
    assert waiting.status["stall"]["stacks"]["state"] == "Requested"
    assert "action" not in waiting.status["stall"]

    both = frozen(later, since, stacks_dumped=request_id)
    done = run(j, waiting.status, both, later)
    stall = done.status["stall"]
    assert (stall["stacks"]["state"], stall["stacks"]["ranksCaptured"]) == ("Captured", 2)
    assert stall["action"] == "Report"
    (event,) = [e for e in done.events if e.reason == "StacksCaptured"]
    assert event.type == "Normal"
    assert "2/2 ranks wrote their Python stacks to" in event.message
    assert stalled_condition(done.status)["status"] == "True"  # type: ignore[index]
    assert done.status["phase"] == "Training"
    assert not done.delete_pods

    # A rank advances past the stall: the condition clears, the record says when.
    resumed_at = later + timedelta(seconds=5)
    moving = [rank(0, 42, resumed_at, now=resumed_at), rank(1, 42, resumed_at, now=resumed_at)]
    resumed = run(j, done.status, moving, resumed_at)
    condition = stalled_condition(resumed.status)
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "ProgressResumed")
    assert resumed.status["stall"]["resolvedTime"] == "2026-12-03T08:01:16Z"
    assert [e.reason for e in resumed.events] == ["ProgressResumed"]


def test_without_every_answer_the_action_waits_two_report_intervals_and_a_margin() -> None:
    j = job()
    status, since, now = detected(j)
    wait = stack_wait_seconds(j.spec.health)
    assert wait == 2 * 5.0 + 3.0
    early = now + timedelta(seconds=wait - 2)
    assert run(j, status, frozen(early, since), early).status["stall"]["stacks"]["state"] == (
        "Requested"
    )
    late = now + timedelta(seconds=wait + 1)
    decision = run(j, status, frozen(late, since), late)
    stacks = decision.status["stall"]["stacks"]
    assert (stacks["state"], stacks["missingRanks"]) == ("Missing", [0, 1])
    (event,) = [e for e in decision.events if e.reason == "StacksCaptured"]
    assert event.type == "Warning"
    assert "no answer from rank 0, 1" in event.message


def answered(j: JobRef) -> tuple[dict[str, Any], list[RankSample], datetime]:
    status, since, now = detected(j)
    request_id = status["stall"]["stacks"]["requestId"]
    later = now + timedelta(seconds=1)
    return status, frozen(later, since, stacks_dumped=request_id), later


def test_on_stall_restart_restarts_the_gang_counted_as_a_stall_restart_recorded_first() -> None:
    j = job(onStall="Restart", maxStallRestarts=1)
    status, ranks, now = answered(j)
    decision = run(j, status, ranks, now)
    new = decision.status
    assert new["restarts"] == {"total": 1, "application": 0, "infrastructure": 0, "stall": 1}
    assert (new["attempt"], new["phase"], new["reason"]) == (1, "Restarting", "GangRestart")
    assert new["lastFailure"]["class"] == "Stall"
    assert decision.status_first  # the restart is stored before the pods go
    assert sorted(d.name for d in decision.delete_pods) == ["bert-train-0-0", "bert-train-0-1"]
    assert new["stall"]["action"] == "Restart"
    condition = stalled_condition(new)
    assert condition is not None
    assert condition["reason"] == "GangRestarted"

    # The new attempt trains: the old stall's record stays, its condition keeps its reason.
    restarted = {**new, "phase": "Training", "reason": "GangRunning"}
    seen = observed(j, now, 1)
    later = decide(j, restarted, seen, ranks=())
    assert stalled_condition(later.status)["reason"] == "GangRestarted"  # type: ignore[index]
    assert later.status["stall"]["attempt"] == 0

    # The budget spent, the next stall fails the job.
    spent = {**status, "restarts": new["restarts"]}
    final = run(j, spent, ranks, now)
    assert (final.status["phase"], final.status["reason"]) == (
        "Failed",
        "StallRestartLimitExceeded",
    )


def test_on_stall_fail_ends_the_job_failed_with_a_reason_naming_the_stall() -> None:
    j = job(onStall="Fail")
    status, ranks, now = answered(j)
    decision = run(j, status, ranks, now)
    assert (decision.status["phase"], decision.status["reason"]) == ("Failed", "StallTimeout")
    assert "stopped first: rank 0 on n0" in decision.status["message"]
    assert "spec.health.onStall is Fail" in decision.status["message"]
