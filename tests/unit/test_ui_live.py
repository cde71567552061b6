"""The job list's live columns and health state, mapped from a TrainingJob's status."""

from __future__ import annotations

from typing import Any

from trainium_operator.ui.live import RestartCounts, StragglerRow, job_live

PROGRESS = {
    "attempt": 1,
    "step": 1200,
    "maxStep": 1203,
    "totalSteps": 5000,
    "stepTimeP50Ms": 412.5,
    "stepsPerSecond": 2.42,
    "tokensPerSecond": 99000.0,
    "eta": "2026-12-03T14:00:00Z",
    "etaSummary": "26m",
    "lastProgressTime": "2026-12-03T12:00:00Z",
    "updateTime": "2026-12-03T12:00:05Z",
    "ranksReporting": 64,
    "worldSize": 64,
}


def training(**extra: Any) -> dict[str, Any]:
    return {"phase": "Training", "attempt": 1, "progress": PROGRESS, **extra}


def stalled_condition(status: str = "True") -> dict[str, Any]:
    return {"type": "Stalled", "status": status, "reason": "NoProgress", "message": "m"}


def test_progress_figures_are_carried_into_the_row() -> None:
    live = job_live(training())
    assert (live.step, live.max_step, live.total_steps) == (1200, 1203, 5000)
    assert live.step_time_p50_ms == 412.5
    assert live.steps_per_second == 2.42
    assert live.tokens_per_second == 99000.0
    assert (live.eta, live.eta_summary) == ("2026-12-03T14:00:00Z", "26m")
    assert live.last_progress_time == "2026-12-03T12:00:00Z"
    assert (live.ranks_reporting, live.world_size) == (64, 64)
    assert (live.health, live.health_reason) == ("healthy", "")


def test_a_training_job_with_the_stalled_condition_is_stalled_with_where_it_stopped() -> None:
    stall = {
        "attempt": 1,
        "step": 1200,
        "lastProgressTime": "2026-12-03T11:50:00Z",
        "boundSeconds": 120,
        "stoppedRanks": [{"rank": 7, "node": "trn-3", "step": 1200}],
        "action": "Report",
    }
    live = job_live(training(stall=stall, conditions=[stalled_condition()]))
    assert live.health == "stalled"
    assert live.health_reason == (
        "no rank advanced since 2026-12-03T11:50:00Z (bound 120 s); "
        "stopped first: rank 7 on trn-3 at step 1200; action Report"
    )


def test_a_stall_the_condition_says_is_over_is_not_shown_as_stalled() -> None:
    stall = {"attempt": 1, "step": 1200, "resolvedTime": "2026-12-03T11:55:00Z"}
    live = job_live(training(stall=stall, conditions=[stalled_condition("False")]))
    assert live.health == "healthy"


def test_without_a_condition_an_unresolved_stall_of_the_current_attempt_is_stalled() -> None:
    assert job_live(training(stall={"attempt": 1})).health == "stalled"
    assert job_live(training(stall={"attempt": 0})).health == "healthy"  # an earlier gang's


def test_stragglers_of_the_current_gang_make_it_a_straggler_slowest_first() -> None:
    stragglers = {
        "attempt": 1,
        "gangStepTimeMs": 400.0,
        "ranks": [
            {"rank": 12, "node": "trn-2", "stepTimeMs": 720.0, "ratio": 1.8},
            {"rank": 3, "stepTimeMs": 600.0, "ratio": 1.5},
        ],
    }
    live = job_live(training(stragglers=stragglers))
    assert live.health == "straggler"
    assert live.stragglers == (
        StragglerRow(12, "trn-2", 720.0, 1.8),
        StragglerRow(3, None, 600.0, 1.5),
    )
    assert live.health_reason == (
        "rank 12 on trn-2 1.80x the gang's step time; rank 3 1.50x the gang's step time"
    )


def test_stragglers_of_an_earlier_attempt_or_none_now_are_healthy() -> None:
    old = {"attempt": 0, "ranks": [{"rank": 1, "ratio": 2.0}]}
    assert job_live(training(stragglers=old)).health == "healthy"
    assert job_live(training(stragglers={"attempt": 1, "ranks": []})).health == "healthy"


def test_a_restarting_job_is_restarting_with_its_restarts_by_kind() -> None:
    status = {
        "phase": "Restarting",
        "attempt": 2,
        "restarts": {"total": 3, "application": 1, "infrastructure": 1, "stall": 1},
        "lastFailure": {"class": "Stall", "reason": "NoProgress"},
        "conditions": [stalled_condition()],
    }
    live = job_live(status)
    assert live.health == "restarting"  # more urgent than the stall that caused it
    assert live.restarts == RestartCounts(total=3, application=1, infrastructure=1, stall=1)
    assert live.health_reason == "restart 3 after a stall failure (NoProgress)"


def test_stalled_outranks_stragglers() -> None:
    stragglers = {"attempt": 1, "ranks": [{"rank": 1, "ratio": 2.0}]}
    status = training(stragglers=stragglers, conditions=[stalled_condition()])
    assert job_live(status).health == "stalled"


def test_jobs_not_training_are_inactive_even_with_old_health_figures() -> None:
    for phase in ("Pending", "Compiling", "Suspended", "Succeeded", "Failed"):
        status = {"phase": phase, "conditions": [stalled_condition()], "progress": PROGRESS}
        live = job_live(status)
        assert live.health == "inactive", phase
        assert live.step == 1200  # the last figures are still shown


def test_malformed_fields_are_left_out_instead_of_failing_the_list() -> None:
    status = {
        "phase": "Training",
        "progress": {"step": "12", "stepsPerSecond": True, "eta": 5, "totalSteps": 100},
        "restarts": "many",
        "stragglers": {"ranks": [{"rank": "x"}, "junk", {"rank": 4}]},
        "conditions": ["junk", {"type": "Stalled"}],
        "stall": [],
    }
    live = job_live(status)
    assert (live.step, live.steps_per_second, live.eta, live.total_steps) == (None, None, None, 100)
    assert live.restarts == RestartCounts()
    assert live.stragglers == (StragglerRow(4, None, None, None),)
    assert live.health == "straggler"
    assert job_live(None).health == "inactive"


def test_status_strings_are_passed_as_data_and_cut_to_a_bounded_length() -> None:
    stall = {"attempt": 1, "stoppedRanks": [{"rank": 0, "node": "<img src=x onerror=1>" * 100}]}
    live = job_live(training(stall=stall, conditions=[stalled_condition()]))
    assert "<img src=x onerror=1>" in live.health_reason  # escaping is the browser's job
    assert len(live.health_reason) < 700
