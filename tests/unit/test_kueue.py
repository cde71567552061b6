"""Jobs Kueue queues: the pods' queue labels, the pass's decisions over Kueue's Workloads, the
refusals of Kueue keys a job author may not set, and the cache's view of Kueue's objects.

Kueue itself (its webhook, admission and preemption) is exercised on the dev cluster's real
Kueue by tests/integration/test_kueue.py; here the operator's own decisions are pure."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from trainium_operator.api import kueue
from trainium_operator.api.crd import training_job_crd
from trainium_operator.builders import pods as pod_builders
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.controller.cache import ClusterCache
from trainium_operator.k8s.informer import WatchEvent
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.observed import (
    LocalQueueView,
    NodeView,
    Observed,
    PodView,
    WorkloadView,
    local_queue_view,
    pod_view,
    workload_view,
)
from trainium_operator.lifecycle.parse import parse_job
from trainium_operator.lifecycle.render import render_stages
from trainium_operator.lifecycle.snapshot import PassSettings
from unit.jobs import decide, job_document

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
NODES = {f"n{i}": NodeView(f"n{i}", True, None, "trn1.32xlarge") for i in range(4)}
KUEUE_ON = PassSettings(kueue=True)
QUEUE_OPEN = LocalQueueView("team-a-queue", exists=True, active=True)


def kueue_document(*, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    document = job_document(**{"compile": {"enabled": False}, **spec})
    document["metadata"]["labels"] = (
        {kueue.QUEUE_NAME_LABEL: "team-a-queue"} if labels is None else labels
    )
    return document


def kueue_job(**spec: Any) -> JobRef:
    parsed = parse_job(kueue_document(**spec))
    assert isinstance(parsed, JobRef), parsed
    return parsed


def pod(job: JobRef, attempt: int, rank: int, phase: str = "Running", **kw: Any) -> PodView:
    fields: dict[str, Any] = {
        "ready": phase == "Running",
        "node": f"n{rank}",
        "deleting": False,
        "exit_code": None,
        "reason": None,
        "message": None,
        "disrupted": False,
        "kueue_finalizer": True,
    }
    fields.update(kw)
    name = job.pod_name(Stage.TRAIN, attempt, rank)
    return PodView(name, Stage.TRAIN, attempt, rank, phase, **fields)


def seen(
    *pods: PodView,
    workloads: tuple[WorkloadView, ...] = (),
    local_queue: LocalQueueView | None = QUEUE_OPEN,
    now: datetime = T0,
    nodes: dict[str, NodeView] = NODES,
) -> Observed:
    return Observed(
        pods=pods,
        podgroups={},
        service_exists=True,
        nodes=nodes,
        now=now,
        network_policy_missing=False,
        workloads={w.name: w for w in workloads},
        local_queue=local_queue,
    )


def admitted(name: str = "bert-train-0") -> WorkloadView:
    return WorkloadView(name, quota_reserved=True, admitted=True, cluster_queue="trainium")


def training(attempt: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "phase": "Training",
        "reason": "GangRunning",
        "attempt": attempt,
        "startTime": "2026-12-05T11:00:00Z",
        "training": {"startTime": "2026-12-05T11:00:00Z", "firstAttempt": 0},
        "restarts": {"total": 0, "application": 0, "infrastructure": 0},
        **extra,
    }


def names(objects: list[dict[str, Any]]) -> list[str]:
    return [o["metadata"]["name"] for o in objects]


def created_pods(decision: Decision) -> list[dict[str, Any]]:
    return [o for o in decision.create if o["kind"] == "Pod"]


# -- the pods --------------------------------------------------------------------------------


def test_a_kueue_jobs_pods_carry_its_queue_group_and_priority_and_no_volcano_group() -> None:
    document = kueue_document()
    document["metadata"]["labels"][kueue.PRIORITY_CLASS_LABEL] = "high"
    job = parse_job(document)
    assert isinstance(job, JobRef)
    built = pod_builders.pod(job, Stage.TRAIN, 3, 1)
    labels, annotations = built["metadata"]["labels"], built["metadata"]["annotations"]
    assert labels[kueue.QUEUE_NAME_LABEL] == "team-a-queue"
    assert labels[kueue.POD_GROUP_NAME_LABEL] == "bert-train-3"
    assert labels[kueue.PRIORITY_CLASS_LABEL] == "high"
    assert annotations[kueue.POD_GROUP_TOTAL_COUNT_ANNOTATION] == "2"
    assert annotations[kueue.RETRIABLE_IN_GROUP_ANNOTATION] == "false"
    assert "scheduling.k8s.io/group-name" not in annotations
    assert built["spec"]["schedulerName"] == "default-scheduler"


def test_a_volcano_jobs_pods_carry_no_kueue_key() -> None:
    parsed = parse_job(job_document())
    assert isinstance(parsed, JobRef)
    built = pod_builders.pod(parsed, Stage.TRAIN, 0, 0)
    keys = [*built["metadata"]["labels"], *built["metadata"]["annotations"]]
    assert not [k for k in keys if k.startswith(kueue.RESERVED_PREFIX)]
    assert built["spec"]["schedulerName"] == "volcano"


def test_the_group_name_of_the_longest_job_name_fits_a_label_value() -> None:
    assert len(kueue.group_name("j" * 40, "compile", 10**9)) <= 63


# -- what a job may set ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "scheduling", "named"),
    [
        ({kueue.QUEUE_NAME_LABEL: "Team_A"}, {}, "is not a LocalQueue name"),
        ({kueue.PRIORITY_CLASS_LABEL: "high"}, {}, "only a job Kueue queues"),
        (
            {kueue.QUEUE_NAME_LABEL: "q"},
            {"schedulerName": "volcano"},
            "spec.scheduling.schedulerName: volcano cannot place",
        ),
    ],
)
def test_kueue_labels_that_cannot_work_are_refused_naming_the_field(
    labels: dict[str, str], scheduling: dict[str, str], named: str
) -> None:
    problems = parse_job(kueue_document(labels=labels, scheduling=scheduling))
    assert isinstance(problems, list)
    assert any(named in p for p in problems), problems


@pytest.mark.parametrize("where", ["podMetadata", "podTemplate"])
@pytest.mark.parametrize(
    "field", ["labels", "annotations"], ids=["a Kueue label", "a Kueue annotation"]
)
def test_a_job_author_cannot_hand_its_pods_to_kueue_through_pod_metadata(
    where: str, field: str
) -> None:
    metadata = {field: {"kueue.x-k8s.io/queue-name": "other-team"}}
    spec = (
        {"podMetadata": metadata}
        if where == "podMetadata"
        else {"podTemplate": {"metadata": metadata}}
    )
    problems = parse_job(job_document(**spec))
    assert isinstance(problems, list)
    assert any(f"{field}[kueue.x-k8s.io/queue-name]" in p for p in problems), problems


@pytest.mark.parametrize("where", ["podMetadata", "podTemplate"])
def test_the_crd_refuses_kueue_keys_in_pod_metadata_before_the_operator_sees_them(
    where: str,
) -> None:
    schema = training_job_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]["properties"]
    metadata = spec[where] if where == "podMetadata" else spec[where]["properties"]["metadata"]
    rules = " ".join(r["rule"] for r in metadata["x-kubernetes-validations"])
    assert rules.count("!k.startsWith('kueue.x-k8s.io/')") == 2


# -- the pass ---------------------------------------------------------------------------------


def test_a_kueue_gang_is_created_at_once_behind_kueues_gate_and_waits_quietly() -> None:
    job = kueue_job()
    decision = decide(job, {}, seen(), settings=KUEUE_ON)
    assert names(decision.create) == ["bert-train-0-0", "bert-train-0-1"]
    assert not [o for o in decision.create if o["kind"] == "PodGroup"]
    assert decision.status["phase"] == "Pending"
    assert decision.status["reason"] == "Queued"
    assert "waiting in Kueue LocalQueue 'team-a-queue'" in decision.status["message"]
    assert decision.status["queue"]["summary"] == "kueue/team-a-queue:Pending"
    assert not [e for e in decision.events if e.type == "Warning"]


def test_the_queue_says_kueues_words_while_its_workload_waits_for_quota() -> None:
    job = kueue_job()
    waiting = WorkloadView(
        "bert-train-0",
        quota_reserved=False,
        admitted=False,
        cluster_queue=None,
        pending=(
            "Pending",
            "couldn't assign flavors: insufficient quota for aws.amazon.com/neuron",
        ),
    )
    gated = [pod(job, 0, r, "Pending", node=None, ready=False, gated=True) for r in range(2)]
    status = {"phase": "Pending", "attempt": 0, "training": {"firstAttempt": 0}}
    decision = decide(job, status, seen(*gated, workloads=(waiting,)), settings=KUEUE_ON)
    assert decision.status["reason"] == "Queued"
    assert "insufficient quota for aws.amazon.com/neuron" in decision.status["message"]
    assert not created_pods(decision)


def test_an_admitted_running_kueue_gang_trains_and_shows_its_cluster_queue() -> None:
    job = kueue_job()
    gang = [pod(job, 0, r) for r in range(2)]
    decision = decide(job, {}, seen(*gang, workloads=(admitted(),)), settings=KUEUE_ON)
    assert decision.status["phase"] == "Training"
    queue = decision.status["queue"]
    assert queue == {
        "scheduler": "Kueue",
        "name": "team-a-queue",
        "admission": "Admitted",
        "workload": "bert-train-0",
        "clusterQueue": "trainium",
        "summary": "kueue/team-a-queue:Admitted",
    }


def test_a_missing_local_queue_is_a_warning_naming_the_label_and_the_fix() -> None:
    job = kueue_job()
    missing = LocalQueueView("team-a-queue", exists=False)
    decision = decide(job, {}, seen(local_queue=missing), settings=KUEUE_ON)
    assert decision.status["reason"] == "QueueNotFound"
    assert "metadata.labels[kueue.x-k8s.io/queue-name]" in decision.status["message"]
    assert [e.reason for e in decision.events if e.type == "Warning"] == ["QueueNotFound"]


def test_an_operator_without_kueue_creates_nothing_for_a_kueue_job_and_says_so() -> None:
    job = kueue_job()
    decision = decide(job, {}, seen())
    assert not created_pods(decision)
    assert decision.status["reason"] == "KueueNotEnabled"
    assert "chart value kueue.enabled" in decision.status["message"]


def evicted_gang(job: JobRef, reason: str) -> list[PodView]:
    stop = (kueue.EVICTED_REASON_PREFIX + reason, f"Preempted to accommodate a workload ({reason})")
    return [pod(job, 0, r, deleting=True, stopped_by_kueue=stop) for r in range(2)]


def test_a_preempted_gang_restarts_as_infrastructure_in_kueues_words_on_no_budget() -> None:
    job = kueue_job(runPolicy={"infrastructureBackoffLimit": 1})
    spent = {"total": 1, "application": 0, "infrastructure": 1}
    status = training(restarts=spent)
    gang = evicted_gang(job, kueue.PREEMPTED)
    decision = decide(job, status, seen(*gang, workloads=(admitted(),)), settings=KUEUE_ON)
    assert decision.status["phase"] == "Restarting"
    assert decision.status["restarts"] == {
        "total": 2,
        "application": 0,
        "infrastructure": 2,
        "preempted": 1,
    }
    failure = decision.status["lastFailure"]
    assert failure["class"] == "Infrastructure"
    assert failure["reason"] == "WorkloadEvictedDueToPreempted"
    assert "Kueue stopped pod bert-train-0-0" in failure["message"]


def test_a_gang_kueue_evicted_for_another_reason_spends_the_infrastructure_budget() -> None:
    job = kueue_job(runPolicy={"infrastructureBackoffLimit": 1})
    status = training(restarts={"total": 1, "application": 0, "infrastructure": 1})
    gang = evicted_gang(job, "PodsReadyTimeout")
    decision = decide(job, status, seen(*gang, workloads=(admitted(),)), settings=KUEUE_ON)
    assert decision.status["phase"] == "Failed"
    assert decision.status["reason"] == "InfrastructureBackoffLimitExceeded"


def test_a_lost_nodes_kueue_pod_is_force_deleted_and_kueues_finalizer_lifted() -> None:
    job = kueue_job()
    lost = {**NODES, "n1": NodeView("n1", False, T0 - timedelta(minutes=5), "trn1.32xlarge")}
    gang = [pod(job, 0, 0), pod(job, 0, 1)]
    decision = decide(
        job, training(), seen(*gang, workloads=(admitted(),), nodes=lost), settings=KUEUE_ON
    )
    by_name = {d.name: d for d in decision.delete_pods}
    assert by_name["bert-train-0-1"].force
    assert by_name["bert-train-0-1"].release_finalizer == kueue.MANAGED_FINALIZER
    assert by_name["bert-train-0-0"].release_finalizer is None  # a normal delete: Kueue's


# -- what Kueue wrote, as the operator reads it ----------------------------------------------


def test_a_stopped_pod_is_read_with_kueues_reason_its_gate_and_finalizer() -> None:
    raw = {
        "metadata": {
            "name": "bert-train-0-0",
            "labels": {"trainium.dev/stage": "train", "trainium.dev/attempt": "0"}
            | {"trainium.dev/node-rank": "0"},
            "finalizers": [kueue.MANAGED_FINALIZER],
        },
        "spec": {"schedulingGates": [{"name": kueue.ADMISSION_GATE}]},
        "status": {
            "conditions": [
                {
                    "type": "TerminationTarget",
                    "status": "True",
                    "reason": "WorkloadEvictedDueToPreempted",
                    "message": "Preempted to accommodate a workload",
                }
            ]
        },
    }
    view = pod_view(raw)
    assert view is not None
    assert view.stopped_by_kueue == (
        "WorkloadEvictedDueToPreempted",
        "Preempted to accommodate a workload",
    )
    assert view.gated
    assert view.kueue_finalizer
    assert view.infrastructure_failure


def test_a_workloads_admission_and_kueues_reason_for_waiting_are_read() -> None:
    pending = {
        "metadata": {"name": "bert-train-0"},
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": "no quota",
                }
            ]
        },
    }
    assert workload_view(pending).pending == ("Pending", "no quota")
    done = copy.deepcopy(pending)
    done["status"] = {
        "admission": {"clusterQueue": "trainium"},
        "conditions": [
            {"type": "QuotaReserved", "status": "True"},
            {"type": "Admitted", "status": "True"},
        ],
    }
    view = workload_view(done)
    assert (view.admitted, view.cluster_queue, view.pending) == (True, "trainium", None)


def test_a_local_queue_is_active_missing_or_inactive_in_kueues_words() -> None:
    assert not local_queue_view("q", None).exists
    inactive = {
        "status": {
            "conditions": [
                {
                    "type": "Active",
                    "status": "False",
                    "reason": "x",
                    "message": "ClusterQueue trainium is stopped",
                }
            ]
        }
    }
    assert local_queue_view("q", inactive).message == "ClusterQueue trainium is stopped"
    assert local_queue_view("q", {"status": {}}).active is None


def workload_object(name: str, owners: list[str], namespace: str = "team-a") -> dict[str, Any]:
    refs = [{"kind": "Pod", "name": owner, "uid": owner} for owner in owners]
    return {"metadata": {"name": name, "namespace": namespace, "ownerReferences": refs}}


def test_the_cache_keeps_only_the_workloads_of_our_pod_groups_and_names_their_job() -> None:
    cache = ClusterCache()
    ours = workload_object("my-job-train-2", ["my-job-train-2-0", "my-job-train-2-1"])
    foreign = workload_object("pod-web-1a2b3", ["web-1a2b3"])
    lookalike = workload_object("x-train-1", ["someone-else"])
    assert cache.on_workload(WatchEvent("ADDED", ours)) == ("team-a", "my-job")
    assert cache.on_workload(WatchEvent("ADDED", foreign)) is None
    assert cache.on_workload(WatchEvent("ADDED", lookalike)) is None
    assert [w["metadata"]["name"] for w in cache.workloads(("team-a", "my-job"))] == [
        "my-job-train-2"
    ]
    assert cache.sizes()["workloads"] == 1


def test_a_local_queue_event_wakes_the_jobs_labelled_with_it_in_its_namespace() -> None:
    cache = ClusterCache()
    for namespace, name, queue in [
        ("team-a", "a", "q"),
        ("team-a", "b", "other"),
        ("team-b", "c", "q"),
    ]:
        document = kueue_document(labels={kueue.QUEUE_NAME_LABEL: queue})
        document["metadata"].update(name=name, namespace=namespace)
        cache.on_job(WatchEvent("ADDED", document))
    created = {"metadata": {"name": "q", "namespace": "team-a"}}
    assert cache.on_local_queue(WatchEvent("ADDED", created)) == [("team-a", "a")]


def test_the_dry_run_shows_a_kueue_jobs_gated_pod_groups_and_no_podgroup() -> None:
    document = kueue_document(compile={"enabled": True})
    stages = render_stages(document, T0)
    kinds = [(stage.value, o["kind"]) for stage, objects in stages for o in objects]
    assert ("compile", "PodGroup") not in kinds
    assert ("train", "PodGroup") not in kinds
    groups = {
        o["metadata"]["labels"][kueue.POD_GROUP_NAME_LABEL]
        for _, objects in stages
        for o in objects
        if o["kind"] == "Pod"
    }
    assert groups == {"bert-compile-0", "bert-train-0"}
    assert len([k for k in kinds if k[1] == "Pod"]) == 4  # two per stage, none twice


def test_a_restarted_kueue_gang_waiting_in_its_queue_is_pending_queued_not_restarting() -> None:
    job = kueue_job()
    restarting = training(
        attempt=1,
        phase="Restarting",
        reason="GangRestart",
        restarts={"total": 1, "application": 0, "infrastructure": 1, "preempted": 1},
    )
    gated = [pod(job, 1, r, "Pending", node=None, ready=False, gated=True) for r in range(2)]
    waiting = WorkloadView("bert-train-1", quota_reserved=False, admitted=False, cluster_queue=None)
    decision = decide(job, restarting, seen(*gated, workloads=(waiting,)), settings=KUEUE_ON)
    assert (decision.status["phase"], decision.status["reason"]) == ("Pending", "Queued")
    assert not [e for e in decision.events if e.type == "Warning"]
