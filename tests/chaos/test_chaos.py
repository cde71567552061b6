"""Chaos suite: seeded, bounded fault injection on the real local cluster, invariants after every
step.

Two operator replicas run with kopf peering (one active, one standby; a short peering lifetime so a
crashed active one is replaced in seconds). One-node, two-node and four-node jobs run through
compile, training and restarts while a replica is SIGKILLed at random moments (at least 50 times,
at least 25 of them the acting replica; while a standby takes over, the kill hits it or the
restarted one; each restart takes a new random priority, so the active one changes), the kube-
apiserver crashes and comes back, pods are deleted and force-deleted, PodGroups and Services are
deleted by hand, training processes fail, a ResourceQuota refuses the jobs' pods for a while, and
nodes are partitioned: a node's heartbeat stops (its Lease is taken over, as when the kubelet is
cut off), the control plane marks it NotReady while its pods stay Running in the API (nothing acts
for an unreachable node), and it comes back once the operator has given up on those pods. A second
quota refuses every profile-upload pod for the whole run (a side pod's refusal), and two control
jobs run beside the others that no fault targets (they are only finished).

The cluster gets `EXTRA_NODES` more nodes for this module (removed after it), so every gang fits
while one node is partitioned. After every step, and on every poll while waiting, the checks of
`checks.py` run on what the poll saw:

- a (job, stage, attempt, rank) that was ever scheduled is never re-created as another pod, and
  never two attempts' live pods of one job at once (two gangs never write to one attempt);
- a job's attempt and restart counts only grow, each restart is counted once
  (restarts.total == attempt), and a job that trained never goes back to Pending in the attempt;
- a partitioned node's pods stay Running while it is unreachable, are gone within
  `PARTITION_TIMEOUT_SECONDS` of it going NotReady, and the gang restarted as a new attempt;

and at the end:

- every job is Succeeded/TrainingSucceeded, including the one whose uploads were all refused
  (their refusal shows only as `status.profile.upload` Failed and a ProfileUploadFailed Warning);
- each job's newest events carry its final reason (an event older than the state it describes
  is a violation, and so are ties to the second with one: kubectl may list either last);
- the control jobs have no Warning event at all;
- the faults restarted at least 5 gangs, multi-node gangs of 2 and 4 nodes ran, partitions
  happened and upload pods were refused (so no check passed for want of its case);
- after deletion nothing the jobs created is left, and neither replica crashed or logged an
  unhandled exception.

`CHAOS_SEED` picks the run (default 20261201); `CHAOS_STEPS` its length. The report (kills,
faults, gangs, partitions, refusals, violations) is printed and published; any violation fails
the test with the step that broke it.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiException

from chaos.checks import (
    EventSeen,
    Ledger,
    PodSeen,
    check_pods,
    check_status,
    final_event_violations,
    live_attempts,
    refused_uploads,
    side_pod_refusal_violations,
    warning_violations,
)
from integration.operator_harness import (
    GROUP,
    PLURAL,
    VERSION,
    OperatorProcess,
    create_job,
    create_peering,
    ensure_shared_claim,
    install_crds,
    job_manifest,
    publish_report,
)
from trainium_devcluster import cluster, stages, testing
from trainium_devcluster import kueue as dev_kueue
from trainium_devcluster.sim import (
    WaitTimeoutError,
    node_is_ready,
    restore_node,
    simulate_node_loss,
    simulate_pod_outcome,
    wait_for,
)
from trainium_operator.api import kueue

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

SEED = int(os.environ.get("CHAOS_SEED", "20261201"))
STEPS = int(os.environ.get("CHAOS_STEPS", "80"))
MIN_KILLS = 50
# Of those, kills of the replica acting at that moment (the others hit a standby, often the one
# about to take over): the extra kills go on until both counts are reached.
MIN_ACTING_KILLS = 25
VOLCANO = ("scheduling.volcano.sh", "v1beta1")
PEERING = "chaos"
PEERING_LIFETIME_SECONDS = 4
# A replica is never killed during its imports, so the kills wait for a restarted one to start
# up: with two replicas that sets the pace of the kills past the seeded steps.
REPLICAS = 2
STARTUP_TIMEOUT_SECONDS = 30
NODE_LOST_GRACE_SECONDS = 3
# Every gang at once (1+1+1+2+4 targeted, 1+2 control) plus a partitioned node and one spare.
EXTRA_NODES = 12
# The faults that target pods only hit jobs of this PriorityClass (value 0, the default's), so
# a quota scoped to it refuses their pods and never the control jobs'.
TARGET_PRIORITY_CLASS = "chaos-target"
TARGET_QUOTA = "chaos-quota"
# Upload pods are the only pods with activeDeadlineSeconds, so a quota on the Terminating scope
# refuses exactly them; the API server's ResourceQuota admission enforces it.
UPLOAD_QUOTA = "chaos-no-upload-pods"
CONTROL_JOBS = ("ctl-one", "ctl-two")
# Queued by the dev cluster's real Kueue (the label kueue.x-k8s.io/queue-name), one targeted by
# the faults and one control job; the others by Volcano. The replicas run with --kueue.
KUEUE_JOBS = ("c-two", "ctl-two")
UPLOAD_JOB = "p-two"
# The node lifecycle controller marks a node whose Lease stopped NotReady after its monitor
# grace period; the operator gives up on its pods `nodeLostGracePeriodSeconds` later. Past this
# (counted from NotReady) the partitioned pods still existing is a violation.
# Both bounds have room for a loaded machine: CI runs this suite on 2 cores beside the other
# tests' session, and a killed operator's standby takes over only after its peering lifetime.
PARTITION_TIMEOUT_SECONDS = 75
# The margin covers the controller's 5 s monitor period and a loaded machine (CI runs this suite
# beside the other tests on 2 cores: 20 s once fell short).
NOT_READY_TIMEOUT_SECONDS = stages.NODE_MONITOR_GRACE_PERIOD_MS / 1000 + 60


@pytest.fixture(scope="module", autouse=True)
def crds(dev_cluster: Any) -> None:
    install_crds(dev_cluster.clients)


@pytest.fixture(scope="module", autouse=True)
def chaos_nodes(dev_cluster: Any) -> Iterator[list[str]]:
    with testing.extra_nodes(dev_cluster, EXTRA_NODES) as names:
        yield names


@pytest.fixture(scope="module", autouse=True)
def target_priority_class(dev_cluster: Any) -> Iterator[str]:
    from kubernetes import client

    scheduling = client.SchedulingV1Api(dev_cluster.clients.api_client)
    body = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": TARGET_PRIORITY_CLASS},
        "value": 0,
        "description": "chaos suite: the jobs its faults target",
    }
    with contextlib.suppress(client.ApiException):
        scheduling.create_priority_class(body)
    yield TARGET_PRIORITY_CLASS
    scheduling.delete_priority_class(TARGET_PRIORITY_CLASS)


def target_quota() -> dict[str, Any]:
    selector = {"scopeName": "PriorityClass", "operator": "In", "values": [TARGET_PRIORITY_CLASS]}
    return {
        "metadata": {"name": TARGET_QUOTA},
        "spec": {"hard": {"pods": "0"}, "scopeSelector": {"matchExpressions": [selector]}},
    }


def upload_quota() -> dict[str, Any]:
    return {
        "metadata": {"name": UPLOAD_QUOTA},
        "spec": {"hard": {"pods": "0"}, "scopes": ["Terminating"]},
    }


def chaos_jobs() -> dict[str, dict[str, Any]]:
    limits = {
        "backoffLimit": 100,
        "infrastructureBackoffLimit": 100,
        "nodeLostGracePeriodSeconds": NODE_LOST_GRACE_SECONDS,
    }
    target = {"priorityClassName": TARGET_PRIORITY_CLASS}
    no_compile = {"enabled": False}
    profile = {"enabled": True, "startStep": 1, "endStep": 4, "s3Uri": "s3://chaos/profiles"}
    manifests = [
        job_manifest("c-one", nodes=1, runPolicy=limits, scheduling=target),
        job_manifest("c-two", nodes=1, runPolicy=limits, scheduling=target),
        job_manifest("t-one", nodes=1, compile=no_compile, runPolicy=limits, scheduling=target),
        job_manifest("m-four", nodes=4, runPolicy=limits, scheduling=target),
        job_manifest(
            UPLOAD_JOB,
            nodes=2,
            compile=no_compile,
            profile=profile,
            runPolicy=limits,
            scheduling=target,
        ),
        job_manifest("ctl-one", nodes=1, runPolicy=limits),
        job_manifest("ctl-two", nodes=2, compile=no_compile, runPolicy=limits),
    ]
    for manifest in manifests:
        if manifest["metadata"]["name"] in KUEUE_JOBS:
            manifest["metadata"]["labels"] = {kueue.QUEUE_NAME_LABEL: dev_kueue.LOCAL_QUEUE}
    return {m["metadata"]["name"]: m for m in manifests}


@dataclass
class Snapshot:
    """One poll: every pod of the namespace and every job's status, read before the pods (never
    newer than them) and again after (never older)."""

    pods: list[PodSeen]
    statuses: dict[str, dict[str, Any]]
    statuses_after: dict[str, dict[str, Any]]


@dataclass
class Partition:
    node: str
    pods: dict[str, PodSeen]  # uid -> the live pod on the node when it was cut off
    started: float
    # When the node lifecycle controller could last begin counting the missing heartbeat: an
    # API server restart or a relaunched controller manager starts its grace period again.
    counted_from: float = 0.0
    not_ready_at: float | None = None
    gone_at: float | None = None
    healed_at: float | None = None
    changed: set[str] = field(default_factory=set)  # uids already reported
    # Pods seen Running but not Ready while the node was NotReady: what an unreachable
    # node's pods look like (the node lifecycle controller clears Ready, nothing ends them).
    running_unready: set[str] = field(default_factory=set)
    # Jobs whose pods the scheduler placed on the node after it was cut off (it stays Ready
    # until its heartbeat is missed): the partition hit them too, control jobs included.
    placed_after: set[str] = field(default_factory=set)
    # The wall clock at `started`: the replicas' log lines carry it.
    started_wall: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass
class Chaos:
    clients: Any
    cluster_name: str
    namespace: str
    replicas: list[OperatorProcess]
    nodes_of: dict[str, int]
    rng: random.Random
    ledger: Ledger
    kills: int = 0
    acting_kills: int = 0  # of these, kills of the replica that was acting
    partition: Partition | None = None
    partitions: list[Partition] = field(default_factory=list)
    control_plane: dict[str, Any] = field(default_factory=dict)  # how to start each again
    seconds: dict[str, float] = field(default_factory=dict)  # wall time of each phase
    # Wall time of the seeded steps by fault (the injection and the watch after it), and the
    # part of the kills spent waiting for a replica to finish starting: where the suite's time
    # goes.
    step_seconds: Counter[str] = field(default_factory=Counter)
    startup_wait_seconds: float = 0.0
    # Nodes seen NotReady with no partition on them: KWOK's lease renewals sometimes stall
    # past the grace period after an API server restart, and such a node's NodeLost is true.
    not_ready_unasked: set[str] = field(default_factory=set)

    @property
    def names(self) -> list[str]:
        return list(self.nodes_of)

    @property
    def targets(self) -> list[str]:
        return [n for n in self.nodes_of if n not in CONTROL_JOBS]

    # --- observing ---------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        # Two lists are two moments. A check that a live pod is not behind its job's attempt
        # needs a status no newer than the pods (else the operator may have deleted the pod and
        # moved on in between); one that a lost pod's job moved on needs a status no older.
        before = self.statuses()
        pods = [
            seen
            for pod in self.clients.core.list_namespaced_pod(self.namespace).items
            if (seen := PodSeen.of(pod)) is not None
        ]
        return Snapshot(pods, before, self.statuses())

    def statuses(self) -> dict[str, dict[str, Any]]:
        jobs = self.clients.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL
        )["items"]
        return {j["metadata"]["name"]: j.get("status") or {} for j in jobs}

    def check(self) -> Snapshot:
        seen = self.snapshot()
        check_pods(seen.pods, self.nodes_of, self.ledger)
        for name, status in seen.statuses.items():
            check_status(name, status, live_attempts(seen.pods, name), self.ledger)
        self.advance_partition(seen)
        self.note_nodes_not_ready()
        return seen

    def note_nodes_not_ready(self) -> None:
        cut_off = self.partition.node if self.partition else None
        serialise = self.clients.api_client.sanitize_for_serialization
        for node in self.clients.core.list_node().items:
            if node.metadata.name != cut_off and not node_is_ready(serialise(node)):
                self.not_ready_unasked.add(node.metadata.name)

    def watch(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.check()
            time.sleep(0.2)
        # A controller manager that exited after an API server restart takes the node
        # lifecycle controller with it: nodes would never turn NotReady again.
        for component in cluster.relaunch_exited(self.cluster_name, self.control_plane):
            self.ledger.faults[f"{component} restarted"] += 1
            self.restart_node_monitor_clock()

    def restart_node_monitor_clock(self) -> None:
        if self.partition is not None and self.partition.not_ready_at is None:
            self.partition.counted_from = time.monotonic()

    def running(self, names: list[str], seen: Snapshot | None = None) -> list[PodSeen]:
        seen = seen or self.snapshot()
        cut_off = self.partition.node if self.partition else None
        return [
            p
            for p in seen.pods
            if p.job in names
            and p.attempt is not None
            and p.phase == "Running"
            and not p.deleting
            and p.node != cut_off
        ]

    def pick_pod(self) -> PodSeen | None:
        """A running pod of a targeted job, off the partitioned node (nothing acts there)."""
        pods = self.running(self.targets)
        return self.rng.choice(pods) if pods else None

    # --- faults --------------------------------------------------------------------------------

    def kill_operator(self) -> None:
        # At a random moment: often mid-reconcile, since every fault wakes the jobs. The
        # replica comes back with a new random priority, as a new pod of the Deployment would.
        time.sleep(self.rng.uniform(0.0, 0.8))
        # Never during its imports (seconds on a busy machine): a kill there interrupts no
        # work, and kills that fast in a row leave no replica running at all.
        started = [r for r in self.replicas if r.started_up()]
        # The acting replica when one acts (killed mid-reconcile); during a takeover, the one
        # taking over or the restarted one, at whatever point of its start-up it has reached.
        acting = [r for r in started if r.acting()]
        replica = self.rng.choice(acting or started or self.replicas)
        if not started:
            waiting = time.monotonic()
            with contextlib.suppress(WaitTimeoutError):
                wait_for(
                    replica.started_up,
                    timeout=STARTUP_TIMEOUT_SECONDS,
                    description="replica started",
                    interval=0.1,
                )
            self.startup_wait_seconds += time.monotonic() - waiting
        self.acting_kills += replica.acting()
        replica.kill()
        self.kills += 1
        time.sleep(self.rng.uniform(0.0, 0.5))
        replica.start()

    def restart_apiserver(self) -> None:
        cluster.restart_apiserver(self.cluster_name, downtime=self.rng.uniform(0.5, 3.0))
        self.restart_node_monitor_clock()

    def delete_pod(self) -> None:
        if pod := self.pick_pod():
            self.clients.core.delete_namespaced_pod(pod.name, self.namespace)

    def force_delete_pod(self) -> None:
        if pod := self.pick_pod():
            self.clients.core.delete_namespaced_pod(
                pod.name, self.namespace, grace_period_seconds=0
            )

    def fail_pod(self) -> None:
        """A training process exits non-zero; a compile pod is evicted (a compile failure would
        end the job, and the suite wants its jobs alive through the faults)."""
        if pod := self.pick_pod():
            simulate_pod_outcome(
                self.clients.core, self.namespace, pod.name, succeeded=False,
                exit_code=self.rng.choice([1, 137]),
                reason="Evicted" if pod.stage == "compile" else "Error",
            )  # fmt: skip

    def finish_gang(self, name: str | None = None) -> None:
        """Progress: a job whose whole current gang runs finishes that stage, its ranks a
        moment apart (as real ranks end), so the operator sees some done and some running."""
        name = name or self.rng.choice(self.names)
        seen = self.snapshot()
        attempt = int(seen.statuses.get(name, {}).get("attempt", 0))
        pods = [p for p in self.running([name], seen) if p.attempt == attempt]
        one_stage = len({p.stage for p in pods}) == 1
        # A pod already told how to end (a failure injected, or finishing) is left to it.
        untouched = all(p.outcome is None for p in pods)
        if pods and one_stage and untouched and len(pods) == self.nodes_of[name]:
            for pod in pods:
                simulate_pod_outcome(
                    self.clients.core, self.namespace, pod.name, succeeded=True,
                    after=self.rng.uniform(0.0, 1.5) if len(pods) > 1 else None,
                )  # fmt: skip

    def _targeted(self, items: list[Any], labels: Callable[[Any], dict[str, str]]) -> list[Any]:
        return [i for i in items if (labels(i) or {}).get("trainium.dev/job-name") in self.targets]

    def delete_podgroup(self) -> None:
        groups = self.clients.custom.list_namespaced_custom_object(
            *VOLCANO, self.namespace, "podgroups"
        )["items"]
        groups = self._targeted(groups, lambda g: g["metadata"].get("labels"))
        if groups:
            group = self.rng.choice(groups)["metadata"]["name"]
            self.clients.custom.delete_namespaced_custom_object(
                *VOLCANO, self.namespace, "podgroups", group
            )

    def delete_service(self) -> None:
        services = self.clients.core.list_namespaced_service(self.namespace).items
        services = self._targeted(services, lambda s: s.metadata.labels)
        if services:
            self.clients.core.delete_namespaced_service(
                self.rng.choice(services).metadata.name, self.namespace
            )

    def quota_for_a_while(self) -> None:
        self.clients.core.create_namespaced_resource_quota(self.namespace, target_quota())
        try:
            self.watch(self.rng.uniform(1, 3))
        finally:
            self.clients.core.delete_namespaced_resource_quota(TARGET_QUOTA, self.namespace)

    def partition_node(self) -> None:
        """Cuts a node of a targeted job off: its heartbeat stops; `advance_partition` brings
        it back once the operator has given up on its pods (or the timeout says it did not)."""
        seen = self.snapshot()
        pods = self.running(self.targets, seen)
        if not pods:
            self.ledger.faults["partition-node (no running pod)"] += 1
            return
        node = self.rng.choice(pods).node
        assert node is not None
        on_node = {p.uid: p for p in seen.pods if p.node == node and p.live}
        if any(p.job in CONTROL_JOBS for p in on_node.values()):
            return
        # KWOK plays a stage it queued before the cut (a pod told to end, one about to run)
        # after it, as no cut-off kubelet could report: cut only a node whose pods are settled.
        if any(p.phase != "Running" or p.outcome is not None for p in on_node.values()):
            self.ledger.faults["partition-node (a pod about to change)"] += 1
            return
        simulate_node_loss(self.clients.core, node)
        now = time.monotonic()
        self.partition = Partition(node, on_node, now, counted_from=now)

    def advance_partition(self, seen: Snapshot) -> None:
        part = self.partition
        if part is None:
            return
        now = time.monotonic()
        if part.not_ready_at is None:
            node = self.clients.core.read_node(part.node)
            if not node_is_ready(self.clients.api_client.sanitize_for_serialization(node)):
                part.not_ready_at = now
            elif now - part.counted_from > NOT_READY_TIMEOUT_SECONDS:
                self.ledger.violation(
                    f"partition of {part.node}: still Ready {now - part.started:.0f} s after "
                    f"its heartbeat stopped ({now - part.counted_from:.0f} s since the control "
                    "plane last restarted)"
                )
                self.heal(now)
                return
        part.placed_after |= {
            p.job for p in seen.pods if p.node == part.node and p.live and p.uid not in part.pods
        }
        present = [p for p in seen.pods if p.uid in part.pods]
        for pod in present:
            if part.not_ready_at is not None and pod.phase == "Running" and not pod.ready:
                part.running_unready.add(pod.uid)
            # Nothing acts for an unreachable node: its pods stay Running in the API until
            # the operator deletes them.
            if pod.phase != "Running" and pod.uid not in part.changed:
                part.changed.add(pod.uid)
                self.ledger.violation(
                    f"partition of {part.node}: pod {pod.name} turned {pod.phase} while its "
                    "node was unreachable"
                )
        if not present and part.gone_at is None:
            part.gone_at = now
        if part.not_ready_at is None:
            return
        not_ready_for = now - part.not_ready_at
        if part.gone_at is not None and not_ready_for >= NODE_LOST_GRACE_SECONDS + 1:
            self.heal(now, seen)
        elif not_ready_for > PARTITION_TIMEOUT_SECONDS:
            self.ledger.violation(
                f"partition of {part.node}: pods {sorted(p.name for p in present)} still exist "
                f"{not_ready_for:.0f} s after the node went NotReady "
                f"(nodeLostGracePeriodSeconds {NODE_LOST_GRACE_SECONDS})"
            )
            self.heal(now, seen)

    def heal(self, now: float, seen: Snapshot | None = None) -> None:
        part = self.partition
        if part is None:
            return
        restore_node(self.clients.core, part.node)
        part.healed_at = now
        self.partitions.append(part)
        self.partition = None
        for pod in part.pods.values():
            status = seen.statuses_after.get(pod.job, {}) if seen else {}
            if status and pod.attempt is not None and int(status.get("attempt", 0)) <= pod.attempt:
                self.ledger.violation(
                    f"partition of {part.node}: {pod.job} still at attempt {status.get('attempt')}"
                    f" after its pod {pod.name} was lost with the node"
                )

    def faults(self) -> list[tuple[str, Callable[[], None], int]]:
        return [
            ("kill-operator", self.kill_operator, 10),
            ("restart-apiserver", self.restart_apiserver, 1),
            ("finish-gang", self.finish_gang, 3),
            ("fail-pod", self.fail_pod, 3),
            ("delete-pod", self.delete_pod, 1),
            ("force-delete-pod", self.force_delete_pod, 1),
            ("delete-podgroup", self.delete_podgroup, 1),
            ("delete-service", self.delete_service, 1),
            ("quota", self.quota_for_a_while, 1),
            # One partition at a time: it lasts about 20 s across the steps that follow.
            ("partition-node", self.partition_node, 0 if self.partition else 3),
        ]


@contextlib.contextmanager
def peered_replicas(
    dev_cluster: Any, namespace: str, tmp_path: Path
) -> Iterator[list[OperatorProcess]]:
    """`REPLICAS` replicas sharing a KopfPeering, each with a random priority (the CLI's
    default)."""
    clients = dev_cluster.clients
    ensure_shared_claim(clients, namespace)
    create_peering(clients, namespace, PEERING)
    dev_kueue.ensure_local_queue(clients, namespace, dev_kueue.LOCAL_QUEUE)
    # Timestamped lines: what the replicas did, and when, against the report's times.
    args = (
        *("--peering", PEERING, "--peering-lifetime", str(PEERING_LIFETIME_SECONDS), "--kueue"),
        *("--log-format", "full"),
    )
    replicas = [
        OperatorProcess(
            Path(dev_cluster.kubeconfig), namespace, tmp_path / f"replica-{i}.log", extra_args=args
        )
        for i in range(REPLICAS)
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


def job_events(clients: Any, namespace: str, name: str) -> list[EventSeen]:
    events = clients.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},involvedObject.kind=TrainingJob"
    ).items
    return [EventSeen.of(e) for e in events]


def settled_events(clients: Any, namespace: str, name: str, reason: str) -> list[EventSeen]:
    """The job's events once the one for its final state is in (a pass posts its events just
    after it writes the status), or whatever is there after a few seconds."""
    try:
        return wait_for(
            lambda: job_events(clients, namespace, name),
            until=lambda events: any(e.reason == reason for e in events),
            timeout=10,
            description=f"{name}'s {reason} event",
        )
    except AssertionError:
        return job_events(clients, namespace, name)


def drive(chaos: Chaos) -> None:
    """The seeded steps, the kills still missing, then every job to its end (no faults)."""
    rng, ledger, names = chaos.rng, chaos.ledger, chaos.names
    started = time.monotonic()
    for index in range(STEPS):
        faults = chaos.faults()
        label, inject, _ = rng.choices(faults, weights=[w for _, _, w in faults])[0]
        ledger.step = f"step {index} {label}"
        ledger.faults[label] += 1
        step_started = time.monotonic()
        try:
            inject()
        except ApiException as error:  # a fault racing a deletion is fine; note it
            ledger.faults[f"{label} (raced: {getattr(error, 'status', type(error).__name__)})"] += 1
        chaos.watch(rng.uniform(0.3, 1.5))
        chaos.step_seconds[label] += time.monotonic() - step_started
    chaos.seconds["steps"] = time.monotonic() - started
    while chaos.kills < MIN_KILLS or chaos.acting_kills < MIN_ACTING_KILLS:
        ledger.step = f"extra kill {chaos.kills}"
        chaos.kill_operator()
        chaos.watch(0.5)
    chaos.seconds["extra kills"] = time.monotonic() - started - chaos.seconds["steps"]
    ledger.step = "drive to the end"
    started = time.monotonic()
    # The partition in progress runs its course; then every job reaches Succeeded: finish
    # whatever gang runs, no more faults.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        seen = chaos.check()
        phases = {n: seen.statuses.get(n, {}).get("phase") for n in names}
        if chaos.partition is None and all(p in ("Succeeded", "Failed") for p in phases.values()):
            break
        for name, phase in phases.items():
            if phase not in ("Succeeded", "Failed"):
                chaos.finish_gang(name)
        chaos.watch(0.5)
    if chaos.partition is not None:
        ledger.violation(f"partition of {chaos.partition.node} never resolved")
        chaos.heal(time.monotonic())
    chaos.seconds["drive to the end"] = time.monotonic() - started


def partition_line(part: Partition) -> str:
    def at(moment: float | None) -> str:
        return f"{moment - part.started:.1f} s" if moment is not None else "never"

    pods = ", ".join(sorted(p.name for p in part.pods.values()))
    return (
        f"{part.node} ({pods}), cut at {part.started_wall:%H:%M:%S.%f} UTC: NotReady at "
        f"{at(part.not_ready_at)}, pods gone at "
        f"{at(part.gone_at)}, healed at {at(part.healed_at)}; seen Running and not Ready: "
        f"{len(part.running_unready)}/{len(part.pods)}"
    )


def upload_decided(status: dict[str, Any]) -> bool:
    upload = (status.get("profile") or {}).get("upload") or {}
    return upload.get("state") not in (None, "Pending")


def test_invariants_hold_under_seeded_faults(
    dev_cluster: Any, namespace: str, tmp_path: Path, chaos_nodes: list[str]
) -> None:
    clients = dev_cluster.clients
    rng = random.Random(SEED)
    ledger = Ledger()
    jobs = chaos_jobs()
    nodes_of = {name: int(m["spec"]["nodes"]) for name, m in jobs.items()}
    names = list(jobs)
    started = time.monotonic()
    clients.core.create_namespaced_resource_quota(namespace, upload_quota())
    with peered_replicas(dev_cluster, namespace, tmp_path) as replicas:
        # The control jobs first: they find room before the others queue.
        for manifest in sorted(
            jobs.values(), key=lambda m: m["metadata"]["name"] not in CONTROL_JOBS
        ):
            create_job(clients, namespace, manifest)
        chaos = Chaos(clients, dev_cluster.name, namespace, replicas, nodes_of, rng, ledger)
        chaos.control_plane = cluster.control_plane_launches(dev_cluster.name)
        try:
            drive(chaos)
        finally:
            if chaos.partition is not None:  # never leave a node cut off for later suites
                restore_node(clients.core, chaos.partition.node)
        ledger.step = "end"
        statuses = chaos.statuses()
        refusals: dict[str, list[int]] = {}
        cuts = [*chaos.partitions, *([chaos.partition] if chaos.partition is not None else [])]
        hit = {job for part in cuts for job in part.placed_after}
        lapsed = frozenset(chaos.not_ready_unasked - {part.node for part in cuts})
        for name in names:
            status = statuses.get(name, {})
            want = ("Succeeded", "TrainingSucceeded")
            if (status.get("phase"), status.get("reason")) != want:
                ledger.violation(
                    f"{name} ended {status.get('phase')}/{status.get('reason')}, expected "
                    f"{want[0]}/{want[1]}: {status.get('message')}"
                )
            if name == UPLOAD_JOB:
                # The last attempt's upload is decided in the pass that finishes the job or
                # the next one.
                try:
                    status = wait_for(
                        lambda: chaos.statuses().get(UPLOAD_JOB, {}),
                        until=upload_decided,
                        timeout=20,
                        description=f"{UPLOAD_JOB}'s last upload decided",
                    )
                except WaitTimeoutError as error:
                    ledger.violation(str(error))
            events = settled_events(clients, namespace, name, str(status.get("reason")))
            for text in final_event_violations(name, status, events):
                ledger.violation(text)
            if name in CONTROL_JOBS and name not in hit:
                for text in warning_violations(name, events, lapsed):
                    ledger.violation(text)
            if name == UPLOAD_JOB:
                refusals[name] = refused_uploads(status)
                for text in side_pod_refusal_violations(name, status, events):
                    ledger.violation(text)
        ledger.step = "delete"
        for name in names:
            clients.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

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
    gangs = Counter(nodes for nodes in ledger.full_gangs.values())
    lost = [p for p in chaos.partitions if p.gone_at is not None]

    def mean(values: list[float]) -> str:
        return f"{sum(values) / len(values):.1f} s" if values else "-"

    to_not_ready = [p.not_ready_at - p.started for p in lost if p.not_ready_at is not None]
    to_gone = [
        max(0.0, p.gone_at - p.not_ready_at)
        for p in lost
        if p.gone_at is not None and p.not_ready_at is not None
    ]
    report: list[str] = []
    phases = ", ".join(f"{label} {seconds:.0f} s" for label, seconds in chaos.seconds.items())
    report.append(
        f"chaos suite: seed {SEED}, {STEPS} steps, {time.monotonic() - started:.0f} s ({phases})"
    )
    report.append(
        f"  replicas              {REPLICAS} (kopf peering, lifetime {PEERING_LIFETIME_SECONDS} s)"
    )
    report.append(
        f"  nodes                 {testing.NODES + len(chaos_nodes)} "
        f"({len(chaos_nodes)} added for the suite)"
    )
    report.append(
        f"  operator kills        {chaos.kills} ({chaos.acting_kills} of the acting replica, "
        f"{chaos.kills - chaos.acting_kills} of a standby; waiting for a replica to start: "
        f"{chaos.startup_wait_seconds:.0f} s)"
    )
    by_fault = ", ".join(f"{k} {v:.0f} s" for k, v in chaos.step_seconds.most_common())
    report.append(f"  steps' time by fault  {by_fault}")
    for label, count in sorted(ledger.faults.items()):
        report.append(f"  {label:<21} {count}")
    report.append(
        f"  jobs                  {len(names)} ({len(CONTROL_JOBS)} control jobs no fault "
        f"targets: {', '.join(CONTROL_JOBS)})"
    )
    report.append(
        f"  queued by Kueue       {', '.join(KUEUE_JOBS)} (LocalQueue {dev_kueue.LOCAL_QUEUE}; "
        "the others by Volcano)"
    )
    report.append(
        f"  multi-node gangs ran  {sum(gangs.values())} "
        f"({', '.join(f'{n}-node: {c}' for n, c in sorted(gangs.items())) or 'none'})"
    )
    report.append(
        f"  partitions injected   {len(chaos.partitions)} (pods lost: "
        f"{sum(len(p.pods) for p in lost)}; NotReady after {mean(to_not_ready)}, pods gone "
        f"{mean(to_gone)} after NotReady, grace {NODE_LOST_GRACE_SECONDS} s)"
    )
    for part in chaos.partitions:
        report.append(f"    {partition_line(part)}")
        if part.placed_after:
            placed = ", ".join(sorted(part.placed_after))
            report.append(f"      placed there after the cut (hit by it too): {placed}")
    report.append(
        f"  side-pod refusals     {sum(len(a) for a in refusals.values())} "
        f"(upload pods of {UPLOAD_JOB} refused by quota {UPLOAD_QUOTA}: attempts "
        f"{refusals.get(UPLOAD_JOB, [])})"
    )
    report.append(
        f"  nodes NotReady unasked {', '.join(sorted(lapsed)) or 'none'} (seen NotReady during "
        "the run with no partition on them: their jobs' NodeLost is true)"
    )
    report.append(f"  restarts seen         {restarts}")
    report.append(f"  violations            {len(ledger.violations)}")
    report += [f"    {text}" for text in ledger.violations[:30]]
    publish_report("chaos", report)
    assert chaos.kills >= MIN_KILLS
    assert chaos.acting_kills >= MIN_ACTING_KILLS
    # Not vacuous: the faults did restart gangs (each counted, checked above), gangs of 2 and 4
    # nodes ran, nodes were partitioned and upload pods refused.
    assert sum(restarts.values()) >= 5, restarts
    assert {2, 4} <= set(gangs), gangs
    assert lost, "no partition took a pod with it"
    assert refusals.get(UPLOAD_JOB), "no upload pod was refused"
    assert not ledger.violations, "\n".join(ledger.violations[:20])
