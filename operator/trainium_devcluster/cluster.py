"""`dev up` / `dev down` / `dev status`: a kwokctl binary-runtime cluster plus our set-up.

`up` is idempotent: it starts (or reuses) the control plane, then creates only what is missing:
Volcano's CRDs and queues, fake Trainium nodes with their CSINodes, the FSx volume and claim, the
real Volcano scheduler and controller manager, and the real Kueue (its CRDs, webhooks, controller
manager, and a ClusterQueue whose quota is the nodes' capacity).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainium_devcluster import build, kueue, objects, paths, sim, stages, versions, volcano
from trainium_devcluster.clients import (
    Clients,
    apply_crds,
    clients_for,
    create_if_missing,
    is_status,
)
from trainium_operator.api import instance_types
from trainium_operator.builders.job import VOLCANO_GROUP, VOLCANO_VERSION

Echo = Callable[[str], None]
CREATE_TIMEOUT = "120s"


class ClusterError(RuntimeError):
    """The dev cluster could not be brought up or inspected; the message says where to look."""


@dataclass
class StepTimer:
    steps: list[tuple[str, float]] = field(default_factory=list)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        yield
        self.steps.append((name, time.monotonic() - started))

    @property
    def total(self) -> float:
        return sum(seconds for _, seconds in self.steps)


def _kwokctl_env() -> dict[str, str]:
    env = dict(os.environ)
    env["KWOK_WORKDIR"] = str(paths.kwok_workdir())
    return env


def _kwokctl(toolchain: build.Toolchain, *args: str, log: Path | None = None) -> str:
    command = [str(toolchain.binary("kwokctl")), *args]
    result = subprocess.run(
        command, env=_kwokctl_env(), capture_output=True, text=True, check=False
    )
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as handle:
            handle.write(f"$ {' '.join(command)}\n{result.stdout}{result.stderr}\n")
    if result.returncode != 0:
        raise ClusterError(
            f"`kwokctl {' '.join(args)}` failed (exit {result.returncode}):\n"
            f"{result.stderr.strip()[-3000:]}"
        )
    return result.stdout


def _pid_alive(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    # A zombie or a recycled pid of another program is not our process.
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return pid
    return pid if b"kube-apiserver" in cmdline else None


def apiserver_running(cluster: paths.ClusterPaths) -> bool:
    return _pid_alive(cluster.kwok_dir / "pids" / "kube-apiserver.pid") is not None


CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller")


def restart_apiserver(name: str, downtime: float = 1.0, *, timeout: float = 60.0) -> int:
    """Kills the cluster's kube-apiserver (SIGKILL, a crash), keeps it down for `downtime`
    seconds and starts it again with the same command line, working directory and log, as a
    supervisor would; returns the new pid once it serves requests. A fault for the tests.

    Like the kubelet that runs a real control plane's static pods, it also restarts a component
    that exited meanwhile (the controller manager and scheduler exit when they cannot renew
    their leader lease within ten seconds)."""
    cluster = paths.ClusterPaths(name)
    pids = cluster.kwok_dir / "pids"
    launches = {c: _launch_of(pids / f"{c}.pid") for c in CONTROL_PLANE}
    apiserver = launches["kube-apiserver"]
    if apiserver is None:
        raise ClusterError(f"kube-apiserver of {name!r} is not running ({pids})")
    os.kill(apiserver.pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while not _exited(apiserver.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(downtime)
    new_pid = _relaunch(cluster, "kube-apiserver", apiserver)
    clients = clients_for(cluster.kubeconfig)
    try:
        sim.wait_for(
            lambda: _serves(clients),
            timeout=max(1.0, deadline - time.monotonic()),
            description=f"kube-apiserver of {name!r} serving again",
        )
    except sim.WaitTimeoutError as error:
        log = cluster.kwok_dir / "logs" / "kube-apiserver.log"
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
        alive = "running" if not _exited(new_pid) else "exited"
        raise ClusterError(
            f"{error}; the new kube-apiserver ({new_pid}) {alive}; {log}:\n{tail}"
        ) from error
    for component, launch in launches.items():
        if launch is not None and component != "kube-apiserver" and _exited(launch.pid):
            _relaunch(cluster, component, launch)
    return new_pid


def control_plane_launches(name: str) -> dict[str, _Launch]:
    """How each running control-plane component was started (to start it again later)."""
    pids = paths.ClusterPaths(name).kwok_dir / "pids"
    launches = {c: _launch_of(pids / f"{c}.pid") for c in CONTROL_PLANE}
    return {c: launch for c, launch in launches.items() if launch is not None}


def relaunch_exited(name: str, launches: dict[str, _Launch]) -> list[str]:
    """Starts again every component of `launches` whose current process has exited, as the
    kubelet restarts a static pod: the controller manager and scheduler exit on their own up to
    ten seconds after an API server restart (their leader lease could not be renewed), later
    than `restart_apiserver` looks. Returns the components started."""
    cluster = paths.ClusterPaths(name)
    started = []
    for component, launch in launches.items():
        current = _launch_of(cluster.kwok_dir / "pids" / f"{component}.pid")
        if current is None:
            _relaunch(cluster, component, launch)
            started.append(component)
    return started


@dataclass(frozen=True)
class _Launch:
    pid: int
    argv: list[str]
    cwd: str


def _launch_of(pid_file: Path) -> _Launch | None:
    try:
        pid = int(pid_file.read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except (OSError, ValueError):
        return None
    if _exited(pid) or not argv[0]:
        return None
    return _Launch(pid, [a.decode() for a in argv], cwd)


def _relaunch(cluster: paths.ClusterPaths, component: str, launch: _Launch) -> int:
    with (cluster.kwok_dir / "logs" / f"{component}.log").open("ab") as log:
        process = subprocess.Popen(
            launch.argv,
            cwd=launch.cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    (cluster.kwok_dir / "pids" / f"{component}.pid").write_text(str(process.pid))
    return process.pid


def _exited(pid: int) -> bool:
    """Gone, or a zombie nobody has reaped yet (its port is free either way)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _serves(clients: Clients) -> bool:
    try:
        clients.core.list_namespace(limit=1)
    except Exception:
        return False
    return True


