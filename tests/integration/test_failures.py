"""Failure modes of the crash-safety review, each reproduced on the real local cluster.

Each test is one numbered scenario: it failed against the operator before the fix it names.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from integration.operator_harness import (
    OperatorProcess,
    OperatorView,
    create_job,
    events_with_reason,
    eventually,
    finish_job,
    finish_pods,
    get_job,
    job_events,
    job_manifest,
    job_pods,
    metric,
    operator_serving,
    start_training,
    training_job,
    wait_attempt,
    wait_gang_running,
    wait_phase,
    wait_reason,
    wait_running_gone,
)
from trainium_devcluster.sim import simulate_pod_outcome, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]


def attempts_alive(clients: Any, namespace: str, name: str) -> set[str]:
    return {
        p.metadata.labels["trainium.dev/attempt"]
        for p in job_pods(clients, namespace, name)
        if p.status.phase not in ("Succeeded", "Failed")
    }


def wait_next_gang_alone(clients: Any, namespace: str, name: str) -> list[Any]:
    """The job's attempt-1 gang once both its pods run, asserting that no two attempts' pods
    were alive at once on any look while it waited."""
    seen: list[set[str]] = []

    def restarted() -> list[Any]:
        seen.append(attempts_alive(clients, namespace, name))
        fresh = job_pods(clients, namespace, name, "train", 1)
        return fresh if len(fresh) == 2 and all(p.status.phase == "Running" for p in fresh) else []

    new: list[Any] = wait_for(restarted, timeout=90, description="attempt 1 gang Running")
    assert all(len(alive) <= 1 for alive in seen), seen
    return new


def test_operator_restarts_never_restart_a_running_gang(
    dev_cluster: Any, clients: Any, namespace: str, tmp_path: Path
) -> None:
    """Scenario 1: right after a start the node cache is empty; that is not node loss."""
    with operator_serving(dev_cluster, namespace, tmp_path, "--metrics-port") as (operator, ports):
        (port,) = ports
        pods = training_job(clients, namespace, "steady")
        uids = {p.metadata.uid for p in pods}
        passes = "trainium_operator_reconciles_total"
        for _ in range(3):
            operator.kill()
            operator.start()
            # The new process's first pass over the job, with the node watch still filling, has
            # ended once a second one starts (a job's passes run one at a time); a pod event
            # asks for that second pass.
            wait_for(lambda: metric(port, passes), timeout=30, description="a first pass")
            poke = {"metadata": {"annotations": {"test.trainium.dev/poke": str(operator.starts)}}}
            clients.core.patch_namespaced_pod(pods[0].metadata.name, namespace, poke)
            wait_for(
                lambda: metric(port, passes),
                until=lambda n: n >= 2,
                timeout=30,
                description="a second pass of the restarted operator",
            )
        job = get_job(clients, namespace, "steady")
        assert job["status"]["restarts"]["total"] == 0
        assert job["status"]["attempt"] == 0
        assert {p.metadata.uid for p in job_pods(clients, namespace, "steady")} == uids
        finish_job(clients, namespace, "steady", pods)


def test_a_force_deleted_training_pod_restarts_the_whole_gang_not_one_rank(
    clients: Any, namespace: str, operator: OperatorView
) -> None:
    """Scenario 3: the vanished rank is not re-created alone beside the old survivors."""
    pods = training_job(clients, namespace, "gone")
    clients.core.delete_namespaced_pod(pods[1].metadata.name, namespace, grace_period_seconds=0)

    # Two attempts were never alive at once, and rank 1 of attempt 0 was never re-created.
    new = wait_next_gang_alone(clients, namespace, "gone")
    assert all(
        p.metadata.name != pods[1].metadata.name for p in job_pods(clients, namespace, "gone")
    )
    job = wait_phase(clients, namespace, "gone", "Training")
    # The watch may show the pod terminating before it is gone (PodDeleted) or only its removal
    # (PodVanished); either way the whole gang restarts, charged to infrastructure.
    assert job["status"]["lastFailure"]["reason"] in ("PodVanished", "PodDeleted")
    assert job["status"]["restarts"] == {"total": 1, "application": 0, "infrastructure": 1}
    assert "--resume" in new[0].spec.containers[0].command
    finish_job(clients, namespace, "gone", new)


def test_a_restart_never_runs_two_attempts_at_once_and_counts_once(
    clients: Any, namespace: str, own_operator: OperatorProcess
) -> None:
    """Scenario 2: the new attempt is recorded first and starts after the old gang is gone."""
    pods = start_training(clients, namespace, "once")
    finish_pods(clients, namespace, pods[:1], succeeded=False, exit_code=1)
    # The operator dies right after it decided the restart, and comes back.
    wait_attempt(clients, namespace, "once", 1)
    own_operator.kill()
    own_operator.start()

    new = wait_next_gang_alone(clients, namespace, "once")
    assert not job_pods(clients, namespace, "once", "train", 2)
    job = wait_phase(clients, namespace, "once", "Training")
    assert job["status"]["restarts"] == {"total": 1, "application": 1, "infrastructure": 0}
    finish_job(clients, namespace, "once", new)


def test_a_gang_recorded_by_an_operator_stopped_before_its_creates_starts_as_the_next_attempt(
    clients: Any, namespace: str, own_operator: OperatorProcess
) -> None:
    """The operator stores a gang's createdAttempt before its pods; one killed in between
    leaves that record and no pod. Its successor neither reuses the attempt nor reports a
    failure: the gang starts as attempt 1, with no Warning, charged to no budget."""
    own_operator.kill()
    create_job(clients, namespace, job_manifest("unsent", compile={"enabled": False}))
    # The status as the killed process left it: the record written, no pod created.
    clients.custom.patch_namespaced_custom_object_status(
        "trainium.dev",
        "v1alpha1",
        namespace,
        "trainingjobs",
        "unsent",
        {
            "status": {
                "phase": "Pending",
                "attempt": 0,
                "restarts": {"total": 0, "application": 0, "infrastructure": 0},
                "training": {"firstAttempt": 0, "createdAttempt": 0},
            }
        },
    )
    own_operator.start()
    pods = wait_gang_running(clients, namespace, "unsent", "train", 1)
    assert not job_pods(clients, namespace, "unsent", "train", 0), "the attempt was reused"
    job = get_job(clients, namespace, "unsent")
    assert job["status"]["restarts"] == {
        "total": 1,
        "application": 0,
        "infrastructure": 1,
        "unseenGang": 1,
    }
    assert "lastFailure" not in job["status"]
    assert "--resume" not in pods[0].spec.containers[0].command
    assert [e for e in job_events(clients, namespace, "unsent") if e[0] == "Warning"] == []
    assert events_with_reason(clients, namespace, "unsent", "GangNotFound")
    finish_job(clients, namespace, "unsent", pods)


def test_a_kubelet_admission_rejection_is_charged_as_infrastructure(
    clients: Any, namespace: str, operator: OperatorView
) -> None:
    """Scenario 8: OutOf<resource> is the node's doing, not the script's backoffLimit."""
    pods = start_training(clients, namespace, "refused", runPolicy={"backoffLimit": 0})
    simulate_pod_outcome(
        clients.core,
        namespace,
        pods[0].metadata.name,
        succeeded=False,
        # KWOK sets the reason on the container's termination; the kubelet puts it on the pod
        # status, which the operator reads first. Both count the same.
        exit_code=1,
        reason="OutOfaws.amazon.com/neuron",
        message="Node didn't have enough resource: aws.amazon.com/neuron",
    )
    new = wait_gang_running(clients, namespace, "refused", "train", 1)
    job = get_job(clients, namespace, "refused")
    assert job["status"]["restarts"] == {"total": 1, "application": 0, "infrastructure": 1}
    assert job["status"]["phase"] != "Failed"
    finish_job(clients, namespace, "refused", new)


def test_a_deleted_job_is_forgotten_by_the_work_queue(
    dev_cluster: Any, clients: Any, namespace: str, tmp_path: Path
) -> None:
    """Scenario 7: its pods' deletion events do not bring it back for every resync."""
    with operator_serving(dev_cluster, namespace, tmp_path, "--metrics-port") as (_, (port,)):
        start_training(clients, namespace, "brief")
        known = "trainium_operator_known_jobs"
        wait_for(lambda: metric(port, known), until=lambda n: n == 1, timeout=30, description="1")
        clients.custom.delete_namespaced_custom_object(
            "trainium.dev", "v1alpha1", namespace, "trainingjobs", "brief"
        )
        gone = "the job's pods garbage-collected"
        wait_running_gone(clients, namespace, "brief", gone, terminating_too=True)
        # The pod watch delivers in order: once the operator has seen a later job's pods run,
        # it has handled every deletion event of the old job's pods.
        start_training(clients, namespace, "later", nodes=1)
        wait_phase(clients, namespace, "later", "Training")
        assert metric(port, known) == 1, "the deleted job came back with its pods' events"


