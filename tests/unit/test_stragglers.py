"""Stragglers (lifecycle/stragglers.py): a rank persistently slower than the other ranks."""

from __future__ import annotations

from datetime import UTC, datetime

from trainium_operator.api.status import validated_status
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.observed import Observed
from trainium_operator.lifecycle.progress import RankSample
from trainium_operator.lifecycle.stragglers import apply_straggler_policy, stragglers
from unit.jobs import job_ref

NOW = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def rank(number: int, ms: float, count: int = 16) -> RankSample:
    return RankSample(number, 0, 3, 100, (ms,) * count, NOW, node=f"n{number}")


def run(status: dict[str, object], ranks: list[RankSample], **health: object) -> Decision:
    decision = Decision(status=status)
    apply_straggler_policy(job_ref(health=health), decision, Observed((), {}, True, {}, NOW), ranks)
    validated_status(decision.status)
    return decision


def test_a_rank_30_percent_slower_than_the_others_is_named_with_one_warning() -> None:
    decision = run({"phase": "Training", "attempt": 0}, [rank(0, 50), rank(1, 50), rank(2, 65)])
    named = decision.status["stragglers"]["ranks"]
    assert named == [{"rank": 2, "node": "n2", "stepTimeMs": 65.0, "ratio": 1.3}]
    (event,) = decision.events
    assert (event.type, event.reason) == ("Warning", "Straggler")
    assert "rank 2 on n2" in event.message
    assert "30 % slower" in event.message
    # The same straggler next pass: no new write, no new event.
    again = run(decision.status, [rank(0, 50), rank(1, 50), rank(2, 65)])
    assert again.status == decision.status
    assert not again.events


def test_in_a_two_rank_gang_the_slow_rank_is_compared_with_the_other_only() -> None:
    slow, _ = stragglers([rank(0, 50), rank(1, 65)], 0.2)
    assert [s["rank"] for s in slow] == [1]


def test_under_the_threshold_or_a_short_window_or_not_training_names_no_one() -> None:
    assert stragglers([rank(0, 50), rank(1, 55)], 0.2)[0] == []
    assert stragglers([rank(0, 50), rank(1, 90, count=4)], 0.2)[0] == []  # 4 steps: not yet
    assert "stragglers" not in run({"phase": "Compiling"}, [rank(0, 50), rank(1, 90)]).status
    off = run({"phase": "Training"}, [rank(0, 50), rank(1, 90)], stragglerThreshold=None)
    assert "stragglers" not in off.status


def test_a_straggler_that_recovers_is_dropped_with_a_normal_event() -> None:
    slow = run({"phase": "Training", "attempt": 0}, [rank(0, 50), rank(1, 90)])
    recovered = run(slow.status, [rank(0, 50), rank(1, 51)])
    assert recovered.status["stragglers"]["ranks"] == []
    assert [e.reason for e in recovered.events] == ["StragglersRecovered"]
