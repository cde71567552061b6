"""The reconciler's order of writes, against the in-memory cluster seam (tests/unit/fake_cluster):
a restart is recorded before its side effects, events follow the status they describe, and
refusals, conflicts and a namespace being deleted each end a pass the way they should."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, NewConnectionError

from trainium_operator.builders.job import LABEL_JOB_NAME
from trainium_operator.controller.cache import ClusterCache
from trainium_operator.controller.reconciler import (
    CordonReservations,
    JobGoneError,
    PermissionDeniedError,
    Reconciler,
)
from trainium_operator.k8s.client import is_conflict
from trainium_operator.k8s.informer import WatchEvent, ownership_and_status, ownership_only
from trainium_operator.lifecycle.policies.profile_upload import UploadDefaults
from trainium_operator.lifecycle.ranks import RankSample
from unit.fake_cluster import FakeCluster, Write, api_error
from unit.jobs import job_document

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NAMESPACE, NAME = "team-a", "bert"
KEY = (NAMESPACE, NAME)


def ready_node(name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"node.kubernetes.io/instance-type": "trn1.32xlarge"},
        },
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T11:00:00Z"}
            ]
        },
    }


def open_queue(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"state": "Open"}}


def new_world(*, isolate_jobs: bool = True, **spec: Any) -> tuple[FakeCluster, Reconciler]:
    cache = ClusterCache()
    cluster = FakeCluster(cache)
    for index in range(2):
        cluster.add_node(ready_node(f"trn1-{index}"))
    cache.on_queue(WatchEvent("ADDED", open_queue("default")))
    cluster.add_job(job_document(compile={"enabled": False}, **spec))
    reconciler = Reconciler(
        cluster,
        cache,
        synced=lambda: True,
        clock=lambda: NOW,
        upload_defaults=UploadDefaults(),
        isolate_jobs=isolate_jobs,
    )
    return cluster, reconciler


def admit(cluster: FakeCluster, group: str) -> None:
    """Volcano lets the gang in."""
    cluster.update("PodGroup", group, {"status": {"phase": "Inqueue"}})


def run_pods(cluster: FakeCluster, prefix: str = "bert-train-0-") -> None:
    """The scheduler binds the gang's pods each to its own node and the kubelet starts them."""
    gang = sorted(
        (p for p in cluster.pods() if p["metadata"]["name"].startswith(prefix)),
        key=lambda p: p["metadata"]["name"],
    )
    for index, pod in enumerate(gang):
        cluster.update(
            "Pod",
            pod["metadata"]["name"],
            {
                "spec": {"nodeName": f"trn1-{index}"},
                "status": {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            },
        )


def end_pod(cluster: FakeCluster, name: str, exit_code: int) -> None:
    cluster.update(
        "Pod",
        name,
        {
            "status": {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [
                    {"name": "trainer", "state": {"terminated": {"exitCode": exit_code}}}
                ],
            }
        },
    )


def running_gang(**spec: Any) -> tuple[FakeCluster, Reconciler]:
    cluster, reconciler = new_world(**spec)
    reconciler.reconcile(*KEY)
    admit(cluster, "bert-train")
    reconciler.reconcile(*KEY)
    run_pods(cluster)
    reconciler.reconcile(*KEY)
    assert cluster.job(NAME)["status"]["phase"] == "Training"
    cluster.writes.clear()
    return cluster, reconciler


def test_a_new_job_stores_its_phase_then_creates_isolation_service_and_podgroup_not_pods() -> None:
    cluster, reconciler = new_world()
    reconciler.reconcile(*KEY)
    kinds = [(w.verb, w.kind) for w in cluster.writes]
    assert kinds[:4] == [
        ("status", "TrainingJob"),  # a phase change is stored before any side effect
        ("create", "NetworkPolicy"),
        ("create", "Service"),
        ("create", "PodGroup"),
    ], "the isolation first: no pod of the job ever runs without it"
    assert ("create", "Pod") not in kinds, "no pods before Volcano admits the gang"
    cluster.writes.clear()
    admit(cluster, "bert-train")
    reconciler.reconcile(*KEY)
    assert [w.name for w in cluster.of("create")] == ["bert-train-0-0", "bert-train-0-1"]


def test_a_deleted_job_network_policy_is_created_again_and_none_when_isolation_is_off() -> None:
    cluster, reconciler = new_world()
    reconciler.reconcile(*KEY)
    policy = cluster.objects[("NetworkPolicy", NAME)]
    assert policy["spec"]["podSelector"] == {"matchLabels": {LABEL_JOB_NAME: NAME}}
    cluster.vanish("NetworkPolicy", NAME)
    cluster.writes.clear()
    reconciler.reconcile(*KEY)
    assert [(w.verb, w.kind) for w in cluster.of("create")] == [("create", "NetworkPolicy")]
    cluster, reconciler = new_world(isolate_jobs=False)
    reconciler.reconcile(*KEY)
    assert ("NetworkPolicy", NAME) not in cluster.objects
    assert [w.kind for w in cluster.of("create")] == ["Service", "PodGroup"]


def test_the_stages_first_attempt_is_stored_before_its_pods_are_created() -> None:
    cluster, reconciler = new_world()
    reconciler.reconcile(*KEY)
    admit(cluster, "bert-train")
    cluster.writes.clear()
    reconciler.reconcile(*KEY)
    order = [(w.verb, w.kind) for w in cluster.writes if w.verb in ("status", "create")]
    assert order[0] == ("status", "TrainingJob"), f"firstAttempt after the creates: {order}"
    assert cluster.job(NAME)["status"]["training"]["firstAttempt"] == 0
    assert cluster.job(NAME)["status"]["training"]["createdAttempt"] == 0
    assert [w.name for w in cluster.of("create")] == ["bert-train-0-0", "bert-train-0-1"]


def assert_restarted_as_vanished(cluster: FakeCluster) -> None:
    """The pass restarted the gang (attempt 1, PodVanished) and created no pod of attempt 0."""
    status = cluster.job(NAME)["status"]
    assert status["lastFailure"]["reason"] == "PodVanished"
    assert status["attempt"] == 1
    assert not [w for w in cluster.of("create") if w.name.startswith("bert-train-0-")]


def test_a_gang_deleted_before_any_pass_saw_it_restarts_as_a_new_attempt_not_created_twice() -> (
    None
):
    # The pass that created the gang was the operator's last; its pods were placed and
    # force-deleted before the next pass (a force-deleted process may still run on its node).
    cluster, reconciler = new_world()
    reconciler.reconcile(*KEY)
    admit(cluster, "bert-train")
    reconciler.reconcile(*KEY)
    run_pods(cluster)
    for pod in ("bert-train-0-0", "bert-train-0-1"):
        cluster.vanish("Pod", pod)
    cluster.writes.clear()
    reconciler.reconcile(*KEY)
    assert_restarted_as_vanished(cluster)


def unreachable() -> MaxRetryError:
    """What the client raises when no connection to the API server can be made."""
    refused = NewConnectionError(None, "Failed to establish a new connection: Connection refused")  # type: ignore[arg-type]
    return MaxRetryError(None, "/api/v1/namespaces/team-a/pods", refused)  # type: ignore[arg-type]


def gang_record_stored_then_creates_unsent() -> tuple[FakeCluster, Reconciler]:
    cluster, reconciler = new_world()
    reconciler.reconcile(*KEY)
    admit(cluster, "bert-train")
    cluster.refuse("create", "Pod", unreachable())
    with pytest.raises(MaxRetryError):
        reconciler.reconcile(*KEY)
    assert cluster.job(NAME)["status"]["training"]["createdAttempt"] == 0
    assert not [w for w in cluster.of("create") if w.kind == "Pod"]
    cluster.allow("create", "Pod")
    return cluster, reconciler


def test_a_gang_whose_creates_never_reached_the_api_server_is_created_again_not_restarted() -> None:
    cluster, reconciler = gang_record_stored_then_creates_unsent()
    reconciler.reconcile(*KEY)
    status = cluster.job(NAME)["status"]
    pods = [w.name for w in cluster.of("create") if w.kind == "Pod"]
    assert pods == ["bert-train-0-0", "bert-train-0-1"]
    assert (status["attempt"], status["restarts"]["total"]) == (0, 0)
    assert "lastFailure" not in status


def test_an_unsent_retry_of_a_gang_some_of_whose_pods_existed_still_restarts_once_all_vanish() -> (
    None
):
    cluster, reconciler = new_world()
    reconciler.reconcile(*KEY)
    admit(cluster, "bert-train")
    reconciler.reconcile(*KEY)
    cluster.vanish("Pod", "bert-train-0-1")
    cluster.refuse("create", "Pod", unreachable())
    with pytest.raises(MaxRetryError):
        reconciler.reconcile(*KEY)  # re-creating rank 1: never sent
    cluster.vanish("Pod", "bert-train-0-0")  # rank 0 existed: it may have run
    cluster.allow("create", "Pod")
    cluster.writes.clear()
    reconciler.reconcile(*KEY)
    assert_restarted_as_vanished(cluster)


def successor_of(cluster: FakeCluster) -> Reconciler:
    """A replica that took over: the same cluster and cache, none of the old process's memory."""
    return Reconciler(
        cluster,
        cluster.cache,
        synced=lambda: True,
        clock=lambda: NOW,
        upload_defaults=UploadDefaults(),
        isolate_jobs=True,
    )


def test_a_new_operator_creates_a_recorded_gang_it_finds_no_pod_of_as_the_next_attempt() -> None:
    # A replica that took over cannot know whether the creates left the other one; a gang of
    # that attempt may have run, so it is not created again, and no failure is counted.
    cluster, _ = gang_record_stored_then_creates_unsent()
    cluster.writes.clear()
    cluster.events.clear()
    successor_of(cluster).reconcile(*KEY)
    status = cluster.job(NAME)["status"]
    assert (status["attempt"], status["restarts"]["total"]) == (1, 1)
    assert status["restarts"]["unseenGang"] == 1
    assert "lastFailure" not in status
    order = [(w.verb, w.name) for w in cluster.writes if w.verb in ("status", "create")]
    assert order[0] == ("status", NAME), f"the new attempt must be stored first: {order}"
    assert sorted(name for verb, name in order if verb == "create") == [
        "bert-train-1-0",
        "bert-train-1-1",
    ]
    assert ("Normal", "GangNotFound") in [(e["type"], e["reason"]) for e in cluster.events]
    assert {e["type"] for e in cluster.events} == {"Normal"}


def test_a_gang_a_new_operator_saw_restarts_as_vanished_when_its_pods_go_unseen() -> None:
    cluster, reconciler = new_world()
    reconciler.reconcile(*KEY)
    admit(cluster, "bert-train")
    reconciler.reconcile(*KEY)
    successor = successor_of(cluster)
    successor.reconcile(*KEY)  # sees the gang's pods
    for pod in ("bert-train-0-0", "bert-train-0-1"):
        cluster.vanish("Pod", pod)
    cluster.writes.clear()
    successor.reconcile(*KEY)
    assert_restarted_as_vanished(cluster)


def test_what_the_operator_remembers_of_a_job_goes_with_the_job() -> None:
    cluster, reconciler = new_world()
    reconciler.reconcile(*KEY)
    admit(cluster, "bert-train")
    reconciler.reconcile(*KEY)
    assert len(reconciler.memory) == 1
    for pod in ("bert-train-0-0", "bert-train-0-1"):
        cluster.vanish("Pod", pod)
    cluster.vanish("TrainingJob", NAME)
    with pytest.raises(JobGoneError):
        reconciler.reconcile(*KEY)
    assert len(reconciler.memory) == 0


def test_a_pod_name_a_foreign_pod_holds_keeps_the_waits_start_and_records_no_created_gang() -> None:
    cluster, reconciler = new_world(nodes=1)
    reconciler.reconcile(*KEY)
    admit(cluster, "bert-train")
    cluster.objects[("Pod", "bert-train-0-0")] = {
        "kind": "Pod",
        "metadata": {"name": "bert-train-0-0", "namespace": NAMESPACE, "resourceVersion": "1"},
    }
    clock = [NOW]
    reconciler.clock = lambda: clock[0]
    reconciler.reconcile(*KEY)
    first = cluster.job(NAME)["status"]
    assert first["reason"] == "WaitingForNameConflict"
    clock[0] = NOW + timedelta(seconds=5)
    reconciler.reconcile(*KEY)
    status = cluster.job(NAME)["status"]
    assert status["message"] == first["message"], "the bounded wait started again"
    assert "createdAttempt" not in status["training"], "no pod of the attempt was created"
    assert status["restarts"]["total"] == 0


def test_a_restart_is_written_to_the_status_before_the_failed_gang_is_deleted() -> None:
    cluster, reconciler = running_gang()
    end_pod(cluster, "bert-train-0-0", exit_code=137)
    reconciler.reconcile(*KEY)
    order = [(w.verb, w.name) for w in cluster.writes if w.verb in ("status", "delete")]
    assert order[0] == ("status", NAME), f"the restart must be recorded first: {order}"
    assert ("delete", "bert-train-0-1") in order[1:]
    status = cluster.job(NAME)["status"]
    assert status["phase"] == "Restarting"
    assert status["restarts"]["total"] == 1


def test_a_restart_whose_status_write_fails_deletes_nothing() -> None:
    cluster, reconciler = running_gang()
    end_pod(cluster, "bert-train-0-0", exit_code=137)
    cluster.refuse("status", "TrainingJob", api_error(503, "etcdserver: request timed out"))
    with pytest.raises(ApiException) as raised:
        reconciler.reconcile(*KEY)
    assert raised.value.status == 503
    assert cluster.of("delete") == [], "side effects of an unrecorded restart"
    assert cluster.of("event") == []
    cluster.allow("status", "TrainingJob")
    reconciler.reconcile(*KEY)
    assert cluster.job(NAME)["status"]["restarts"]["total"] == 1
    assert cluster.of("delete")


def test_events_are_posted_after_the_status_write_they_describe() -> None:
    cluster, reconciler = running_gang()
    for pod in ("bert-train-0-0", "bert-train-0-1"):
        end_pod(cluster, pod, exit_code=0)
    reconciler.reconcile(*KEY)
    verbs = [w.verb for w in cluster.writes]
    assert "event" in verbs
    assert verbs.index("status") < verbs.index("event")
    assert Write("event", "Event", NAME, "Normal TrainingSucceeded") in cluster.writes
    assert cluster.job(NAME)["status"]["phase"] == "Succeeded"


def test_a_stale_view_fails_the_status_write_with_a_conflict_and_posts_no_event() -> None:
    cluster, reconciler = running_gang()
    for pod in ("bert-train-0-0", "bert-train-0-1"):
        end_pod(cluster, pod, exit_code=0)
    # Someone else wrote the job after the cache saw it: the pass's resourceVersion is stale.
    cluster.job(NAME)["metadata"]["resourceVersion"] = "999999"
    with pytest.raises(ApiException) as raised:
        reconciler.reconcile(*KEY)
    assert is_conflict(raised.value)
    assert cluster.of("event") == [], "an event for a status that was not written"
    assert "status" not in [w.verb for w in cluster.writes]


def test_a_quota_refusal_is_the_jobs_reason_holds_it_and_is_not_a_permission_warning() -> None:
    cluster, reconciler = new_world()
    reconciler.reconcile(*KEY)
    admit(cluster, "bert-train")
    cluster.refuse(
        "create",
        "Pod",
        api_error(403, 'pods "bert-train-0-0" is forbidden: exceeded quota: compute'),
    )
    requeue = reconciler.reconcile(*KEY)
    status = cluster.job(NAME)["status"]
    assert status["reason"] == "QuotaExceeded"
    assert "exceeded quota" in status["message"]
    assert requeue is not None, "held, with a bound"
    assert "createdAttempt" not in status["training"], "no pod of the attempt was created"
    assert not [e for e in cluster.events if e["reason"] == "PermissionDenied"]
    writes = len(cluster.writes)
    reconciler.reconcile(*KEY)
    assert len(cluster.writes) == writes, "a held job was retried with nothing changed"


def test_an_rbac_denial_is_a_permission_warning_naming_the_chart() -> None:
    cluster, reconciler = new_world()
    cluster.refuse(
        "create",
        "Service",
        api_error(403, 'services is forbidden: User "op" cannot create resource "services"'),
    )
    with pytest.raises(PermissionDeniedError, match="RBAC"):
        reconciler.reconcile(*KEY)
    (event,) = cluster.events
    assert (event["type"], event["reason"]) == ("Warning", "PermissionDenied")


def test_a_create_refused_because_the_namespace_is_being_deleted_ends_the_job_quietly() -> None:
    cluster, reconciler = new_world()
    cluster.refuse(
        "create",
        "Service",
        api_error(
            403,
            f'services "bert" is forbidden: unable to create new content in namespace '
            f"{NAMESPACE} because it is being terminated",
            causes=[{"reason": "NamespaceTerminating", "field": "metadata.namespace"}],
        ),
    )
    with pytest.raises(JobGoneError):
        reconciler.reconcile(*KEY)
    assert cluster.events == [], "no Warning for a namespace its owner deletes"


def test_a_repeated_pass_over_an_unchanged_world_writes_nothing() -> None:
    cluster, reconciler = running_gang()
    reconciler.reconcile(*KEY)
    reconciler.reconcile(*KEY)
    assert cluster.writes == []


PROFILED = {"profile": {"enabled": True, "s3Uri": "s3://bucket/profiles"}}
QUOTA = 'pods "bert-upload-0" is forbidden: exceeded quota: compute, requested: pods=1'


def test_a_refused_upload_pod_is_the_uploads_failure_and_never_changes_a_succeeded_job() -> None:
    cluster, reconciler = running_gang(**PROFILED)
    cluster.refuse("create", "Pod", api_error(403, QUOTA))
    for pod in ("bert-train-0-0", "bert-train-0-1"):
        end_pod(cluster, pod, exit_code=0)
    requeue = reconciler.reconcile(*KEY)
    status = cluster.job(NAME)["status"]
    assert (status["phase"], status["reason"]) == ("Succeeded", "TrainingSucceeded")
    (upload,) = status["profileUploads"]
    assert upload["state"] == "Failed"
    assert "exceeded quota" in upload["message"]
    condition = next(c for c in status["conditions"] if c["type"] == "ProfileUploaded")
    assert (condition["status"], condition["reason"]) == ("False", "UploadFailed")
    warnings = [e for e in cluster.events if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["ProfileUploadFailed"]
    assert "not affected" in warnings[0]["message"]
    assert requeue is None or requeue > 1, "no hold, no tight retry"
    writes = len(cluster.writes)
    reconciler.reconcile(*KEY)
    assert len(cluster.writes) == writes, "a refused upload is not retried with nothing changed"
    assert cluster.job(NAME)["status"]["phase"] == "Succeeded"


def test_a_refused_upload_pod_during_a_restart_leaves_the_restart_as_decided() -> None:
    cluster, reconciler = running_gang(**PROFILED)
    cluster.refuse("create", "Pod", api_error(403, QUOTA))
    end_pod(cluster, "bert-train-0-0", exit_code=137)
    reconciler.reconcile(*KEY)
    status = cluster.job(NAME)["status"]
    assert status["phase"] == "Restarting"
    assert status["restarts"]["total"] == 1
    assert ("delete", "bert-train-0-1") in [(w.verb, w.name) for w in cluster.writes]
    assert status["profileUploads"][0]["state"] == "Failed"
    assert not [e for e in cluster.events if e["reason"] == "QuotaExceeded"]


def test_a_later_failure_without_an_exit_code_leaves_no_earlier_exit_code_on_the_server() -> None:
    cluster, reconciler = running_gang()
    end_pod(cluster, "bert-train-0-0", exit_code=137)
    reconciler.reconcile(*KEY)
    assert cluster.job(NAME)["status"]["lastFailure"]["exitCode"] == 137
    reconciler.reconcile(*KEY)  # the old gang is gone: attempt 1 is created
    run_pods(cluster, prefix="bert-train-1-")
    reconciler.reconcile(*KEY)
    assert cluster.job(NAME)["status"]["phase"] == "Training"
    cluster.vanish("Pod", "bert-train-1-1")  # deleted behind the operator's back, no exit code
    reconciler.reconcile(*KEY)
    failure = cluster.job(NAME)["status"]["lastFailure"]
    assert failure["pod"] == "bert-train-1-1"
    assert "exitCode" not in failure, f"an earlier failure's exit code survived: {failure}"


def test_once_a_refusal_is_lifted_the_next_pass_creates_the_gang_without_waiting() -> None:
    cluster, reconciler = new_world()
    reconciler.reconcile(*KEY)
    admit(cluster, "bert-train")
    cluster.refuse("create", "Pod", api_error(403, 'pods "x" is forbidden: exceeded quota: q'))
    reconciler.reconcile(*KEY)
    assert cluster.job(NAME)["status"]["reason"] == "QuotaExceeded"
    cluster.allow("create", "Pod")
    reconciler.holds.release_namespace(NAMESPACE)  # the quota changed
    reconciler.reconcile(*KEY)
    created = [w.name for w in cluster.of("create") if w.kind == "Pod"]
    assert created == ["bert-train-0-0", "bert-train-0-1"], "the pass waited for refused pods"


def test_an_upload_pod_refused_by_a_terminating_namespace_ends_the_job_quietly() -> None:
    cluster, reconciler = running_gang(**PROFILED)
    cluster.refuse(
        "create",
        "Pod",
        api_error(
            403,
            f"unable to create new content in namespace {NAMESPACE} because it is being terminated",
            causes=[{"reason": "NamespaceTerminating"}],
        ),
    )
    for pod in ("bert-train-0-0", "bert-train-0-1"):
        end_pod(cluster, pod, exit_code=0)
    with pytest.raises(JobGoneError):
        reconciler.reconcile(*KEY)
    assert not [e for e in cluster.events if e["type"] == "Warning"]
    uploads = cluster.job(NAME)["status"]["profileUploads"]
    assert [u["state"] for u in uploads] == ["Pending"], "not recorded as a refused upload"


def test_an_unrelated_service_of_the_jobs_name_fails_the_job_after_a_bound_and_is_kept() -> None:
    cache = ClusterCache()
    cluster = FakeCluster(cache)
    for index in range(2):
        cluster.add_node(ready_node(f"trn1-{index}"))
    cache.on_queue(WatchEvent("ADDED", open_queue("default")))
    cluster.objects[("Service", NAME)] = {
        "kind": "Service",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "resourceVersion": "1"},
    }
    cluster.add_job(job_document(compile={"enabled": False}))
    clock = [NOW]
    reconciler = Reconciler(
        cluster,
        cache,
        synced=lambda: True,
        clock=lambda: clock[0],
        upload_defaults=UploadDefaults(),
    )
    requeue = reconciler.reconcile(*KEY)
    status = cluster.job(NAME)["status"]
    assert status["reason"] == "WaitingForNameConflict"
    assert f"Service {NAMESPACE}/{NAME} exists and is not this job's" in status["message"]
    assert requeue is not None, "the wait has a bound"
    assert requeue <= 30
    clock[0] = NOW + timedelta(seconds=31)
    reconciler.reconcile(*KEY)
    status = cluster.job(NAME)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "NameConflict")
    assert ("Service", NAME) in cluster.objects, "a Service the job does not own is never deleted"
    assert ("delete", "Service") not in [(w.verb, w.kind) for w in cluster.writes]