HELD = "held until the spec"


def holds_logged(operator: OperatorView, namespace: str) -> int:
    """Hold messages about jobs of `namespace` (the module's operator serves other tests too)."""
    return sum(1 for line in operator.log().splitlines() if HELD in line and namespace in line)


def test_a_missing_priority_class_is_reported_then_the_job_starts_once_the_class_exists(
    clients: Any, namespace: str, operator: OperatorView
) -> None:
    """Scenario 4: the admission refusal names its real cause, the job does not spin, and
    creating the PriorityClass lets it start at once (not at a timer)."""
    class_name = f"later-{namespace}"
    scheduling = {"queue": "test", "priorityClassName": class_name}
    create_job(clients, namespace, job_manifest("noclass", scheduling=scheduling))
    job = wait_reason(clients, namespace, "noclass", "PriorityClassNotFound")
    assert job["status"]["phase"] == "Pending"
    assert f"no PriorityClass with name {class_name}" in job["status"]["message"]
    (admitted,) = [c for c in job["status"]["conditions"] if c["type"] == "Admitted"]
    assert admitted["status"] == "False"
    events = [e for e in job_events(clients, namespace, "noclass") if e[1] == "PermissionDenied"]
    assert not events
    # A watch's first listing during the refused pass may cost one more try; then it is quiet.
    wait_for(lambda: holds_logged(operator, namespace), timeout=10, description="hold logged")
    time.sleep(4)
    tries = holds_logged(operator, namespace)
    time.sleep(8)
    assert "permission denied" not in operator.log()
    assert holds_logged(operator, namespace) == tries, "a held job was retried with nothing changed"

    body = {"metadata": {"name": class_name}, "value": 1000, "preemptionPolicy": "Never"}
    clients.scheduling.create_priority_class(body)
    try:
        started = time.monotonic()
        wait_for(
            lambda: job_pods(clients, namespace, "noclass"),
            until=lambda pods: len(pods) == 2,
            timeout=30,
            description="noclass pods created after the PriorityClass",
        )
        assert time.monotonic() - started < 30
        job = wait_for(
            lambda: get_job(clients, namespace, "noclass"),
            until=lambda j: any(
                c["type"] == "Admitted" and c["status"] == "True"
                for c in (j.get("status") or {}).get("conditions", [])
            ),
            timeout=30,
            description="noclass Admitted",
        )
    finally:
        clients.scheduling.delete_priority_class(class_name)


