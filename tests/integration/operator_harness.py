"""Runs the operator as a real process against the dev cluster, plus job helpers for tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from support import local_server
from trainium_devcluster import kueue
from trainium_devcluster.sim import simulate_pod_outcome, wait_for

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "trainium.dev", "v1alpha1", "trainingjobs"
JOB_LABEL = "trainium.dev/job-name"
free_port = local_server.free_port  # the tests' operators listen on one (their --*-port flags)
# The operator exits within 3 s of SIGTERM (tested); past this it is killed and the test fails.
STOP_TIMEOUT_SECONDS = 10


@dataclass
class OperatorProcess:
    """`trainium-operator run` in a subprocess, watching one namespace."""

    kubeconfig: Path
    namespace: str
    log_path: Path
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    env: dict[str, str] = field(default_factory=dict)
    start_offset: int = 0  # where the latest start's output begins in the log

    def start(self) -> None:
        self.starts += 1
        self.start_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = self.log_path.open("ab")
        log.write(f"\n===== operator start #{self.starts} =====\n".encode())
        log.flush()
        self.process = subprocess.Popen(
            operator_command(self.kubeconfig, self.namespace, "--verbose", *self.extra_args),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
        )

    def kill(self) -> None:
        """SIGKILL: the operator dies mid-work without any cleanup."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> float | None:
        """SIGTERM; returns the seconds the operator took to exit (None: it had to be killed,
        or was not running)."""
        if not self.process or self.process.poll() is not None:
            return None
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        return time.monotonic() - started

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def latest_output(self) -> bytes:
        """What the latest start has logged so far."""
        if not self.log_path.exists():
            return b""
        with self.log_path.open("rb") as log:
            log.seek(self.start_offset)
            return log.read()

    def started_up(self) -> bool:
        """The latest start got past its imports and, under peering, joined the peering (kopf
        starts paused and touches the peering every second: "Keep-alive in ...", as the acting
        replica and as a standby alike; without peering "Starting Kopf" is the last word before
        it works)."""
        text = self.latest_output()
        if "--peering" not in self.extra_args:
            return b"Starting Kopf" in text
        return b"Keep-alive in" in text or b"Resuming operations" in text

    def acting(self) -> bool:
        """Under peering: the latest start resumed operations and has not paused since (kopf
        logs each change of role; a standby from its start logs none)."""
        text = self.latest_output()
        return text.rfind(b"Resuming operations") > text.rfind(b"Pausing ")

    def assert_alive(self) -> None:
        assert self.process is not None
        assert self.process.poll() is None, f"operator exited:\n{self.log()[-4000:]}"


class OperatorView:
    """A shared operator as one test sees it: the log it wrote since the test began."""

    def __init__(self, process: OperatorProcess) -> None:
        self._process = process
        self._offset = process.log_path.stat().st_size if process.log_path.exists() else 0

    def log(self) -> str:
        if not self._process.log_path.exists():
            return ""
        with self._process.log_path.open("rb") as log:
            log.seek(self._offset)
            return log.read().decode(errors="replace")

    def assert_alive(self) -> None:
        self._process.assert_alive()


@contextlib.contextmanager
def running_operator(
    dev_cluster: Any,
    namespace: str,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
) -> Iterator[OperatorProcess]:
    """The operator watching `namespace` for the duration of a test (with extra `env`, as the
    chart's Deployment sets it, and extra command-line arguments); fails the test if it crashed
    or logged an unhandled exception."""
    ensure_shared_claim(dev_cluster.clients, namespace)
    proc = OperatorProcess(
        kubeconfig=Path(dev_cluster.kubeconfig),
        namespace=namespace,
        log_path=tmp_path / "operator.log",
        extra_args=extra_args,
        env=dict(env or {}),
    )
    with supervised(proc):
        yield proc


# The health_operator fixture: an operator process, its health channel port, its metrics port.
HealthOperator = tuple[OperatorProcess, int, int]


@contextlib.contextmanager
def operator_serving(
    dev_cluster: Any,
    namespace: str,
    tmp_path: Path,
    *port_flags: str,
    extra_args: tuple[str, ...] = (),
) -> Iterator[tuple[OperatorProcess, list[int]]]:
    """`running_operator` serving each of `port_flags` (--health-port, --metrics-port) on a free
    port: the operator and those ports, in the flags' order."""
    ports = [free_port() for _ in port_flags]
    served = tuple(
        arg for flag, port in zip(port_flags, ports, strict=True) for arg in (flag, str(port))
    )
    with running_operator(
        dev_cluster, namespace, tmp_path, extra_args=(*served, *extra_args)
    ) as proc:
        yield proc, ports


@contextlib.contextmanager
def supervised(proc: OperatorProcess) -> Iterator[OperatorProcess]:
    """Starts `proc`, and after the block stops it with SIGTERM and prints its log's tail;
    fails if it crashed meanwhile, ignored SIGTERM or logged an unhandled exception."""
    proc.start()
    try:
        yield proc
    finally:
        alive = proc.process is not None and proc.process.poll() is None
        stopped_in = proc.stop()
        print(proc.log()[-6000:])
    assert alive, "the operator crashed"
    assert stopped_in is not None, f"the operator ignored SIGTERM for {STOP_TIMEOUT_SECONDS} s"
    assert "Traceback" not in proc.log(), "the operator logged an unhandled exception"


