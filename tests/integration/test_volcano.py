"""What a Volcano user depends on, with the operator and the real Volcano v1.14.1 scheduler.

The session cluster has two trn1.32xlarge nodes; each job's pod takes a whole node (16 Neuron
devices, 8 EFA interfaces). Every test fails if the scheduler binds part of a gang, ignores a
queue's capability or orders jobs other than by priority.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from integration.operator_harness import (
    OperatorView,
    create_job,
    finish_pods,
    get_job,
    job_manifest,
    job_pods,
    wait_gang_running,
    wait_phase,
)
from trainium_devcluster import objects
from trainium_devcluster.sim import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]

VOLCANO = ("scheduling.volcano.sh", "v1beta1")


def train_only(name: str, **spec: Any) -> dict[str, Any]:
    return job_manifest(name, compile={"enabled": False}, **spec)


def bound_pods(clients: Any, namespace: str, name: str) -> int:
    return sum(
        1
        for p in job_pods(clients, namespace, name, "train")
        if p.spec.node_name and p.status.phase not in ("Succeeded", "Failed")
    )


def podgroup(clients: Any, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = clients.custom.get_namespaced_custom_object(
        *VOLCANO, namespace, "podgroups", name
    )
    return result


def watch_gangs(
    clients: Any, namespace: str, jobs: dict[str, int], seconds: float
) -> list[dict[str, int]]:
    """Samples each job's bound pod count for `seconds`; the caller checks the invariant."""
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples.append({name: bound_pods(clients, namespace, name) for name in jobs})
        time.sleep(0.25)
    return samples


# Volcano binds a gang's pods with one API call each, so a LIST can land between two binds.
BIND_WINDOW_SECONDS = 3.0


def assert_never_partial(timed: list[tuple[float, dict[str, int]]], jobs: dict[str, int]) -> None:
    """No two gangs hold nodes at once, and no gang stays part-bound beyond one bind window."""
    partial_since: dict[str, float] = {}
    for at, sample in timed:
        holding = [name for name in jobs if sample[name] > 0]
        assert len(holding) <= 1, f"two gangs hold nodes at once: {sample}"
        for name, size in jobs.items():
            if sample[name] in (0, size):
                partial_since.pop(name, None)
                continue
            since = partial_since.setdefault(name, at)
            assert at - since < BIND_WINDOW_SECONDS, (
                f"{name} stayed at {sample[name]}/{size} pods bound for {at - since:.1f} s"
            )


@contextlib.contextmanager
def cluster_object(create: Callable[[], Any], delete: Callable[[], Any]) -> Iterator[None]:
    create()
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            delete()


def test_a_gang_bigger_than_the_cluster_stays_queued_with_volcanos_event_and_the_shortfall(
    dev_cluster: Any, namespace: str, operator: OperatorView
) -> None:
    clients = dev_cluster.clients
    create_job(clients, namespace, train_only("big", nodes=3))

    job = wait_for(
        lambda: get_job(clients, namespace, "big"),
        until=lambda j: "gang needs 3" in ((j.get("status") or {}).get("message") or ""),
        timeout=60,
        description="TrainingJob big Pending/Queued naming the shortfall",
    )
    assert (job["status"]["phase"], job["status"]["reason"]) == ("Pending", "Queued")
    assert (
        "the cluster has 2 Ready trn1.32xlarge node(s) and the gang needs 3"
        in (job["status"]["message"])
    )
    # Volcano's own words stay on its PodGroup, which its enqueue action keeps Pending.
    events = wait_for(
        lambda: (
            clients.core.list_namespaced_event(
                namespace,
                field_selector="involvedObject.name=big-train,involvedObject.kind=PodGroup",
            ).items
        ),
        until=lambda items: any(e.reason == "Unschedulable" for e in items),
        timeout=30,
        description="Volcano's Unschedulable event on PodGroup big-train",
    )
    assert any("overused" in e.message or "unschedulable" in e.message for e in events)
    assert podgroup(clients, namespace, "big-train")["status"]["phase"] == "Pending"
    # The gang holds no pods while it waits: none bound, none Pending in etcd.
    samples = watch_gangs(clients, namespace, {"big": 3}, seconds=4)
    assert all(sample["big"] == 0 for sample in samples)
    assert job_pods(clients, namespace, "big") == []
    assert get_job(clients, namespace, "big")["status"]["phase"] == "Pending"


