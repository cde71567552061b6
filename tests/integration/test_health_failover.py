"""The health channel under peering on the dev cluster: two replicas, the Service selecting the
acting one's pod, a failover, and the ranks' progress carried across it.

The operators run as local processes, not pods, so each gets a stand-in Pod (KWOK runs it:
Running, Ready, an IP) named by its --pod-name; the Service selects those pods as the chart's
health Service selects the operator's, and the dev cluster's kube-controller-manager writes its
EndpointSlice. Nothing here runs kube-proxy: `Forwarder` stands in for it.
"""

from __future__ import annotations

import http.server
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from integration.health_ranks import rank_env, reporting_job, start_rank
from integration.operator_harness import (
    OperatorProcess,
    create_peering,
    ensure_shared_claim,
    free_port,
)
from trainium_devcluster.sim import wait_for
from trainium_operator.contract import channel as contract
from trainium_operator.controller.health_role import ACTIVE, LABEL, ROLE_PERIOD_SECONDS

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]

PEERING = "tj"
LIFETIME = 2  # seconds: kopf's keep-alive is then every second
SERVICE = "health"
SELECTOR = {"app.kubernetes.io/name": "ha-operator"}
REPORT_S = 0.2  # the ranks' spec.health.reportIntervalSeconds
# A rank whose sends failed (no endpoint during the failover) retries at its report interval,
# but never under 1 s apart (profiler/channel.py Reporter.max_backoff_s).
RANK_RETRY_S = 1.0


def stand_in_pod(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(SELECTOR)},
        "spec": {"nodeName": node, "containers": [{"name": "operator", "image": "operator"}]},
    }


def health_service() -> dict[str, Any]:
    """The chart's health Service under peering (templates/health.yaml)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE},
        "spec": {
            "selector": {**SELECTOR, LABEL: ACTIVE},
            "ports": [{"name": "health-channel", "port": contract.PORT}],
        },
    }


def ready_endpoints(clients: Any, namespace: str) -> set[str]:
    """The pods the Service's EndpointSlices list as ready."""
    slices = client.DiscoveryV1Api(clients.core.api_client).list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={SERVICE}"
    )
    return {
        endpoint.target_ref.name
        for each in slices.items
        for endpoint in each.endpoints or []
        if endpoint.target_ref is not None and (endpoint.conditions.ready is not False)
    }


def pod_labels(clients: Any, namespace: str) -> dict[str, str | None]:
    pods = clients.core.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/name")
    return {p.metadata.name: (p.metadata.labels or {}).get(LABEL) for p in pods.items}


class Forwarder(http.server.ThreadingHTTPServer):
    """Stands in for kube-proxy: each rank message goes to the replica whose pod the Service's
    EndpointSlice lists now; with none listed the connection is closed unanswered (kube-proxy
    rejects it), which the rank counts as a failed send."""

    def __init__(self, clients: Any, namespace: str, ports: dict[str, int]) -> None:
        self.clients, self.namespace, self.ports = clients, namespace, ports
        self.routed: list[str] = []
        super().__init__(("127.0.0.1", 0), _Relay)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{contract.PATH}"