def test_a_resource_quota_refusal_is_held_until_the_quota_changes(
    clients: Any, namespace: str, operator: OperatorView
) -> None:
    quota = {"metadata": {"name": "two-pods"}, "spec": {"hard": {"pods": "1"}}}
    clients.core.create_namespaced_resource_quota(namespace, quota)
    wait_for(
        lambda: clients.core.read_namespaced_resource_quota("two-pods", namespace).status.hard,
        timeout=30,
        description="quota status",
    )
    create_job(clients, namespace, job_manifest("quota", compile={"enabled": False}))
    job = wait_reason(clients, namespace, "quota", "QuotaExceeded")
    assert "exceeded quota: two-pods" in job["status"]["message"]
    # The first pod's admission changes the quota's usage (one more try); then it is quiet.
    time.sleep(4)
    tries = holds_logged(operator, namespace)
    assert tries >= 1
    time.sleep(8)
    assert holds_logged(operator, namespace) == tries, "a held job was retried with nothing changed"

    clients.core.patch_namespaced_resource_quota(
        "two-pods", namespace, {"spec": {"hard": {"pods": "10"}}}
    )
    wait_for(
        lambda: job_pods(clients, namespace, "quota", "train"),
        until=lambda pods: len(pods) == 2,
        timeout=30,
        description="quota pods created after the quota was raised",
    )
    finish_job(
        clients, namespace, "quota", wait_gang_running(clients, namespace, "quota", "train", 0)
    )