def test_a_queue_capability_holds_jobs_until_its_capacity_frees(
    dev_cluster: Any, namespace: str, operator: OperatorView
) -> None:
    clients = dev_cluster.clients
    queue_name = f"one-node-{namespace}"
    # Room for one trn1.32xlarge pod, although the cluster has two free nodes.
    queue = objects.volcano_queue(
        queue_name,
        reclaimable=False,
        capability={"aws.amazon.com/neuron": "16", "vpc.amazonaws.com/efa": "8"},
    )
    with cluster_object(
        lambda: clients.custom.create_cluster_custom_object(*VOLCANO, "queues", queue),
        lambda: clients.custom.delete_cluster_custom_object(*VOLCANO, "queues", queue_name),
    ):
        wait_for(
            lambda: clients.custom.get_cluster_custom_object(*VOLCANO, "queues", queue_name),
            until=lambda q: (q.get("status") or {}).get("state") == "Open",
            timeout=30,
            description=f"queue {queue_name} Open",
        )
        scheduling = {"queue": queue_name}
        create_job(clients, namespace, train_only("first", nodes=1, scheduling=scheduling))
        first = wait_gang_running(clients, namespace, "first", "train", 0, nodes=1)
        create_job(clients, namespace, train_only("second", nodes=1, scheduling=scheduling))
        create_job(clients, namespace, train_only("wide", nodes=2, scheduling=scheduling))

        held = wait_for(
            lambda: get_job(clients, namespace, "second"),
            until=lambda j: (j.get("status") or {}).get("reason") == "Queued",
            timeout=60,
            description="TrainingJob second held in its queue",
        )
        assert f"waiting in Volcano queue {queue_name!r}" in held["status"]["message"]
        samples = watch_gangs(clients, namespace, {"second": 1, "wide": 2}, seconds=4)
        assert all(s == {"second": 0, "wide": 0} for s in samples), samples[-1]
        assert podgroup(clients, namespace, "second-train")["status"]["phase"] == "Pending"
        # A job waiting in its queue holds its PodGroup only: no Pending pods in etcd.
        assert job_pods(clients, namespace, "second") == []
        assert job_pods(clients, namespace, "wide") == []

        finish_pods(clients, namespace, first)
        wait_phase(clients, namespace, "first", "Succeeded")
        second = wait_gang_running(clients, namespace, "second", "train", 0, nodes=1)
        # The job wider than the queue's capability never gets a pod bound.
        assert bound_pods(clients, namespace, "wide") == 0
        finish_pods(clients, namespace, second)
        wait_phase(clients, namespace, "second", "Succeeded")
        time.sleep(3)
        assert bound_pods(clients, namespace, "wide") == 0
        assert get_job(clients, namespace, "wide")["status"]["phase"] == "Pending"


def test_two_jobs_bigger_than_the_cluster_run_one_after_the_other_never_half_of_each(
    dev_cluster: Any, namespace: str, operator: OperatorView
) -> None:
    clients = dev_cluster.clients
    jobs = {"left": 2, "right": 2}
    for name in jobs:
        create_job(clients, namespace, train_only(name))

    timed: list[tuple[float, dict[str, int]]] = []

    def sample() -> dict[str, int]:
        counts = {name: bound_pods(clients, namespace, name) for name in jobs}
        timed.append((time.monotonic(), counts))
        return counts

    finished: list[str] = []
    deadline = time.monotonic() + 120
    while len(finished) < len(jobs):
        assert time.monotonic() < deadline, f"no progress: {timed[-1:]} finished {finished}"
        counts = sample()
        running = [n for n, size in jobs.items() if counts[n] == size and n not in finished]
        if running:
            # Both full gangs at once cannot fit on two nodes.
            assert len(running) == 1, counts
            (name,) = running
            pods = wait_gang_running(clients, namespace, name, "train", 0)
            watch_until = time.monotonic() + 2
            while time.monotonic() < watch_until:
                sample()
                time.sleep(0.25)
            finish_pods(clients, namespace, pods)
            wait_phase(clients, namespace, name, "Succeeded")
            finished.append(name)
        time.sleep(0.25)

    assert_never_partial(timed, jobs)
    assert sorted(finished) == sorted(jobs)


def test_a_higher_priority_job_is_admitted_before_a_lower_one_waiting_in_the_same_queue(
    dev_cluster: Any, namespace: str, operator: OperatorView
) -> None:
    clients = dev_cluster.clients
    suffix = uuid.uuid4().hex[:6]
    classes = {"low": (f"low-{suffix}", 10), "high": (f"high-{suffix}", 100000)}
    with contextlib.ExitStack() as stack:
        for name, value in classes.values():
            body = {"metadata": {"name": name}, "value": value, "preemptionPolicy": "Never"}
            stack.enter_context(
                cluster_object(
                    lambda body=body: clients.scheduling.create_priority_class(body),
                    lambda name=name: clients.scheduling.delete_priority_class(name),
                )
            )
        create_job(clients, namespace, train_only("blocker"))
        blocker = wait_gang_running(clients, namespace, "blocker", "train", 0)

        # The low-priority job waits first, the high-priority one arrives later.
        low = {"queue": "test", "priorityClassName": classes["low"][0]}
        create_job(clients, namespace, train_only("patient", scheduling=low))
        wait_for(
            lambda: get_job(clients, namespace, "patient"),
            until=lambda j: (j.get("status") or {}).get("phase") == "Pending",
            timeout=30,
            description="patient Pending",
        )
        time.sleep(3)
        high = {"queue": "test", "priorityClassName": classes["high"][0]}
        create_job(clients, namespace, train_only("urgent", scheduling=high))
        urgent_group = wait_for(
            lambda: podgroup(clients, namespace, "urgent-train"),
            timeout=30,
            description="PodGroup urgent-train",
        )
        assert urgent_group["spec"]["priorityClassName"] == classes["high"][0]
        time.sleep(3)
        # Neither fits while the blocker runs: both wait, the older one too.
        assert bound_pods(clients, namespace, "patient") == 0
        assert bound_pods(clients, namespace, "urgent") == 0

        finish_pods(clients, namespace, blocker)
        urgent = wait_gang_running(clients, namespace, "urgent", "train", 0)
        assert bound_pods(clients, namespace, "patient") == 0
        finish_pods(clients, namespace, urgent)
        patient = wait_gang_running(clients, namespace, "patient", "train", 0)
        finish_pods(clients, namespace, patient)
        wait_phase(clients, namespace, "patient", "Succeeded")