def publish_report(name: str, lines: list[str]) -> Path:
    """Prints a suite's report and keeps it in artifacts/, where `.ci/run` prints it from."""
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    out = ROOT / "artifacts" / f"{name}-report.txt"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text)
    return out


def create_peering(clients: Any, namespace: str, name: str) -> None:
    """The namespaced KopfPeering replicas started with `--peering <name>` share."""
    clients.custom.create_namespaced_custom_object(
        "kopf.dev",
        "v1",
        namespace,
        "kopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": name}},
    )


def install_crds(clients: Any) -> None:
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd:
                continue
            try:
                clients.apiextensions.create_custom_resource_definition(crd)
            except Exception as error:
                if getattr(error, "status", None) != 409:
                    raise
                existing = clients.apiextensions.read_custom_resource_definition(
                    crd["metadata"]["name"]
                )
                crd["metadata"]["resourceVersion"] = existing.metadata.resource_version
                clients.apiextensions.replace_custom_resource_definition(
                    crd["metadata"]["name"], crd
                )
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if crd:
                wait_for(
                    lambda name=crd["metadata"]["name"]: _crd_established(clients, name),
                    timeout=30,
                    description=f"CRD {crd['metadata']['name']} Established",
                )


def _crd_established(clients: Any, name: str) -> bool:
    crd = clients.apiextensions.read_custom_resource_definition(name)
    return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])


def job_manifest(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "image": "example.com/trainium/training:test",
        "command": {
            "script": "/opt/trainium/trainium_training/pretrain.py",
            "args": [],
            # Our BERT script resumes with --resume; the operator adds it only when asked.
            "resumeArgs": ["--resume"],
        },
        "nodes": 2,
        "scheduling": {"queue": "test"},
        "runPolicy": {"nodeLostGracePeriodSeconds": 5},
    }
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": body,
    }


def create_job(clients: Any, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = clients.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, manifest
    )
    return result


def get_job(clients: Any, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = clients.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return result


def patch_job(clients: Any, namespace: str, name: str, patch: dict[str, Any]) -> None:
    clients.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)


def wait_status(
    clients: Any, namespace: str, name: str, *, key: str, value: object, timeout: float
) -> dict[str, Any]:
    """The job once `status.<key>` is `value`."""
    return wait_for(
        lambda: get_job(clients, namespace, name),
        until=lambda job: (job.get("status") or {}).get(key) == value,
        timeout=timeout,
        description=f"TrainingJob {namespace}/{name} {key} {value}",
    )


def wait_phase(
    clients: Any, namespace: str, name: str, phase: str, timeout: float = 90
) -> dict[str, Any]:
    return wait_status(clients, namespace, name, key="phase", value=phase, timeout=timeout)


def wait_reason(
    clients: Any, namespace: str, name: str, reason: str, timeout: float = 60
) -> dict[str, Any]:
    return wait_status(clients, namespace, name, key="reason", value=reason, timeout=timeout)


def job_pods(
    clients: Any, namespace: str, name: str, stage: str | None = None, attempt: int | None = None
) -> list[Any]:
    selector = f"{JOB_LABEL}={name}"
    if stage:
        selector += f",trainium.dev/stage={stage}"
    if attempt is not None:
        selector += f",trainium.dev/attempt={attempt}"
    pods = clients.core.list_namespaced_pod(namespace, label_selector=selector).items
    return sorted(pods, key=lambda p: p.metadata.name)


def wait_gang_running(
    clients: Any, namespace: str, name: str, stage: str, attempt: int, *, nodes: int = 2
) -> list[Any]:
    def running() -> list[Any]:
        pods = [
            p
            for p in job_pods(clients, namespace, name, stage, attempt)
            if p.metadata.deletion_timestamp is None
        ]
        ok = len(pods) == nodes and all(p.status.phase == "Running" for p in pods)
        return pods if ok else []

    return wait_for(
        running,
        timeout=90,
        description=f"{nodes} {stage} pods of attempt {attempt} Running for {namespace}/{name}",
    )


def start_training(clients: Any, namespace: str, name: str, **spec: Any) -> list[Any]:
    """Creates a job of `spec` (without a compile stage unless `spec` has one) and returns its
    attempt-0 training gang once every pod runs."""
    create_job(clients, namespace, job_manifest(name, **{"compile": {"enabled": False}, **spec}))
    return wait_gang_running(clients, namespace, name, "train", 0, nodes=spec.get("nodes", 2))


def start_compiling(clients: Any, namespace: str, name: str, **spec: Any) -> list[Any]:
    """Creates a job of `spec` and returns its attempt-0 compile gang once every pod runs."""
    create_job(clients, namespace, job_manifest(name, **spec))
    return wait_gang_running(clients, namespace, name, "compile", 0, nodes=spec.get("nodes", 2))


def training_job(clients: Any, namespace: str, name: str) -> list[Any]:
    """Creates a job without a compile stage and returns its gang once it trains."""
    pods = start_training(clients, namespace, name)
    wait_phase(clients, namespace, name, "Training")
    return pods