def test_a_straggler_replacement_is_stored_before_its_node_is_cordoned_and_its_gang_deleted() -> (
    None
):
    cluster, reconciler = running_gang(
        health={"onStraggler": "Replace", "stragglerPersistenceSeconds": 1}
    )
    for index in range(2, 4):
        cluster.add_node(ready_node(f"trn1-{index}"))
    clock = {"now": NOW}
    step = {"n": 100}

    def ranks(key: tuple[str, str]) -> list[RankSample]:
        return [
            RankSample(
                r,
                0,
                3,
                step["n"],
                ((65.0 if r == 2 else 50.0),) * 16,
                clock["now"],
                node="trn1-1" if r == 2 else "trn1-0",
            )
            for r in range(3)
        ]

    reconciler.progress = ranks
    reconciler.health_url = "http://operator:8443"
    reconciler.clock = lambda: clock["now"]
    reconciler.cordons = CordonReservations(1)  # the operator admin's opt-in
    reconciler.reconcile(*KEY)
    assert cluster.job(NAME)["status"]["stragglers"]["ranks"][0]["rank"] == 2
    cluster.writes.clear()
    clock["now"] = NOW + timedelta(seconds=5)
    step["n"] = 120
    reconciler.reconcile(*KEY)
    order = [(w.verb, w.kind) for w in cluster.writes if w.verb in ("status", "patch", "delete")]
    assert order[:2] == [("status", "TrainingJob"), ("patch", "Node")], order
    assert ("delete", "Pod") in order[2:]
    assert [w.name for w in cluster.of("patch")] == ["trn1-1"]
    status = cluster.job(NAME)["status"]
    assert status["restarts"]["straggler"] == 1


