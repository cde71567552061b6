"""Benchmark: one large gang (128 and 512 nodes) through the operator, against a direct client
creating the same objects, on a fresh dev cluster per size.

Run:  .venv/bin/python tests/bench/bench_gang.py [--nodes 128,512] [--pairs 5] [--quick]
      [--kubeflow] [--verbose]

For each size it starts its own dev cluster of N fake trn1.32xlarge nodes (KWOK), installs the
CRDs, measures the API server's idle request rate (the nodes' heartbeats and leases), runs one
full-size gang through the direct client unmeasured (a new cluster's first large gang binds
slowly whoever creates it), and runs `--pairs` pairs (default 5; `--quick`: 32 nodes, 2
pairs). One job is one gang of N pods, one per node, the compile stage off. Every run of a
pair starts the same seeded time (0-0.8 s, one draw per pair) after one of Volcano's scheduling
sessions closed (its log says when), so each run of the pair waits for Volcano's next session
equally long, and the pairs' phases spread over the 1 s period:

* ours, fresh: a new operator process (`trainium-operator run --namespace NS --workers 4
  --liveness-endpoint ...`); once its /healthz answers (the chart's readiness probe), one job is
  created: create -> first pod, -> all pods, -> all Running. Then the job is deleted
  (TrainingJob only; garbage collection removes its children): delete -> all its pods gone.
* direct: the same Python client (`Cluster.create`, the operator's own create path) creates
  the TrainingJob and exactly the objects `render_job` returns for it (NetworkPolicy, Service,
  PodGroup, the N pods) from 8 threads, in a namespace nothing reconciles; the pods only once
  a PodGroup watch shows Volcano admitted the group (Inqueue), as the operator does. Then it
  deletes them: the pods by label selector (one deletecollection), the PodGroup, Service,
  NetworkPolicy and TrainingJob by name, all with their default grace period, as garbage
  collection does -> all pods gone.
* ours, warm: the same operator process, a second job: the same three figures. Then one rank
  is marked Failed (`sim.simulate_pod_outcome`, exit code 1, as the tests do) -> the next
  attempt's gang all Running.
* direct restart (the floor for a restart): the direct client starts a second gang as before,
  marks one rank Failed the same way, and does what the operator does: from the failed pod's
  watch event it deletes the gang's other pods by name (uid precondition, default grace) from
  8 threads, and once they are all gone creates the next attempt's pods (the rendered pods
  renamed to that attempt) from 8 threads -> the new gang all Running.
* Kubeflow (`--kubeflow`, at 128 nodes or fewer): its training-operator creates the PyTorchJob
  twin (bench_operator's peer): the same three figures.

Targets (issue 34): every figure's median <= 1.2x the direct client's, the fresh operator's
first job included; a restart <= 1.2x a fresh gang's start (ours, warm, all Running). The
table also gives the direct client's restart against its own start (what this machine allows a
restart, whoever drives it) and ours against it.
Everything runs on the same machine (API server, etcd, KWOK, Volcano, the operator, this
script); a ratio is the median of the pairs' ratios (each pair's runs met Volcano's tick at the
same phase), measured in the same run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes.watch.watch import iter_resp_lines

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_operator as bo
import kubeflow_peer

from trainium_devcluster import build, paths, sim, volcano
from trainium_operator.api import spec as spec_model
from trainium_operator.builders.job import LABEL_ATTEMPT
from trainium_operator.k8s.client import PODGROUPS, Cluster, load_api_client

Obj = dict[str, Any]
DIRECT_THREADS = 8
TARGET = 1.2
JITTER_SEED = 20261205
READY_TIMEOUT = 60.0
GONE_TIMEOUT = 180.0
IDLE_SECONDS = 10.0
_POD_NAME = re.compile(r"^(?P<job>.+)-train-(?P<attempt>\d+)-(?P<rank>\d+)$")
_REQUESTS = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


# -- pure helpers (tests/unit/test_bench_gang.py) ----------------------------------------------


def ratio(ours: float | None, reference: float | None) -> float | None:
    if ours is None or reference is None or reference <= 0:
        return None
    return ours / reference


def verdict(value: float | None, limit: float = TARGET) -> str:
    if value is None:
        return "-"
    return "met" if value <= limit else "NOT met"


def spread(measured: list[float | None]) -> str:
    """`median (min-max)` in seconds of the values measured, or `-` without any."""
    values = [v for v in measured if v is not None]
    if not values:
        return "-"
    median = statistics.median(values)
    if len(values) == 1:
        return f"{median:.2f}"
    return f"{median:.2f} ({min(values):.2f}-{max(values):.2f})"


def paired_ratio(ours: list[float | None], reference: list[float | None]) -> float | None:
    """The median of the pairs' ratios (pair i: ours[i] / reference[i]), over the pairs that
    measured both: the runs of a pair met Volcano's tick at the same phase."""
    ratios = [r for o, ref in zip(ours, reference, strict=False) if (r := ratio(o, ref))]
    return statistics.median(ratios) if ratios else None