def test_a_recreated_job_waits_for_its_predecessors_terminating_pod_instead_of_adopting_it(
    clients: Any, namespace: str, operator: OperatorView
) -> None:
    """A 409 AlreadyExists is success only for our own child."""
    old = start_training(clients, namespace, "twin")
    held = old[0].metadata.name
    hold = {"metadata": {"finalizers": ["sim.trainium.dev/hold"]}}
    clients.core.patch_namespaced_pod(held, namespace, hold)
    try:
        clients.custom.delete_namespaced_custom_object(
            "trainium.dev", "v1alpha1", namespace, "trainingjobs", "twin"
        )
        wait_for(
            lambda: clients.core.read_namespaced_pod(held, namespace),
            until=lambda p: p.metadata.deletion_timestamp is not None,
            timeout=60,
            description=f"{held} terminating",
        )
        wait_for(
            lambda: [p.metadata.name for p in job_pods(clients, namespace, "twin")],
            until=lambda names: names == [held],
            timeout=60,
            description="only the held pod left",
        )
        # One node: the held pod keeps the other busy, so Volcano admits the new gang and its
        # rank 0 meets the old rank 0's name.
        successor = job_manifest("twin", nodes=1, compile={"enabled": False})
        create_job(clients, namespace, successor)
        job = wait_reason(clients, namespace, "twin", "WaitingForPredecessor")
        assert held in job["status"]["message"]
    finally:
        clients.core.patch_namespaced_pod(held, namespace, {"metadata": {"finalizers": None}})
    new = wait_gang_running(clients, namespace, "twin", "train", 0, nodes=1)
    new_uid = get_job(clients, namespace, "twin")["metadata"]["uid"]
    assert all(p.metadata.owner_references[0].uid == new_uid for p in new)
    finish_job(clients, namespace, "twin", new)


def test_foreground_deletion_with_a_lost_node_does_not_hang(
    dev_cluster: Any, namespace: str, operator: OperatorView
) -> None:
    """The lost node's kubelet never confirms the delete: the operator force-deletes."""
    from trainium_devcluster.sim import node_is_ready, restore_node, simulate_node_loss

    clients = dev_cluster.clients
    pods = start_training(clients, namespace, "fg", runPolicy={"nodeLostGracePeriodSeconds": 3600})
    lost = pods[1].spec.node_name
    simulate_node_loss(clients.core, lost)
    try:
        wait_for(
            lambda: clients.api_client.sanitize_for_serialization(clients.core.read_node(lost)),
            until=lambda node: not node_is_ready(node),
            timeout=60,
            description=f"{lost} NotReady",
        )
        clients.custom.delete_namespaced_custom_object(
            "trainium.dev",
            "v1alpha1",
            namespace,
            "trainingjobs",
            "fg",
            body={"propagationPolicy": "Foreground"},
        )

        def gone() -> bool:
            try:
                get_job(clients, namespace, "fg")
            except Exception as error:
                return getattr(error, "status", None) == 404
            return False

        wait_for(gone, timeout=60, description="TrainingJob fg deleted (foreground)")
        assert not job_pods(clients, namespace, "fg")
    finally:
        restore_node(clients.core, lost)


def test_the_first_training_gang_after_a_compile_restart_starts_fresh(
    clients: Any, namespace: str, operator: OperatorView
) -> None:
    """Scenario 6: a compile-stage restart raises the attempt; training must not --resume."""
    create_job(clients, namespace, job_manifest("fresh"))
    compile_pods = wait_gang_running(clients, namespace, "fresh", "compile", 0)
    simulate_pod_outcome(
        clients.core, namespace, compile_pods[0].metadata.name,
        succeeded=False, exit_code=137, reason="Evicted", message="node pressure",
    )  # fmt: skip
    again = wait_gang_running(clients, namespace, "fresh", "compile", 1)
    finish_pods(clients, namespace, again)
    train = wait_gang_running(clients, namespace, "fresh", "train", 1)
    for pod in train:
        assert "--resume" not in pod.spec.containers[0].command
    job = get_job(clients, namespace, "fresh")
    assert job["status"]["restarts"] == {"total": 1, "application": 0, "infrastructure": 1}
    finish_job(clients, namespace, "fresh", train)