def test_a_finished_jobs_pods_are_deleted_only_after_its_terminal_status_is_stored() -> None:
    cluster, reconciler = running_gang(runPolicy={"cleanPodPolicy": "All"})
    for pod in ("bert-train-0-0", "bert-train-0-1"):
        end_pod(cluster, pod, exit_code=0)
    reconciler.reconcile(*KEY)
    order = [(w.verb, w.name) for w in cluster.writes if w.verb in ("status", "delete")]
    assert order[0] == ("status", NAME), f"pods deleted before Succeeded was stored: {order}"
    assert ("delete", "bert-train-0-0") in order[1:]
    assert cluster.job(NAME)["status"]["phase"] == "Succeeded"


def test_a_finished_job_whose_status_write_fails_keeps_its_pods_and_never_trains_again() -> None:
    cluster, reconciler = running_gang(runPolicy={"cleanPodPolicy": "All"})
    for pod in ("bert-train-0-0", "bert-train-0-1"):
        end_pod(cluster, pod, exit_code=0)
    # A 409 (the operator's own annotation removal, a label edit) or an exit between the deletes
    # and the status write used to lose Succeeded: the next pass saw no pods and restarted.
    cluster.refuse("status", "TrainingJob", api_error(409, "the object has been modified"))
    with pytest.raises(ApiException):
        reconciler.reconcile(*KEY)
    assert cluster.of("delete") == [], "the pods of an unrecorded finish were deleted"
    cluster.allow("status", "TrainingJob")
    reconciler.reconcile(*KEY)
    reconciler.reconcile(*KEY)
    status = cluster.job(NAME)["status"]
    assert status["phase"] == "Succeeded"
    assert status.get("attempt", 0) == 0
    assert not status.get("restarts", {}).get("total")
    assert not [w for w in cluster.of("create") if w.kind == "Pod"], "a finished job trained again"


