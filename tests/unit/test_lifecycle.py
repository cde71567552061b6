"""The state machine, driven through whole job histories with hand-made observations."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.lifecycle import machine
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.observed import (
    NodeView,
    Observed,
    PodGroupView,
    PodView,
    QueueView,
    podgroup_view,
)
from unit.jobs import decide, job_ref, refused

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NODES = {f"n{i}": NodeView(f"n{i}", True, None, "trn1.32xlarge") for i in range(4)}


def pod(
    job: JobRef, stage: Stage, attempt: int, rank: int, phase: str = "Running", **kw: Any
) -> PodView:
    defaults: dict[str, Any] = {
        "ready": phase == "Running",
        "node": f"n{rank}",
        "deleting": False,
        "exit_code": None,
        "reason": None,
        "message": None,
        "disrupted": False,
    }
    defaults.update(kw)
    return PodView(job.pod_name(stage, attempt, rank), stage, attempt, rank, phase, **defaults)


def observed(*pods: PodView, now: datetime = T0, nodes: dict[str, NodeView] = NODES) -> Observed:
    return Observed(
        pods=pods,
        podgroups={
            name: PodGroupView(name, "Running", None) for name in ("bert-compile", "bert-train")
        },
        service_exists=True,
        nodes=nodes,
        now=now,
    )


def gang(job: JobRef, stage: Stage, attempt: int, phase: str = "Running") -> list[PodView]:
    return [pod(job, stage, attempt, r, phase) for r in range(job.spec.nodes)]


def names(objs: list[dict[str, Any]]) -> list[str]:
    return [o["metadata"]["name"] for o in objs]


def test_new_job_creates_service_and_podgroup_but_no_pods_until_volcano_admits_it() -> None:
    job = job_ref()
    decision = decide(job, {}, Observed((), {}, False, NODES, T0))
    assert names(decision.create) == ["bert", "bert-compile"]
    assert decision.status["phase"] == "Pending"
    assert decision.status["reason"] == "Queued"
    assert "created once Volcano admits it" in decision.status["message"]
    assert decision.status["workers"]["summary"] == "0/2"


@pytest.mark.parametrize("phase", [None, "Pending"])
def test_a_queued_podgroup_holds_no_pods_and_the_status_says_it_waits_in_its_queue(
    phase: str | None,
) -> None:
    job = job_ref()
    queued = Observed(
        (), {"bert-compile": PodGroupView("bert-compile", phase, None)}, True, NODES, T0
    )
    decision = decide(job, {}, queued)
    assert decision.create == []
    assert (decision.status["phase"], decision.status["reason"]) == ("Pending", "Queued")
    assert "waiting in Volcano queue 'default'" in decision.status["message"]


def test_a_queued_gang_bigger_than_the_clusters_nodes_of_its_type_says_how_many_are_missing() -> (
    None
):
    job = job_ref(nodes=3)
    two = {n: v for n, v in NODES.items() if n in ("n0", "n1")}
    queued = Observed(
        (), {"bert-compile": PodGroupView("bert-compile", "Pending", None)}, True, two, T0
    )
    decision = decide(job, {}, queued)
    assert (decision.status["phase"], decision.status["reason"]) == ("Pending", "Queued")
    assert (
        "the cluster has 2 Ready trn1.32xlarge node(s) and the gang needs 3"
        in (decision.status["message"])
    )
    assert [e.type for e in decision.events] == ["Warning"]


@pytest.mark.parametrize("phase", ["Inqueue", "Running"])
def test_an_admitted_podgroup_gets_its_whole_gang_created(phase: str) -> None:
    job = job_ref()
    admitted = Observed(
        (), {"bert-compile": PodGroupView("bert-compile", phase, None)}, True, NODES, T0
    )
    decision = decide(job, {}, admitted)
    assert names(decision.create) == ["bert-compile-0-0", "bert-compile-0-1"]


def test_a_gang_with_pods_already_is_completed_even_if_its_podgroup_went_back_to_pending() -> None:
    job = job_ref()
    first = pod(job, Stage.COMPILE, 0, 0, "Pending", node=None)
    view = Observed(
        (first,), {"bert-compile": PodGroupView("bert-compile", "Pending", None)}, True, NODES, T0
    )
    decision = decide(job, {}, view)
    assert names(decision.create) == ["bert-compile-0-1"]


def test_compile_gang_running_means_compiling_then_success_starts_training() -> None:
    job = job_ref()
    running = decide(job, {}, observed(*gang(job, Stage.COMPILE, 0)))
    assert running.status["phase"] == "Compiling"
    assert running.create == []
    done = decide(job, running.status, observed(*gang(job, Stage.COMPILE, 0, "Succeeded")))
    assert names(done.create) == ["bert-train-0-0", "bert-train-0-1"]
    assert done.status["compile"]["completionTime"] == "2026-11-30T12:00:00Z"
    assert any(c["type"] == "Compiled" and c["status"] == "True" for c in done.status["conditions"])
    assert "CompileSucceeded" in [e.reason for e in done.events]


def test_training_success_finishes_the_job_and_keeps_finished_pods() -> None:
    job = job_ref(compile={"enabled": False})
    status = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status
    assert status["phase"] == "Training"
    final = decide(job, status, observed(*gang(job, Stage.TRAIN, 0, "Succeeded")))
    assert final.status["phase"] == "Succeeded"
    assert final.status["completionTime"]
    assert final.delete_pods == []


def test_compile_failure_fails_the_job_with_the_pod_and_exit_code() -> None:
    job = job_ref()
    status = decide(job, {}, observed(*gang(job, Stage.COMPILE, 0))).status
    failed = pod(job, Stage.COMPILE, 0, 1, "Failed", exit_code=2, message="graph error")
    decision = decide(job, status, observed(pod(job, Stage.COMPILE, 0, 0), failed))
    assert decision.status["phase"] == "Failed"
    assert decision.status["reason"] == "CompileFailed"
    assert "exit code 2" in decision.status["message"]
    assert decision.status["lastFailure"]["exitCode"] == 2
    assert [d.name for d in decision.delete_pods] == ["bert-compile-0-0"]


def test_worker_failure_restarts_the_whole_gang_with_resume_and_counts_it() -> None:
    job = job_ref(compile={"enabled": False})
    status = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status
    failed = pod(job, Stage.TRAIN, 0, 0, "Failed", exit_code=137, reason="Error")
    decision = decide(job, status, observed(failed, pod(job, Stage.TRAIN, 0, 1)))
    assert decision.status["phase"] == "Restarting"
    assert decision.status["attempt"] == 1
    assert decision.status["restarts"] == {"total": 1, "application": 1, "infrastructure": 0}
    assert [d.name for d in decision.delete_pods] == ["bert-train-0-1"]  # failed pod kept for logs
    # Recorded before anything is deleted; the new gang waits for a later pass.
    assert decision.status_first
    assert decision.create == []
    assert decision.status["lastFailure"]["pod"] == "bert-train-0-0"
    # The old survivor is gone (the failed pod stays for its logs): the new gang starts.
    started = decide(job, decision.status, observed(failed))
    assert names(started.create) == ["bert-train-1-0", "bert-train-1-1"]
    assert started.create[0]["spec"]["containers"][0]["command"][-1] == "--resume"
    assert started.status["restarts"]["total"] == 1


@pytest.mark.parametrize(
    ("exit_code", "reason", "by_the_delete"),
    [
        (137, None, True),  # SIGKILL
        (143, None, True),  # SIGTERM
        (137, "Error", True),  # as a kubelet (and KWOK) reports a killed container
        (2, None, False),  # its own failure, deleted afterwards
        (137, "OOMKilled", False),  # the kernel's kill, not the delete's
    ],
)
def test_a_compile_pod_seen_only_once_failed_while_being_deleted_restarts_if_the_delete_ended_it(
    exit_code: int, reason: str | None, by_the_delete: bool
) -> None:
    # The pass that would have seen it terminating never ran (an operator restart).
    job = job_ref()
    status = decide(job, {}, observed(*gang(job, Stage.COMPILE, 0))).status
    ended = pod(
        job, Stage.COMPILE, 0, 0, "Failed", exit_code=exit_code, reason=reason, deleting=True
    )
    decision = decide(job, status, observed(ended, pod(job, Stage.COMPILE, 0, 1)))
    if by_the_delete:
        assert decision.status["phase"] == "Restarting"
        assert decision.status["restarts"] == {"total": 1, "application": 0, "infrastructure": 1}
        assert decision.status["lastFailure"]["reason"] == "PodDeleted"
        assert decision.status["lastFailure"]["exitCode"] == exit_code
    else:
        assert decision.status["phase"] == "Failed"
        assert decision.status["reason"] == "CompileFailed"


def test_repeating_a_pass_after_a_restart_decision_is_idempotent() -> None:
    job = job_ref(compile={"enabled": False})
    status = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status
    failed = pod(job, Stage.TRAIN, 0, 0, "Failed", exit_code=1)
    after = decide(job, status, observed(failed, pod(job, Stage.TRAIN, 0, 1))).status
    # The operator restarted before seeing the new pods: same world, no second restart.
    again = decide(job, after, observed(failed, pod(job, Stage.TRAIN, 0, 1, deleting=True)))
    assert again.status["attempt"] == 1
    assert again.status["restarts"]["total"] == 1
    # Never two attempts at once: nothing is created while the old pod is still terminating.
    assert again.create == []
    assert again.status["reason"] == "WaitingForOldGang"
    done = decide(job, again.status, observed(failed))
    assert names(done.create) == ["bert-train-1-0", "bert-train-1-1"]
    assert done.status["restarts"]["total"] == 1


def test_a_restarts_next_gang_is_created_while_volcano_admits_its_podgroup_again() -> None:
    job = job_ref(compile={"enabled": False})
    status = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status
    failed = pod(job, Stage.TRAIN, 0, 0, "Failed", exit_code=1)
    restarting = decide(job, status, observed(failed, pod(job, Stage.TRAIN, 0, 1))).status
    # The old pods gone, Volcano put the group back to Pending (no placed pods left).
    pending = replace(
        observed(failed), podgroups={"bert-train": PodGroupView("bert-train", "Pending", None)}
    )
    decision = decide(job, restarting, pending)
    assert names(decision.create) == ["bert-train-1-0", "bert-train-1-1"]
    assert decision.status["phase"] == "Restarting"
    # Not so for a job that never ran: it waits in its queue holding no pods.
    queued = replace(pending, pods=())
    assert decide(job, {}, queued).create == []


def test_backoff_limit_exhaustion_fails_the_job() -> None:
    job = job_ref(compile={"enabled": False}, runPolicy={"backoffLimit": 1})
    status = {"phase": "Training", "attempt": 1, "restarts": {"total": 1, "application": 1}}
    failed = pod(job, Stage.TRAIN, 1, 1, "Failed", exit_code=1)
    decision = decide(job, status, observed(pod(job, Stage.TRAIN, 1, 0), failed))
    assert decision.status["phase"] == "Failed"
    assert decision.status["reason"] == "BackoffLimitExceeded"
    assert "backoffLimit (1) exhausted" in decision.status["message"]


def test_lost_node_force_deletes_its_pods_and_uses_the_infrastructure_budget() -> None:
    job = job_ref(compile={"enabled": False}, runPolicy={"nodeLostGracePeriodSeconds": 30})
    status = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status
    nodes = {**NODES, "n1": NodeView("n1", False, T0)}
    early = decide(job, status, observed(*gang(job, Stage.TRAIN, 0), nodes=nodes))
    assert early.delete_pods == []
    assert early.requeue_after == 30
    late = decide(
        job,
        status,
        observed(*gang(job, Stage.TRAIN, 0), nodes=nodes, now=T0 + timedelta(seconds=31)),
    )
    assert late.status["restarts"] == {"total": 1, "application": 0, "infrastructure": 1}
    assert late.status["lastFailure"]["reason"] == "NodeLost"
    deletions = {d.name: d.force for d in late.delete_pods}
    assert deletions == {"bert-train-0-0": False, "bert-train-0-1": True}


def test_evicted_pod_is_an_infrastructure_failure() -> None:
    job = job_ref(compile={"enabled": False})
    status = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status
    evicted = pod(job, Stage.TRAIN, 0, 0, "Failed", reason="Evicted")
    decision = decide(job, status, observed(evicted, pod(job, Stage.TRAIN, 0, 1)))
    assert decision.status["restarts"]["infrastructure"] == 1


def test_active_deadline_fails_the_job_and_stops_running_pods() -> None:
    job = job_ref(compile={"enabled": False}, runPolicy={"activeDeadlineSeconds": 60})
    status = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status
    decision = decide(
        job, status, observed(*gang(job, Stage.TRAIN, 0), now=T0 + timedelta(seconds=61))
    )
    assert decision.status["reason"] == "DeadlineExceeded"
    assert len(decision.delete_pods) == 2


def test_suspend_deletes_pods_and_podgroups_and_resume_starts_a_new_attempt() -> None:
    job = job_ref(compile={"enabled": False})
    status = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status
    suspended_job = replace(
        job,
        spec=job.spec.model_copy(
            update={"run_policy": job.spec.run_policy.model_copy(update={"suspend": True})}
        ),
    )
    suspended = decide(suspended_job, status, observed(*gang(job, Stage.TRAIN, 0)))
    assert suspended.status["phase"] == "Suspended"
    assert len(suspended.delete_pods) == 2
    assert set(suspended.delete_podgroups) == {"bert-compile", "bert-train"}
    resumed = decide(job, suspended.status, Observed((), {}, True, NODES, T0))
    assert resumed.status["attempt"] == 1
    assert names(resumed.create) == ["bert-train"]  # the pods follow once Volcano admits it
    admitted = decide(job, resumed.status, observed())
    assert names(admitted.create) == ["bert-train-1-0", "bert-train-1-1"]


def test_ttl_after_finished_deletes_the_job_when_due() -> None:
    job = job_ref(runPolicy={"ttlSecondsAfterFinished": 100})
    status = {"phase": "Succeeded", "completionTime": "2026-11-30T12:00:00Z"}
    assert decide(job, status, observed()).requeue_after == 100
    assert decide(job, status, observed(now=T0 + timedelta(seconds=100))).delete_job


def test_clean_pod_policy_all_deletes_finished_pods_too() -> None:
    job = job_ref(runPolicy={"cleanPodPolicy": "All"})
    status = {"phase": "Succeeded", "completionTime": "2026-11-30T12:00:00Z"}
    decision = decide(job, status, observed(*gang(job, Stage.TRAIN, 0, "Succeeded")))
    assert len(decision.delete_pods) == 2


def test_unchanged_world_changes_nothing() -> None:
    job = job_ref()
    first = decide(job, {}, observed(*gang(job, Stage.COMPILE, 0)))
    second = decide(job, first.status, observed(*gang(job, Stage.COMPILE, 0)))
    assert second.status == first.status
    assert second.events == []
    assert second.create == []


def test_invalid_spec_fails_once_with_every_problem() -> None:
    decision = refused({}, 1, ["spec.nodes: bad", "spec.image: bad"], T0)
    assert decision.status["phase"] == "Failed"
    assert decision.status["reason"] == "InvalidSpec"
    assert decision.status["message"] == "invalid spec: spec.nodes: bad; spec.image: bad"
    again = refused(decision.status, 1, ["spec.nodes: bad", "spec.image: bad"], T0)
    assert again.status == decision.status
    assert again.events == []


def waiting(
    job: JobRef, *, group: PodGroupView | None, queue: QueueView | None, pods: tuple[PodView, ...]
) -> dict[str, Any]:
    groups = {group.name: group} if group else {}
    return decide(job, {}, Observed(pods, groups, True, NODES, T0, queue)).status


def test_a_missing_queue_is_reported_with_the_field_and_the_fix() -> None:
    job = job_ref()
    status = waiting(job, group=None, queue=QueueView("test", False, None), pods=())
    assert (status["phase"], status["reason"]) == ("Pending", "QueueNotFound")
    assert status["message"].startswith("spec.scheduling.queue: Volcano queue 'default' does not")


def test_a_closed_queue_is_reported() -> None:
    status = waiting(job_ref(), group=None, queue=QueueView("test", True, "Closed"), pods=())
    assert status["reason"] == "QueueClosed"


def test_a_podgroup_volcano_has_not_admitted_waits_in_its_queue() -> None:
    job = job_ref()
    pending = tuple(pod(job, Stage.COMPILE, 0, r, "Pending", node=None) for r in range(2))
    group = PodGroupView("bert-compile", "Pending", None)
    status = waiting(job, group=group, queue=QueueView("test", True, "Open"), pods=pending)
    assert (status["phase"], status["reason"]) == ("Pending", "Queued")
    assert "waiting in Volcano queue 'default'" in status["message"]


def test_an_unschedulable_gang_carries_volcanos_message() -> None:
    job = job_ref()
    pending = tuple(pod(job, Stage.COMPILE, 0, r, "Pending", node=None) for r in range(2))
    volcano_says = "2/2 tasks in gang unschedulable: pod group is not ready, 2 Pending"
    group = PodGroupView("bert-compile", "Inqueue", volcano_says)
    status = waiting(job, group=group, queue=None, pods=pending)
    assert (status["phase"], status["reason"]) == ("Pending", "Unschedulable")
    assert status["message"].endswith(volcano_says)


def test_volcanos_unschedulable_before_the_gangs_pods_exist_is_not_a_refusal() -> None:
    job = job_ref()
    one_of_two = (pod(job, Stage.COMPILE, 0, 0, "Pending", node=None),)
    volcano_says = "2/0 tasks in gang unschedulable: pod group is not ready, 2 minAvailable"
    group = PodGroupView("bert-compile", "Inqueue", volcano_says)
    status = waiting(job, group=group, queue=None, pods=one_of_two)
    assert (status["phase"], status["reason"]) == ("Pending", "WaitingForGang")


@pytest.mark.parametrize(
    ("volcano_says", "refused"),
    [
        (
            "1/1 tasks in gang unschedulable: pod group is not ready, 1 Pending, 1 minAvailable; "
            "Pending: 1 ",
            False,
        ),
        (
            "1/1 tasks in gang unschedulable: pod group is not ready, 1 Pending, 1 minAvailable; "
            "Pending: 1 Unschedulable. Origin reason is x-0: 0/4 nodes are unavailable",
            True,
        ),
        (
            "1/1 tasks in gang unschedulable: pod group is not ready, 1 Pending, 1 minAvailable; "
            "Pending: 1 Unschedulable",
            True,
        ),
    ],
    ids=["a task Volcano has not evaluated", "an origin reason", "a named reason"],
)
def test_a_volcano_verdict_that_names_no_reason_is_no_refusal_and_no_warning(
    volcano_says: str, refused: bool
) -> None:
    job = job_ref(nodes=1)
    pending = (pod(job, Stage.COMPILE, 0, 0, "Pending", node=None),)
    group = PodGroupView("bert-compile", "Inqueue", volcano_says)
    status = waiting(job, group=group, queue=None, pods=pending)
    assert status["reason"] == ("Unschedulable" if refused else "WaitingForGang")


def test_the_newer_of_volcanos_scheduled_and_unschedulable_conditions_wins() -> None:
    def group(unschedulable_at: str, scheduled_at: str) -> PodGroupView:
        return podgroup_view(
            {
                "metadata": {"name": "g"},
                "status": {
                    "phase": "Inqueue",
                    "conditions": [
                        {
                            "type": "Unschedulable",
                            "status": "True",
                            "message": "no room",
                            "lastTransitionTime": unschedulable_at,
                        },
                        {"type": "Scheduled", "status": "True", "lastTransitionTime": scheduled_at},
                    ],
                },
            }
        )

    assert group("2026-12-01T10:00:02Z", "2026-12-01T10:00:01Z").unschedulable == "no room"
    assert group("2026-12-01T10:00:01Z", "2026-12-01T10:00:02Z").unschedulable is None
    assert not podgroup_view({"metadata": {"name": "g"}}).admitted


def test_a_pod_vanished_from_a_full_gang_restarts_the_gang_instead_of_being_recreated_alone() -> (
    None
):
    job = job_ref(compile={"enabled": False})
    running = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status
    assert running["training"]["fullGangAttempt"] == 0
    decision = decide(job, running, observed(pod(job, Stage.TRAIN, 0, 0)))
    assert decision.create == []
    assert decision.status["attempt"] == 1
    assert decision.status["lastFailure"]["reason"] == "PodVanished"
    assert decision.status["restarts"] == {"total": 1, "application": 0, "infrastructure": 1}
    assert [d.name for d in decision.delete_pods] == ["bert-train-0-0"]


def test_a_gang_still_being_created_gets_its_missing_ranks_not_a_restart() -> None:
    job = job_ref(compile={"enabled": False})
    first = decide(job, {}, Observed((), {}, True, NODES, T0)).status
    unplaced = pod(job, Stage.TRAIN, 0, 0, "Pending", node=None)
    partial = decide(job, first, observed(unplaced))
    assert names(partial.create) == ["bert-train-0-1"]
    assert partial.status["restarts"]["total"] == 0


def test_the_first_attempt_is_recorded_before_the_stages_first_pods_are_created() -> None:
    job = job_ref(compile={"enabled": False})
    admitted = Observed(
        (), {"bert-train": PodGroupView("bert-train", "Inqueue", None)}, True, NODES, T0
    )
    decision = decide(job, {}, admitted)
    assert names(decision.create) == ["bert-train-0-0", "bert-train-0-1"]
    assert decision.status["training"]["firstAttempt"] == 0
    record = decision.status_before_pods
    assert record is not None, "the record must be stored before the creates"
    assert record["training"] == {"firstAttempt": 0, "createdAttempt": 0}
    again = decide(job, decision.status, observed(*gang(job, Stage.TRAIN, 0)))
    assert again.status_before_pods is None, "only the pass that creates the gang writes first"


def test_a_placed_gang_whose_whole_gang_record_was_lost_restarts_on_a_vanished_rank() -> None:
    # The operator created the gang and crashed before it recorded fullGangAttempt; a rank was
    # force-deleted while it was down. Volcano placed rank 0, so the whole gang had existed.
    job = job_ref(compile={"enabled": False})
    lost_record = {
        "phase": "Pending",
        "attempt": 0,
        "startTime": "2026-11-30T11:59:00Z",
        "restarts": {"total": 0, "application": 0, "infrastructure": 0},
        "training": {"firstAttempt": 0, "startTime": "2026-11-30T11:59:00Z"},
    }
    decision = decide(job, lost_record, observed(pod(job, Stage.TRAIN, 0, 0)))
    assert decision.create == [], "a rank re-created alone cannot join the closed rendezvous"
    assert decision.status["lastFailure"]["reason"] == "PodVanished"
    assert decision.status["attempt"] == 1
    resumed = decide(job, decision.status, observed())
    assert resumed.status["phase"] in ("Restarting", "Pending")
    train = [o for o in resumed.create if o["kind"] == "Pod"]
    assert names(train) == ["bert-train-1-0", "bert-train-1-1"]
    assert "--resume" in train[0]["spec"]["containers"][0]["command"]


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_gang_this_operator_created_whose_pods_all_vanished_unseen_restarts_not_recreated(
    nodes: int,
) -> None:
    # The pass that created the gang stored createdAttempt first; its pods were placed and
    # force-deleted before the next pass saw them (a force-deleted process may still run on
    # its node): the same attempt must not get a second gang.
    job = job_ref(compile={"enabled": False}, nodes=nodes)
    creating = decide(job, {}, observed())
    assert names([o for o in creating.create if o["kind"] == "Pod"]) == [
        f"bert-train-0-{rank}" for rank in range(nodes)
    ]
    assert creating.status["training"]["createdAttempt"] == 0
    record = creating.status_before_pods
    assert record is not None, "the record must be stored before the creates"
    assert record["training"]["createdAttempt"] == 0
    after = decide(job, creating.status, observed(), gangs_known_here={Stage.TRAIN: 0})
    assert [o for o in after.create if o["kind"] == "Pod"] == []
    assert after.status["lastFailure"]["reason"] == "PodVanished"
    assert after.status["attempt"] == 1
    assert after.status["restarts"]["infrastructure"] == 1


def test_a_recorded_gang_a_new_operator_finds_no_pod_of_starts_as_the_next_attempt_unbudgeted() -> (
    None
):
    # The operator stored createdAttempt and was stopped before its creates; its successor
    # (which neither created nor saw the gang) finds no pod of it.
    job = job_ref(compile={"enabled": False})
    recorded = decide(job, {}, observed()).status
    after = decide(job, recorded, observed())
    assert after.status["attempt"] == 1
    assert after.status["restarts"] == {
        "total": 1,
        "application": 0,
        "infrastructure": 1,
        "unseenGang": 1,
    }, "a restart of the infrastructure's, charged to no budget"
    assert "lastFailure" not in after.status, "nothing says a failure happened"
    assert [e.type for e in after.events] == ["Normal"]
    assert after.events[0].reason == "GangNotFound"
    pods = [o for o in after.create if o["kind"] == "Pod"]
    assert names(pods) == ["bert-train-1-0", "bert-train-1-1"], "the attempt is not reused"
    assert after.status_first, "the new attempt is stored before its pods are created"
    assert after.status["training"]["createdAttempt"] == 1
    assert after.status["training"]["firstAttempt"] == 1
    assert "--resume" not in pods[0]["spec"]["containers"][0]["command"]


def test_a_restarts_gang_a_new_operator_finds_no_pod_of_names_the_attempt_it_now_starts() -> None:
    job = job_ref(compile={"enabled": False})
    running = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status
    failed = pod(job, Stage.TRAIN, 0, 0, "Failed", exit_code=1)
    restarting = decide(job, running, observed(failed, pod(job, Stage.TRAIN, 0, 1))).status
    # The next pass recorded attempt 1's gang; the operator was stopped before its creates.
    recorded = decide(job, restarting, observed(failed)).status
    assert recorded["training"]["createdAttempt"] == 1
    after = decide(job, recorded, observed(failed))
    assert after.status["phase"] == "Restarting"
    assert "as attempt 2" in after.status["message"]
    assert after.status["restarts"]["total"] == 2
    assert [e.type for e in after.events] == ["Normal"]
    pods = [o for o in after.create if o["kind"] == "Pod"]
    assert names(pods) == ["bert-train-2-0", "bert-train-2-1"]
    assert "--resume" in pods[0]["spec"]["containers"][0]["command"], "attempt 0 trained"


def test_a_recorded_gang_whose_pods_a_new_operator_sees_is_not_skipped() -> None:
    job = job_ref(compile={"enabled": False})
    recorded = decide(job, {}, observed()).status
    unplaced = pod(job, Stage.TRAIN, 0, 0, "Pending", node=None)
    after = decide(job, recorded, observed(unplaced))
    assert after.status["attempt"] == 0
    assert names(after.create) == ["bert-train-0-1"]
    assert after.events == []


def test_a_gang_whose_creates_were_refused_before_any_pod_is_created_again_not_restarted() -> None:
    job = job_ref(compile={"enabled": False})
    creating = decide(job, {}, observed())
    refused = machine.decide_finding(
        creating.status, 1, T0, None, machine.ChildRefused("QuotaExceeded", "no room", False)
    )
    assert "createdAttempt" not in refused.status["training"]
    again = decide(job, refused.status, observed())
    pods = [o for o in again.create if o["kind"] == "Pod"]
    assert names(pods) == ["bert-train-0-0", "bert-train-0-1"]
    assert again.status["restarts"]["total"] == 0
    partly = machine.decide_finding(
        creating.status, 1, T0, None, machine.ChildRefused("QuotaExceeded", "no room", False, True)
    )
    assert partly.status["training"]["createdAttempt"] == 0


def test_an_unknown_node_right_after_start_is_not_a_lost_node() -> None:
    job = job_ref(compile={"enabled": False})
    running = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status
    empty_cache = replace(observed(*gang(job, Stage.TRAIN, 0), nodes={}), nodes_known=False)
    decision = decide(job, running, empty_cache)
    assert decision.status["restarts"]["total"] == 0
    assert decision.delete_pods == []
    listed = observed(*gang(job, Stage.TRAIN, 0), nodes={})  # a full list without the node
    assert decide(job, running, listed).status["lastFailure"]["reason"] == "NodeLost"


def test_the_first_training_gang_after_a_compile_restart_does_not_resume() -> None:
    job = job_ref()
    compiling = decide(job, {}, observed(*gang(job, Stage.COMPILE, 0))).status
    lost = pod(job, Stage.COMPILE, 0, 0, "Failed", reason="Evicted")
    restarting = decide(job, compiling, observed(lost, pod(job, Stage.COMPILE, 0, 1)))
    assert restarting.status["attempt"] == 1
    compiled = decide(
        job, restarting.status, observed(lost, *gang(job, Stage.COMPILE, 1, "Succeeded"))
    )
    train = [o for o in compiled.create if o["kind"] == "Pod"]
    assert names(train) == ["bert-train-1-0", "bert-train-1-1"]
    assert "--resume" not in train[0]["spec"]["containers"][0]["command"]
    assert compiled.status["training"]["firstAttempt"] == 1


@pytest.mark.parametrize("reason", ["OutOfcpu", "OutOfaws.amazon.com/neuron", "NodeAffinity"])
def test_kubelet_admission_rejections_are_infrastructure_failures(reason: str) -> None:
    job = job_ref(compile={"enabled": False})
    running = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status
    rejected = pod(job, Stage.TRAIN, 0, 1, "Failed", reason=reason, message="kubelet said no")
    decision = decide(job, running, observed(pod(job, Stage.TRAIN, 0, 0), rejected))
    assert decision.status["restarts"] == {"total": 1, "application": 0, "infrastructure": 1}


def test_resuming_a_job_suspended_before_it_started_is_not_a_restart() -> None:
    job = job_ref(compile={"enabled": False})
    running = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status
    running.pop("startTime")  # suspended before the run counted as started
    suspended_job = job_ref(compile={"enabled": False}, runPolicy={"suspend": True})
    suspended = decide(suspended_job, running, observed(*gang(job, Stage.TRAIN, 0)))
    resumed = decide(job, suspended.status, Observed((), {}, True, NODES, T0))
    assert resumed.status["restarts"]["total"] == 0
    admitted = decide(job, resumed.status, observed())
    assert names([o for o in admitted.create if o["kind"] == "Pod"]) == [
        "bert-train-0-0",
        "bert-train-0-1",
    ]


def _placed(job: JobRef, rank: int, at: datetime, **kw: Any) -> PodView:
    return pod(job, Stage.TRAIN, 0, rank, kw.pop("phase", "Pending"), scheduled_at=at, **kw)


def test_a_pod_that_cannot_pull_its_image_is_the_jobs_reason_then_fails_it() -> None:
    job = job_ref(compile={"enabled": False}, runPolicy={"startupTimeoutSeconds": 60})
    pulling = _placed(
        job, 1, T0, waiting_reason="ImagePullBackOff", waiting_message="Back-off pulling image"
    )
    running = _placed(job, 0, T0, phase="Running")
    early = decide(job, {}, observed(running, pulling, now=T0 + timedelta(seconds=10)))
    assert (early.status["phase"], early.status["reason"]) == ("Pending", "ImagePullBackOff")
    assert "bert-train-0-1 (rank 1) cannot start" in early.status["message"]
    assert early.requeue_after is not None
    assert early.requeue_after <= 50
    late = decide(job, early.status, observed(running, pulling, now=T0 + timedelta(seconds=61)))
    assert (late.status["phase"], late.status["reason"]) == ("Failed", "ImagePullBackOff")
    assert late.status["lastFailure"]["pod"] == "bert-train-0-1"
    assert "startupTimeoutSeconds (60s)" in late.status["message"]


def test_a_gang_stuck_starting_without_a_cause_restarts_as_infrastructure() -> None:
    job = job_ref(compile={"enabled": False}, runPolicy={"startupTimeoutSeconds": 60})
    stuck = _placed(job, 1, T0)  # placed, never Running, no reason given
    decision = decide(
        job,
        {},
        observed(_placed(job, 0, T0, phase="Running"), stuck, now=T0 + timedelta(minutes=2)),
    )
    assert decision.status["lastFailure"]["reason"] == "StartupTimeout"
    assert decision.status["restarts"] == {"total": 1, "application": 0, "infrastructure": 1}


def test_waiting_in_the_queue_never_times_out() -> None:
    job = job_ref(compile={"enabled": False}, runPolicy={"startupTimeoutSeconds": 60})
    queued = [pod(job, Stage.TRAIN, 0, r, "Pending", node=None) for r in range(2)]
    decision = decide(job, {}, observed(*queued, now=T0 + timedelta(days=2)))
    assert decision.status["phase"] == "Pending"
    assert "lastFailure" not in decision.status


def test_a_rendezvous_timeout_is_blamed_on_the_rank_that_never_started() -> None:
    job = job_ref(compile={"enabled": False})
    timed_out = _placed(job, 0, T0, phase="Failed", exit_code=1, message="rendezvous timeout")
    never = _placed(job, 1, T0, waiting_reason="ErrImagePull", waiting_message="not found")
    decision = decide(job, {}, observed(timed_out, never))
    assert decision.status["lastFailure"]["pod"] == "bert-train-0-1"
    assert decision.status["lastFailure"]["reason"] == "ErrImagePull"


def test_a_missing_claim_is_named_with_the_field() -> None:
    job = job_ref(compile={"enabled": False})
    message = (
        '0/2 nodes are unavailable: 2 looking up PVC team-a/nope: persistentvolumeclaim "nope" '
        "not found."
    )
    waiting = [
        pod(job, Stage.TRAIN, 0, r, "Pending", node=None, unschedulable=message) for r in range(2)
    ]
    status = decide(job, {}, observed(*waiting)).status
    assert status["reason"] == "ClaimNotFound"
    assert status["message"].startswith("spec.storage.claimName: PersistentVolumeClaim 'nope'")


def test_ranks_finishing_at_different_times_are_not_a_startup_timeout() -> None:
    job = job_ref(compile={"enabled": False}, runPolicy={"startupTimeoutSeconds": 60})
    done = _placed(job, 0, T0, phase="Succeeded")
    still = _placed(job, 1, T0, phase="Running")
    decision = decide(job, {}, observed(done, still, now=T0 + timedelta(hours=3)))
    assert "lastFailure" not in decision.status
    assert decision.status["restarts"]["total"] == 0


def test_a_verdict_volcano_wrote_before_the_gangs_pods_existed_is_no_warning_once_they_do() -> None:
    job = job_ref()
    both = tuple(pod(job, Stage.COMPILE, 0, r, "Pending", node=None) for r in range(2))
    stale = "2/0 tasks in gang unschedulable: pod group is not ready, 2 minAvailable"
    group = PodGroupView("bert-compile", "Inqueue", stale)
    decision = decide(
        job,
        {},
        replace(
            observed(*both),
            podgroups={"bert-compile": group},
        ),
    )
    assert (decision.status["phase"], decision.status["reason"]) == ("Pending", "WaitingForGang")
    assert not [e for e in decision.events if e.type == "Warning"], decision.events


def test_a_rank_that_finishes_before_the_others_leaves_the_job_training_with_no_event() -> None:
    job = job_ref(compile={"enabled": False})
    running = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0)))
    assert (running.status["phase"], running.status["reason"]) == ("Training", "GangRunning")
    finished = pod(job, Stage.TRAIN, 0, 0, "Succeeded")
    later = decide(job, running.status, observed(finished, pod(job, Stage.TRAIN, 0, 1)))
    assert (later.status["phase"], later.status["reason"]) == ("Training", "GangRunning")
    assert later.events == [], "no event describes a state the job is not in"
    assert "1 finished" in later.status["message"]


def test_a_restart_force_deletes_an_old_pod_stuck_terminating_on_a_ready_node() -> None:
    job = job_ref(compile={"enabled": False})
    running = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status
    failed = pod(job, Stage.TRAIN, 0, 0, "Failed", exit_code=1)
    restart = decide(job, running, observed(failed, pod(job, Stage.TRAIN, 0, 1)))
    assert restart.status["attempt"] == 1
    stuck = pod(job, Stage.TRAIN, 0, 1, deleting=True, deletion_due=T0)

    def at(seconds: float, status: dict[str, Any]) -> Decision:
        return decide(job, status, observed(failed, stuck, now=T0 + timedelta(seconds=seconds)))

    waiting = at(5, restart.status)
    assert waiting.delete_pods == [], "within its bound a Terminating pod is left to its kubelet"
    assert waiting.status["reason"] == "WaitingForOldGang"
    forced = at(30, waiting.status)
    assert [(d.name, d.force) for d in forced.delete_pods] == [("bert-train-0-1", True)]
    assert forced.status["reason"] == "ForceDeletingOldGang"
    assert "bert-train-0-1 on n1" in forced.status["message"]
    assert [e.reason for e in forced.events] == ["ForceDeletingOldGang"]
    assert forced.create == [], "the next attempt still waits for the old pod to go"
    held = at(90, forced.status)
    assert (held.status["phase"], held.status["reason"]) == ("Failed", "OldGangStuck")
    assert "bert-train-0-1" in held.status["message"]


def test_a_job_that_ends_before_its_pods_exist_releases_its_admitted_podgroup() -> None:
    job = job_ref(compile={"enabled": False}, runPolicy={"activeDeadlineSeconds": 60})
    admitted = Observed(
        (), {"bert-train": PodGroupView("bert-train", "Inqueue", None)}, True, NODES, T0
    )
    started = decide(job, {}, admitted).status
    later = replace(admitted, now=T0 + timedelta(seconds=61))
    ended = decide(job, started, later)
    assert (ended.status["phase"], ended.status["reason"]) == ("Failed", "DeadlineExceeded")
    assert ended.delete_podgroups == ["bert-train"], "Volcano would keep reserving its capacity"


def test_an_ended_job_keeps_the_podgroup_of_pods_still_running() -> None:
    job = job_ref(compile={"enabled": False}, runPolicy={"cleanPodPolicy": "None"})
    running = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status
    failed = {**running, "phase": "Failed", "reason": "DeadlineExceeded"}
    decision = decide(job, failed, observed(*gang(job, Stage.TRAIN, 0)))
    assert "bert-train" not in decision.delete_podgroups


def test_a_running_gang_whose_readiness_blinks_stays_in_its_stage() -> None:
    job = job_ref(compile={"enabled": False})
    running = decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status
    unready = [pod(job, Stage.TRAIN, 0, r, ready=False) for r in range(2)]
    blink = decide(job, running, observed(*unready))
    assert (blink.status["phase"], blink.status["reason"]) == ("Training", "GangRunning")
    assert blink.events == []
    assert "(0/2 ready)" in blink.status["message"]
    fresh = decide(job, {}, observed(*unready))
    assert fresh.status["phase"] == "Pending", "a gang that never ran still waits for readiness"