class _Relay(http.server.BaseHTTPRequestHandler):
    server: Forwarder

    def log_message(self, *_: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        forwarder = self.server
        listed = sorted(ready_endpoints(forwarder.clients, forwarder.namespace))
        if not listed:
            self.close_connection = True
            return
        forwarder.routed.append(listed[0])
        request = urllib.request.Request(
            f"http://127.0.0.1:{forwarder.ports[listed[0]]}{contract.PATH}",
            data=body,
            method="POST",
            headers={k: v for k, v in self.headers.items() if k.lower() != "host"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                status, headers, answer = response.status, response.headers, response.read()
        except urllib.error.HTTPError as error:
            status, headers, answer = error.code, error.headers, error.read()
        except OSError:
            self.close_connection = True
            return
        self.send_response(status)
        for name in ("Content-Type", "Retry-After"):
            if headers.get(name):
                self.send_header(name, headers[name])
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


@contextmanager
def serving(forwarder: Forwarder) -> Iterator[Forwarder]:
    thread = threading.Thread(target=forwarder.serve_forever, daemon=True)
    thread.start()
    try:
        yield forwarder
    finally:
        forwarder.shutdown()
        forwarder.server_close()


class ProgressLog:
    """status.progress as the test saw it, every 0.1 s: (when, step, ranks reporting)."""

    def __init__(self, clients: Any, namespace: str, name: str) -> None:
        self.seen: list[tuple[float, int | None, int | None]] = []
        self._stop = threading.Event()
        self._args = (clients, namespace, name)
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        clients, namespace, name = self._args
        while not self._stop.wait(0.1):
            job = clients.custom.get_namespaced_custom_object(
                "trainium.dev", "v1alpha1", namespace, "trainingjobs", name
            )
            figures = (job.get("status") or {}).get("progress") or {}
            self.seen.append((time.monotonic(), figures.get("step"), figures.get("ranksReporting")))

    def step(self) -> int:
        return max((s for _, s, _ in self.seen if s is not None), default=-1)

    def first_above(self, step: int, after: float) -> float | None:
        return next((t for t, s, _ in self.seen if t >= after and s is not None and s > step), None)

    def __enter__(self) -> ProgressLog:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self.thread.join(5)


def test_the_health_service_follows_the_acting_replica_and_progress_survives_a_failover(
    dev_cluster: Any, clients: Any, namespace: str, tmp_path: Path
) -> None:
    create_peering(clients, namespace, PEERING)
    ensure_shared_claim(clients, namespace)
    nodes = [n.metadata.name for n in clients.core.list_node().items]
    for name, node in (("op-a", nodes[0]), ("op-b", nodes[-1])):
        clients.core.create_namespaced_pod(namespace, stand_in_pod(name, node))
    clients.core.create_namespaced_service(namespace, health_service())
    ports = {"op-a": free_port(), "op-b": free_port()}
    forwarder = Forwarder(clients, namespace, ports)

    def replica(pod: str, priority: int) -> OperatorProcess:
        return OperatorProcess(
            Path(dev_cluster.kubeconfig),
            namespace,
            tmp_path / f"{pod}.log",
            extra_args=(
                *("--peering", PEERING, "--priority", str(priority)),
                *("--peering-lifetime", str(LIFETIME)),
                *("--pod-name", pod, "--pod-namespace", namespace),
                *("--health-port", str(ports[pod]), "--health-url", forwarder.url),
                *("--progress-interval", "0.5"),
            ),
        )

    active, standby = replica("op-a", 200), replica("op-b", 100)
    ranks: list[Any] = []
    with serving(forwarder):
        active.start()
        standby.start()
        try:
            # Only the acting replica's pod is labelled active, and only it is an endpoint.
            wait_for(
                lambda: pod_labels(clients, namespace),
                until=lambda labels: labels == {"op-a": ACTIVE, "op-b": "standby"},
                timeout=30,
                description="op-a labelled active, op-b standby",
            )
            wait_for(
                lambda: ready_endpoints(clients, namespace),
                until=lambda listed: listed == {"op-a"},
                timeout=10,
                description="the EndpointSlice listing op-a only",
            )

            pod, token = reporting_job(
                clients,
                namespace,
                "ha",
                tmp_path,
                processes=2,
                health={"reportIntervalSeconds": REPORT_S},
            )
            env = {e.name: e.value for e in pod.spec.containers[0].env}
            assert env[contract.URL] == forwarder.url
            ranks = [
                start_rank(rank_env(pod, token, rank, 2, local=(rank, 2)), 600, 0.05)
                for rank in range(2)
            ]
            with ProgressLog(clients, namespace, "ha") as progress:
                wait_for(
                    progress.step,
                    until=lambda step: step >= 5,
                    timeout=15,
                    description="progress from the ranks through op-a",
                )
                # The acting replica dies with its pod (the Service's endpoint goes with it).
                active.kill()
                killed = time.monotonic()
                clients.core.delete_namespaced_pod("op-a", namespace, grace_period_seconds=0)
                before = progress.step()

                wait_for(
                    lambda: pod_labels(clients, namespace).get("op-b"),
                    until=lambda label: label == ACTIVE,
                    timeout=LIFETIME + 10,
                    description="op-b labelling itself active",
                )
                took_over = time.monotonic()
                # kopf's peering lets it act once op-a's entry expired (the lifetime after op-a's
                # last keep-alive); the role is re-checked every period, the gate cached as long.
                assert took_over - killed <= LIFETIME + 2 * ROLE_PERIOD_SECONDS + 1.0
                wait_for(
                    lambda: ready_endpoints(clients, namespace),
                    until=lambda listed: listed == {"op-b"},
                    timeout=10,
                    description="the EndpointSlice listing op-b only",
                )
                resumed = wait_for(
                    lambda: progress.first_above(before, took_over),
                    until=lambda moment: moment is not None,
                    timeout=10,
                    description="progress moving again through op-b",
                )
                time.sleep(1.0)
            print(
                f"failover: op-b active {took_over - killed:.2f} s after the kill; progress "
                f"past step {before} {resumed - took_over:.2f} s after that"
            )
            # Resumed within a rank's retry after its failed sends, a report and a progress
            # write of the new replica acting; and never backwards, never blanked.
            assert resumed - took_over <= RANK_RETRY_S + REPORT_S + 0.5 + 1.0
            steps = [s for _, s, _ in progress.seen if s is not None]
            assert steps == sorted(steps), "status.progress.step went backwards"
            # Never blanked, and never fewer ranks counted once both were (a failover's partial
            # store writes nothing).
            full = next(i for i, (_, _, n) in enumerate(progress.seen) if n == 2)
            assert all(n == 2 for _, _, n in progress.seen[full:]), progress.seen
            assert {"op-a", "op-b"} <= set(forwarder.routed)
            assert "Traceback" not in standby.log(), standby.log()[-3000:]
        finally:
            for process in ranks:
                process.kill()
            for operator in (active, standby):
                operator.stop()
            print(standby.log()[-4000:])