def test_a_restart_force_deletes_an_old_pod_stuck_terminating_on_a_ready_node_naming_it(
    clients: Any, namespace: str, operator: OperatorView
) -> None:
    """Issue 19 (7): a restart used to wait forever for an old pod whose kubelet never confirmed
    its deletion (here a finalizer keeps it Terminating on a Ready node)."""
    pods = start_training(
        clients,
        namespace,
        "stuck",
        runPolicy={"nodeLostGracePeriodSeconds": 0},
        podTemplate={"spec": {"terminationGracePeriodSeconds": 1}},
    )
    held = pods[1].metadata.name
    clients.core.patch_namespaced_pod(
        held, namespace, {"metadata": {"finalizers": ["sim.trainium.dev/hold"]}}
    )
    try:
        simulate_pod_outcome(
            clients.core, namespace, pods[0].metadata.name, succeeded=False, exit_code=1
        )
        job = wait_reason(clients, namespace, "stuck", "ForceDeletingOldGang")
        assert held in job["status"]["message"]
        assert job["status"]["phase"] == "Restarting"
        # Events are posted last in a pass, after the status and the force deletion it records.
        eventually(
            lambda: (
                ("Warning", "ForceDeletingOldGang")
                in [(kind, reason) for kind, reason, _ in job_events(clients, namespace, "stuck")]
            ),
            timeout=10,
            description="the ForceDeletingOldGang Warning",
        )
        assert (
            clients.core.read_namespaced_pod(held, namespace).metadata.deletion_grace_period_seconds
            == 0
        )
    finally:
        clients.core.patch_namespaced_pod(held, namespace, {"metadata": {"finalizers": None}})
    wait_gang_running(clients, namespace, "stuck", "train", 1)
    assert get_job(clients, namespace, "stuck")["status"]["restarts"]["total"] == 1


FOREIGN_SERVICE = {
    "metadata": {"name": "clash"},
    "spec": {"clusterIP": "None", "selector": {"app": "other"}, "ports": [{"port": 80}]},
}


@dataclass(frozen=True)
class CannotStart:
    """A job that cannot start: `waiting`, the reason and words of the Pending job before it
    fails, if it waits first; `failed`, the reason and words it fails with; `service`, a
    Service created before the job, kept as it was."""

    manifest: dict[str, Any]
    waiting: tuple[str, str] | None
    failed: tuple[str, str]
    service: dict[str, Any] | None = None


CANNOT_START = [
    pytest.param(
        CannotStart(
            job_manifest("badlabel", podMetadata={"labels": {"team": "not a valid value!"}}),
            None,
            ("InvalidPodSpec", "metadata.labels"),
            None,
        ),
        id="invalid-pass-through-field-with-the-api-servers-reason",
    ),
    # Scenario 5: Volcano's own words about the claim become the job's reason.
    pytest.param(
        CannotStart(
            job_manifest(
                "noclaim",
                storage={"claimName": "no-such-claim"},
                runPolicy={"startupTimeoutSeconds": 20},
            ),
            ("ClaimNotFound", "'no-such-claim' does not exist"),
            ("ClaimNotFound", "startupTimeoutSeconds (20s)"),
            None,
        ),
        id="missing-claim-named-then-failed-after-the-startup-timeout",
    ),
    # Issue 19 (7): a job used to wait forever behind a Service of its name that no
    # TrainingJob owns; that Service is kept.
    pytest.param(
        CannotStart(
            job_manifest(
                "clash", compile={"enabled": False}, runPolicy={"nodeLostGracePeriodSeconds": 0}
            ),
            ("WaitingForNameConflict", "Service {namespace}/clash"),
            ("NameConflict", "delete or rename that Service"),
            FOREIGN_SERVICE,
        ),
        id="unrelated-service-of-the-jobs-name-named-and-kept",
    ),
]


@pytest.mark.parametrize("case", CANNOT_START)
def test_a_job_that_cannot_start_fails_naming_its_cause(
    clients: Any, namespace: str, operator: OperatorView, case: CannotStart
) -> None:
    name = case.manifest["metadata"]["name"]
    if case.service is not None:
        clients.core.create_namespaced_service(namespace, case.service)
    create_job(clients, namespace, case.manifest)
    if case.waiting is not None:
        job = wait_reason(clients, namespace, name, case.waiting[0])
        assert job["status"]["phase"] == "Pending"
        assert case.waiting[1].format(namespace=namespace) in job["status"]["message"]
    job = wait_phase(clients, namespace, name, "Failed", timeout=60)
    assert job["status"]["reason"] == case.failed[0]
    assert case.failed[1] in job["status"]["message"]
    if case.service is not None:
        kept = clients.core.read_namespaced_service(case.service["metadata"]["name"], namespace)
        assert kept.spec.selector == case.service["spec"]["selector"]