def test_a_failure_past_the_backoff_limit_is_stored_before_the_running_rank_is_deleted() -> None:
    cluster, reconciler = running_gang(runPolicy={"backoffLimit": 0})
    # Any terminal decision that deletes pods: the write order is the applier's, not the policy's.
    end_pod(cluster, "bert-train-0-0", exit_code=1)
    cluster.refuse("status", "TrainingJob", api_error(503, "etcdserver: request timed out"))
    with pytest.raises(ApiException):
        reconciler.reconcile(*KEY)
    assert cluster.of("delete") == [], "the surviving rank was deleted before Failed was stored"
    cluster.allow("status", "TrainingJob")
    reconciler.reconcile(*KEY)
    assert cluster.job(NAME)["status"]["phase"] == "Failed"
    assert [w.name for w in cluster.of("delete")] == ["bert-train-0-1"]


class CountingLock:
    """The cordon lock, counting how often a pass takes it."""

    def __init__(self) -> None:
        self.taken = 0
        self._lock = threading.Lock()

    def __enter__(self) -> bool:
        self.taken += 1
        return self._lock.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._lock.__exit__(None, None, None)


def gang_reporting(slow_ms: float, step: int) -> Callable[[tuple[str, str]], list[RankSample]]:
    """Three ranks of attempt 0, rank 2 stepping in `slow_ms` against 50 ms."""

    def ranks(key: tuple[str, str]) -> list[RankSample]:
        return [
            RankSample(
                r,
                0,
                3,
                step,
                ((slow_ms if r == 2 else 50.0),) * 16,
                NOW,
                node="trn1-1" if r == 2 else "trn1-0",
            )
            for r in range(3)
        ]

    return ranks


