"""Stragglers (lifecycle/policies/stragglers.py): a rank persistently slower than the others."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from trainium_operator.api.spec import HealthSpec
from trainium_operator.api.status import StragglerRank
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.observed import (
    CORDONED_BY_ANNOTATION,
    NodeView,
    Observed,
    node_view,
)
from trainium_operator.lifecycle.policies.stragglers import (
    CordonBudget,
    cordoned_for_stragglers,
    slow_ranks,
    stragglers,
)
from trainium_operator.lifecycle.ranks import RankSample
from trainium_operator.lifecycle.status_edit import dump
from unit.jobs import job_ref, run_policy
from unit.stragglers_quadratic import quadratic_stragglers

NOW = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
OFF = CordonBudget(0)
ROOMY = CordonBudget(4)


def pass_on(status: dict[str, object], observed: Observed, *, cordons: CordonBudget) -> Decision:
    """The policy over a gang between a replacement and its new pods (no ranks report)."""
    job = job_ref(health=REPLACE)
    return run_policy(stragglers, job, status, observed, ranks=(), cordon_budget=cordons)


def rank(number: int, ms: float, count: int = 16) -> RankSample:
    return RankSample(number, 0, 3, 100, (ms,) * count, NOW, node=f"n{number}")


def run(status: dict[str, object], ranks: list[RankSample], **health: object) -> Decision:
    seen = Observed((), {}, True, {}, NOW)
    return run_policy(stragglers, job_ref(health=health), status, seen, ranks=tuple(ranks))


def test_a_rank_30_percent_slower_than_the_others_is_named_with_one_warning() -> None:
    decision = run({"phase": "Training", "attempt": 0}, [rank(0, 50), rank(1, 50), rank(2, 65)])
    named = decision.status["stragglers"]["ranks"]
    assert named == [
        {
            "rank": 2,
            "node": "n2",
            "stepTimeMs": 65.0,
            "ratio": 1.3,
            "since": "2026-12-03T09:00:00Z",
            "sinceStep": 100,
        }
    ]
    (event,) = decision.events
    assert (event.type, event.reason) == ("Warning", "Straggler")
    assert "rank 2 on n2" in event.message
    assert "30 % slower" in event.message
    # The same straggler next pass: no new write, no new event.
    again = run(decision.status, [rank(0, 50), rank(1, 50), rank(2, 65)])
    assert again.status == decision.status
    assert not again.events


def test_in_a_two_rank_gang_the_slow_rank_is_compared_with_the_other_only() -> None:
    slow, _ = slow_ranks([rank(0, 50), rank(1, 65)], 0.2)
    assert [s.rank for s in slow] == [1]


def test_under_the_threshold_or_a_short_window_or_not_training_names_no_one() -> None:
    assert slow_ranks([rank(0, 50), rank(1, 55)], 0.2)[0] == []
    assert slow_ranks([rank(0, 50), rank(1, 90, count=4)], 0.2)[0] == []  # 4 steps: not yet
    assert "stragglers" not in run({"phase": "Compiling"}, [rank(0, 50), rank(1, 90)]).status
    off = run({"phase": "Training"}, [rank(0, 50), rank(1, 90)], stragglerThreshold=None)
    assert "stragglers" not in off.status


def test_a_straggler_that_recovers_is_dropped_with_a_normal_event() -> None:
    slow = run({"phase": "Training", "attempt": 0}, [rank(0, 50), rank(1, 90)])
    recovered = run(slow.status, [rank(0, 50), rank(1, 51)])
    assert recovered.status["stragglers"]["ranks"] == []
    assert [e.reason for e in recovered.events] == ["StragglersRecovered"]


REPLACE = {"onStraggler": "Replace", "stragglerPersistenceSeconds": 60}


def nodes(count: int, *, cordoned: tuple[str, ...] = ()) -> dict[str, NodeView]:
    return {
        f"n{i}": NodeView(f"n{i}", True, None, "trn1.32xlarge", unschedulable=f"n{i}" in cordoned)
        for i in range(count)
    }


def at_step(number: int, ms: float, step: int) -> RankSample:
    return RankSample(number, 0, 3, step, (ms,) * 16, NOW, node=f"n{number}")


def replace_run(
    status: dict[str, object],
    step: int,
    *,
    now: datetime,
    node_count: int = 4,
    cordons: CordonBudget = ROOMY,
    **health: object,
) -> Decision:
    observed = Observed((), {}, True, nodes(node_count), now)
    gang = (at_step(0, 50, step), at_step(1, 50, step), at_step(2, 65, step))
    job = job_ref(health={**REPLACE, **health})
    return run_policy(stragglers, job, status, observed, ranks=gang, cordon_budget=cordons)


def named_then(
    later: float,
    steps: int,
    *,
    node_count: int = 4,
    cordons: CordonBudget = ROOMY,
    **health: object,
) -> Decision:
    first = replace_run({"phase": "Training", "attempt": 0}, 100, now=NOW, cordons=cordons)
    assert not first.patch_nodes  # named, not yet replaced
    return replace_run(
        first.status,
        100 + steps,
        now=NOW + timedelta(seconds=later),
        node_count=node_count,
        cordons=cordons,
        **health,
    )


def test_replace_waits_for_the_persistence_time_and_a_whole_new_window_of_steps() -> None:
    assert not named_then(30, 40).patch_nodes  # 30 s of 60 s
    early = named_then(90, 10)  # the time, but only 10 new steps of 16
    assert not early.patch_nodes
    assert early.status["phase"] == "Training"


def test_a_persistent_straggler_is_recorded_then_its_node_cordoned_and_the_gang_restarted() -> None:
    decision = named_then(90, 20)
    assert decision.status_first  # the restart is stored before the cordon and the deletes
    status = decision.status
    assert status["phase"] == "Restarting"
    assert status["attempt"] == 1
    assert (status["restarts"]["straggler"], status["restarts"]["total"]) == (1, 1)
    assert status["lastFailure"]["class"] == "Straggler"
    (replaced,) = status["stragglers"]["replacements"]
    assert (replaced["rank"], replaced["node"], replaced["attempt"]) == (2, "n2", 0)
    (patch,) = decision.patch_nodes  # one node per replacement
    assert patch.name == "n2"
    assert patch.body["spec"] == {"unschedulable": True}
    annotations = patch.body["metadata"]["annotations"]
    assert annotations[CORDONED_BY_ANNOTATION].endswith("/" + job_ref().name)
    assert "rank 2" in annotations["trainium.dev/cordon-reason"]
    (event,) = [e for e in decision.events if e.reason == "StragglerReplaced"]
    assert event.type == "Warning"
    assert "rank 2 on n2" in event.message
    assert "30 % slower" in event.message


def test_the_replacement_budget_and_a_cluster_without_spare_nodes_only_report() -> None:
    spent = named_then(90, 20, maxStragglerReplacements=0)
    assert not spent.patch_nodes
    assert "maxStragglerReplacements (0) is spent" in spent.status["stragglers"]["held"]
    assert [e.reason for e in spent.events] == ["StragglerNotReplaced"]
    # job_ref's gang is one node: n2 and nothing else leaves no node for it.
    lonely = named_then(90, 20, node_count=0)
    assert not lonely.patch_nodes
    assert lonely.status["phase"] == "Training"
    assert "only 0 other schedulable Ready" in lonely.status["stragglers"]["held"]
    again = replace_run(lonely.status, 130, now=NOW + timedelta(seconds=95), node_count=0)
    assert not again.events  # held once, not every pass


def test_the_cordon_is_re_asserted_until_the_new_gang_has_pods() -> None:
    restarted = named_then(90, 20)
    later = NOW + timedelta(seconds=91)
    decision = pass_on(
        restarted.status,
        Observed((), {}, True, nodes(4), later),
        cordons=CordonBudget(1, frozenset({"n2"})),  # its own cordon, lost: no extra cost
    )
    assert [p.name for p in decision.patch_nodes] == ["n2"]
    done = pass_on(
        restarted.status, Observed((), {}, True, nodes(4, cordoned=("n2",)), later), cordons=ROOMY
    )
    assert not done.patch_nodes
    # An operator restarted with replacement off re-asserts nothing.
    off = pass_on(restarted.status, Observed((), {}, True, nodes(4), later), cordons=OFF)
    assert not off.patch_nodes


def test_with_replacement_off_in_the_operator_a_persistent_straggler_is_only_reported() -> None:
    decision = named_then(90, 20, cordons=OFF)
    assert not decision.patch_nodes
    status = decision.status
    assert status["phase"] == "Training"
    assert "restarts" not in status or not status["restarts"].get("straggler")
    held = status["stragglers"]["held"]
    assert "rank 2 on n2" in held
    assert "spec.health.onStraggler: Replace is off in this cluster" in held
    assert "health.stragglerReplacement" in held  # where the admin turns it on
    assert "onStraggler: Report" in held  # what the author can do meanwhile
    (event,) = decision.events
    assert (event.type, event.reason, event.message) == ("Warning", "StragglerNotReplaced", held)


def test_the_cluster_wide_cordon_budget_bounds_cordons_across_jobs() -> None:
    spent = CordonBudget(2, frozenset({"other-a", "other-b"}))
    decision = named_then(90, 20, cordons=spent)
    assert not decision.patch_nodes
    assert decision.status["phase"] == "Training"
    held = decision.status["stragglers"]["held"]
    assert "cluster-wide cordon budget is spent: 2 of 2 node(s)" in held
    assert "other-a, other-b" in held
    assert "kubectl uncordon" in held
    # One node left in the budget: the straggler's node takes it.
    room = named_then(90, 20, cordons=CordonBudget(3, frozenset({"other-a", "other-b"})))
    assert [p.name for p in room.patch_nodes] == ["n2"]


def test_the_budget_counts_nodes_cordoned_for_stragglers_while_unschedulable() -> None:
    def node(name: str, *, label: bool, unschedulable: bool) -> dict[str, object]:
        labels = {"trainium.dev/cordoned": "straggler"} if label else {}
        return {
            "metadata": {"name": name, "labels": labels},
            "spec": {"unschedulable": unschedulable},
        }

    counted = cordoned_for_stragglers(
        [
            node("cordoned", label=True, unschedulable=True),
            node("uncordoned-since", label=True, unschedulable=False),
            node("admin-drained", label=False, unschedulable=True),
        ]
    )
    assert counted == frozenset({"cordoned"})


def test_replace_needs_the_health_channel() -> None:
    with pytest.raises(ValidationError, match="onStraggler: Replace needs the health channel"):
        HealthSpec.model_validate({"onStraggler": "Replace", "enabled": False})


def stored(
    verdict: tuple[list[StragglerRank], float | None],
) -> tuple[list[dict[str, Any]], float | None]:
    """slow_ranks' stragglers as status.stragglers.ranks stores them (the reference's form)."""
    slow, median = verdict
    return [dump(s) for s in slow], median


def gang_of(times: list[float]) -> list[RankSample]:
    return [rank(number, ms) for number, ms in enumerate(times)]


# Hand-made gangs: (step times by rank, the stragglers at threshold 0.2, slowest first). Odd and
# even gang sizes, ties at the median, a straggler exactly at the threshold (not one), every rank
# but one slow, zero step times, and more stragglers than are listed.
VERDICTS: list[tuple[list[float], list[int]]] = [
    ([50, 65], [1]),
    ([50, 50, 65], [2]),
    ([50, 50, 60], []),  # exactly 20 % slower: not more than the threshold
    ([50, 60.001, 50, 50], [1]),
    ([10, 10, 10, 12.5, 13, 30], [5, 4, 3]),
    ([100, 100, 100, 100, 10, 100], []),  # a fast rank is not a straggler
    ([50, 80, 80, 80, 50, 50, 50], [1, 2, 3]),
    ([0, 0, 0, 5], []),  # the others' median is 0: no ratio to take
    ([0, 0, 5, 5, 5], [2, 3, 4]),  # the others' median 2.5: twice as slow
    ([1.0] * 20 + [2.0 + i / 10 for i in range(20)], [39 - i for i in range(16)]),
]


@pytest.mark.parametrize(("times", "slow"), VERDICTS)
def test_the_check_flags_the_same_stragglers_as_the_quadratic_reference(
    times: list[float], slow: list[int]
) -> None:
    gang = gang_of(times)
    verdict, median = slow_ranks(gang, 0.2)
    assert [s.rank for s in verdict] == slow
    assert stored((verdict, median)) == quadratic_stragglers(gang, 0.2)


def test_random_gangs_get_the_reference_verdict_rank_for_rank() -> None:
    generator = random.Random(29)
    for size in [*range(2, 12), 31, 64, 257]:
        for _ in range(5):
            # Coarse values: many ties, where removing "one" rank's time must not matter.
            times = [float(generator.choice([40, 50, 50, 55, 61, 70, 90])) for _ in range(size)]
            gang = gang_of(times)
            assert stored(slow_ranks(gang, 0.2)) == quadratic_stragglers(gang, 0.2), times


def test_ranks_outside_the_specs_world_size_are_ignored() -> None:
    # A hostile rank may claim any rank number; job_ref's world is 2 nodes x 32 processes.
    outside = [rank(2**40, 500), rank(-1, 500), rank(64, 500)]
    gang = [rank(0, 50), rank(1, 50), rank(2, 65)]
    decision = run({"phase": "Training", "attempt": 0}, [*gang, *outside])  # validates it
    assert [s["rank"] for s in decision.status["stragglers"]["ranks"]] == [2]
    assert decision.status["stragglers"]["gangStepTimeMs"] == 50.0
    assert [e.message.split(" on ")[0] for e in decision.events] == ["rank 2"]


def test_a_node_seen_cordoned_for_a_replacement_is_not_cordoned_again_after_an_uncordon() -> None:
    restarted = named_then(90, 20)
    assert [p.name for p in restarted.patch_nodes] == ["n2"]
    later = NOW + timedelta(seconds=91)
    # The next pass sees the cordon on the node; the new gang still queues (no pods yet).
    seen = pass_on(
        restarted.status,
        Observed((), {}, True, nodes(4, cordoned=("n2",)), later),
        cordons=CordonBudget(4, frozenset({"n2"})),
    )
    assert not seen.patch_nodes
    # An admin runs `kubectl uncordon n2` while the gang still queues: that stands.
    for seconds in (92, 300):
        uncordoned = pass_on(
            seen.status,
            Observed((), {}, True, nodes(4), NOW + timedelta(seconds=seconds)),
            cordons=ROOMY,
        )
        assert not uncordoned.patch_nodes, f"re-cordoned n2 {seconds} s after the replacement"
        assert uncordoned.status == seen.status
    assert uncordoned.status["stragglers"]["replacements"][-1]["cordonSeen"]


def test_a_cordon_uncordoned_before_any_pass_saw_it_is_known_by_its_annotations() -> None:
    restarted = named_then(90, 20)
    (patch,) = restarted.patch_nodes
    replacement = restarted.status["stragglers"]["replacements"][-1]
    # The patch landed and an admin uncordoned n2 before the next pass: the node keeps the
    # annotations the patch wrote.
    landed = node_view(
        {
            "metadata": {"name": "n2", **patch.body["metadata"]},
            "spec": {"unschedulable": False},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
    )
    assert (landed.cordoned_by, landed.cordoned_at) == ("team-a/bert", replacement["time"])
    later = NOW + timedelta(seconds=91)
    observed = Observed((), {}, True, {**nodes(4), "n2": landed}, later)
    decision = pass_on(restarted.status, observed, cordons=ROOMY)
    assert not decision.patch_nodes
    assert decision.status["stragglers"]["replacements"][-1]["cordonSeen"] == "2026-12-03T09:01:31Z"
    # Another job's marks (an older cordon of the node) do not say this patch landed.
    other = NodeView("n2", True, None, "trn1.32xlarge", cordoned_by="team-b/gpt", cordoned_at="x")
    observed = Observed((), {}, True, {**nodes(4), "n2": other}, later)
    lost = pass_on(restarted.status, observed, cordons=ROOMY)
    assert [p.name for p in lost.patch_nodes] == ["n2"]
