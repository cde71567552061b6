"""Benchmark: how fast the operator turns TrainingJobs into pods, against the API server alone.

Run:  .venv/bin/python tests/bench/bench_operator.py [--quick] [--repeats N]

It starts its own fresh dev cluster (a unique name, 16 fake trn1.32xlarge nodes; `--quick`: 4),
installs the CRDs and measures two scenarios: a 16-node job (5 repetitions) and 100 two-node
jobs created at once (2 repetitions); `--quick`: a 4-node job (3) and 10 two-node jobs (1).
16 nodes hold the 16-node gang; of the 100 two-node gangs 8 run and 92 wait in the queue, which
does not change when their pods are *created* (the figure), while 200 KWOK nodes would only add
heartbeats and node events to a 2-CPU machine (`--nodes N` changes it).

* operator: `python -m trainium_operator run --namespace NS --metrics-port P` as a subprocess,
  a fresh process per scenario so its VmHWM (peak RSS, /proc/<pid>/status) is the scenario's.
  The clock starts just before the first TrainingJob `create` (the jobs are created by 4 client
  threads, "at once") and stops when a pod watch opened beforehand has seen every compile pod
  the operator must create (their names from `render_job`). The operator's request counter
  (`trainium_operator_api_requests_total` on its /metrics) is scraped before, when all pods
  exist, and once the operator has gone quiet (pods being bound and started keep it busy).
* direct (the peer): the same client (`trainium_operator.k8s.client.Cluster.create`, the code
  path the operator uses) creates each TrainingJob and then exactly the objects `render_job`
  returns for it (Service, PodGroup, pods, owned by the real job uid), sequentially, then from
  4 threads (the operator's `--workers` default), in another namespace nothing reconciles, timed
  by the same watch: what the API server itself needs to hold the same objects.

The figure is operator_time / direct_time (medians over the repetitions, which alternate
operator, direct sequential, direct 4 threads). Everything runs on one machine (API server,
etcd, KWOK, the Volcano scheduler and controller manager, the operator and this script), so
absolute times follow its load; the ratio is measured in the same run on the same cluster.
Between repetitions the run's objects are deleted and its pods are gone, so every run starts
from the same cluster state.
Namespaces and the cluster are deleted in `finally` (also on SIGTERM and Ctrl-C).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from kubernetes.watch.watch import iter_resp_lines

from trainium_operator.api import spec as spec_model
from trainium_operator.controller.commands import render_job
from trainium_operator.devcluster import cluster, sim
from trainium_operator.devcluster.clients import Clients, clients_for, is_status
from trainium_operator.k8s.client import (
    PODGROUPS,
    VOLCANO_GROUP,
    VOLCANO_VERSION,
    Cluster,
    load_api_client,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from integration.operator_harness import (  # noqa: E402
    ensure_shared_claim,
    install_crds,
    job_manifest,
)

Obj = dict[str, Any]
WORKERS = 4  # the operator's --workers default; the direct peer uses as many client threads
INSTANCE_TYPE = "trn1.32xlarge"
JOB_LABEL = "trainium.dev/job-name"
RUN_TIMEOUT = 120.0
QUIET_SECONDS = 2.0
QUIET_TIMEOUT = 30.0
_METRIC = re.compile(
    r'^trainium_operator_api_requests_total\{verb="([^"]+)",resource="([^"]+)"\} (\d+)$'
)


@dataclass(frozen=True)
class Scenario:
    label: str
    jobs: int
    nodes_per_job: int
    repeats: int

    @property
    def pods(self) -> int:
        return self.jobs * self.nodes_per_job


FULL = (Scenario("16-node job", 1, 16, 5), Scenario("100 x 2-node jobs", 100, 2, 2))
QUICK = (Scenario("4-node job", 1, 4, 3), Scenario("10 x 2-node jobs", 10, 2, 1))


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
class OperatorSample:
    seconds: float
    first_pod_seconds: float
    at_all_pods: Metrics
    settled: Metrics
    settle_seconds: float


@dataclass
class DirectSample:
    seconds: float
    client_seconds: float  # when the last create call returned
    requests: Counter[str]


@dataclass
class Result:
    scenario: Scenario
    operator: list[OperatorSample] = field(default_factory=list)
    sequential: list[DirectSample] = field(default_factory=list)
    concurrent: list[DirectSample] = field(default_factory=list)
    idle_rss_kib: int = 0
    peak_rss_kib: int = 0
    log_problems: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return all(
            len(samples) == self.scenario.repeats
            for samples in (self.operator, self.sequential, self.concurrent)
        )


@dataclass
class Bench:
    name: str
    kubeconfig: Path
    clients: Clients
    log_dir: Path
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    return 0


# -- jobs and namespaces -----------------------------------------------------------------------


def manifests(scenario: Scenario, prefix: str) -> list[Obj]:
    return [
        job_manifest(f"{prefix}-{index:03d}", nodes=scenario.nodes_per_job)
        for index in range(scenario.jobs)
    ]


def children(manifest: Obj, namespace: str, uid: str) -> list[Obj]:
    """Exactly what the operator creates for this job on its first pass."""
    document = {
        **manifest,
        "metadata": {**manifest["metadata"], "namespace": namespace, "uid": uid},
    }
    return render_job(document, datetime.now(UTC))


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


def clear_namespace(bench: Bench, name: str, *, wait: bool = True) -> None:
    """Deletes the run's objects; with `wait`, until its pods are gone (a deleted namespace
    takes the namespace controller ~10 s, so runs reuse theirs and only clear it)."""
    core, custom = bench.clients.core, bench.clients.custom
    # Jobs first: with pods gone and its job still there, the operator would start a new
    # attempt (a deleted pod is an infrastructure failure).
    custom.delete_collection_namespaced_custom_object(
        spec_model.GROUP, spec_model.VERSION, name, spec_model.PLURAL
    )
    custom.delete_collection_namespaced_custom_object(
        VOLCANO_GROUP, VOLCANO_VERSION, name, PODGROUPS
    )
    core.delete_collection_namespaced_service(name)
    deadline = time.monotonic() + 60
    while True:
        # Without grace, or they hold their nodes (and the next run's gangs) for 30 s; again
        # and again, for pods garbage collection deletes gracefully or a reconcile that read
        # its job before the deletion still creates.
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        if not wait or not core.list_namespaced_pod(name).items:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods of {name} still there after 60 s")
        time.sleep(0.2)


def delete_namespace(bench: Bench, name: str) -> None:
    try:
        clear_namespace(bench, name, wait=False)
        bench.clients.core.delete_namespace(name)
    except Exception as error:
        if not is_status(error, 404):
            raise
    if name in bench.namespaces:
        bench.namespaces.remove(name)


# -- watching pods appear ----------------------------------------------------------------------


class PodWatch:
    """Records when each expected pod is first seen, from a watch opened before the run.

    It reads the raw stream and parses only JSON (no client model objects), so it takes
    next to nothing from the direct peer's threads in this process."""

    def __init__(self, clients: Clients, namespace: str, expected: set[str]):
        self.namespace = namespace
        self.expected = set(expected)
        self.seen: dict[str, float] = {}
        self.done = threading.Event()
        self.error: BaseException | None = None
        listed = clients.core.list_namespaced_pod(namespace)
        for pod in listed.items:
            if pod.metadata.name in self.expected:
                self.seen[pod.metadata.name] = time.monotonic()
        self._response = clients.core.list_namespaced_pod(
            namespace,
            watch=True,
            resource_version=listed.metadata.resource_version,
            allow_watch_bookmarks=False,
            timeout_seconds=int(RUN_TIMEOUT) + 30,
            _preload_content=False,
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for line in iter_resp_lines(self._response):
                if not line:
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    raise RuntimeError(f"watch error: {event.get('object')}")
                name = event["object"]["metadata"]["name"]
                if name in self.expected and name not in self.seen:
                    self.seen[name] = time.monotonic()
                    if len(self.seen) == len(self.expected):
                        break
        except BaseException as error:
            self.error = error
        finally:
            self.done.set()
            with contextlib.suppress(Exception):
                self._response.release_conn()

    def wait(self, started: float) -> tuple[float, float]:
        """(seconds from `started` to the first and to the last expected pod)."""
        if not self.done.wait(RUN_TIMEOUT) or len(self.seen) < len(self.expected):
            missing = sorted(self.expected - set(self.seen))
            raise TimeoutError(
                f"{len(missing)} of {len(self.expected)} pods not created in {RUN_TIMEOUT:.0f}s "
                f"in {self.namespace} (e.g. {missing[:3]}; watch error: {self.error!r})"
            )
        return min(self.seen.values()) - started, max(self.seen.values()) - started


# -- the operator ------------------------------------------------------------------------------


class Operator:
    def __init__(self, bench: Bench, namespace: str, label: str):
        self.port = _free_port()
        self.log_path = bench.log_dir / f"operator-{label}.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainium_operator",
                "run",
                "--kubeconfig",
                str(bench.kubeconfig),
                "--namespace",
                namespace,
                "--metrics-port",
                str(self.port),
                "--workers",
                str(WORKERS),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def scrape(self) -> Metrics:
        if self.process.poll() is not None:
            raise RuntimeError(f"the operator exited:\n{self.log()[-3000:]}")
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

    def rss_kib(self, key: str) -> int:
        return _status_kib(self.process.pid, key)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def wait_operator_ready(bench: Bench, operator: Operator, namespace: str) -> None:
    """/metrics answers and the pod watch is live: a labelled pod nobody schedules gets
    reconciled (its job does not exist, so that pass costs one GET)."""
    sim.wait_for(operator.try_scrape, timeout=60, description="operator /metrics answers")
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bench-ready-probe", "labels": {JOB_LABEL: "bench-ready-probe"}},
        "spec": {
            "schedulerName": "bench-nobody",
            "containers": [{"name": "c", "image": "example.com/none:0"}],
        },
    }
    bench.clients.core.create_namespaced_pod(namespace, probe)
    sim.wait_for(
        operator.scrape,
        until=lambda metrics: metrics.reconciles >= 1,
        timeout=60,
        description="the operator reconciles after a pod event",
    )
    bench.clients.core.delete_namespaced_pod("bench-ready-probe", namespace, grace_period_seconds=0)