def next_attempt_name(pod_name: str) -> str:
    """A training pod's name in the gang's next attempt (`<job>-train-<attempt>-<rank>`)."""
    match = _POD_NAME.match(pod_name)
    if match is None:
        raise ValueError(f"not a training pod name: {pod_name}")
    return f"{match['job']}-train-{int(match['attempt']) + 1}-{match['rank']}"


def next_attempt(pod_names: set[str]) -> set[str]:
    """The pod names of the gang's next attempt."""
    return {next_attempt_name(name) for name in pod_names}


def next_attempt_pods(pods: list[Obj]) -> list[Obj]:
    """Rendered training pods as the gang's next attempt: each renamed and labelled with that
    attempt, everything else as rendered (the direct client's restart creates these)."""
    renamed = []
    for pod in pods:
        metadata = pod["metadata"]
        labels = metadata.get("labels", {})
        attempt = int(labels[LABEL_ATTEMPT]) + 1
        renamed.append(
            {
                **pod,
                "metadata": {
                    **metadata,
                    "name": next_attempt_name(metadata["name"]),
                    "labels": {**labels, LABEL_ATTEMPT: str(attempt)},
                },
            }
        )
    return renamed


def request_rates(
    before: Counter[str], after: Counter[str], seconds: float
) -> list[tuple[str, float]]:
    """Requests per second by `verb resource` between two scrapes, highest first."""
    rates = [(key, (after[key] - before.get(key, 0)) / seconds) for key in after]
    return sorted(((k, r) for k, r in rates if r > 0), key=lambda kr: -kr[1])


def parse_request_counts(text: str) -> Counter[str]:
    """apiserver_request_total summed by `verb resource` (every code, scope and client)."""
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        match = _REQUESTS.match(line)
        if match is None:
            continue
        fields = dict(part.split("=", 1) for part in match["labels"].split(",") if "=" in part)
        key = f"{fields.get('verb', '').strip(chr(34))} {fields.get('resource', '').strip(chr(34))}"
        counts[key] += int(float(match["value"]))
    return counts


@dataclass(frozen=True)
class Row:
    figure: str
    ours: list[float | None]  # one per pair, None where the pair did not measure it
    reference: list[float | None]
    reference_label: str  # "direct", or "ours warm" for the restart
    limit: float = TARGET

    def cells(self) -> list[str]:
        r = paired_ratio(self.ours, self.reference)
        return [
            self.figure,
            spread(self.ours),
            spread(self.reference),
            self.reference_label,
            "-" if r is None else f"{r:.2f}x",
            verdict(r, self.limit) if self.limit else "",
        ]


