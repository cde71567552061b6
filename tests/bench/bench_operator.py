"""Benchmark: how fast the operator turns TrainingJobs into running gangs, against Kubeflow's
training-operator and the API server alone, in one run on one cluster.

Run:  .venv/bin/python tests/bench/bench_operator.py [--quick] [--repeats N] [--no-kubeflow]

It starts its own fresh dev cluster (a unique name, 16 fake trn1.32xlarge nodes; `--quick`: 4),
installs the CRDs and measures three scenarios: a 16-node job (5 repetitions), 100 two-node
jobs created at once (2 repetitions) and 1000 one-node jobs (once, with a node loss);
`--quick`: a 4-node job (3), 10 two-node jobs (1) and 50 one-node jobs. Every job is one gang
of training pods (the compile stage is off, so our TrainingJob and the peer's PyTorchJob hold
the same pods). 16 nodes hold the 16-node gang; of 100 two-node gangs 8 fit and 92 wait in
Volcano's queue.

Who is measured, alternating within each repetition on the same cluster:

* ours: `python -m trainium_operator run --namespace NS --metrics-port P --workers 4` as a
  subprocess, a fresh process per scenario so its VmHWM (peak RSS) is the scenario's.
* kubeflow: Kubeflow's training-operator v1.9.2 (`--enable-scheme=pytorchjob
  --gang-scheduler-name=volcano --namespace NS --controller-threads=4`, its client QPS/burst
  left at their defaults 20/30), built from the Go module proxy (`build.build_kubeflow`, cached;
  opt-in, never built by `dev build`/CI), its PyTorchJob CRD and ClusterRole copied from that
  module. Each TrainingJob's PyTorchJob twin has the same pod spec, queue and gang size
  (`kubeflow_peer.pytorchjob_for`, checked by tests/unit/test_bench_kubeflow_peer.py).
* direct: the same Python client (`Cluster.create`, the operator's own code path) creates each
  TrainingJob and exactly the objects `render_job` returns for it (Service, PodGroup, pods), in
  a namespace nothing reconciles, sequentially and from 4 threads: what the API server itself
  needs to hold the same objects.

Figures, from a pod watch opened before each run (the clock starts just before the first
create, jobs are created from 4 client threads):

* all pods: until every pod of every job exists (only where every gang fits: under Volcano
  Kubeflow creates a gang's pods only once its PodGroup is admitted, so with queued jobs the
  two are not comparable);
* gangs Running: until every gang that fits (nodes // gang size) has all its pods Running:
  the like-for-like figure when some jobs must queue;
* API requests, counted by the API server for both operators: each runs as its own
  ServiceAccount matched by its own FlowSchema (priority level `exempt`, so nothing is
  throttled), and the server's `apiserver_flowcontrol_dispatched_requests_total` per FlowSchema
  is read before, at gangs Running and once the operator has gone quiet. It includes list and
  watch requests. Ours is also counted by its own /metrics counter (which leaves out kopf's
  list/watch streams), as before;
* peak RSS: VmHWM from /proc/<pid>/status.

1000 one-node jobs (ours; Kubeflow's gangs-Running, RSS and requests too): time to all pods,
RSS, requests per job, and the time from a node's NotReady (seen by polling the node) until the
job with a pod on it records the loss (`NodeLost` in its status; nodeLostGracePeriodSeconds 0).

Everything runs on one 2-core machine (API server, etcd, KWOK, Volcano, both operators and this
script), so absolute times follow its load; the ratios are measured in the same run.
Namespaces and the cluster are deleted in `finally` (also on SIGTERM and Ctrl-C).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from kubernetes.watch.watch import iter_resp_lines

from trainium_devcluster import build, cluster, sim
from trainium_devcluster.clients import Clients, clients_for, is_status
from trainium_operator.api import spec as spec_model
from trainium_operator.builders.job import VOLCANO_GROUP, VOLCANO_GROUP_ANNOTATION, VOLCANO_VERSION
from trainium_operator.k8s.client import (
    PODGROUPS,
    Cluster,
    load_api_client,
)
from trainium_operator.k8s.informer import interrupt_read
from trainium_operator.lifecycle.render import render_job

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import kubeflow_peer  # noqa: E402

from integration.operator_harness import (  # noqa: E402
    ensure_shared_claim,
    free_port,
    install_crds,
    job_manifest,
    operator_command,
)

Obj = dict[str, Any]
WORKERS = 4  # the operator's --workers default; the peers use as many threads
INSTANCE_TYPE = "trn1.32xlarge"
JOB_LABEL = "trainium.dev/job-name"
RUN_TIMEOUT = 120.0
QUIET_SECONDS = 2.0
QUIET_TIMEOUT = 30.0
STALL_SECONDS = 10.0
# Each run starts after a seeded random pause of up to one Volcano scheduling period: a run that
# starts when the previous one ended would start at the same phase of Volcano's 1 s tick, which
# biases the admission wait of every contender in a fixed but different way.
TICK_JITTER_SECONDS = 1.0
JITTER_SEED = 20261201
NODE_LOSS_TIMEOUT = 90.0
OURS_NAMESPACE = "trainium-system"  # our operator's ServiceAccount lives here
_METRIC = re.compile(
    r'^trainium_operator_api_requests_total\{verb="([^"]+)",resource="([^"]+)"\} (\d+)$'
)


@dataclass(frozen=True)
class Scenario:
    label: str
    jobs: int
    nodes_per_job: int
    repeats: int
    node_loss: bool = False

    @property
    def pods(self) -> int:
        return self.jobs * self.nodes_per_job

    def gangs_that_fit(self, nodes: int) -> int:
        """One training pod takes a whole trn1.32xlarge (all 16 Neuron devices)."""
        return min(self.jobs, nodes // self.nodes_per_job)

    def all_fit(self, nodes: int) -> bool:
        return self.gangs_that_fit(nodes) == self.jobs

    @property
    def timeout(self) -> float:
        return max(RUN_TIMEOUT, 0.5 * self.pods)


FULL = (
    Scenario("16-node job", 1, 16, 5),
    Scenario("100 x 2-node jobs", 100, 2, 2),
    Scenario("1000 x 1-node jobs", 1000, 1, 1, node_loss=True),
)
QUICK = (
    Scenario("4-node job", 1, 4, 3),
    Scenario("10 x 2-node jobs", 10, 2, 1),
    Scenario("50 x 1-node jobs", 50, 1, 1, node_loss=True),
)


@dataclass
class Metrics:
    requests: Counter[str]
    reconciles: int

    def minus(self, before: Metrics) -> Metrics:
        requests = Counter(self.requests)
        requests.subtract(before.requests)
        return Metrics(+requests, self.reconciles - before.reconciles)

    @property
    def total(self) -> int:
        return sum(self.requests.values())


@dataclass
class Times:
    first_pod: float
    # None where not every pod is expected (Kubeflow with queued gangs) or, with `stall`, where
    # the operator stopped creating pods once the gangs that fit were Running (queued jobs' pods
    # held back, as Kubeflow does and the issue asks of ours).
    all_pods: float | None
    gangs_running: float
    # When a watch first saw Volcano admit one of the namespace's PodGroups (Inqueue): the
    # operators create a gang's pods only after it, so all_pods - admitted is their own share
    # (Volcano's 1 s scheduling period makes the time before it vary by up to a second).
    admitted: float | None = None
    # When every expected pod was first seen bound to a node (spec.nodeName): between all pods
    # and this is the scheduler's binding, after it KWOK's (the kubelet's) start.
    all_bound: float | None = None

    @property
    def pods_after_admission(self) -> float | None:
        if self.all_pods is None or self.admitted is None:
            return None
        return self.all_pods - self.admitted


@dataclass
class OperatorSample:
    times: Times
    at_all_pods: Metrics | None
    settled: Metrics
    settle_seconds: float
    server_at_running: int
    server_settled: int
    quiet: bool  # False: still reconciling when QUIET_TIMEOUT ran out


@dataclass
class KubeflowSample:
    times: Times
    server_at_running: int
    server_settled: int
    settle_seconds: float
    quiet: bool


@dataclass
class DirectSample:
    times: Times
    client_seconds: float  # when the last create call returned
    requests: Counter[str]


@dataclass
class NodeLoss:
    node: str
    job: str
    not_ready_after: float  # from stopping the heartbeat to NotReady seen
    reached_job: float | None  # from NotReady seen to NodeLost in the job's status


@dataclass
class Result:
    scenario: Scenario
    nodes: int
    operator: list[OperatorSample] = field(default_factory=list)
    kubeflow: list[KubeflowSample] = field(default_factory=list)
    sequential: list[DirectSample] = field(default_factory=list)
    concurrent: list[DirectSample] = field(default_factory=list)
    # From 4 threads as well, but each job's pods only once Volcano admits its PodGroup.
    gated: list[DirectSample] = field(default_factory=list)
    # VmRSS the moment the process is ready (it has just reconciled the probe job), and once it
    # is idle: no request and no reconcile for QUIET_SECONDS after that.
    ready_rss_kib: int = 0
    idle_rss_kib: int = 0
    peak_rss_kib: int = 0
    # From the process start until it reconciles a new job (ours: the probe TrainingJob;
    # Kubeflow: /readyz, then its probe PyTorchJob).
    ready_seconds: float | None = None
    kubeflow_ready_seconds: float | None = None
    kubeflow_idle_rss_kib: int = 0
    kubeflow_peak_rss_kib: int = 0
    node_loss: NodeLoss | None = None
    log_problems: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def direct_repeats(self) -> int:
        return 0 if self.scenario.node_loss else self.scenario.repeats

    @property
    def complete(self) -> bool:
        return (
            not self.error
            and len(self.operator) == self.scenario.repeats
            and len(self.sequential)
            == len(self.concurrent)
            == len(self.gated)
            == self.direct_repeats
        )


@dataclass
class Bench:
    name: str
    kubeconfig: Path
    clients: Clients
    log_dir: Path
    counter: kubeflow_peer.ApiServerCounter
    ours: kubeflow_peer.Identity
    kubeflow: kubeflow_peer.Identity | None = None
    kubeflow_build: build.KubeflowBuild | None = None
    namespaces: list[str] = field(default_factory=list)


def _echo(message: str) -> None:
    # A closed stderr (`| head`) must not stop the clean-up, which reports through here.
    with contextlib.suppress(OSError):
        print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _step(what: str) -> Iterator[None]:
    started = time.monotonic()
    yield
    _echo(f"  {what}: {time.monotonic() - started:.1f}s")


# -- jobs and namespaces -----------------------------------------------------------------------


def training_job(name: str, nodes: int, *, node_lost_grace: int = 5) -> Obj:
    """One gang of training pods: the compile stage off, so the PyTorchJob twin is exact."""
    return job_manifest(
        name,
        nodes=nodes,
        compile={"enabled": False},
        runPolicy={"nodeLostGracePeriodSeconds": node_lost_grace},
    )


def manifests(scenario: Scenario, prefix: str) -> list[Obj]:
    grace = 0 if scenario.node_loss else 5
    return [
        training_job(f"{prefix}-{index:04d}", scenario.nodes_per_job, node_lost_grace=grace)
        for index in range(scenario.jobs)
    ]


def children(manifest: Obj, namespace: str, uid: str) -> list[Obj]:
    """Exactly what the operator creates for this job on its first pass."""
    document = {
        **manifest,
        "metadata": {**manifest["metadata"], "namespace": namespace, "uid": uid},
    }
    return render_job(document, datetime.now(UTC))


def pytorchjobs(jobs: list[Obj], namespace: str) -> list[Obj]:
    return [
        kubeflow_peer.pytorchjob_for(job["metadata"]["name"], children(job, namespace, "0"))
        for job in jobs
    ]


def expected_pods(jobs: list[Obj], namespace: str) -> set[str]:
    return {
        obj["metadata"]["name"]
        for manifest in jobs
        for obj in children(manifest, namespace, "0")
        if obj["kind"] == "Pod"
    }


def create_namespace(bench: Bench, purpose: str) -> str:
    name = f"bench-{purpose}-{uuid.uuid4().hex[:6]}"
    core = bench.clients.core
    core.create_namespace({"metadata": {"name": name, "labels": {"trainium.dev/bench": "true"}}})
    bench.namespaces.append(name)
    sim.wait_for(
        lambda: core.read_namespaced_service_account("default", name),
        timeout=30,
        description=f"ServiceAccount {name}/default",
    )
    # The FSx claim the pods mount, so Volcano binds them as it would for a user.
    ensure_shared_claim(bench.clients, name)
    return name


def _job_kinds(bench: Bench) -> list[tuple[str, str, str]]:
    kinds = [(spec_model.GROUP, spec_model.VERSION, spec_model.PLURAL)]
    if bench.kubeflow is not None:
        kinds.append((kubeflow_peer.GROUP, kubeflow_peer.VERSION, kubeflow_peer.PLURAL))
    return kinds


def clear_namespace(bench: Bench, name: str, *, wait: bool = True) -> None:
    """Deletes the run's objects; with `wait`, until its pods are gone (a deleted namespace
    takes the namespace controller ~10 s, so runs reuse theirs and only clear it)."""
    core, custom = bench.clients.core, bench.clients.custom
    # Jobs first: with pods gone and its job still there, an operator would start a new
    # attempt (a deleted pod is an infrastructure failure).
    for group, version, plural in _job_kinds(bench):
        custom.delete_collection_namespaced_custom_object(group, version, name, plural)
    custom.delete_collection_namespaced_custom_object(
        VOLCANO_GROUP, VOLCANO_VERSION, name, PODGROUPS
    )
    core.delete_collection_namespaced_service(name)
    deadline = time.monotonic() + 120
    while True:
        # Without grace, or they hold their nodes (and the next run's gangs) for 30 s; again
        # and again, for pods garbage collection deletes gracefully or a reconcile that read
        # its job before the deletion still creates.
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        if not wait or not core.list_namespaced_pod(name, limit=1).items:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods of {name} still there after 120 s")
        time.sleep(0.3)


def delete_namespace(bench: Bench, name: str) -> None:
    try:
        clear_namespace(bench, name, wait=False)
        bench.clients.core.delete_namespace(name)
    except Exception as error:
        if not is_status(error, 404):
            raise
    if name in bench.namespaces:
        bench.namespaces.remove(name)


# -- watching pods appear and gangs run --------------------------------------------------------


def abort_stream(response: Any) -> None:
    """Ends a watch another thread is reading: its blocked read first (closing alone would wait
    for it until the server's next event or the watch's timeout), then the response."""
    interrupt_read(response)
    with contextlib.suppress(Exception):
        response.close()


class PodGroupAdmissions:
    """Pods held per PodGroup until a watch sees Volcano admit the group (Inqueue, Running)."""

    def __init__(self, clients: Clients, namespace: str, timeout: float):
        self._lock = threading.Lock()
        self._held: dict[str, list[Obj]] = {}
        self._admitted: set[str] = set()
        self._ready: list[Obj] = []
        self.first_admitted_at: float | None = None
        listed = clients.custom.list_namespaced_custom_object(
            "scheduling.volcano.sh", "v1beta1", namespace, "podgroups"
        )
        self._response = clients.custom.list_namespaced_custom_object(
            "scheduling.volcano.sh",
            "v1beta1",
            namespace,
            "podgroups",
            watch=True,
            resource_version=listed["metadata"]["resourceVersion"],
            timeout_seconds=int(timeout) + 30,
            _preload_content=False,
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def hold(self, pods: list[Obj]) -> None:
        with self._lock:
            for pod in pods:
                group = pod["metadata"]["annotations"][VOLCANO_GROUP_ANNOTATION]
                if group in self._admitted:
                    self._ready.append(pod)
                else:
                    self._held.setdefault(group, []).append(pod)

    def held(self) -> bool:
        with self._lock:
            return bool(self._held or self._ready)

    def admitted(self) -> list[Obj]:
        """The pods whose group was admitted since the last call."""
        with self._lock:
            ready, self._ready = self._ready, []
        return ready

    def stop(self) -> None:
        abort_stream(self._response)

    def _run(self) -> None:
        with contextlib.suppress(Exception):
            for line in iter_resp_lines(self._response):
                if not line:
                    continue
                event = json.loads(line)
                group = event.get("object", {})
                phase = group.get("status", {}).get("phase")
                if event.get("type") in ("ADDED", "MODIFIED") and phase in ("Inqueue", "Running"):
                    with self._lock:
                        name = group["metadata"]["name"]
                        if self.first_admitted_at is None:
                            self.first_admitted_at = time.monotonic()
                        self._admitted.add(name)
                        self._ready.extend(self._held.pop(name, []))


class PodWatch:
    """Records when each expected pod is first seen and when `gangs` gangs (pods grouped by
    `gang_label`, `gang_size` each) have every pod Running, from a watch opened before the run.

    It reads the raw stream and parses only JSON (no client model objects), so it takes next
    to nothing from the direct peer's threads in this process. `on_all_pods` and
    `on_gangs_running` run in threads of their own (say, scraping a counter) so the watch never
    waits for them."""

    def __init__(
        self,
        clients: Clients,
        namespace: str,
        expected: set[str],
        *,
        gang_label: str,
        gang_size: int,
        gangs: int,
        timeout: float,
        on_all_pods: Callable[[], None] | None = None,
        on_gangs_running: Callable[[], None] | None = None,
        only_expected: bool = False,
    ):
        self.namespace = namespace
        self.expected = set(expected)
        # Count only the expected pods towards the gangs (a restart's new attempt beside the
        # old gang, still Running when the watch opens).
        self.only_expected = only_expected
        self.gang_label = gang_label
        self.gang_size = gang_size
        self.gangs = gangs
        self.timeout = timeout
        self.seen: dict[str, float] = {}
        self.running: dict[str, dict[str, float]] = {}  # gang -> pod -> first seen Running
        self.first_pod: float | None = None
        self.all_pods_at: float | None = None
        self.last_new = time.monotonic()  # when the last expected pod first appeared
        self.gangs_at: float | None = None
        self.bound: set[str] = set()
        self.all_bound_at: float | None = None
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._hooks = {"pods": on_all_pods, "gangs": on_gangs_running}
        self._hook_threads: list[threading.Thread] = []
        self.admissions = PodGroupAdmissions(clients, namespace, timeout)
        listed = clients.core.list_namespaced_pod(namespace)
        for pod in listed.items:
            self._saw(clients.api_client.sanitize_for_serialization(pod))
        self._clients = clients
        self._version = listed.metadata.resource_version
        self._deadline = time.monotonic() + timeout
        self._stopped = False
        self.reopened = 0  # watches the API server ended early (a slow reader under load)
        self._response = self._open()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _open(self) -> Any:
        return self._clients.core.list_namespaced_pod(
            self.namespace,
            watch=True,
            resource_version=self._version,
            allow_watch_bookmarks=False,
            timeout_seconds=int(self.timeout) + 30,
            _preload_content=False,
        )

    def _hook(self, which: str) -> None:
        hook = self._hooks[which]
        if hook is not None:
            thread = threading.Thread(target=hook, daemon=True)
            thread.start()
            self._hook_threads.append(thread)

    def _saw(self, pod: Obj) -> bool:
        """Records one pod event; True once everything awaited has happened."""
        now = time.monotonic()
        meta = pod.get("metadata") or {}
        name = meta.get("name", "")
        if self.only_expected and name not in self.expected:
            return False
        if self.first_pod is None and (not self.expected or name in self.expected):
            self.first_pod = now
        if name in self.expected and name not in self.seen:
            self.seen[name] = now
            self.last_new = now
            if len(self.seen) == len(self.expected) and self.all_pods_at is None:
                self.all_pods_at = now
                self._hook("pods")
        if name in self.expected and (pod.get("spec") or {}).get("nodeName"):
            self.bound.add(name)
            if len(self.bound) == len(self.expected) and self.all_bound_at is None:
                self.all_bound_at = now
        gang = (meta.get("labels") or {}).get(self.gang_label)
        if gang and (pod.get("status") or {}).get("phase") == "Running":
            pods = self.running.setdefault(gang, {})
            pods.setdefault(name, now)
            if self.gangs_at is None and self.full_gangs() >= self.gangs:
                self.gangs_at = now
                self._hook("gangs")
        return (not self.expected or self.all_pods_at is not None) and self.gangs_at is not None

    def full_gangs(self) -> int:
        return sum(1 for pods in self.running.values() if len(pods) >= self.gang_size)

    def _run(self) -> None:
        try:
            if self.gangs_at is not None and (not self.expected or self.all_pods_at):
                return
            while True:
                for line in iter_resp_lines(self._response):
                    if not line:
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        raise RuntimeError(f"watch error: {event.get('object')}")
                    self._version = event["object"]["metadata"]["resourceVersion"]
                    if event.get("type") == "DELETED":
                        continue
                    if self._saw(event["object"]):
                        return
                # The API server ends a watch whose reader falls behind (a loaded machine):
                # go on from the last event seen.
                if self._stopped or time.monotonic() > self._deadline:
                    return
                self.reopened += 1
                self._response = self._open()
        except BaseException as error:
            self.error = error
        finally:
            self.done.set()
            with contextlib.suppress(Exception):
                self._response.release_conn()

    def wait(self, started: float, *, stall: float | None = None) -> Times:
        """Seconds from `started` to the first pod, to every expected pod, to the gangs.
        With `stall`, once the gangs are Running, no new expected pod for `stall` seconds ends
        the wait with `all_pods` None instead of a timeout."""
        deadline = time.monotonic() + self.timeout
        stalled = False
        while not self.done.wait(0.5) and time.monotonic() < deadline:
            if (
                stall is not None
                and self.gangs_at is not None
                and time.monotonic() - self.last_new > stall
            ):
                stalled = True
                self._stopped = True
                abort_stream(self._response)
                break
        for thread in self._hook_threads:
            thread.join(timeout=60)
        self.admissions.stop()
        missing_pods = self.expected and self.all_pods_at is None and not stalled
        if missing_pods or self.gangs_at is None:
            missing = sorted(self.expected - set(self.seen))
            raise TimeoutError(
                f"in {self.timeout:.0f}s in {self.namespace}: {len(self.seen)} of "
                f"{len(self.expected)} pods created (e.g. missing {missing[:3]}), "
                f"{self.full_gangs()} of {self.gangs} gangs Running; watch error {self.error!r}, "
                f"reopened {self.reopened}x"
            )
        assert self.first_pod is not None
        admitted = self.admissions.first_admitted_at
        return Times(
            first_pod=self.first_pod - started,
            all_pods=None if self.all_pods_at is None else self.all_pods_at - started,
            gangs_running=self.gangs_at - started,
            admitted=None if admitted is None else admitted - started,
            all_bound=None if self.all_bound_at is None else self.all_bound_at - started,
        )


def watch_jobs(
    bench: Bench,
    namespace: str,
    scenario: Scenario,
    expected: set[str],
    gang_label: str,
    **hooks: Callable[[], None],
) -> PodWatch:
    return PodWatch(
        bench.clients,
        namespace,
        expected,
        gang_label=gang_label,
        gang_size=scenario.nodes_per_job,
        gangs=scenario.gangs_that_fit(bench_nodes(bench)),
        timeout=scenario.timeout,
        **hooks,
    )


def bench_nodes(bench: Bench) -> int:
    return len(bench.clients.core.list_node().items)


def create_all(bench: Bench, namespace: str, kind: tuple[str, str, str], jobs: list[Obj]) -> float:
    """Creates `jobs` from WORKERS threads ("at once"); returns the start time."""
    custom = bench.clients.custom

    def create(manifest: Obj) -> None:
        custom.create_namespaced_custom_object(*kind[:2], namespace, kind[2], manifest)

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(create, jobs))
    return started


def wait_server_quiet(bench: Bench, identity: kubeflow_peer.Identity) -> tuple[int, float, bool]:
    """The API server's count for `identity` once unchanged for QUIET_SECONDS (or
    QUIET_TIMEOUT passed), how long after the call it last changed, and whether it went quiet."""
    started = time.monotonic()
    last = bench.counter.count(identity)
    last_change = started
    while time.monotonic() - started < QUIET_TIMEOUT:
        time.sleep(0.5)
        current = bench.counter.count(identity)
        if current != last:
            last, last_change = current, time.monotonic()
        elif time.monotonic() - last_change >= QUIET_SECONDS:
            return last, last_change - started, True
    return last, last_change - started, False


# -- our operator ------------------------------------------------------------------------------


class Operator(kubeflow_peer.LoggedProcess):
    def __init__(self, bench: Bench, namespace: str, label: str, *extra: str):
        self.port = free_port()
        flags = ("--metrics-port", str(self.port), "--workers", str(WORKERS), *extra)
        command = operator_command(bench.ours.kubeconfig, namespace, *flags)
        super().__init__("the operator", command, bench.log_dir / f"operator-{label}.log")

    def scrape(self) -> Metrics:
        self.check_alive()
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        requests: Counter[str] = Counter()
        reconciles = 0
        for line in text.splitlines():
            match = _METRIC.match(line)
            if match:
                requests[f"{match.group(1)} {match.group(2)}"] = int(match.group(3))
            elif line.startswith("trainium_operator_reconciles_total "):
                reconciles = int(line.split()[1])
        return Metrics(requests, reconciles)

    def try_scrape(self) -> Metrics | None:
        try:
            return self.scrape()
        except OSError:
            return None

    def wait_quiet(self) -> tuple[Metrics, float]:
        """Metrics once nothing changed for QUIET_SECONDS (or QUIET_TIMEOUT passed), and
        how long after the call the last change was seen."""
        started = time.monotonic()
        last = self.scrape()
        last_change = started
        while time.monotonic() - started < QUIET_TIMEOUT:
            time.sleep(0.25)
            current = self.scrape()
            if current.reconciles != last.reconciles or current.requests != last.requests:
                last, last_change = current, time.monotonic()
            elif time.monotonic() - last_change >= QUIET_SECONDS:
                break
        return last, last_change - started


def wait_operator_ready(bench: Bench, operator: Operator, namespace: str) -> None:
    """/metrics answers and the job watch is live: a probe TrainingJob in a queue nobody has
    gets reconciled (a pod event alone no longer wakes a job the operator has not seen)."""
    sim.wait_for(operator.try_scrape, timeout=60, description="operator /metrics answers")
    probe = training_job("bench-ready-probe", 1)
    probe["spec"]["scheduling"] = {"queue": "bench-nobody"}
    bench.clients.custom.create_namespaced_custom_object(
        spec_model.GROUP, spec_model.VERSION, namespace, spec_model.PLURAL, probe
    )
    sim.wait_for(
        operator.scrape,
        until=lambda metrics: metrics.reconciles >= 1,
        timeout=60,
        description="the operator reconciles a new TrainingJob",
    )
    clear_namespace(bench, namespace)


def operator_sample(
    bench: Bench, operator: Operator, namespace: str, scenario: Scenario, prefix: str
) -> OperatorSample:
    before, _ = operator.wait_quiet()
    server_before, _, _ = wait_server_quiet(bench, bench.ours)
    jobs = manifests(scenario, prefix)
    marks: dict[str, Any] = {}

    def at_all_pods() -> None:
        marks["pods"] = operator.scrape()

    # Every pod only where every gang fits; otherwise an operator that holds queued jobs' pods
    # back stops creating them once the gangs that fit run (then "all pods" is "-").
    stall = None if scenario.all_fit(bench_nodes(bench)) else STALL_SECONDS

    def at_running() -> None:
        marks["running"] = bench.counter.count(bench.ours)

    pod_watch = watch_jobs(
        bench,
        namespace,
        scenario,
        expected_pods(jobs, namespace),
        JOB_LABEL,
        on_all_pods=at_all_pods,
        on_gangs_running=at_running,
    )
    started = create_all(
        bench, namespace, (spec_model.GROUP, spec_model.VERSION, spec_model.PLURAL), jobs
    )
    times = pod_watch.wait(started, stall=stall)
    settled, settle_seconds = operator.wait_quiet()
    server_settled, _, server_quiet = wait_server_quiet(bench, bench.ours)
    quiet = server_quiet and settle_seconds < QUIET_TIMEOUT - QUIET_SECONDS
    if not scenario.node_loss:
        clear_namespace(bench, namespace)
    _echo(
        f"  ours: {scenario.pods} pods in {_seconds(times.all_pods)}, gangs Running "
        f"{times.gangs_running:.2f}s, quiet {settle_seconds:.1f}s later"
    )
    return OperatorSample(
        times,
        marks["pods"].minus(before) if "pods" in marks else None,
        settled.minus(before),
        settle_seconds,
        marks["running"] - server_before,
        server_settled - server_before,
        quiet,
    )


# -- Kubeflow's training-operator ----------------------------------------------------------------


def kubeflow_sample(
    bench: Bench, namespace: str, scenario: Scenario, prefix: str
) -> KubeflowSample:
    assert bench.kubeflow is not None
    identity = bench.kubeflow
    server_before, _, _ = wait_server_quiet(bench, identity)
    jobs = pytorchjobs(manifests(scenario, prefix), namespace)
    expected = (
        set().union(*(kubeflow_peer.pod_names(job) for job in jobs))
        if scenario.all_fit(bench_nodes(bench))
        else set()
    )
    marks: dict[str, int] = {}

    def at_running() -> None:
        marks["running"] = bench.counter.count(identity)

    pod_watch = watch_jobs(
        bench,
        namespace,
        scenario,
        expected,
        kubeflow_peer.JOB_NAME_LABEL,
        on_gangs_running=at_running,
    )
    started = create_all(
        bench, namespace, (kubeflow_peer.GROUP, kubeflow_peer.VERSION, kubeflow_peer.PLURAL), jobs
    )
    times = pod_watch.wait(started)
    server_settled, settle_seconds, quiet = wait_server_quiet(bench, identity)
    clear_namespace(bench, namespace)
    pods = "" if times.all_pods is None else f"{scenario.pods} pods in {times.all_pods:.2f}s, "
    _echo(
        f"  kubeflow: {pods}gangs Running {times.gangs_running:.2f}s, "
        + (f"quiet {settle_seconds:.1f}s later" if quiet else f"not quiet in {QUIET_TIMEOUT:.0f}s")
    )
    return KubeflowSample(
        times,
        marks["running"] - server_before,
        server_settled - server_before,
        settle_seconds,
        quiet,
    )


def kubeflow_probe(namespace: str) -> Obj:
    probe = kubeflow_peer.pytorchjob_for(
        "bench-ready-probe", children(training_job("bench-ready-probe", 1), namespace, "0")
    )
    # A queue nobody has: Volcano never admits it, so no pod is created.
    probe["spec"]["runPolicy"]["schedulingPolicy"]["queue"] = "bench-nobody"
    return probe


# -- the peer: the API server alone ------------------------------------------------------------


def direct_sample(
    bench: Bench,
    namespace: str,
    scenario: Scenario,
    prefix: str,
    workers: int,
    *,
    gated: bool = False,
    clear: bool = True,
) -> DirectSample:
    """The same objects the operator creates, from `workers` threads of a plain client. With
    `gated`, each job's pods are held until a PodGroup watch shows Volcano admitted its group
    (Inqueue or later), as ours and Kubeflow's operator do: the floor for that protocol."""
    client = Cluster(load_api_client(str(bench.kubeconfig)))
    jobs = manifests(scenario, prefix)
    pod_watch = watch_jobs(bench, namespace, scenario, expected_pods(jobs, namespace), JOB_LABEL)
    admissions = pod_watch.admissions if gated else None

    def create_job(manifest: Obj) -> list[Obj]:
        client.counter.add("create", spec_model.PLURAL)
        created = client.custom.create_namespaced_custom_object(
            spec_model.GROUP, spec_model.VERSION, namespace, spec_model.PLURAL, manifest
        )
        objects = children(manifest, namespace, created["metadata"]["uid"])
        if admissions is None:
            return objects
        admissions.hold([o for o in objects if o["kind"] == "Pod"])
        return [o for o in objects if o["kind"] != "Pod"]

    def create(obj: Obj) -> list[Obj]:
        if not client.create(obj):
            raise RuntimeError(f"{obj['kind']} {obj['metadata']['name']} already existed")
        return []

    started = time.monotonic()
    if workers == 1:
        for manifest in jobs:
            for obj in create_job(manifest):
                create(obj)
    else:
        # Per object, not per job: a job's children spread over the threads too, so this is
        # the floor for `workers` concurrent clients.
        deadline = started + scenario.timeout
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            pending = {pool.submit(create_job, manifest) for manifest in jobs}
            while pending or (admissions is not None and admissions.held()):
                if admissions is not None:
                    pending |= {pool.submit(create, pod) for pod in admissions.admitted()}
                    if pod_watch.gangs_at is not None or time.monotonic() > deadline:
                        break  # every gang that fits runs; the rest stay queued
                # Ungated, block until a create returns; gated, also wake for admissions.
                poll = None if admissions is None else 0.01
                finished, pending = concurrent.futures.wait(
                    pending, timeout=poll, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for future in finished:
                    pending |= {pool.submit(create, obj) for obj in future.result()}
    client_seconds = time.monotonic() - started
    times = pod_watch.wait(started, stall=STALL_SECONDS if admissions is not None else None)
    if clear:
        clear_namespace(bench, namespace)
    _echo(
        f"  direct x{workers}{' gated' if gated else ''}: {scenario.pods} pods in "
        f"{_seconds(times.all_pods)}, gangs Running {times.gangs_running:.2f}s"
    )
    return DirectSample(times, client_seconds, client.counter.counts)


# -- node loss with many jobs ------------------------------------------------------------------


def node_loss(bench: Bench, namespace: str) -> NodeLoss:
    """Stops the heartbeat of a node that runs one of the jobs; times NotReady, then how long
    until that job's status records the loss."""
    core, custom = bench.clients.core, bench.clients.custom
    running = [
        pod
        for pod in core.list_namespaced_pod(namespace, label_selector=JOB_LABEL).items
        if pod.status.phase == "Running" and pod.spec.node_name
    ]
    victim = sorted(running, key=lambda pod: pod.metadata.name)[0]
    node, job = victim.spec.node_name, victim.metadata.labels[JOB_LABEL]
    api = bench.clients.api_client
    started = time.monotonic()
    sim.simulate_node_loss(core, node)
    try:
        sim.wait_for(
            lambda: api.sanitize_for_serialization(core.read_node(node)),
            until=lambda obj: not sim.node_is_ready(obj),
            timeout=NODE_LOSS_TIMEOUT,
            description=f"{node} NotReady",
            interval=0.05,
        )
        not_ready = time.monotonic()
        reached: float | None = None
        try:
            sim.wait_for(
                lambda: custom.get_namespaced_custom_object(
                    spec_model.GROUP, spec_model.VERSION, namespace, spec_model.PLURAL, job
                ),
                until=lambda obj: "NodeLost" in json.dumps(obj.get("status") or {}),
                timeout=60,
                description=f"{job} records NodeLost",
                interval=0.05,
            )
            reached = time.monotonic() - not_ready
        except sim.WaitTimeoutError:
            reached = None
        return NodeLoss(node, job, not_ready - started, reached)
    finally:
        sim.restore_node(core, node)


# -- scenarios, cluster, report ----------------------------------------------------------------


def run_scenario(bench: Bench, result: Result) -> None:
    scenario = result.scenario
    label = re.sub(r"\W+", "", scenario.label)
    op_namespace = create_namespace(bench, "op")
    kf_namespace = create_namespace(bench, "kf") if bench.kubeflow else None
    direct_namespace = create_namespace(bench, "direct")
    spawned = time.monotonic()
    operator = Operator(bench, op_namespace, label)
    kubeflow: kubeflow_peer.KubeflowOperator | None = None
    try:
        with _step("operator ready"):
            wait_operator_ready(bench, operator, op_namespace)
        result.ready_seconds = time.monotonic() - spawned
        result.ready_rss_kib = operator.rss_kib("VmRSS")
        operator.wait_quiet()
        result.idle_rss_kib = operator.rss_kib("VmRSS")
        if bench.kubeflow_build is not None and bench.kubeflow and kf_namespace:
            spawned = time.monotonic()
            kubeflow = kubeflow_peer.KubeflowOperator(
                bench.kubeflow_build,
                bench.kubeflow,
                kf_namespace,
                bench.log_dir,
                label,
                threads=WORKERS,
            )
            with _step("kubeflow ready"):
                kubeflow.wait_ready()
                kubeflow_peer.wait_reconciling(
                    bench.clients, kf_namespace, kubeflow_probe(kf_namespace)
                )
            result.kubeflow_ready_seconds = time.monotonic() - spawned
            # Its metrics count no requests of its own: idle after the same quiet interval.
            time.sleep(QUIET_SECONDS)
            result.kubeflow_idle_rss_kib = kubeflow.rss_kib("VmRSS")
        jitter = random.Random(JITTER_SEED)

        def desync() -> None:
            time.sleep(jitter.uniform(0, TICK_JITTER_SECONDS))

        for rep in range(scenario.repeats):
            desync()
            result.operator.append(
                operator_sample(bench, operator, op_namespace, scenario, f"op{rep}")
            )
            if scenario.node_loss:
                with _step("node loss"):
                    result.node_loss = node_loss(bench, op_namespace)
                result.peak_rss_kib = operator.rss_kib("VmHWM")
                clear_namespace(bench, op_namespace)
            if kubeflow is not None and kf_namespace:
                desync()
                result.kubeflow.append(kubeflow_sample(bench, kf_namespace, scenario, f"kf{rep}"))
            if rep < result.direct_repeats:
                desync()
                result.sequential.append(
                    direct_sample(bench, direct_namespace, scenario, f"seq{rep}", 1)
                )
                desync()
                result.concurrent.append(
                    direct_sample(bench, direct_namespace, scenario, f"conc{rep}", WORKERS)
                )
                desync()
                result.gated.append(
                    direct_sample(
                        bench, direct_namespace, scenario, f"gate{rep}", WORKERS, gated=True
                    )
                )
        result.peak_rss_kib = max(result.peak_rss_kib, operator.rss_kib("VmHWM"))
        if kubeflow is not None:
            result.kubeflow_peak_rss_kib = kubeflow.rss_kib("VmHWM")
    except Exception as error:
        result.error = f"{type(error).__name__}: {error}"
        _echo(f"  {scenario.label} failed: {result.error}")
    finally:
        operator.stop()
        result.log_problems = [
            line for line in operator.log().splitlines() if "Traceback" in line or "ERROR" in line
        ]
        if kubeflow is not None:
            kubeflow.stop()
        for namespace in (op_namespace, kf_namespace, direct_namespace):
            if namespace:
                delete_namespace(bench, namespace)


def warm_up(bench: Bench) -> None:
    """The first writes after the API server starts (CRD handlers, watch caches) are slow for
    reasons that have nothing to do with the operator: pay them outside the measurements."""
    namespace = create_namespace(bench, "warmup")
    # Gangs of 2 where the cluster has the nodes (`--only 1000` alone asks for one node).
    gang = min(2, bench_nodes(bench))
    direct_sample(bench, namespace, Scenario("warm-up", 8, gang, 1), "warm", WORKERS)
    delete_namespace(bench, namespace)


@contextlib.contextmanager
def dev_cluster(
    name: str, nodes: int, log_dir: Path, kubeflow_build: build.KubeflowBuild | None
) -> Iterator[Bench]:
    def terminate(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    bench: Bench | None = None
    try:
        report = cluster.up(
            name, nodes=nodes, instance_type=INSTANCE_TYPE, neuron_taint=False, echo=_echo
        )
        _echo(f"dev cluster {name!r} with {nodes} nodes up in {report.timer.total:.1f}s")
        clients = clients_for(report.kubeconfig)
        install_crds(clients)
        ours = kubeflow_peer.create_identity(
            clients,
            report.kubeconfig,
            log_dir,
            namespace=OURS_NAMESPACE,
            service_account="trainium-operator",
            cluster_role="cluster-admin",
        )
        bench = Bench(
            name,
            report.kubeconfig,
            clients,
            log_dir,
            kubeflow_peer.ApiServerCounter(clients),
            ours,
        )
        if kubeflow_build is not None:
            kubeflow_peer.install(clients, kubeflow_build)
            bench.kubeflow = kubeflow_peer.create_identity(
                clients,
                report.kubeconfig,
                log_dir,
                namespace=kubeflow_peer.OPERATOR_NAMESPACE,
                service_account=kubeflow_peer.SERVICE_ACCOUNT,
                cluster_role=kubeflow_peer.cluster_role_name(kubeflow_build),
            )
            bench.kubeflow_build = kubeflow_build
        yield bench
    finally:
        try:
            if bench is not None:
                for namespace in list(bench.namespaces):
                    with contextlib.suppress(Exception):
                        delete_namespace(bench, namespace)
        finally:
            cluster.down(name, echo=_echo)
            signal.signal(signal.SIGTERM, previous)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{_median(values):.2f}s"
    return f"median {_median(values):.2f}s (min {min(values):.2f}, max {max(values):.2f})"


def _mib_spread(kib: list[int]) -> str:
    mib = [k / 1024 for k in kib]
    return f"{min(mib):.0f}-{max(mib):.0f} MiB" if len(mib) > 1 else f"{mib[0]:.0f} MiB"


def _mean_requests(samples: list[Metrics]) -> Counter[str]:
    total: Counter[str] = Counter()
    for sample in samples:
        total.update(sample.requests)
    return Counter({key: round(value / len(samples)) for key, value in total.items()})


def _requests_line(requests: Counter[str]) -> str:
    return ", ".join(f"{key} {value}" for key, value in sorted(requests.items()) if value)


def _seconds(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}s"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def _mean(values: list[float]) -> float:
    return statistics.mean(values) if values else float("nan")


@dataclass
class Summary:
    """Medians of one scenario's figures."""

    ours_pods: float | None
    ours_running: float
    kf_pods: float | None
    kf_running: float | None
    seq_pods: float | None
    conc_pods: float | None
    conc_running: float | None
    gated_pods: float | None
    gated_running: float | None


def summarise(result: Result) -> Summary:
    def med(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return _median(present) if present else None

    return Summary(
        ours_pods=med([s.times.all_pods for s in result.operator]),
        ours_running=_median([s.times.gangs_running for s in result.operator]),
        kf_pods=med([s.times.all_pods for s in result.kubeflow]),
        kf_running=med([s.times.gangs_running for s in result.kubeflow]),
        seq_pods=med([s.times.all_pods for s in result.sequential]),
        conc_pods=med([s.times.all_pods for s in result.concurrent]),
        conc_running=med([s.times.gangs_running for s in result.concurrent]),
        gated_pods=med([s.times.all_pods for s in result.gated]),
        gated_running=med([s.times.gangs_running for s in result.gated]),
    )


SPEED_HEADER = (
    f"{'scenario':<19} {'pods':>4} {'fit':>4} {'runs':>4} | {'ours':>7} {'kubeflow':>8} "
    f"{'direct1':>7} {'direct4':>7} {'gated4':>7} | {'ours run':>8} {'kf run':>7} "
    f"{'dir4 run':>8} {'gat4 run':>8} | {'ours/kf':>7} {'ours/d4':>7} {'ours/g4':>7} "
    f"{'kf/d4':>6} | {'run o/kf':>8} {'run o/g4':>8}"
)
REQUESTS_HEADER = (
    f"{'scenario':<19} | {'ours run':>8} {'quiet':>6} {'/job':>6} {'own ctr':>7} "
    f"{'recon':>5} | "
    f"{'kf run':>7} {'quiet':>6} {'/job':>6} | {'ours RSS':>8} {'idle':>6} | "
    f"{'kf RSS':>7} {'idle':>6}"
)


def _table(header: str, rows: list[str]) -> None:
    print(header)
    print("-" * len(header))
    for row in rows:
        print(row)


def _speed_row(result: Result, nodes: int) -> str:
    scenario = result.scenario
    if not result.operator:
        return f"{scenario.label:<19} incomplete: {result.error}"
    s = summarise(result)
    return (
        f"{scenario.label:<19} {scenario.pods:>4} {scenario.gangs_that_fit(nodes):>4} "
        f"{len(result.operator):>4} | {_seconds(s.ours_pods):>7} {_seconds(s.kf_pods):>8} "
        f"{_seconds(s.seq_pods):>7} {_seconds(s.conc_pods):>7} {_seconds(s.gated_pods):>7} | "
        f"{_seconds(s.ours_running):>8} {_seconds(s.kf_running):>7} "
        f"{_seconds(s.conc_running):>8} {_seconds(s.gated_running):>8} | "
        f"{_ratio(s.ours_pods, s.kf_pods):>7} {_ratio(s.ours_pods, s.conc_pods):>7} "
        f"{_ratio(s.ours_pods, s.gated_pods):>7} {_ratio(s.kf_pods, s.conc_pods):>6} | "
        f"{_ratio(s.ours_running, s.kf_running):>8} "
        f"{_ratio(s.ours_running, s.gated_running):>8}"
    )


def _requests_row(result: Result) -> str:
    scenario = result.scenario
    ours_run = _mean([s.server_at_running for s in result.operator])
    ours_quiet = _mean([s.server_settled for s in result.operator])
    ours_quiet_note = "" if all(s.quiet for s in result.operator) else "+"
    own = _mean([s.settled.total for s in result.operator])
    reconciles = _mean([s.settled.reconciles for s in result.operator])
    kf_run = _mean([s.server_at_running for s in result.kubeflow])
    kf_quiet = _mean([s.server_settled for s in result.kubeflow])
    kf_quiet_note = "" if all(s.quiet for s in result.kubeflow) else "+"
    return (
        f"{scenario.label:<19} | {ours_run:>8.0f} {ours_quiet:>5.0f}{ours_quiet_note or ' '} "
        f"{ours_quiet / scenario.jobs:>6.1f} {own:>7.0f} {reconciles:>5.0f} | "
        + (
            f"{kf_run:>7.0f} {kf_quiet:>5.0f}{kf_quiet_note or ' '} "
            f"{kf_quiet / scenario.jobs:>6.1f} | "
            if result.kubeflow
            else f"{'-':>7} {'-':>6} {'-':>6} | "
        )
        + f"{result.peak_rss_kib / 1024:>6.1f}Mi {result.idle_rss_kib / 1024:>4.0f}Mi | "
        + (
            f"{result.kubeflow_peak_rss_kib / 1024:>5.1f}Mi "
            f"{result.kubeflow_idle_rss_kib / 1024:>4.0f}Mi"
            if result.kubeflow
            else f"{'-':>7} {'-':>6}"
        )
    )


def report(results: list[Result], nodes: int, elapsed: float, log_dir: Path) -> None:
    print()
    print(
        f"Operator scale benchmark: {nodes} fake {INSTANCE_TYPE} nodes, ours --workers "
        f"{WORKERS}, Kubeflow training-operator --controller-threads {WORKERS}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, run {elapsed:.0f}s"
    )
    print("Seconds from the first job create (medians): to all pods created / to every gang")
    print("that fits Running.")
    _table(SPEED_HEADER, [_speed_row(result, nodes) for result in results])
    print()
    print(
        "API requests (counted by the API server per FlowSchema, list+watch included) and memory."
    )
    _table(REQUESTS_HEADER, [_requests_row(result) for result in results if result.operator])
    print(
        """
ours / kubeflow = the two operators; direct1 / direct4 = the same objects (TrainingJob,
Service, PodGroup, pods) created by the same Python client sequentially / from 4 threads in a
namespace nothing reconciles; gated4 = direct4, but each job's pods only once a PodGroup watch
shows Volcano admitted the group (Inqueue), the protocol both operators follow (one Volcano
scheduling period, 1 s, later than direct4 at worst). fit = gangs that fit on the nodes at
once; the others queue in Volcano. "- " = not measurable: with queued jobs the operators and
gated4 create a gang's pods only once Volcano admits its PodGroup, so "all pods" exists only
where every gang fits. run = until every gang that fits has all its pods Running (the
like-for-like figure). API requests: ours run / kf run = until the gangs were Running, quiet =
until the operator stopped making requests for 2 s ("+" = still busy after 30 s), /job = quiet
per job, own ctr = ours from its own /metrics (without kopf's list/watch streams), recon = its
reconcile passes. RSS = VmHWM of a fresh
process per scenario, idle = VmRSS once it is idle after start-up (ours: no request and no
reconcile for 2 s after the probe job; Kubeflow: 2 s after its probe)."""
    )
    for result in results:
        if not result.operator:
            continue
        scenario = result.scenario
        jobs = scenario.jobs
        settled = _mean_requests([s.settled for s in result.operator])
        reads = sum(v for k, v in settled.items() if k.split()[0] in ("get", "list"))
        lists = sum(v for k, v in settled.items() if k.split()[0] == "list")
        writes = sum(settled.values()) - reads
        print()
        print(f"{scenario.label} ({len(result.operator)} run(s)):")
        print(
            "  ours, all pods       "
            + (
                _spread([s.times.all_pods or 0.0 for s in result.operator])
                if all(s.times.all_pods is not None for s in result.operator)
                else f"- (stopped creating pods once the gangs that fit ran, {STALL_SECONDS:.0f}s)"
            )
        )
        print(f"  ours, gangs Running  {_spread([s.times.gangs_running for s in result.operator])}")
        if result.kubeflow:
            if all(s.times.all_pods is not None for s in result.kubeflow):
                print(
                    "  kubeflow, all pods   "
                    + _spread([s.times.all_pods or 0.0 for s in result.kubeflow])
                )
            print(
                "  kubeflow, gangs Run. "
                + _spread([s.times.gangs_running for s in result.kubeflow])
            )
        if result.sequential:
            print(
                "  direct sequential    "
                + _spread([s.times.all_pods or 0.0 for s in result.sequential])
            )
            print(
                "  direct 4 threads     "
                + _spread([s.times.all_pods or 0.0 for s in result.concurrent])
                + f"; gangs Running {_spread([s.times.gangs_running for s in result.concurrent])}"
            )
        if result.gated:
            print(
                "  direct 4, gated      "
                + (
                    _spread([s.times.all_pods or 0.0 for s in result.gated])
                    if all(s.times.all_pods is not None for s in result.gated)
                    else "-"
                )
                + f"; gangs Running {_spread([s.times.gangs_running for s in result.gated])}"
            )
        after = admission_to_pods(result)
        if after is not None:
            print(
                "  Volcano admission -> all pods: "
                + ", ".join(f"{who} {_spread(values)}" for who, values in after.items())
            )
        print(
            f"  first pod after      "
            f"{_median([s.times.first_pod for s in result.operator]):.2f}s (ours)"
            + (
                f", {_median([s.times.first_pod for s in result.kubeflow]):.2f}s (kubeflow)"
                if result.kubeflow
                else ""
            )
        )
        print(
            "  ours, own counter until all pods: "
            + _requests_line(
                _mean_requests([s.at_all_pods for s in result.operator if s.at_all_pods])
            )
        )
        print(
            f"  ours, own counter until quiet "
            f"({_median([s.settle_seconds for s in result.operator]):.1f}s later): "
            + _requests_line(settled)
        )
        reconciles = _mean([s.settled.reconciles for s in result.operator])
        direct_writes = result.sequential[0].requests.total() if result.sequential else 0
        print(
            f"  ours per job until quiet: {(reads + writes) / jobs:.1f} requests "
            f"({reads / jobs:.1f} reads, {writes / jobs:.1f} writes; "
            f"{lists / max(reconciles, 1):.2f} LISTs per "
            f"reconcile) in {reconciles / jobs:.1f} reconciles"
            + (
                f"; the direct client needs {direct_writes / jobs:.1f} writes per job"
                if direct_writes
                else ""
            )
        )
        if result.node_loss:
            loss = result.node_loss
            print(
                f"  node loss: {loss.node} NotReady {loss.not_ready_after:.1f}s after its "
                f"heartbeat stopped; job {loss.job} recorded NodeLost "
                + (
                    f"{loss.reached_job:.2f}s after NotReady"
                    if loss.reached_job is not None
                    else "never (60 s)"
                )
                + f" with {jobs} jobs present"
            )
        if result.log_problems:
            print(f"  operator log problems: {result.log_problems[:5]}")
        if result.error:
            print(f"  error: {result.error}")
    verdicts(results, nodes)
    lean_verdicts(results)
    print(f"\nlogs: {log_dir}")


def admission_to_pods(result: Result) -> dict[str, list[float]] | None:
    """Seconds from Volcano admitting the PodGroup to every pod created, per client, for a
    one-job scenario (with many jobs, the first admission says nothing of the others)."""
    if result.scenario.jobs != 1:
        return None
    samples: dict[str, list[Times]] = {
        "ours": [s.times for s in result.operator],
        "kubeflow": [s.times for s in result.kubeflow],
        "direct 4 gated": [s.times for s in result.gated],
    }
    figures = {
        who: [t.pods_after_admission for t in times if t.pods_after_admission is not None]
        for who, times in samples.items()
    }
    return {who: values for who, values in figures.items() if values}


def verdicts(results: list[Result], nodes: int) -> None:
    """The issue's targets, on this run's figures."""
    print("\nTargets (issue 15):")
    for result in results:
        if not result.operator:
            continue
        scenario, s = result.scenario, summarise(result)
        if scenario.node_loss:
            rss = result.peak_rss_kib / 1024
            print(f"  {scenario.label}: operator RSS {rss:.0f} MiB <= 200: {_verdict(rss <= 200)}")
            settled = _mean_requests([x.settled for x in result.operator])
            lists = sum(v for k, v in settled.items() if k.split()[0] == "list")
            reconciles = _mean([x.settled.reconciles for x in result.operator])
            print(
                f"  {scenario.label}: LISTs per reconcile {lists / max(reconciles, 1):.2f} "
                f"(target 0): {_verdict(lists == 0)}"
            )
            loss = result.node_loss
            reached = loss.reached_job if loss else None
            print(
                f"  {scenario.label}: node loss reaches its job in "
                f"{_seconds(reached)} <= 2 s: {_verdict(reached is not None and reached <= 2)}"
            )
        else:
            limit = 1.1 if scenario.jobs == 1 else 1.3
            figure, ratio = _direct_ratio(s.ours_pods, s.ours_running, s.conc_pods, s.conc_running)
            print(
                f"  {scenario.label}: ours / direct 4 ({figure}) {ratio:.2f}x <= {limit}: "
                f"{_verdict(ratio <= limit)}"
            )
            figure, ratio = _direct_ratio(
                s.ours_pods, s.ours_running, s.gated_pods, s.gated_running
            )
            print(
                f"  {scenario.label}: ours / direct 4 gated on admission ({figure}) "
                f"{ratio:.2f}x <= {limit}: {_verdict(ratio <= limit)}"
            )
            after = admission_to_pods(result)
            if after and "ours" in after and "direct 4 gated" in after:
                ours, direct = _median(after["ours"]), _median(after["direct 4 gated"])
                print(
                    f"  {scenario.label}: from Volcano's admission to all pods, ours / direct 4 "
                    f"gated {ours / direct:.2f}x <= {limit}: {_verdict(ours <= limit * direct)}"
                )
                if "kubeflow" in after:
                    kf = _median(after["kubeflow"])
                    print(
                        f"  {scenario.label}: from Volcano's admission to all pods, ours / "
                        f"Kubeflow {ours / kf:.2f}x <= 1: {_verdict(ours <= kf)}"
                    )
            if scenario.jobs == 1 and s.kf_pods is not None and s.ours_pods is not None:
                print(
                    f"  {scenario.label}: no slower than Kubeflow (all pods "
                    f"{_ratio(s.ours_pods, s.kf_pods)}"
                    f", gangs Running {_ratio(s.ours_running, s.kf_running)}): "
                    f"{_verdict(s.ours_pods <= s.kf_pods)}"
                )
            elif s.kf_running is not None:
                print(
                    f"  {scenario.label}: gangs Running, ours / Kubeflow "
                    f"{_ratio(s.ours_running, s.kf_running)}"
                )


def lean_verdicts(results: list[Result]) -> None:
    """Issue 34's lean-operator targets: idle RSS <= 80 MiB, <= 110 MiB holding 1000 jobs;
    ready <= 2 s and no later than Kubeflow's (medians over the scenarios' fresh processes)."""
    started = [r for r in results if r.ready_seconds is not None]
    if not started:
        return
    print("\nTargets (issue 34, lean operator):")
    idle = _median([r.idle_rss_kib / 1024 for r in started])
    ready_rss = _mib_spread([r.ready_rss_kib for r in started])
    idle_spread = _mib_spread([r.idle_rss_kib for r in started])
    print(f"  idle RSS (median of {len(started)} fresh processes, quiet for {QUIET_SECONDS:.0f} s "
          f"after reconciling the probe job) {idle:.0f} MiB <= 80: {_verdict(idle <= 80)} "
          f"(idle {idle_spread}; the moment it was ready {ready_rss})")  # fmt: skip
    for result in results:
        if result.scenario.node_loss and result.peak_rss_kib:
            peak = result.peak_rss_kib / 1024
            print(f"  {result.scenario.label}: peak RSS {peak:.0f} MiB <= 110: "
                  f"{_verdict(peak <= 110)}")  # fmt: skip
    ready = _median([r.ready_seconds for r in started if r.ready_seconds is not None])
    spread = _spread([r.ready_seconds for r in started if r.ready_seconds is not None])
    print(f"  ready after start: {spread} <= 2 s: {_verdict(ready <= 2)}")
    peers = [r.kubeflow_ready_seconds for r in started if r.kubeflow_ready_seconds is not None]
    if peers:
        kubeflow = _median(peers)
        print(f"  ready after start, ours / Kubeflow {ready:.2f} / {kubeflow:.2f} s = "
              f"{ready / kubeflow:.2f}x <= 1: {_verdict(ready <= kubeflow)}")  # fmt: skip


def _direct_ratio(
    ours_pods: float | None,
    ours_running: float,
    direct_pods: float | None,
    direct_running: float | None,
) -> tuple[str, float]:
    """Ours against direct creates: all pods while ours creates every pod; gangs Running once
    it holds queued jobs' pods back (then "all pods" no longer exists for it)."""
    if ours_pods is not None and direct_pods:
        return "all pods", ours_pods / direct_pods
    if direct_running:
        return "gangs Running", ours_running / direct_running
    return "-", float("nan")


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a 4-node job, 10 and 50 jobs, a few minutes"
    )
    parser.add_argument("--repeats", type=int, default=None, help="runs of every scenario")
    parser.add_argument("--nodes", type=int, default=None, help="fake nodes (default: largest job)")
    parser.add_argument("--name", default=None, help="dev cluster name (default: unique)")
    parser.add_argument(
        "--no-kubeflow", action="store_true", help="skip Kubeflow's training-operator (no build)"
    )
    parser.add_argument(
        "--only", action="append", default=None, help="run only scenarios whose label has this"
    )
    args = parser.parse_args(argv)
    scenarios: tuple[Scenario, ...] = QUICK if args.quick else FULL
    if args.only:
        scenarios = tuple(s for s in scenarios if any(o in s.label for o in args.only))
    if args.repeats:
        scenarios = tuple(
            Scenario(
                s.label, s.jobs, s.nodes_per_job, 1 if s.node_loss else args.repeats, s.node_loss
            )
            for s in scenarios
        )
    # Enough nodes for the largest gang. The jobs beyond that wait in the queue; 200 KWOK nodes
    # would load the machine with heartbeats and node events the measurement does not need.
    nodes = args.nodes or max(s.nodes_per_job for s in scenarios)
    name = args.name or f"bench-op-{os.getpid()}-{uuid.uuid4().hex[:4]}"
    log_dir = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    kubeflow_build = None
    if not args.no_kubeflow:
        with _step("kubeflow training-operator build (cached after the first)"):
            kubeflow_build = build.build_kubeflow(jobs=build.default_jobs(), echo=_echo)
    with _step("bytecode of the environment, as the image's pip install writes it"):
        compile_environment()
    started = time.monotonic()
    results = [Result(s, nodes) for s in scenarios]
    try:
        with dev_cluster(name, nodes, log_dir, kubeflow_build) as bench:
            with _step("warm-up"):
                warm_up(bench)
            for result in results:
                with _step(result.scenario.label):
                    run_scenario(bench, result)
    finally:
        report(results, nodes, time.monotonic() - started, log_dir)
    return 0 if all(result.complete for result in results) else 1


def compile_environment() -> None:
    """Writes the bytecode of every installed module that lacks it: the image's pip install
    does, and an operator that compiles its imports from source at start (a venv installed
    without bytecode, PYTHONDONTWRITEBYTECODE set) holds about 30 MiB more memory."""
    package = Path(spec_model.__file__).resolve().parents[1]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "compileall",
            "-q",
            "-j",
            "0",
            sysconfig.get_path("purelib"),
            str(package),
        ],
        check=False,
        stdout=subprocess.DEVNULL,
    )


if __name__ == "__main__":
    sys.exit(main())
