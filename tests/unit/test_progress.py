"""status.progress from the ranks' messages (lifecycle/policies/progress.py): figures, ETA and
batching."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from trainium_operator.api.status import validated_status
from trainium_operator.builders.job import JobRef
from trainium_operator.lifecycle.observed import Observed
from trainium_operator.lifecycle.policies.progress import duration_text, progress
from trainium_operator.lifecycle.ranks import RankSample
from trainium_operator.lifecycle.snapshot import PassSettings
from unit.jobs import job_ref, run_policy

NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)


def rank(number: int, step: int, ms: float = 500.0, attempt: int = 0, **more: int) -> RankSample:
    return RankSample(
        rank=number,
        attempt=attempt,
        world_size=4,
        step=step,
        step_times_ms=(ms,) * 16,
        received=NOW - timedelta(seconds=number),
        samples=more.get("samples"),
        tokens=more.get("tokens"),
    )


def test_progress_names_the_slowest_and_fastest_rank_and_the_gangs_rate_and_eta() -> None:
    job = job_ref(health={"totalSteps": 1000})
    ranks = [rank(0, 100, samples=800, tokens=102400), rank(1, 98, samples=784), rank(2, 101)]
    figures = shown_progress(job, ranks)
    assert figures is not None
    assert (
        figures["step"],
        figures["slowestRank"],
        figures["maxStep"],
        figures["fastestRank"],
    ) == (
        98,
        1,
        101,
        2,
    )
    assert figures["stepTimeP50Ms"] == 500.0
    assert figures["stepsPerSecond"] == 2.0
    assert figures["samplesPerSecond"] == 32.0  # two reporting ranks of 8 samples a step
    assert figures["tokensPerSecond"] == 2048.0
    assert figures["eta"] == "2026-12-02T12:07:31Z"  # 902 steps x 0.5 s
    assert (figures["stepSummary"], figures["rateSummary"], figures["etaSummary"]) == (
        "98/1000",
        "2 steps/s",
        "7m",
    )
    assert figures["ranksReporting"] == 3
    validated_status({"progress": figures})


def test_without_a_total_there_is_no_eta_and_without_step_times_no_rate() -> None:
    fresh = RankSample(rank=0, attempt=0, world_size=1, step=0, step_times_ms=(), received=NOW)
    figures = shown_progress(job_ref(), [fresh])
    assert figures is not None
    assert "eta" not in figures
    assert "rateSummary" not in figures
    assert figures["stepSummary"] == "0"


def test_ranks_of_an_earlier_gang_are_not_the_current_progress() -> None:
    assert shown_progress(job_ref(), [rank(0, 500, attempt=0)], attempt=1) is None


def with_progress(
    job: JobRef,
    status: dict[str, object],
    ranks: list[RankSample],
    now: datetime,
    interval: float = 10.0,
) -> dict[str, object]:
    """The progress policy's status after one pass with these reports."""
    seen = Observed((), {}, True, {}, now)
    settings = PassSettings(progress_interval=interval)
    plan = run_policy(progress, job, status, seen, ranks=tuple(ranks), settings=settings)
    return plan.status


def shown_progress(
    job: JobRef, ranks: list[RankSample], attempt: int = 0, now: datetime = NOW
) -> Any:
    """status.progress after one pass of a training job's gang `attempt` with these reports
    (None: the pass wrote none)."""
    status = with_progress(job, {"phase": "Training", "attempt": attempt}, ranks, now)
    return status.get("progress")


def _training(**progress_figures: object) -> dict[str, object]:
    status: dict[str, object] = {"phase": "Training", "attempt": 0}
    if progress_figures:
        status["progress"] = progress_figures
    return status


def test_progress_is_written_at_most_once_per_interval_whatever_the_rank_count() -> None:
    job = job_ref()
    ranks = [rank(n, 10 + n % 3) for n in range(4096)]
    status = with_progress(job, _training(), ranks, NOW, 10.0)
    writes = 1
    for second in range(1, 61):
        later = NOW + timedelta(seconds=second)
        ranks = [rank(n, 10 + second * 2 + n % 3) for n in range(4096)]
        new = with_progress(job, status, ranks, later, 10.0)
        if new != status:
            writes += 1
        status = new
    assert 6 <= writes <= 8  # a minute at 10 s: the target is <= 12


def test_a_job_not_training_keeps_its_last_figures() -> None:
    status = {"phase": "Restarting", "attempt": 0, "progress": {"step": 7}}
    assert with_progress(job_ref(), status, [rank(0, 50)], NOW) == status


def test_last_progress_time_stays_while_the_slowest_rank_does_not_advance() -> None:
    job = job_ref()
    first = with_progress(job, _training(), [rank(0, 5)], NOW)
    later = NOW + timedelta(seconds=30)
    stuck = RankSample(0, 0, 4, 5, (500.0,), received=later)
    second = with_progress(job, first, [stuck], later)
    assert second["progress"]["lastProgressTime"] == first["progress"]["lastProgressTime"]
    assert second["progress"]["updateTime"] == "2026-12-02T12:00:30Z"


def test_durations_read_as_the_eta_column_shows_them() -> None:
    assert [duration_text(s) for s in (5, 59.6, 61, 3600, 12000, 200000)] == [
        "5s",
        "1m",
        "1m",
        "1h",
        "3h20m",
        "2d7h",
    ]