@pytest.mark.parametrize(
    ("health", "slow_ms"),
    [
        ({"onStraggler": "Report"}, 65.0),  # a straggler, only reported
        ({"onStraggler": "Replace", "stragglerPersistenceSeconds": 1}, 50.0),  # no straggler
        ({"onStraggler": "Replace", "stragglerPersistenceSeconds": 60}, 65.0),  # not persistent
    ],
)
def test_a_pass_that_cannot_cordon_checks_stragglers_without_the_cordon_lock(
    health: dict[str, Any], slow_ms: float
) -> None:
    cluster, reconciler = running_gang(health=health)
    reconciler.progress = gang_reporting(slow_ms, 100)
    reconciler.health_url = "http://operator:8443"
    reconciler.cordons = CordonReservations(1)
    lock = CountingLock()
    reconciler.cordons.lock = lock  # type: ignore[assignment]
    for _ in range(3):
        reconciler.reconcile(*KEY)
    named = (cluster.job(NAME)["status"].get("stragglers") or {}).get("ranks", [])
    assert [s["rank"] for s in named] == ([2] if slow_ms > 60 else [])
    assert lock.taken == 0, f"the cordon lock was taken {lock.taken} times"


def test_a_running_job_whose_unchanged_spec_a_newer_operator_refuses_is_held_not_failed() -> None:
    # An upgrade tightened the spec's rules (here: where the claim may be mounted). The spec
    # did not change since an operator accepted it, so failing the job would strand its
    # running gang under a Failed status: the operator leaves it alone and says why.
    cluster, reconciler = running_gang()
    # The stored spec as the newer operator reads it; the same generation: not an edit.
    cluster.update("TrainingJob", NAME, {"spec": {"storage": {"mountPath": "/opt/data"}}})
    reconciler.reconcile(*KEY)
    reconciler.reconcile(*KEY)
    status = cluster.job(NAME)["status"]
    assert status["phase"] == "Training"
    blocked = next(c for c in status["conditions"] if c["type"] == "Blocked")
    assert (blocked["status"], blocked["reason"]) == ("True", "SpecRefusedAfterUpgrade")
    assert "spec.storage.mountPath" in blocked["message"]
    assert cluster.of("delete") == [], "a running gang was disturbed by an operator upgrade"
    assert [w.detail for w in cluster.of("event")] == ["Warning SpecRefusedAfterUpgrade"]
    # An edit of the spec is judged as any new spec: still refused, the job fails.
    cluster.update("TrainingJob", NAME, {"metadata": {"generation": 2}})
    reconciler.reconcile(*KEY)
    assert cluster.job(NAME)["status"]["phase"] == "Failed"


