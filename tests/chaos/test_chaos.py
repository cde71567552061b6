"""Chaos suite: seeded, bounded fault injection on the real local cluster, invariants after every
step.

Two operator replicas run with kopf peering (one active, one standby; a short peering lifetime so
a crashed active one is replaced in seconds). Jobs run through compile, training and restarts
while a replica is SIGKILLed at random moments (at least 50 times; each restart takes a new random
priority, so the active one changes), the kube-apiserver crashes and comes back, pods are deleted
and force-deleted, PodGroups and Services are deleted by hand, training processes fail, a node is
lost and restored, and a ResourceQuota refuses pods for a while. After every step (and on every
poll while waiting) the invariants are checked:

- never two attempts' live pods of one job at once;
- a job's attempt number and restart count only grow, and each restart was counted
  (restarts.total == attempt for jobs that are never suspended);
- at the end every job reaches Succeeded/TrainingSucceeded (compile pods are evicted, not failed,
  and the limits are far above the faults injected), and the faults caused at least 5 restarts;
- after deletion nothing the jobs created is left;
- neither replica crashed or logged an unhandled exception.

`CHAOS_SEED` picks the run (default 20261201); `CHAOS_STEPS` its length. The report (kills,
faults, jobs, violations) is printed; any violation fails the test with the step that broke it.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from integration.operator_harness import (
    OperatorProcess,
    create_job,
    ensure_shared_claim,
    finish_pods,
    get_job,
    install_crds,
    job_manifest,
    job_pods,
    publish_report,
)
from trainium_operator.devcluster import cluster
from trainium_operator.devcluster.sim import (
    restore_node,
    simulate_node_loss,
    simulate_pod_outcome,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

SEED = int(os.environ.get("CHAOS_SEED", "20261201"))
STEPS = int(os.environ.get("CHAOS_STEPS", "110"))
MIN_KILLS = 50
VOLCANO = ("scheduling.volcano.sh", "v1beta1")
PEERING = "chaos"
PEERING_LIFETIME_SECONDS = 4


@pytest.fixture(scope="module", autouse=True)
def crds(dev_cluster: Any) -> None:
    install_crds(dev_cluster.clients)


@dataclass
class Ledger:
    """What the suite has seen so far, to check that things only move forward."""

    attempts: dict[str, int] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    step: str = "start"

    def violation(self, text: str) -> None:
        self.violations.append(f"[{self.step}] {text}")


def live_attempts(clients: Any, namespace: str, name: str) -> set[int]:
    return {
        int(p.metadata.labels["trainium.dev/attempt"])
        for p in job_pods(clients, namespace, name)
        if p.status.phase not in ("Succeeded", "Failed")
    }


def check(clients: Any, namespace: str, names: list[str], ledger: Ledger) -> None:
    for name in names:
        alive = live_attempts(clients, namespace, name)
        if len(alive) > 1:
            ledger.violation(f"{name}: pods of attempts {sorted(alive)} alive at once")
        try:
            status = get_job(clients, namespace, name).get("status") or {}
        except Exception:
            continue
        attempt = int(status.get("attempt", 0))
        total = int((status.get("restarts") or {}).get("total", 0))
        if attempt < ledger.attempts.get(name, 0):
            ledger.violation(f"{name}: attempt went down {ledger.attempts[name]} -> {attempt}")
        if total < ledger.restarts.get(name, 0):
            ledger.violation(f"{name}: restarts went down {ledger.restarts[name]} -> {total}")
        if "attempt" in status and total != attempt:
            ledger.violation(f"{name}: attempt {attempt} but {total} restarts counted")
        if alive and max(alive) < attempt and status.get("phase") not in ("Restarting", None):
            ledger.violation(f"{name}: live pods of attempt {max(alive)} below status {attempt}")
        ledger.attempts[name] = max(attempt, ledger.attempts.get(name, 0))
        ledger.restarts[name] = max(total, ledger.restarts.get(name, 0))


def watch(clients: Any, namespace: str, names: list[str], ledger: Ledger, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        check(clients, namespace, names, ledger)
        time.sleep(0.2)


def running_pods(clients: Any, namespace: str, names: list[str]) -> list[Any]:
    return [
        p
        for name in names
        for p in job_pods(clients, namespace, name)
        if p.status.phase == "Running" and p.metadata.deletion_timestamp is None
    ]


@dataclass
class Chaos:
    clients: Any
    cluster_name: str
    namespace: str
    replicas: list[OperatorProcess]
    names: list[str]
    rng: random.Random
    ledger: Ledger
    lost_node: str | None = None
    kills: int = 0

    def kill_operator(self) -> None:
        # At a random moment: often mid-reconcile, since every fault wakes the jobs. The
        # replica comes back with a new random priority, as a new pod of the Deployment would.
        time.sleep(self.rng.uniform(0.0, 0.8))
        replica = self.rng.choice(self.replicas)
        replica.kill()
        self.kills += 1
        time.sleep(self.rng.uniform(0.0, 0.5))
        replica.start()

    def restart_apiserver(self) -> None:
        cluster.restart_apiserver(self.cluster_name, downtime=self.rng.uniform(0.5, 3.0))

    def pick_pod(self) -> Any | None:
        pods = running_pods(self.clients, self.namespace, self.names)
        return self.rng.choice(pods) if pods else None

    def delete_pod(self) -> None:
        if pod := self.pick_pod():
            self.clients.core.delete_namespaced_pod(pod.metadata.name, self.namespace)

    def force_delete_pod(self) -> None:
        if pod := self.pick_pod():
            self.clients.core.delete_namespaced_pod(
                pod.metadata.name, self.namespace, grace_period_seconds=0
            )

    def fail_pod(self) -> None:
        """A training process exits non-zero; a compile pod is evicted (a compile failure would
        end the job, and the suite wants its jobs alive through the faults)."""
        if pod := self.pick_pod():
            compile_pod = pod.metadata.labels["trainium.dev/stage"] == "compile"
            simulate_pod_outcome(
                self.clients.core, self.namespace, pod.metadata.name, succeeded=False,
                exit_code=self.rng.choice([1, 137]),
                reason="Evicted" if compile_pod else "Error",
            )  # fmt: skip

    def finish_gang(self) -> None:
        """Progress: a job whose whole current gang runs finishes that stage."""
        name = self.rng.choice(self.names)
        status = get_job(self.clients, self.namespace, name).get("status") or {}
        attempt = str(status.get("attempt", 0))
        pods = [
            p
            for p in job_pods(self.clients, self.namespace, name)
            if p.metadata.labels["trainium.dev/attempt"] == attempt and p.status.phase == "Running"
        ]
        nodes = get_job(self.clients, self.namespace, name)["spec"]["nodes"]
        if len(pods) == nodes:
            finish_pods(self.clients, self.namespace, pods)

    def delete_podgroup(self) -> None:
        groups = self.clients.custom.list_namespaced_custom_object(
            *VOLCANO, self.namespace, "podgroups"
        )["items"]
        if groups:
            group = self.rng.choice(groups)["metadata"]["name"]
            self.clients.custom.delete_namespaced_custom_object(
                *VOLCANO, self.namespace, "podgroups", group
            )

    def delete_service(self) -> None:
        services = self.clients.core.list_namespaced_service(self.namespace).items
        if services:
            self.clients.core.delete_namespaced_service(
                self.rng.choice(services).metadata.name, self.namespace
            )

    def quota_for_a_while(self) -> None:
        quota = {"metadata": {"name": "chaos-quota"}, "spec": {"hard": {"pods": "0"}}}
        self.clients.core.create_namespaced_resource_quota(self.namespace, quota)
        watch(self.clients, self.namespace, self.names, self.ledger, self.rng.uniform(1, 3))
        self.clients.core.delete_namespaced_resource_quota("chaos-quota", self.namespace)

    def lose_node(self) -> None:
        if self.lost_node is not None:
            restore_node(self.clients.core, self.lost_node)
            self.lost_node = None
            return
        if pod := self.pick_pod():
            self.lost_node = pod.spec.node_name
            simulate_node_loss(self.clients.core, self.lost_node)

    def faults(self) -> list[tuple[str, Callable[[], None], int]]:
        return [
            ("kill-operator", self.kill_operator, 10),
            ("restart-apiserver", self.restart_apiserver, 1),
            ("finish-gang", self.finish_gang, 2),
            ("fail-pod", self.fail_pod, 3),
            ("delete-pod", self.delete_pod, 1),
            ("force-delete-pod", self.force_delete_pod, 1),
            ("delete-podgroup", self.delete_podgroup, 1),
            ("delete-service", self.delete_service, 1),
            ("quota", self.quota_for_a_while, 1),
            ("lose-or-restore-node", self.lose_node, 1),
        ]


@contextlib.contextmanager
def peered_replicas(
    dev_cluster: Any, namespace: str, tmp_path: Path
) -> Iterator[list[OperatorProcess]]:
    """Two replicas sharing a KopfPeering, each with a random priority (the CLI's default)."""
    clients = dev_cluster.clients
    ensure_shared_claim(clients, namespace)
    peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": PEERING}}
    clients.custom.create_namespaced_custom_object(
        "kopf.dev", "v1", namespace, "kopfpeerings", peering
    )
    args = ("--peering", PEERING, "--peering-lifetime", str(PEERING_LIFETIME_SECONDS))
    replicas = [
        OperatorProcess(
            Path(dev_cluster.kubeconfig), namespace, tmp_path / f"replica-{i}.log", extra_args=args
        )
        for i in range(2)
    ]
    for replica in replicas:
        replica.start()
    try:
        yield replicas
    finally:
        alive = [r.process is not None and r.process.poll() is None for r in replicas]
        for replica in replicas:
            replica.stop()
        for replica in replicas:
            print(replica.log()[-3000:])
    assert all(alive), "a replica crashed during the suite"
    for replica in replicas:
        assert "Traceback" not in replica.log(), "a replica logged an unhandled exception"


def test_invariants_hold_under_seeded_faults(
    dev_cluster: Any, namespace: str, tmp_path: Path
) -> None:
    clients = dev_cluster.clients
    rng = random.Random(SEED)
    ledger = Ledger()
    limits = {
        "backoffLimit": 100,
        "infrastructureBackoffLimit": 100,
        "nodeLostGracePeriodSeconds": 3,
    }
    jobs = {
        "c-one": job_manifest("c-one", nodes=1, runPolicy=limits),
        "c-two": job_manifest("c-two", nodes=1, runPolicy=limits),
        "t-one": job_manifest("t-one", nodes=1, compile={"enabled": False}, runPolicy=limits),
    }
    names = list(jobs)
    started = time.monotonic()
    with peered_replicas(dev_cluster, namespace, tmp_path) as replicas:
        for manifest in jobs.values():
            create_job(clients, namespace, manifest)
        chaos = Chaos(clients, dev_cluster.name, namespace, replicas, names, rng, ledger)
        faults = chaos.faults()
        weights = [w for _, _, w in faults]
        for index in range(STEPS):
            label, inject, _ = rng.choices(faults, weights=weights)[0]
            ledger.step = f"step {index} {label}"
            ledger.faults[label] += 1
            try:
                inject()
            except Exception as error:  # a fault racing a deletion is fine; note it
                ledger.faults[
                    f"{label} (raced: {getattr(error, 'status', type(error).__name__)})"
                ] += 1
            watch(clients, namespace, names, ledger, rng.uniform(0.3, 1.5))
        while chaos.kills < MIN_KILLS:
            ledger.step = f"extra kill {chaos.kills}"
            chaos.kill_operator()
            watch(clients, namespace, names, ledger, 0.5)
        if chaos.lost_node is not None:
            restore_node(clients.core, chaos.lost_node)
        ledger.step = "drive to the end"
        # Every job reaches Succeeded: finish whatever gang runs, no more faults.
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            phases = {
                n: (get_job(clients, namespace, n).get("status") or {}).get("phase") for n in names
            }
            if all(p in ("Succeeded", "Failed") for p in phases.values()):
                break
            chaos.finish_gang()
            watch(clients, namespace, names, ledger, 0.5)
        for name in names:
            status = get_job(clients, namespace, name).get("status") or {}
            want = ("Succeeded", "TrainingSucceeded")
            if (status.get("phase"), status.get("reason")) != want:
                ledger.violation(
                    f"{name} ended {status.get('phase')}/{status.get('reason')}, expected "
                    f"{want[0]}/{want[1]}: {status.get('message')}"
                )
        ledger.step = "delete"
        for name in names:
            clients.custom.delete_namespaced_custom_object(
                "trainium.dev", "v1alpha1", namespace, "trainingjobs", name
            )

        def leftovers() -> list[str]:
            pods = [p.metadata.name for p in clients.core.list_namespaced_pod(namespace).items]
            services = [
                s.metadata.name for s in clients.core.list_namespaced_service(namespace).items
            ]
            groups = clients.custom.list_namespaced_custom_object(*VOLCANO, namespace, "podgroups")
            return pods + services + [g["metadata"]["name"] for g in groups["items"]]

        try:
            wait_for(leftovers, until=lambda left: not left, timeout=90, description="no orphans")
        except Exception as error:
            ledger.violation(f"orphans after deletion: {error}")
        restarts = dict(ledger.restarts)
    report: list[str] = []
    report.append(f"chaos suite: seed {SEED}, {STEPS} steps, {time.monotonic() - started:.0f} s")
    report.append(
        f"  replicas              2 (kopf peering, lifetime {PEERING_LIFETIME_SECONDS} s)"
    )
    report.append(f"  operator kills        {chaos.kills}")
    for label, count in sorted(ledger.faults.items()):
        report.append(f"  {label:<21} {count}")
    report.append(f"  jobs                  {len(names)} (restarts seen: {restarts})")
    report.append(f"  violations            {len(ledger.violations)}")
    publish_report("chaos", report)
    assert chaos.kills >= MIN_KILLS
    # Not vacuous: the faults did restart gangs, and each restart was counted (checked above).
    assert sum(restarts.values()) >= 5, restarts
    assert not ledger.violations, "\n".join(ledger.violations[:20])
