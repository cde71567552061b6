"""Jobs queued by the real Kueue of the dev cluster (its pod webhook, scheduler and pod
controller; the kube-scheduler places what Kueue admits), driven by one operator with --kueue.

The dev cluster's ClusterQueue `trainium` holds the Trainium capacity of its nodes; each test
gets a LocalQueue `trainium` in its namespace. Tests here fill that quota on purpose, so they
run one after the other and each ends its jobs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from integration.operator_harness import (
    OperatorProcess,
    create_job,
    events_with_reason,
    finish_job,
    finish_pods,
    get_job,
    job_events,
    job_manifest,
    job_pods,
    kubectl,
    patch_job,
    supervised,
    wait_for,
    wait_gang_running,
    wait_phase,
    wait_reason,
)
from trainium_devcluster import kueue as dev_kueue
from trainium_devcluster.sim import node_is_ready, restore_node, simulate_node_loss
from trainium_operator.api import kueue

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]

ROOT = Path(__file__).resolve().parents[2]
QUEUE = dev_kueue.LOCAL_QUEUE


@pytest.fixture(scope="module")
def kueue_operator(
    dev_cluster: Any, crds: None, tmp_path_factory: Any
) -> Iterator[OperatorProcess]:
    """One operator with Kueue on for the module, watching its `tk-*` namespaces."""
    if not dev_kueue.api_installed(dev_cluster.clients):
        pytest.fail("the dev cluster runs no Kueue (trainium-operator dev up starts it)")
    proc = OperatorProcess(
        kubeconfig=Path(dev_cluster.kubeconfig),
        namespace="tk-*",
        log_path=tmp_path_factory.mktemp("kueue-operator") / "operator.log",
        extra_args=("--kueue",),
    )
    with supervised(proc):
        yield proc


@pytest.fixture
def queue_namespace(dev_cluster: Any, kueue_operator: OperatorProcess) -> Iterator[str]:
    from integration.operator_harness import ensure_shared_claim
    from trainium_devcluster import testing

    with testing.fresh_namespace(dev_cluster, prefix="tk-") as name:
        ensure_shared_claim(dev_cluster.clients, name)
        dev_kueue.ensure_local_queue(dev_cluster.clients, name, QUEUE)
        yield name
    assert "Traceback" not in kueue_operator.log(), kueue_operator.log()[-4000:]


def trainium_nodes(clients: Any) -> int:
    nodes = clients.core.list_node().items
    return sum(
        1
        for n in nodes
        if (n.metadata.labels or {}).get("node.kubernetes.io/instance-type") == "trn1.32xlarge"
        and node_is_ready(clients.api_client.sanitize_for_serialization(n))
        and not n.spec.unschedulable
    )


def kueue_manifest(name: str, *, priority: str | None = None, **spec: Any) -> dict[str, Any]:
    manifest = job_manifest(name, **{"compile": {"enabled": False}, **spec})
    labels = {kueue.QUEUE_NAME_LABEL: QUEUE}
    if priority:
        labels[kueue.PRIORITY_CLASS_LABEL] = priority
    manifest["metadata"]["labels"] = labels
    return manifest


def gated(pod: Any) -> bool:
    return any(g.name == kueue.ADMISSION_GATE for g in pod.spec.scheduling_gates or ())


def test_the_readme_job_runs_to_success_through_kueue_admitted_whole(
    dev_cluster: Any, queue_namespace: str
) -> None:
    """The README's TrainingJob with the queue label: each stage's gang is one Kueue pod group,
    admitted whole; `kubectl get tj` shows the queue and the admission."""
    clients, namespace = dev_cluster.clients, queue_namespace
    readme = (ROOT / "README.md").read_text()
    manifest = yaml.safe_load(re.search(r"```yaml\n(.*?)```", readme, re.S).group(1))  # type: ignore[union-attr]
    manifest["metadata"]["labels"] = {kueue.QUEUE_NAME_LABEL: QUEUE}
    manifest["spec"]["image"] = "example.com/trainium/training:test"
    manifest["spec"].pop("scheduling", None)
    manifest["spec"]["profile"].pop("s3Uri", None)
    name = manifest["metadata"]["name"]
    create_job(clients, namespace, manifest)

    compile_gang = wait_gang_running(clients, namespace, name, "compile", 0)
    group = dev_kueue.read_workload(clients.custom, namespace, f"{name}-compile-0")
    assert dev_kueue.condition(group, "Admitted")["status"] == "True"
    assert group["spec"]["podSets"][0]["count"] == 2, "one Workload holds the whole gang"
    assert all(p.spec.scheduler_name == "default-scheduler" for p in compile_gang)
    assert not any(gated(p) for p in compile_gang)
    assert all(kueue.MANAGED_FINALIZER in (p.metadata.finalizers or ()) for p in compile_gang)
    job = wait_phase(clients, namespace, name, "Compiling")
    assert job["status"]["queue"]["summary"] == f"kueue/{QUEUE}:Admitted"
    assert job["status"]["queue"]["clusterQueue"] == dev_kueue.CLUSTER_QUEUE
    table = kubectl(dev_cluster, namespace, "get", "tj", name).stdout
    assert "QUEUE" in table.splitlines()[0]
    assert f"kueue/{QUEUE}:Admitted" in table

    finish_pods(clients, namespace, compile_gang)
    train = wait_gang_running(clients, namespace, name, "train", 0)
    assert (
        dev_kueue.condition(
            dev_kueue.read_workload(clients.custom, namespace, f"{name}-train-0"), "Admitted"
        )["status"]
        == "True"
    )
    done = finish_job(clients, namespace, name, train)
    assert done["status"]["restarts"]["total"] == 0
    assert not [e for e in job_events(clients, namespace, name) if e[0] == "Warning"]


def test_a_gang_waits_behind_kueues_gate_for_quota_and_runs_when_the_first_ends(
    dev_cluster: Any, queue_namespace: str
) -> None:
    clients, namespace = dev_cluster.clients, queue_namespace
    nodes = trainium_nodes(clients)
    create_job(clients, namespace, kueue_manifest("first", nodes=nodes))
    first = wait_gang_running(clients, namespace, "first", "train", 0, nodes=nodes)

    create_job(clients, namespace, kueue_manifest("second", nodes=1))
    waiting = wait_reason(clients, namespace, "second", "Queued")
    assert waiting["status"]["phase"] == "Pending"
    assert f"waiting in Kueue LocalQueue '{QUEUE}'" in waiting["status"]["message"]
    held = wait_for(
        lambda: job_pods(clients, namespace, "second"),
        until=lambda pods: len(pods) == 1 and gated(pods[0]),
        timeout=30,
        description="the second job's pod created and held by Kueue's gate",
    )
    assert held[0].spec.node_name is None
    group = wait_for(
        lambda: dev_kueue.read_workload(clients.custom, namespace, "second-train-0"),
        until=lambda w: dev_kueue.condition(w, "QuotaReserved").get("status") == "False",
        timeout=30,
        description="the second job's Workload waiting for quota",
    )
    said = dev_kueue.condition(group, "QuotaReserved")["message"]
    assert said in get_job(clients, namespace, "second")["status"]["message"] or wait_for(
        lambda: get_job(clients, namespace, "second"),
        until=lambda job: said in job["status"]["message"],
        timeout=30,
        description="Kueue's words in the second job's status",
    )
    assert not [e for e in job_events(clients, namespace, "second") if e[0] == "Warning"]

    finish_job(clients, namespace, "first", first)
    second = wait_gang_running(clients, namespace, "second", "train", 0, nodes=1)
    finish_job(clients, namespace, "second", second)


def test_a_higher_priority_job_preempts_a_lower_which_requeues_on_no_budget(
    dev_cluster: Any, queue_namespace: str
) -> None:
    clients, namespace = dev_cluster.clients, queue_namespace
    nodes = trainium_nodes(clients)
    policy = {"infrastructureBackoffLimit": 0, "nodeLostGracePeriodSeconds": 5}
    create_job(
        clients, namespace, kueue_manifest("low", priority="low", nodes=nodes, runPolicy=policy)
    )
    wait_gang_running(clients, namespace, "low", "train", 0, nodes=nodes)
    wait_phase(clients, namespace, "low", "Training")

    create_job(clients, namespace, kueue_manifest("high", priority="high", nodes=nodes))
    high = wait_gang_running(clients, namespace, "high", "train", 0, nodes=nodes)
    low = wait_for(
        lambda: get_job(clients, namespace, "low"),
        until=lambda job: (
            (job["status"].get("restarts") or {}).get("preempted") == 1
            and job["status"].get("reason") == "Queued"
        ),
        timeout=60,
        description="the low-priority job preempted, restarted and queued again",
    )
    status = low["status"]
    assert status["phase"] == "Pending"
    assert status["restarts"]["infrastructure"] == 1  # spent no budget of 0
    assert status["lastFailure"]["reason"] == "WorkloadEvictedDueToPreempted"
    assert status["lastFailure"]["class"] == "Infrastructure"
    assert events_with_reason(clients, namespace, "low", "WorkloadEvictedDueToPreempted")

    finish_job(clients, namespace, "high", high)
    again = wait_gang_running(clients, namespace, "low", "train", 1, nodes=nodes)
    finish_job(clients, namespace, "low", again)


@pytest.mark.parametrize("route", ["kueue", "volcano"])
def test_a_failed_rank_restarts_the_gang_and_the_restart_time_is_measured(
    dev_cluster: Any, queue_namespace: str, route: str
) -> None:
    """Under Kueue the next attempt is a new Workload, queued and admitted again; the same
    restart under Volcano (its PodGroup stays admitted) is measured beside it."""
    clients, namespace = dev_cluster.clients, queue_namespace
    manifest = (
        kueue_manifest("flaky")
        if route == "kueue"
        else job_manifest("flaky", compile={"enabled": False})
    )
    create_job(clients, namespace, manifest)
    gang = wait_gang_running(clients, namespace, "flaky", "train", 0)
    wait_phase(clients, namespace, "flaky", "Training")
    failed_at = time.monotonic()
    finish_pods(clients, namespace, gang[:1], succeeded=False, exit_code=1)
    again = wait_gang_running(clients, namespace, "flaky", "train", 1)
    restart_seconds = time.monotonic() - failed_at
    print(f"{route} gang restart: rank failed -> new gang all Running in {restart_seconds:.2f} s")
    job = get_job(clients, namespace, "flaky")
    assert job["status"]["restarts"]["application"] == 1
    if route == "kueue":
        admitted = dev_kueue.condition(
            dev_kueue.read_workload(clients.custom, namespace, "flaky-train-1"), "Admitted"
        )
        assert admitted["status"] == "True"
    finish_job(clients, namespace, "flaky", again)


def test_a_lost_nodes_pods_are_force_deleted_despite_kueues_finalizer(
    dev_cluster: Any, queue_namespace: str
) -> None:
    clients, namespace = dev_cluster.clients, queue_namespace
    create_job(
        clients, namespace, kueue_manifest("lost", runPolicy={"nodeLostGracePeriodSeconds": 2})
    )
    gang = wait_gang_running(clients, namespace, "lost", "train", 0)
    lost = gang[1].spec.node_name
    assert kueue.MANAGED_FINALIZER in (gang[1].metadata.finalizers or ())
    simulate_node_loss(clients.core, lost)
    try:
        wait_for(
            lambda: job_pods(clients, namespace, "lost", "train", 0),
            until=lambda pods: gang[1].metadata.name not in [p.metadata.name for p in pods],
            timeout=90,
            description=f"{gang[1].metadata.name} on lost node {lost} gone (Kueue finalizer)",
        )
        job = get_job(clients, namespace, "lost")
        assert job["status"]["lastFailure"]["reason"] == "NodeLost"
    finally:
        restore_node(clients.core, lost)
    again = wait_gang_running(clients, namespace, "lost", "train", 1)
    finish_job(clients, namespace, "lost", again)


def test_a_suspended_kueue_job_frees_its_quota_and_queues_again_when_resumed(
    dev_cluster: Any, queue_namespace: str
) -> None:
    """As Kueue's own job types: suspending stops the gang and ends its Workload (the quota goes
    back to the queue); resuming queues the next attempt as a new Workload."""
    clients, namespace = dev_cluster.clients, queue_namespace
    nodes = trainium_nodes(clients)
    create_job(clients, namespace, kueue_manifest("pause", nodes=nodes))
    wait_gang_running(clients, namespace, "pause", "train", 0, nodes=nodes)
    patch_job(clients, namespace, "pause", {"spec": {"runPolicy": {"suspend": True}}})
    wait_phase(clients, namespace, "pause", "Suspended")
    wait_for(
        lambda: job_pods(clients, namespace, "pause"),
        until=lambda pods: not pods,
        timeout=60,
        description="the suspended job's pods gone (Kueue's finalizer lifted once they ended)",
    )
    # The quota is free: another job of the whole cluster is admitted and runs meanwhile.
    create_job(clients, namespace, kueue_manifest("other", nodes=nodes))
    other = wait_gang_running(clients, namespace, "other", "train", 0, nodes=nodes)
    patch_job(clients, namespace, "pause", {"spec": {"runPolicy": {"suspend": False}}})
    waiting = wait_reason(clients, namespace, "pause", "Queued")
    assert waiting["status"]["queue"]["workload"] == "pause-train-1"
    finish_job(clients, namespace, "other", other)
    resumed = wait_gang_running(clients, namespace, "pause", "train", 1, nodes=nodes)
    finish_job(clients, namespace, "pause", resumed)