def running_three_node_gang() -> tuple[FakeCluster, Reconciler]:
    cluster, reconciler = new_world(nodes=3)
    cluster.add_node(ready_node("trn1-2"))
    reconciler.reconcile(*KEY)
    admit(cluster, "bert-train")
    reconciler.reconcile(*KEY)
    run_pods(cluster)
    reconciler.reconcile(*KEY)
    return cluster, reconciler


def test_a_restart_deletes_the_old_gangs_pods_together_not_one_after_another() -> None:
    cluster, reconciler = running_three_node_gang()
    # Each delete returns only once another is in flight: deletes issued one after another
    # would break the barrier.
    both_in_flight = threading.Barrier(2, timeout=5)
    delete_pod = cluster.delete_pod

    def delete_once_both_started(namespace: str, name: str, *, force: bool) -> None:
        both_in_flight.wait()
        delete_pod(namespace, name, force=force)

    cluster.delete_pod = delete_once_both_started  # type: ignore[method-assign]
    end_pod(cluster, "bert-train-0-0", exit_code=1)
    reconciler.reconcile(*KEY)
    deleted = sorted(w.name for w in cluster.of("delete"))
    assert deleted == ["bert-train-0-1", "bert-train-0-2"], "the failed rank stays for its logs"
    assert cluster.job(NAME)["status"]["phase"] == "Restarting"