def operator_sample(
    bench: Bench, operator: Operator, namespace: str, scenario: Scenario, prefix: str
) -> OperatorSample:
    before, _ = operator.wait_quiet()
    jobs = manifests(scenario, prefix)
    pod_watch = PodWatch(bench.clients, namespace, expected_pods(jobs, namespace))
    custom = bench.clients.custom

    def create(manifest: Obj) -> None:
        custom.create_namespaced_custom_object(
            spec_model.GROUP, spec_model.VERSION, namespace, spec_model.PLURAL, manifest
        )

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(create, jobs))
    first, last = pod_watch.wait(started)
    at_all_pods = operator.scrape().minus(before)
    settled, settle_seconds = operator.wait_quiet()
    clear_namespace(bench, namespace)
    _echo(f"  operator: {scenario.pods} pods in {last:.2f}s, quiet {settle_seconds:.1f}s later")
    return OperatorSample(last, first, at_all_pods, settled.minus(before), settle_seconds)


# -- the peer: the API server alone ------------------------------------------------------------


def direct_sample(
    bench: Bench, namespace: str, scenario: Scenario, prefix: str, workers: int
) -> DirectSample:
    client = Cluster(load_api_client(str(bench.kubeconfig)))
    jobs = manifests(scenario, prefix)
    pod_watch = PodWatch(bench.clients, namespace, expected_pods(jobs, namespace))

    def create_job(manifest: Obj) -> list[Obj]:
        client.counter.add("create", spec_model.PLURAL)
        created = client.custom.create_namespaced_custom_object(
            spec_model.GROUP, spec_model.VERSION, namespace, spec_model.PLURAL, manifest
        )
        return children(manifest, namespace, created["metadata"]["uid"])

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
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            pending = {pool.submit(create_job, manifest) for manifest in jobs}
            while pending:
                finished, pending = concurrent.futures.wait(
                    pending, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for future in finished:
                    pending |= {pool.submit(create, obj) for obj in future.result()}
    client_seconds = time.monotonic() - started
    _first, last = pod_watch.wait(started)
    clear_namespace(bench, namespace)
    _echo(f"  direct x{workers}: {scenario.pods} pods in {last:.2f}s")
    return DirectSample(last, client_seconds, client.counter.counts)


# -- scenarios, cluster, report ----------------------------------------------------------------


def run_scenario(bench: Bench, result: Result) -> None:
    scenario = result.scenario
    op_namespace = create_namespace(bench, "op")
    direct_namespace = create_namespace(bench, "direct")
    operator = Operator(bench, op_namespace, re.sub(r"\W+", "", scenario.label))
    try:
        with _step("operator ready"):
            wait_operator_ready(bench, operator, op_namespace)
        result.idle_rss_kib = operator.rss_kib("VmRSS")
        for rep in range(scenario.repeats):
            result.operator.append(
                operator_sample(bench, operator, op_namespace, scenario, f"op{rep}")
            )
            result.sequential.append(
                direct_sample(bench, direct_namespace, scenario, f"seq{rep}", 1)
            )
            result.concurrent.append(
                direct_sample(bench, direct_namespace, scenario, f"conc{rep}", WORKERS)
            )
        result.peak_rss_kib = operator.rss_kib("VmHWM")
    finally:
        operator.stop()
        result.log_problems = [
            line for line in operator.log().splitlines() if "Traceback" in line or "ERROR" in line
        ]
        delete_namespace(bench, op_namespace)
        delete_namespace(bench, direct_namespace)


def warm_up(bench: Bench) -> None:
    """The first writes after the API server starts (CRD handlers, watch caches) are slow for
    reasons that have nothing to do with the operator: pay them outside the measurements."""
    namespace = create_namespace(bench, "warmup")
    direct_sample(bench, namespace, Scenario("warm-up", 8, 2, 1), "warm", WORKERS)
    delete_namespace(bench, namespace)


@contextlib.contextmanager
def dev_cluster(name: str, nodes: int, log_dir: Path) -> Iterator[Bench]:
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
        bench = Bench(name, report.kubeconfig, clients, log_dir)
        install_crds(clients)
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


def _mean_requests(samples: list[Metrics]) -> Counter[str]:
    total: Counter[str] = Counter()
    for sample in samples:
        total.update(sample.requests)
    return Counter({key: round(value / len(samples)) for key, value in total.items()})


def _requests_line(requests: Counter[str]) -> str:
    return ", ".join(f"{key} {value}" for key, value in sorted(requests.items()) if value)


def report(results: list[Result], nodes: int, elapsed: float, log_dir: Path) -> None:
    print()
    print(
        f"Operator scale benchmark: {nodes} fake {INSTANCE_TYPE} nodes, operator --workers "
        f"{WORKERS}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
        f"run {elapsed:.0f}s"
    )
    print("Seconds from the first TrainingJob create to all compile pods created (medians).")
    header = (
        f"{'scenario':<18} {'pods':>4} {'runs':>4} | {'operator':>8} {'direct 1':>8} "
        f"{'direct 4':>8} | {'op/dir4':>7} {'op/dir1':>7} | {'op req':>6} {'req/job':>7} "
        f"{'quiet':>6} {'recon':>5} | {'peak RSS':>8} {'idle RSS':>8}"
    )
    print(header)
    print("-" * len(header))
    for result in results:
        scenario = result.scenario
        if not result.complete:
            print(f"{scenario.label:<18} incomplete")
            continue
        op = _median([s.seconds for s in result.operator])
        seq = _median([s.seconds for s in result.sequential])
        conc = _median([s.seconds for s in result.concurrent])
        at_all = statistics.mean(s.at_all_pods.total for s in result.operator)
        quiet = statistics.mean(s.settled.total for s in result.operator)
        reconciles = statistics.mean(s.settled.reconciles for s in result.operator)
        print(
            f"{scenario.label:<18} {scenario.pods:>4} {scenario.repeats:>4} | "
            f"{op:>7.2f}s {seq:>7.2f}s {conc:>7.2f}s | {op / conc:>6.2f}x {op / seq:>6.2f}x | "
            f"{at_all:>6.0f} {at_all / scenario.jobs:>7.1f} {quiet:>6.0f} {reconciles:>5.0f} | "
            f"{result.peak_rss_kib / 1024:>6.1f}Mi {result.idle_rss_kib / 1024:>6.1f}Mi"
        )
    print(
        """
operator = the operator process; direct 1 / direct 4 = the same objects (TrainingJob, Service,
PodGroup, pods) created by the same Python client sequentially / from 4 threads; op/dir4 and
op/dir1 = the ratios (the figure). op req = the operator's API requests until all pods existed
(per run, from its /metrics), req/job = that per job, quiet = its requests until it went
quiet (pods bound and started keep it reconciling), recon = its reconcile passes until quiet;
peak RSS = VmHWM of a fresh operator process per scenario, idle RSS = after start-up. The
operator's counter leaves out kopf's own list+watch streams (TrainingJobs, pods, nodes)."""
    )
    for result in results:
        if not result.complete:
            continue
        scenario = result.scenario
        jobs = scenario.jobs
        settled = _mean_requests([s.settled for s in result.operator])
        reads = sum(v for k, v in settled.items() if k.split()[0] in ("get", "list"))
        writes = sum(settled.values()) - reads
        direct_writes = result.sequential[0].requests.total()
        print()
        print(f"{scenario.label} ({scenario.repeats} run(s)):")
        print(f"  operator          {_spread([s.seconds for s in result.operator])}")
        print(f"  direct sequential {_spread([s.seconds for s in result.sequential])}")
        print(f"  direct 4 threads  {_spread([s.seconds for s in result.concurrent])}")
        print(
            f"  first pod after   {_median([s.first_pod_seconds for s in result.operator]):.2f}s"
            f" (operator); the direct clients' last create returned after "
            f"{_median([s.client_seconds for s in result.sequential]):.2f}s / "
            f"{_median([s.client_seconds for s in result.concurrent]):.2f}s"
        )
        print(
            "  operator requests until all pods: "
            + _requests_line(_mean_requests([s.at_all_pods for s in result.operator]))
        )
        print(
            f"  operator requests until quiet "
            f"({_median([s.settle_seconds for s in result.operator]):.1f}s later): "
            + _requests_line(settled)
        )
        reconciles = statistics.mean(s.settled.reconciles for s in result.operator)
        print(
            f"  per job until quiet: {(reads + writes) / jobs:.1f} requests ({reads / jobs:.1f} "
            f"reads, {writes / jobs:.1f} writes) in {reconciles / jobs:.1f} reconciles; "
            f"the direct client needs {direct_writes / jobs:.1f} writes per job"
        )
        if result.log_problems:
            print(f"  operator log problems: {result.log_problems[:5]}")
    print(f"\noperator logs: {log_dir}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a 4-node job and 10 jobs, about a minute"
    )
    parser.add_argument("--repeats", type=int, default=None, help="runs of every scenario")
    parser.add_argument("--nodes", type=int, default=None, help="fake nodes (default: largest job)")
    parser.add_argument("--name", default=None, help="dev cluster name (default: unique)")
    args = parser.parse_args(argv)
    scenarios: tuple[Scenario, ...] = QUICK if args.quick else FULL
    if args.repeats:
        scenarios = tuple(
            Scenario(s.label, s.jobs, s.nodes_per_job, args.repeats) for s in scenarios
        )
    # Enough nodes for the largest gang. The two-node jobs beyond that wait in the queue, which
    # does not change when their pods are *created* (the figure), while 200 KWOK nodes would
    # load the machine with heartbeats and node events the measurement does not need.
    nodes = args.nodes or max(s.nodes_per_job for s in scenarios)
    name = args.name or f"bench-op-{os.getpid()}-{uuid.uuid4().hex[:4]}"
    log_dir = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    started = time.monotonic()
    results = [Result(s) for s in scenarios]
    try:
        with dev_cluster(name, nodes, log_dir) as bench:
            with _step("warm-up"):
                warm_up(bench)
            for result in results:
                with _step(result.scenario.label):
                    run_scenario(bench, result)
    finally:
        report(results, nodes, time.monotonic() - started, log_dir)
    return 0 if all(result.complete for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