def write_kwokctl_config(cluster: paths.ClusterPaths, toolchain: build.Toolchain) -> Path:
    documents = stages.kwokctl_config_documents(
        binaries=toolchain.binaries,
        kube_version=versions.KUBERNETES_VERSION,
        etcd_version=versions.ETCD_VERSION,
        kwok_version=versions.KWOK_VERSION,
    )
    cluster.state_dir.mkdir(parents=True, exist_ok=True)
    cluster.kwokctl_config.write_text(stages.dump_documents(documents))
    return cluster.kwokctl_config


def start_control_plane(cluster: paths.ClusterPaths, toolchain: build.Toolchain) -> str:
    """Creates the kwokctl cluster, restarts a stopped one, or leaves a running one alone."""
    if apiserver_running(cluster) and cluster.kubeconfig.exists():
        return "reused"
    config = write_kwokctl_config(cluster, toolchain)
    if cluster.kwok_dir.exists():
        _kwokctl(toolchain, "start", "cluster", "--name", cluster.name, log=cluster.kwokctl_log)
        return "restarted"
    _kwokctl(
        toolchain,
        "create",
        "cluster",
        "--name",
        cluster.name,
        "--runtime",
        "binary",
        "--config",
        str(config),
        "--wait",
        CREATE_TIMEOUT,
        log=cluster.kwokctl_log,
    )
    return "created"


def load_volcano_crds(crd_dir: Path) -> list[dict[str, Any]]:
    crds = []
    for manifest in sorted(crd_dir.glob("*.yaml")):
        crds += [doc for doc in yaml.safe_load_all(manifest.read_text()) if doc]
    if not crds:
        raise ClusterError(f"no CRD manifests in {crd_dir}; run `trainium-operator dev build`")
    return crds


def install_volcano_api(clients: Clients, crd_dir: Path) -> None:
    apply_crds(clients, load_volcano_crds(crd_dir))
    for queue in objects.volcano_queues():
        create_if_missing(
            functools.partial(
                clients.custom.create_cluster_custom_object,
                VOLCANO_GROUP,
                VOLCANO_VERSION,
                "queues",
                queue,
            )
        )


def create_nodes(clients: Clients, nodes: list[dict[str, Any]]) -> list[str]:
    created = []
    for node in nodes:
        if create_if_missing(functools.partial(clients.core.create_node, node)):
            created.append(node["metadata"]["name"])
    return created


def create_dra_nodes(
    clients: Clients, count: int, instance_type: str, *, group_limit: int = 16
) -> list[str]:
    """`count` DRA nodes of `instance_type` (a node group of their own, numbered after any
    there), the DeviceClasses, and each node's ResourceSlices (owned by the Node, as the
    drivers' are, so they go with it); returns the created nodes' names."""
    shape = instance_types.INSTANCE_TYPES[instance_type]
    for device_class in objects.device_classes():
        create_if_missing(functools.partial(clients.resource.create_device_class, device_class))
    existing = [node.metadata.name for node in clients.core.list_node().items]
    first = objects.next_node_index(existing, f"{instance_type}.{objects.DRA_NODE_INFIX}")
    names = [objects.dra_node_name(instance_type, first + i) for i in range(count)]
    created = create_nodes(clients, [objects.dra_fake_node(n, shape) for n in names])
    for name in created:
        uid = clients.core.read_node(name).metadata.uid
        owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}
        for published in objects.resource_slices(name, shape, group_limit=group_limit):
            published["metadata"]["ownerReferences"] = [owner]
            create_if_missing(functools.partial(clients.resource.create_resource_slice, published))
    create_csi_nodes(clients, created)
    return created