def test_a_deleted_jobs_pods_are_deleted_together_each_by_its_uid_and_the_pass_finds_it_gone() -> (
    None
):
    cluster, reconciler = running_three_node_gang()
    # Each delete returns only once another is in flight: one after another would not.
    both_in_flight = threading.Barrier(2, timeout=5)
    delete_pod = cluster.delete_pod
    uids: list[str | None] = []

    def delete_once_two_started(
        namespace: str, name: str, *, force: bool, uid: str | None = None
    ) -> None:
        uids.append(uid)
        if len(uids) <= 2:
            both_in_flight.wait()
        delete_pod(namespace, name, force=force, uid=uid)

    cluster.delete_pod = delete_once_two_started  # type: ignore[method-assign]
    cluster.update("Pod", "bert-train-0-2", {"metadata": {"deletionTimestamp": "x"}})
    cluster.writes.clear()
    cluster.vanish("TrainingJob", NAME)
    with pytest.raises(JobGoneError):
        reconciler.reconcile(*KEY)
    deleted = sorted(w.name for w in cluster.of("delete"))
    assert deleted == ["bert-train-0-0", "bert-train-0-1"], "one already terminating is left"
    assert sorted(uids) == ["Pod-bert-train-0-0-uid", "Pod-bert-train-0-1-uid"]
    assert [w.verb for w in cluster.writes] == ["delete", "delete"]