def table(rows: list[Row]) -> str:
    header = ["figure (s)", "ours median (min-max)", "reference", "ref", "ratio", "<=1.2x"]
    cells = [header, *(row.cells() for row in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in cells]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(line.rstrip() for line in lines)


# -- measurements ------------------------------------------------------------------------------


@dataclass
class SizeResult:
    nodes: int
    pairs: int
    idle_rate: float = 0.0
    idle_top: list[tuple[str, float]] = field(default_factory=list)
    fresh: list[bo.Times] = field(default_factory=list)
    warm: list[bo.Times] = field(default_factory=list)
    direct: list[bo.Times] = field(default_factory=list)
    kubeflow: list[bo.Times] = field(default_factory=list)
    restart: list[float] = field(default_factory=list)
    # The direct client's restart (the floor) and the start of the gang it restarts.
    direct_again: list[bo.Times] = field(default_factory=list)
    restart_direct: list[float] = field(default_factory=list)
    delete_ours: list[float] = field(default_factory=list)
    delete_direct: list[float] = field(default_factory=list)
    ready: list[float] = field(default_factory=list)
    log_dir: Path | None = None
    cluster_logs: Path | None = None
    error: str = ""

    def rows(self) -> list[Row]:
        def pick(times: list[bo.Times], what: str) -> list[float | None]:
            return [getattr(t, what) for t in times]

        rows = []
        # Targets on the three figures; the PodGroup's admission and the last bind (limit 0:
        # no verdict) say where the time between them went.
        for label, what, limit in (
            ("PodGroup admitted", "admitted", 0.0),
            ("first pod", "first_pod", TARGET),
            ("all pods", "all_pods", TARGET),
            ("all bound", "all_bound", 0.0),
            ("all Running", "gangs_running", TARGET),
        ):
            direct = pick(self.direct, what)
            rows.append(Row(f"warm job, {label}", pick(self.warm, what), direct, "direct", limit))
            rows.append(Row(f"first job, {label}", pick(self.fresh, what), direct, "direct", limit))
            if self.kubeflow:
                rows.append(
                    Row(f"Kubeflow, {label}", pick(self.kubeflow, what), direct, "direct", 0)
                )
        rows.append(
            Row(
                "rank fails -> new gang Running",
                list(self.restart),
                pick(self.warm, "gangs_running"),
                "ours warm start",
            )
        )
        # The floor for a restart here: the direct client's restart against its own start
        # (no verdict: it says what the machine allows), and ours against it.
        rows.append(
            Row(
                "direct: rank fails -> Running",
                list(self.restart_direct),
                pick(self.direct_again, "gangs_running"),
                "direct start",
                0.0,
            )
        )
        rows.append(
            Row(
                "rank fails -> new gang Running",
                list(self.restart),
                list(self.restart_direct),
                "direct restart",
            )
        )
        rows.append(
            Row(
                "delete -> all pods gone",
                list(self.delete_ours),
                list(self.delete_direct),
                "direct",
            )
        )
        return rows


def _echo(message: str) -> None:
    bo._echo(message)


def api_request_counts(bench: bo.Bench) -> Counter[str]:
    response = bench.clients.api_client.call_api(
        "/metrics",
        "GET",
        auth_settings=["BearerToken"],
        _preload_content=False,
        _return_http_data_only=True,
    )
    return parse_request_counts(response.data.decode())


def idle_load(bench: bo.Bench, result: SizeResult) -> None:
    """The API server's request rate with nothing but the cluster itself running."""
    before = api_request_counts(bench)
    time.sleep(IDLE_SECONDS)
    after = api_request_counts(bench)
    rates = request_rates(before, after, IDLE_SECONDS)
    result.idle_rate = sum(r for _, r in rates)
    result.idle_top = rates[:6]
    _echo(
        f"  idle API load: {result.idle_rate:.1f} requests/s ("
        + ", ".join(f"{k} {r:.1f}" for k, r in result.idle_top)
        + ")"
    )


def gang_scenario(nodes: int) -> bo.Scenario:
    return bo.Scenario("gang", 1, nodes, 1)


def gang_pods(name: str, nodes: int, namespace: str) -> set[str]:
    return bo.expected_pods([bo.training_job(name, nodes)], namespace)


def ours_gang(
    bench: bo.Bench, operator: bo.Operator, namespace: str, name: str, nodes: int
) -> tuple[bo.Times, set[str]]:
    """Creates one TrainingJob and times its gang (the operator must be watching); echoes
    the operator's passes and requests until then."""
    before, cpu_before = operator.scrape(), cpu_seconds(operator.process.pid)
    job = bo.training_job(name, nodes)
    expected = bo.expected_pods([job], namespace)
    watch = bo.watch_jobs(bench, namespace, gang_scenario(nodes), expected, bo.JOB_LABEL)
    wall = datetime.now(UTC)
    started = bo.create_all(
        bench, namespace, (spec_model.GROUP, spec_model.VERSION, spec_model.PLURAL), [job]
    )
    _echo(f"  {name} created at {wall:%H:%M:%S.%f}")
    times = watch.wait(started)
    spent = operator.scrape().minus(before)
    cpu = cpu_seconds(operator.process.pid) - cpu_before
    _echo(
        f"  {name}: {spent.reconciles} passes, {cpu:.2f}s of CPU, requests "
        + bo._requests_line(spent.requests)
    )
    return times, expected


def new_gang_watch(bench: bo.Bench, namespace: str, expected: set[str], nodes: int) -> bo.PodWatch:
    """Times a restart's new gang (only its pods count: the old gang is still Running)."""
    return bo.PodWatch(
        bench.clients,
        namespace,
        expected,
        gang_label=LABEL_ATTEMPT,
        gang_size=nodes,
        gangs=1,
        timeout=gang_scenario(nodes).timeout,
        only_expected=True,
    )


def restart(bench: bo.Bench, namespace: str, pods: set[str], nodes: int) -> float:
    """Marks one rank Failed; seconds until every pod of the next attempt is Running."""
    watch = new_gang_watch(bench, namespace, next_attempt(pods), nodes)
    victim = sorted(pods)[len(pods) // 2]
    # The failed rank's pod stays for its logs; the others go before the new gang starts.
    old = PodsGone(bench, namespace, _job_of(pods), ignore=frozenset({victim}))
    core = bench.clients.core
    started, wall = time.monotonic(), datetime.now(UTC)
    sim.simulate_pod_outcome(core, namespace, victim, succeeded=False, exit_code=1)
    failed = sim.wait_for(
        lambda: core.read_namespaced_pod(victim, namespace).status.phase,
        until=lambda phase: phase == "Failed",
        timeout=60,
        description=f"{victim} Failed",
        interval=0.05,
    )
    failed_after = time.monotonic() - started
    times = watch.wait(started)
    old_gone = old.wait(started)
    marked = None if old.marked_at is None else old.marked_at - started
    _echo(
        f"  restart at {wall:%H:%M:%S.%f}: rank {failed}: {failed_after:.2f}s, old gang deleted "
        f"{bo._seconds(marked)}, gone {old_gone:.2f}s, new gang {_times(times)}"
    )
    return times.gangs_running


def restart_direct(bench: bo.Bench, namespace: str, job: str, nodes: int) -> float:
    """The floor for a restart on this cluster: the direct client does what the operator does
    when a rank fails. From the failed pod's watch event it deletes every other pod of the
    gang by name (the pod's uid as a precondition, the default grace period) from
    DIRECT_THREADS threads, and once a watch shows them all gone it creates the next attempt's
    pods (the rendered pods, renamed to that attempt) from as many threads, into the same
    admitted PodGroup. Marks one rank Failed; seconds until the new gang is Running."""
    client = Cluster(load_api_client(str(bench.kubeconfig)))
    core, custom = bench.clients.core, bench.clients.custom
    uid = custom.get_namespaced_custom_object(
        spec_model.GROUP, spec_model.VERSION, namespace, spec_model.PLURAL, job
    )["metadata"]["uid"]
    rendered = [
        obj
        for obj in bo.children(bo.training_job(job, nodes), namespace, uid)
        if obj["kind"] == "Pod"
    ]
    new_gang = next_attempt_pods(rendered)
    listed = core.list_namespaced_pod(namespace, label_selector=f"{bo.JOB_LABEL}={job}")
    uids = {pod.metadata.name: pod.metadata.uid for pod in listed.items}
    watch = new_gang_watch(bench, namespace, {pod["metadata"]["name"] for pod in new_gang}, nodes)
    victim = sorted(uids)[len(uids) // 2]
    old = PodsGone(bench, namespace, job, ignore=frozenset({victim}))
    failure = core.list_namespaced_pod(
        namespace,
        field_selector=f"metadata.name={victim}",
        watch=True,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=60,
        _preload_content=False,
    )
    started, wall = time.monotonic(), datetime.now(UTC)
    sim.simulate_pod_outcome(core, namespace, victim, succeeded=False, exit_code=1)
    for line in iter_resp_lines(failure):
        if line and json.loads(line)["object"].get("status", {}).get("phase") == "Failed":
            break
    else:
        raise TimeoutError(f"{victim} was not seen Failed in 60s")
    failed_after = time.monotonic() - started
    bo.abort_stream(failure)
    with concurrent.futures.ThreadPoolExecutor(DIRECT_THREADS) as pool:
        list(
            pool.map(
                lambda name: client.delete_pod(namespace, name, force=False, uid=uids[name]),
                sorted(set(uids) - {victim}),
            )
        )
        deleted_after = time.monotonic() - started
        old_gone = old.wait(started)
        list(pool.map(client.create, new_gang))
    times = watch.wait(started)
    _echo(
        f"  direct restart at {wall:%H:%M:%S.%f}: rank failed {failed_after:.2f}s, old gang "
        f"deleted {deleted_after:.2f}s, gone {old_gone:.2f}s, new gang {_times(times)}"
    )
    return times.gangs_running


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _job_of(pods: set[str]) -> str:
    match = _POD_NAME.match(next(iter(pods)))
    assert match is not None
    return match["job"]


class PodsGone:
    """Times until every pod of one job is gone, from a watch opened before the delete."""

    def __init__(
        self, bench: bo.Bench, namespace: str, job: str, ignore: frozenset[str] = frozenset()
    ):
        core = bench.clients.core
        selector = f"{bo.JOB_LABEL}={job}"
        listed = core.list_namespaced_pod(namespace, label_selector=selector)
        self.left = {pod.metadata.name for pod in listed.items} - ignore
        self.gone_at: float | None = None if self.left else time.monotonic()
        # When every one of them had been deleted (a deletionTimestamp): the deleter's share;
        # from there to gone is the kubelet's (KWOK's) removal.
        self.unmarked = set(self.left)
        self.marked_at: float | None = self.gone_at
        self.done = threading.Event()
        self._version = listed.metadata.resource_version
        self._deadline = time.monotonic() + GONE_TIMEOUT

        def open_watch() -> Any:
            return core.list_namespaced_pod(
                namespace,
                label_selector=selector,
                watch=True,
                resource_version=self._version,
                timeout_seconds=int(GONE_TIMEOUT) + 30,
                _preload_content=False,
            )

        self._open = open_watch
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(Exception):
            # Reopened from the last event seen when the API server ends the watch early.
            while self.gone_at is None and time.monotonic() < self._deadline:
                response = self._open()
                for line in iter_resp_lines(response):
                    if not line:
                        continue
                    event = json.loads(line)
                    meta = event["object"]["metadata"]
                    self._version = meta["resourceVersion"]
                    if event.get("type") == "DELETED" or meta.get("deletionTimestamp"):
                        self.unmarked.discard(meta["name"])
                        if not self.unmarked and self.marked_at is None:
                            self.marked_at = time.monotonic()
                    if event.get("type") == "DELETED":
                        self.left.discard(event["object"]["metadata"]["name"])
                        if not self.left:
                            self.gone_at = time.monotonic()
                            break
                with contextlib.suppress(Exception):
                    response.close()
        self.done.set()

    def wait(self, started: float, who: str = "") -> float:
        self.done.wait(GONE_TIMEOUT)
        if self.gone_at is None:
            raise TimeoutError(f"{len(self.left)} pods still there after {GONE_TIMEOUT:.0f}s")
        if who:
            marked = None if self.marked_at is None else self.marked_at - started
            _echo(
                f"  {who} delete: every pod deleted {bo._seconds(marked)}, gone "
                f"{self.gone_at - started:.2f}s"
            )
        return self.gone_at - started


def delete_ours(bench: bo.Bench, namespace: str, job: str) -> float:
    gone = PodsGone(bench, namespace, job)
    started = time.monotonic()
    bench.clients.custom.delete_namespaced_custom_object(
        spec_model.GROUP, spec_model.VERSION, namespace, spec_model.PLURAL, job
    )
    return gone.wait(started, "ours")


def delete_direct(bench: bo.Bench, namespace: str, job: str) -> float:
    """The same objects, deleted by the client: the pods in one deletecollection by label,
    then the PodGroup, Service, NetworkPolicy and TrainingJob by name."""
    core, custom = bench.clients.core, bench.clients.custom
    gone = PodsGone(bench, namespace, job)
    started = time.monotonic()
    core.delete_collection_namespaced_pod(namespace, label_selector=f"{bo.JOB_LABEL}={job}")
    for delete in (
        lambda: custom.delete_namespaced_custom_object(
            "scheduling.volcano.sh", "v1beta1", namespace, PODGROUPS, f"{job}-train"
        ),
        lambda: core.delete_namespaced_service(job, namespace),
        lambda: bench.clients.api_client.call_api(
            f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/{job}",
            "DELETE",
            auth_settings=["BearerToken"],
            _preload_content=False,
        ),
        lambda: custom.delete_namespaced_custom_object(
            spec_model.GROUP, spec_model.VERSION, namespace, spec_model.PLURAL, job
        ),
    ):
        with contextlib.suppress(Exception):
            delete()
    return gone.wait(started, "direct")


def wait_healthz(operator: bo.Operator, port: int) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        operator.check_alive()
        url = f"http://127.0.0.1:{port}/healthz"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as reply:
            if reply.status == 200:
                return
        time.sleep(0.05)
    raise TimeoutError(f"the operator's /healthz did not answer in {READY_TIMEOUT:.0f}s")


class VolcanoTick:
    """Volcano's scheduling sessions, read from its log: a session opens one period after the
    previous one closed (`wait.Until` slides), so a create `phase` seconds after a close meets
    the next session `period - phase` seconds later, whoever creates."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def wait_close(self, timeout: float = 3.0) -> bool:
        """Returns at the next "Close Session" line; False if none came within `timeout`."""
        deadline = time.monotonic() + timeout
        try:
            with self.log.open("rb") as lines:
                lines.seek(0, os.SEEK_END)
                pending = b""
                while time.monotonic() < deadline:
                    chunk = lines.read()
                    if not chunk:
                        time.sleep(0.005)
                        continue
                    pending += chunk
                    if b"Close Session" in pending:
                        return True
                    pending = pending[pending.rfind(b"\n") + 1 :]
        except OSError:
            return False
        return False


def run_pair(
    bench: bo.Bench,
    result: SizeResult,
    index: int,
    namespaces: dict[str, str],
    *,
    jitter: random.Random,
    tick: VolcanoTick,
    verbose: bool,
    kubeflow: kubeflow_peer.KubeflowOperator | None,
) -> None:
    nodes = result.nodes
    # One phase of Volcano's tick for every run of the pair: each meets the scheduler's next
    # session equally late, so the pair's ratios compare the creators, not where the tick fell;
    # the phases of the pairs spread over the period, short of its last fifth, where a session
    # opening a few milliseconds early or late decides which one a run meets.
    phase = jitter.uniform(0, 0.8 * bo.TICK_JITTER_SECONDS)

    def desync() -> None:
        if tick.wait_close():
            time.sleep(phase)
        else:
            time.sleep(jitter.uniform(0, bo.TICK_JITTER_SECONDS))

    op_ns, direct_ns = namespaces["op"], namespaces["direct"]
    health_port = bo.free_port()
    extra = ["--liveness-endpoint", f"http://127.0.0.1:{health_port}/healthz"]
    if verbose:
        extra += ["--verbose", "--log-format", "json"]
    spawned = time.monotonic()
    operator = bo.Operator(bench, op_ns, f"gang{nodes}-pair{index}", *extra)
    try:
        wait_healthz(operator, health_port)
        result.ready.append(time.monotonic() - spawned)
        desync()
        times, _ = ours_gang(bench, operator, op_ns, f"fresh{index}", nodes)
        result.fresh.append(times)
        _echo(f"  pair {index}: ours fresh {_times(times)}")
        desync()
        result.delete_ours.append(delete_ours(bench, op_ns, f"fresh{index}"))
        _echo(f"  pair {index}: ours delete {result.delete_ours[-1]:.2f}s")
        bo.clear_namespace(bench, op_ns)

        desync()
        prefix = f"direct{index}"
        sample = bo.direct_sample(
            bench, direct_ns, gang_scenario(nodes), prefix, DIRECT_THREADS, gated=True, clear=False
        )
        result.direct.append(sample.times)
        _echo(f"  pair {index}: direct {_times(sample.times)}")
        desync()
        result.delete_direct.append(delete_direct(bench, direct_ns, f"{prefix}-0000"))
        _echo(f"  pair {index}: direct delete {result.delete_direct[-1]:.2f}s")
        bo.clear_namespace(bench, direct_ns)

        desync()
        times, pods = ours_gang(bench, operator, op_ns, f"warm{index}", nodes)
        result.warm.append(times)
        _echo(f"  pair {index}: ours warm {_times(times)}")
        desync()
        result.restart.append(restart(bench, op_ns, pods, nodes))
        _echo(f"  pair {index}: restart {result.restart[-1]:.2f}s")
        bo.clear_namespace(bench, op_ns)

        desync()
        prefix = f"again{index}"
        sample = bo.direct_sample(
            bench, direct_ns, gang_scenario(nodes), prefix, DIRECT_THREADS, gated=True, clear=False
        )
        result.direct_again.append(sample.times)
        desync()
        result.restart_direct.append(restart_direct(bench, direct_ns, f"{prefix}-0000", nodes))
        _echo(f"  pair {index}: direct restart {result.restart_direct[-1]:.2f}s")
        bo.clear_namespace(bench, direct_ns)

        if kubeflow is not None:
            desync()
            sample_kf = bo.kubeflow_sample(
                bench, namespaces["kf"], gang_scenario(nodes), f"kf{index}"
            )
            result.kubeflow.append(sample_kf.times)
    finally:
        operator.stop()


def _times(times: bo.Times) -> str:
    return (
        f"admitted {bo._seconds(times.admitted)}, first pod {times.first_pod:.2f}s, all pods "
        f"{bo._seconds(times.all_pods)}, all bound {bo._seconds(times.all_bound)}, "
        f"Running {times.gangs_running:.2f}s"
    )


def run_size(
    nodes: int, pairs: int, *, verbose: bool, with_kubeflow: bool, log_root: Path
) -> SizeResult:
    result = SizeResult(nodes, pairs)
    name = f"gang-{os.getpid()}-{uuid.uuid4().hex[:4]}"
    log_dir = log_root / f"n{nodes}"
    log_dir.mkdir(parents=True, exist_ok=True)
    result.log_dir = log_dir
    result.cluster_logs = paths.ClusterPaths(name).state_dir
    kubeflow_build = None
    if with_kubeflow and nodes <= 128:
        kubeflow_build = build.build_kubeflow(jobs=build.default_jobs(), echo=_echo)
    try:
        with bo.dev_cluster(name, nodes, log_dir, kubeflow_build) as bench:
            with bo._step("warm-up"):
                bo.warm_up(bench)
                # The cluster's first gang of the full size is slow whoever creates it (Volcano's
                # binding); pay it before the measured pairs.
                namespace = bo.create_namespace(bench, "warmgang")
                bo.direct_sample(
                    bench, namespace, gang_scenario(nodes), "warmgang", DIRECT_THREADS, gated=True
                )
                bo.delete_namespace(bench, namespace)
            idle_load(bench, result)
            namespaces = {
                "op": bo.create_namespace(bench, "op"),
                "direct": bo.create_namespace(bench, "direct"),
            }
            kubeflow = None
            if kubeflow_build is not None and bench.kubeflow is not None:
                namespaces["kf"] = bo.create_namespace(bench, "kf")
                kubeflow = kubeflow_peer.KubeflowOperator(
                    kubeflow_build,
                    bench.kubeflow,
                    namespaces["kf"],
                    log_dir,
                    "gang",
                    threads=bo.WORKERS,
                )
                kubeflow.wait_ready()
            jitter = random.Random(JITTER_SEED + nodes)
            try:
                for index in range(pairs):
                    with bo._step(f"{nodes} nodes, pair {index + 1}/{pairs}"):
                        run_pair(
                            bench,
                            result,
                            index,
                            namespaces,
                            jitter=jitter,
                            tick=VolcanoTick(volcano.daemons(paths.ClusterPaths(name))[0].log),
                            verbose=verbose,
                            kubeflow=kubeflow,
                        )
            finally:
                if kubeflow is not None:
                    kubeflow.stop()
    except Exception as error:
        result.error = f"{type(error).__name__}: {error}"
        _echo(f"  {nodes} nodes failed: {result.error}")
    return result


def report(results: list[SizeResult], elapsed: float) -> None:
    print()
    print(
        f"Gang-size benchmark: one gang of N fake trn1.32xlarge nodes (one pod per node, "
        f"compile stage off), {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}, run {elapsed:.0f}s."
    )
    print(
        f"ours = `trainium-operator run --workers {bo.WORKERS}` (first job: a new process, the job "
        "created once /healthz answers; warm: its second job). direct = the same Python client "
        "creating the TrainingJob and exactly the objects render_job returns (NetworkPolicy, "
        f"Service, PodGroup, N pods) from {DIRECT_THREADS} threads, the pods only once Volcano "
        "admits the PodGroup (Inqueue); its delete: the pods by one deletecollection, the rest "
        "by name, default grace as garbage collection uses. Seconds from the create (restart: "
        "from marking one rank Failed; delete: from the delete call); median (min-max) of the "
        "pairs; ratio: the median of the pairs' ratios."
    )
    for result in results:
        print()
        runs = len(result.warm)
        print(
            f"{result.nodes} nodes, {runs} of {result.pairs} pairs; idle API server load "
            f"{result.idle_rate:.1f} requests/s ("
            + ", ".join(f"{k} {r:.1f}" for k, r in result.idle_top)
            + f"); operator /healthz after start {spread(result.ready)}s"
        )
        print(table(result.rows()))
        if result.error:
            print(f"error: {result.error}")
        print(f"logs: {result.log_dir}; cluster logs: {result.cluster_logs}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", default="128,512", help="comma-separated gang sizes")
    parser.add_argument("--pairs", type=int, default=5, help="paired runs per size")
    parser.add_argument("--quick", action="store_true", help="32 nodes, 2 pairs: a smoke run")
    parser.add_argument("--kubeflow", action="store_true", help="Kubeflow at sizes <= 128")
    parser.add_argument("--verbose", action="store_true", help="the operator's --verbose log")
    args = parser.parse_args(argv)
    sizes = [32] if args.quick else [int(n) for n in args.nodes.split(",")]
    pairs = 2 if args.quick else args.pairs
    log_root = Path(tempfile.mkdtemp(prefix="bench-gang-"))
    started = time.monotonic()
    results: list[SizeResult] = []
    try:
        for nodes in sizes:
            results.append(
                run_size(
                    nodes,
                    pairs,
                    verbose=args.verbose,
                    with_kubeflow=args.kubeflow,
                    log_root=log_root,
                )
            )
    finally:
        report(results, time.monotonic() - started)
    return 0 if results and all(not r.error for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