def create_shared_storage(clients: Clients) -> None:
    create_if_missing(lambda: clients.storage.create_csi_driver(objects.fsx_csi_driver()))
    create_if_missing(
        lambda: clients.core.create_persistent_volume(objects.fsx_persistent_volume())
    )
    claim = objects.fsx_persistent_volume_claim()
    create_if_missing(
        lambda: clients.core.create_namespaced_persistent_volume_claim(
            claim["metadata"]["namespace"], claim
        )
    )


def create_csi_nodes(clients: Clients, node_names: list[str]) -> None:
    for name in node_names:
        node = clients.api_client.sanitize_for_serialization(clients.core.read_node(name))
        create_if_missing(
            functools.partial(clients.storage.create_csi_node, objects.csi_node(node))
        )


def wait_nodes_ready(clients: Clients, node_names: list[str], *, timeout: float = 60) -> None:
    for name in node_names:
        sim.wait_for(
            functools.partial(clients.core.read_node, name),
            until=lambda node: sim.node_is_ready(
                clients.api_client.sanitize_for_serialization(node)
            ),
            timeout=timeout,
            description=f"node {name} Ready",
        )


def delete_nodes(clients: Clients, node_names: list[str], *, timeout: float = 60) -> None:
    """Deletes the nodes and waits until they are gone; their CSINodes and Leases go with them
    (owned by the Node), and the pod garbage collector removes pods still bound to them."""
    for name in node_names:
        try:
            clients.core.delete_node(name)
        except Exception as error:
            if not is_status(error, 404):
                raise

    def remaining() -> list[str]:
        present = {node.metadata.name for node in clients.core.list_node().items}
        return [name for name in node_names if name in present]

    sim.wait_for(
        remaining, until=lambda left: not left, timeout=timeout, description="nodes deleted"
    )


def wait_until_ready(clients: Clients, node_names: list[str], *, timeout: float = 60) -> None:
    wait_nodes_ready(clients, node_names, timeout=timeout)
    sim.wait_for(
        lambda: (
            clients.core.read_namespaced_persistent_volume_claim(
                objects.FSX_CLAIM_NAME, objects.FSX_CLAIM_NAMESPACE
            ).status.phase
        ),
        until=lambda phase: phase == "Bound",
        timeout=timeout,
        description=f"PVC {objects.FSX_CLAIM_NAMESPACE}/{objects.FSX_CLAIM_NAME} Bound",
    )
    sim.wait_for(
        lambda: clients.custom.get_cluster_custom_object(
            VOLCANO_GROUP, VOLCANO_VERSION, "queues", objects.TUTORIAL_QUEUE
        ).get("status", {}),
        until=lambda status: status.get("state") == "Open",
        timeout=timeout,
        description=f"queue {objects.TUTORIAL_QUEUE} Open (set by Volcano's queue controller)",
    )
    sim.wait_for(
        lambda: clients.core.read_namespaced_service_account("default", "default"),
        timeout=timeout,
        description="ServiceAccount default/default",
    )


@dataclass
class UpReport:
    name: str
    kubeconfig: Path
    control_plane: str
    nodes_created: list[str]
    pids: dict[str, int]  # Volcano's two processes and Kueue's
    timer: StepTimer


def up(
    name: str,
    *,
    nodes: int,
    instance_type: str,
    neuron_taint: bool,
    echo: Echo,
    schedule_period: str | None = None,
    dra_nodes: int = 0,
) -> UpReport:
    toolchain = build.require_toolchain()
    node_objects = objects.fake_nodes(nodes, instance_type, neuron_taint=neuron_taint)
    cluster = paths.ClusterPaths(name)
    timer = StepTimer()
    with timer.step("control plane"):
        echo(f"starting control plane {name!r} (kwokctl, binary runtime) ...")
        how = start_control_plane(cluster, toolchain)
    clients = clients_for(cluster.kubeconfig)
    with timer.step("volcano api"):
        install_volcano_api(clients, toolchain.volcano_crd_dir)
    with timer.step("nodes and storage"):
        node_names = [node["metadata"]["name"] for node in node_objects]
        created = create_nodes(clients, node_objects)
        create_csi_nodes(clients, node_names)
        create_shared_storage(clients)
        if dra_nodes:
            dra_created = create_dra_nodes(clients, dra_nodes, instance_type)
            created += dra_created
            node_names += dra_created
    with timer.step("volcano"):
        try:
            pids = volcano.start(cluster, toolchain, schedule_period=schedule_period)
        except volcano.VolcanoError as error:
            raise ClusterError(str(error)) from error
    with timer.step("kueue"):
        try:
            pids[kueue.BINARY] = kueue.start(cluster, toolchain, clients)
            kueue.create_queues(clients)
        except (kueue.KueueError, sim.WaitTimeoutError) as error:
            raise ClusterError(str(error)) from error
    with timer.step("ready"):
        wait_until_ready(clients, node_names)
    return UpReport(name, cluster.kubeconfig, how, created, pids, timer)