def test_a_gone_jobs_pod_replaced_by_a_new_pod_of_that_name_is_left_alone() -> None:
    cluster, reconciler = running_gang()
    cluster.vanish("TrainingJob", NAME)
    # Between the cache's view and the delete, the name came to belong to another pod.
    pod = cluster.objects[("Pod", "bert-train-0-0")]
    cluster.objects[("Pod", "bert-train-0-0")] = {
        **pod, "metadata": {**pod["metadata"], "uid": "someone-elses"}
    }  # fmt: skip
    with pytest.raises(JobGoneError):
        reconciler.reconcile(*KEY)
    assert ("Pod", "bert-train-0-0") in cluster.objects
    assert ("Pod", "bert-train-0-1") not in cluster.objects


def test_children_cached_as_ownership_and_state_only_are_still_the_jobs_and_admit_its_gang() -> (
    None
):
    # The reflectors keep only identity, labels and owners of a Service and NetworkPolicy, and
    # the status of a PodGroup as well (k8s.informer's transforms).
    cluster, reconciler = new_world()
    reconciler.reconcile(*KEY)
    admit(cluster, "bert-train")
    children = {kind: obj for (kind, _), obj in cluster.objects.items()}
    cache = reconciler.cache
    cache.on_service(WatchEvent("MODIFIED", ownership_only(children["Service"])))
    cache.on_network_policy(WatchEvent("MODIFIED", ownership_only(children["NetworkPolicy"])))
    cache.on_podgroup(WatchEvent("MODIFIED", ownership_and_status(children["PodGroup"])))
    cluster.writes.clear()
    reconciler.reconcile(*KEY)
    created = sorted((w.kind, w.name) for w in cluster.of("create"))
    assert created == [("Pod", "bert-train-0-0"), ("Pod", "bert-train-0-1")]
