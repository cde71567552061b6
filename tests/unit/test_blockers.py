"""A child name that is taken: every wait is bounded, escalates, and names the object."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from trainium_operator.lifecycle import blockers, machine
from trainium_operator.lifecycle.observed import NodeView

T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
BOUND = 30.0
NODES = {"n0": NodeView("n0", True, None), "n1": NodeView("n1", False, T0)}
PREDECESSOR = [{"kind": "TrainingJob", "uid": "old-uid", "name": "bert"}]


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def existing(kind: str, *, owners: Any = (), node: str | None = None, **meta: Any) -> Any:
    obj: dict[str, Any] = {
        "kind": kind,
        "metadata": {"name": "bert-train-0-0", "namespace": "team-a", **meta},
    }
    obj["metadata"]["ownerReferences"] = list(owners)
    if node:
        obj["spec"] = {"nodeName": node}
    return blockers.blocker_view(obj, NODES)


def run(blocker: blockers.Blocker, at: datetime, status: Any = None) -> Any:
    return machine.decide_finding(status or {}, 1, at, None, machine.ChildNameTaken(blocker, BOUND))


def test_an_unrelated_object_of_the_childs_name_fails_the_job_after_the_bound_naming_it() -> None:
    service = existing("Service", owners=[])
    first = run(service, T0)
    assert first.status["reason"] == "WaitingForNameConflict"
    assert "Service team-a/bert-train-0-0 exists and is not this job's" in first.status["message"]
    assert first.delete_pods == [], "not ours to delete"
    assert first.delete_foreign == []
    assert first.requeue_after == BOUND
    later = run(service, T0 + timedelta(seconds=BOUND), first.status)
    assert (later.status["phase"], later.status["reason"]) == ("Failed", "NameConflict")
    assert "delete or rename that Service, or give the job another name" in later.status["message"]


def test_a_predecessors_pod_on_a_lost_node_is_force_deleted_at_once() -> None:
    pod = existing("Pod", owners=PREDECESSOR, node="n1", deletionTimestamp=stamp(T0))
    decision = run(pod, T0)
    assert [(d.name, d.force) for d in decision.delete_pods] == [("bert-train-0-0", True)]
    assert decision.status["reason"] == "ForceDeletingPredecessor"
    assert "its node n1 is lost" in decision.status["message"]
    assert [e.type for e in decision.events] == ["Warning"]


def test_a_predecessors_pod_terminating_on_a_ready_node_waits_then_is_force_deleted() -> None:
    pod = existing("Pod", owners=PREDECESSOR, node="n0", deletionTimestamp=stamp(T0))
    waiting = run(pod, T0)
    assert waiting.delete_pods == []
    assert waiting.status["reason"] == "WaitingForPredecessor"
    assert "Pod team-a/bert-train-0-0" in waiting.status["message"]
    assert "escalation at 2026-12-02T09:00:30Z" in waiting.status["message"]
    overdue = run(pod, T0 + timedelta(seconds=BOUND), waiting.status)
    assert [(d.name, d.force) for d in overdue.delete_pods] == [("bert-train-0-0", True)]
    assert overdue.status["reason"] == "ForceDeletingPredecessor"
    again = run(pod, T0 + timedelta(seconds=BOUND + 5), overdue.status)
    assert again.events == [], "the escalation is announced once"


def test_a_predecessors_child_that_garbage_collection_left_is_deleted_after_the_bound() -> None:
    group = existing("PodGroup", owners=PREDECESSOR)
    waiting = run(group, T0)
    assert waiting.delete_foreign == []
    later = run(group, T0 + timedelta(seconds=BOUND), waiting.status)
    assert later.delete_foreign == [("PodGroup", "bert-train-0-0")]
    assert later.status["reason"] == "DeletingPredecessor"


def test_a_predecessors_pod_held_by_a_finalizer_fails_the_job_naming_the_finalizer() -> None:
    pod = existing(
        "Pod", owners=PREDECESSOR, node="n0", deletionTimestamp=stamp(T0), finalizers=["x/hold"]
    )
    waiting = run(pod, T0)
    end = run(pod, T0 + timedelta(seconds=3 * BOUND), waiting.status)
    assert (end.status["phase"], end.status["reason"]) == ("Failed", "PredecessorStuck")
    assert "finalizers ['x/hold'] hold it" in end.status["message"]


def test_the_wait_starts_when_the_job_was_first_blocked_not_at_each_pass() -> None:
    service = existing("Service", owners=[])
    first = run(service, T0)
    since = next(c for c in first.status["conditions"] if c["type"] == "Blocked")
    middle = run(service, T0 + timedelta(seconds=BOUND / 2), first.status)
    cond = next(c for c in middle.status["conditions"] if c["type"] == "Blocked")
    assert cond["lastTransitionTime"] == since["lastTransitionTime"]
    assert middle.status["phase"] == "Pending"