def wait_attempt(clients: Any, namespace: str, name: str, attempt: int) -> dict[str, Any]:
    """The job once its status records attempt `attempt` (a restart decided)."""
    return wait_status(clients, namespace, name, key="attempt", value=attempt, timeout=90)


def finish_job(clients: Any, namespace: str, name: str, pods: list[Any]) -> dict[str, Any]:
    """Every pod of the gang `pods` exits 0; returns the job once it has Succeeded."""
    finish_pods(clients, namespace, pods)
    return wait_phase(clients, namespace, name, "Succeeded")


def wait_running_gone(
    clients: Any, namespace: str, name: str, description: str, *, terminating_too: bool = False
) -> None:
    """Waits until none of the job's pods is alive (deleted, or terminating); `terminating_too`:
    until the job has no pod at all."""

    def left() -> list[Any]:
        pods = job_pods(clients, namespace, name)
        return pods if terminating_too else [p for p in pods if not p.metadata.deletion_timestamp]

    wait_for(left, until=lambda pods: not pods, timeout=60, description=description)


def finish_pods(
    clients: Any, namespace: str, pods: list[Any], *, succeeded: bool = True, **outcome: Any
) -> None:
    for pod in pods:
        simulate_pod_outcome(
            clients.core, namespace, pod.metadata.name, succeeded=succeeded, **outcome
        )


def job_events(clients: Any, namespace: str, name: str) -> list[tuple[str, str, str]]:
    events = clients.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},involvedObject.kind=TrainingJob"
    ).items
    return [(e.type, e.reason, e.message) for e in events]


def events_with_reason(
    clients: Any, namespace: str, name: str, reason: str, timeout: float = 10
) -> list[tuple[str, str, str]]:
    """The job's events of `reason`, once there is one: a pass posts its events after the
    status write they report, so a test that read that status may list them too early."""
    found: list[tuple[str, str, str]] = wait_for(
        lambda: [e for e in job_events(clients, namespace, name) if e[1] == reason],
        until=bool,
        timeout=timeout,
        description=f"a {reason} event on {name}",
    )
    return found


def eventually(check: Any, timeout: float = 30, description: str = "condition") -> Any:
    return wait_for(check, timeout=timeout, description=description)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def ensure_shared_claim(clients: Any, namespace: str) -> None:
    """An `fsx-claim` in the test namespace, bound to a static FSx-shaped volume of its own
    (a claim is namespaced and a static PV binds one claim, as on EKS)."""
    from trainium_devcluster import objects

    volume = objects.fsx_persistent_volume()
    volume["metadata"]["name"] = f"fsx-pv-{namespace}"
    volume["spec"]["claimRef"] = {"namespace": namespace, "name": objects.FSX_CLAIM_NAME}
    claim = objects.fsx_persistent_volume_claim()
    claim["metadata"]["namespace"] = namespace
    claim["spec"]["volumeName"] = volume["metadata"]["name"]
    for create in (
        lambda: clients.core.create_persistent_volume(volume),
        lambda: clients.core.create_namespaced_persistent_volume_claim(namespace, claim),
    ):
        try:
            create()
        except Exception as error:
            if getattr(error, "status", None) != 409:
                raise
    wait_for(
        lambda: (
            clients.core.read_namespaced_persistent_volume_claim(
                objects.FSX_CLAIM_NAME, namespace
            ).status.phase
        ),
        until=lambda phase: phase == "Bound",
        timeout=30,
        description=f"{namespace}/fsx-claim Bound",
    )


def operator_command(kubeconfig: Path | str, namespace: str, *flags: str) -> list[str]:
    """`trainium-operator run` in a new interpreter, watching `namespace` through `kubeconfig`."""
    run = [sys.executable, "-m", "trainium_operator", "run", "--kubeconfig", str(kubeconfig)]
    return [*run, "--namespace", namespace, *flags]


def metric(port: int, name: str) -> float:
    """The value of the operator's unlabelled metric `name`, read from its /metrics on `port`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    raise AssertionError(f"no {name} on /metrics")


def kubectl(dev_cluster: Any, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The real kubectl binary against the dev cluster; the caller checks the return code."""
    return subprocess.run(
        ["kubectl", "-n", namespace, *args],
        capture_output=True,
        text=True,
        check=False,
        env=dev_cluster.tool_env(),
    )


def delete_job_now(clients: Any, namespace: str, name: str) -> None:
    """Deletes a TrainingJob and, without waiting for garbage collection or a grace period, its
    pods, so the node capacity they held is free for the next job at once."""
    try:
        clients.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except Exception as error:
        if getattr(error, "status", None) != 404:
            raise
    selector = f"{JOB_LABEL}={name}"
    clients.core.delete_collection_namespaced_pod(
        namespace, label_selector=selector, grace_period_seconds=0
    )
    # Kueue lets go of a pod only once it has ended; a clean-up does not wait for that.
    pods = clients.core.list_namespaced_pod(namespace, label_selector=selector).items
    kueue.strip_finalizers(clients.core, namespace, pods)