def down(name: str, *, echo: Echo) -> None:
    cluster = paths.ClusterPaths(name)
    if kueue.stop(cluster):
        echo(f"stopped {kueue.BINARY}")
    for stopped in volcano.stop(cluster):
        echo(f"stopped {stopped}")
    toolchain = build.expected_toolchain()
    if cluster.kwok_dir.exists():
        if os.access(toolchain.binary("kwokctl"), os.X_OK):
            _kwokctl(toolchain, "delete", "cluster", "--name", name, log=cluster.kwokctl_log)
            echo(f"deleted cluster {name!r}")
        else:
            raise ClusterError(
                f"kwokctl is not built; cannot stop cluster {name!r} in {cluster.kwok_dir}"
            )
    else:
        echo(f"no cluster {name!r} under {paths.kwok_workdir()}")
    cluster.kwokctl_config.unlink(missing_ok=True)


@dataclass
class ClusterStatus:
    name: str
    kubeconfig: Path
    apiserver_running: bool
    volcano: list[tuple[str, int | None, bool]]  # process, pid, healthy (Kueue's too)
    nodes: list[tuple[str, str, bool]]  # name, instance type, ready
    queues: list[tuple[str, str, dict[str, int]]]  # name, state, PodGroups per phase
    fsx_claim_phase: str | None
    cluster_queues: list[tuple[str, int, int]] = field(default_factory=list)  # Kueue: name,
    # Workloads pending, Workloads admitted


def status(name: str) -> ClusterStatus:
    cluster = paths.ClusterPaths(name)
    running = apiserver_running(cluster)
    node_rows: list[tuple[str, str, bool]] = []
    claim_phase = None
    queue_rows: list[tuple[str, str, dict[str, int]]] = []
    cluster_queue_rows: list[tuple[str, int, int]] = []
    if running and cluster.kubeconfig.exists():
        clients = clients_for(cluster.kubeconfig)
        for node in clients.core.list_node().items:
            node_dict = clients.api_client.sanitize_for_serialization(node)
            labels = node_dict["metadata"].get("labels") or {}
            node_rows.append(
                (
                    node.metadata.name,
                    labels.get("node.kubernetes.io/instance-type", "?"),
                    sim.node_is_ready(node_dict),
                )
            )
        queues = clients.custom.list_cluster_custom_object(VOLCANO_GROUP, VOLCANO_VERSION, "queues")
        for queue in queues.get("items", []):
            queue_status = queue.get("status") or {}
            counts = {
                phase: int(queue_status.get(phase.lower()) or 0)
                for phase in ("Pending", "Inqueue", "Running", "Completed", "Unknown")
            }
            queue_rows.append((queue["metadata"]["name"], queue_status.get("state", "-"), counts))
        if kueue.api_installed(clients):
            found = clients.custom.list_cluster_custom_object(
                kueue.GROUP, kueue.VERSION, "clusterqueues"
            )
            for item in found.get("items", []):
                cq_status = item.get("status") or {}
                cluster_queue_rows.append(
                    (
                        item["metadata"]["name"],
                        int(cq_status.get("pendingWorkloads") or 0),
                        int(cq_status.get("admittedWorkloads") or 0),
                    )
                )
        try:
            claim_phase = clients.core.read_namespaced_persistent_volume_claim(
                objects.FSX_CLAIM_NAME, objects.FSX_CLAIM_NAMESPACE
            ).status.phase
        except Exception as error:
            if not is_status(error, 404):
                raise
    return ClusterStatus(
        name=name,
        kubeconfig=cluster.kubeconfig,
        apiserver_running=running,
        volcano=[
            *(
                (daemon.name, volcano.running_pid(daemon), volcano.healthy(daemon))
                for daemon in volcano.daemons(cluster)
            ),
            (kueue.BINARY, volcano.running_pid(kueue.daemon(cluster)), kueue.ready(cluster)),
        ],
        nodes=node_rows,
        queues=queue_rows,
        fsx_claim_phase=claim_phase,
        cluster_queues=cluster_queue_rows,
    )
