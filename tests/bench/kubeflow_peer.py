"""Kubeflow's training-operator (v1, PyTorchJob) beside ours in the operator benchmark.

What is here:

* `pytorchjob_for`: a PyTorchJob like-for-like with one of our TrainingJobs, built from the
  training pods and PodGroup `render_job` returns for it (same container resources, node
  selector, tolerations, volumes, scheduler, queue and gang size); pure, so a unit test checks it.
* `Identity`: a ServiceAccount, a token kubeconfig and an API Priority and Fairness FlowSchema
  per operator, so the API server itself counts each operator's requests
  (`apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}`; see `ApiServerCounter`).
  The FlowSchema maps to the `exempt` priority level, so neither operator is queued or limited
  by APF, as with the admin credentials the benchmark used before.
* `KubeflowOperator`: installs the PyTorchJob CRD and the ClusterRole copied from the
  training-operator module (`build.build_kubeflow`), and runs the binary as a subprocess with
  `--enable-scheme=pytorchjob --gang-scheduler-name=volcano`.

The training-operator does not start its controllers until its cert rotator (cert-controller)
has written a CA and server certificate into the Secret `training-operator-webhook-cert` of its
namespace and sees `tls.crt` in the hard-coded directory `/tmp/k8s-webhook-server/serving-certs`
(in a cluster the Secret is mounted there). Here we create the empty Secret, as its kustomize
base does, and write a self-signed pair into a private `$TMPDIR/k8s-webhook-server/serving-certs`
(the webhook server's default directory), plus `tls.crt` at the hard-coded path only if nothing
is there yet (and remove it again). No ValidatingWebhookConfiguration is installed, so the API
server never calls its webhook: PyTorchJobs are admitted by the CRD schema alone, as our
TrainingJobs are.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from support.local_server import free_port
from trainium_devcluster import build, sim
from trainium_devcluster.clients import Clients, is_status

Obj = dict[str, Any]

GROUP = "kubeflow.org"
VERSION = "v1"
PLURAL = "pytorchjobs"
KIND = "PyTorchJob"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
CONTAINER_NAME = "pytorch"  # the container name the PyTorchJob controller requires
OPERATOR_NAMESPACE = "kubeflow"  # the cert rotator's namespace (MY_POD_NAMESPACE)
SERVICE_ACCOUNT = "training-operator"
WEBHOOK_SECRET = "training-operator-webhook-cert"
ROTATOR_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # hard-coded upstream
FLOW_METRIC = "apiserver_flowcontrol_dispatched_requests_total"
HEALTH_TIMEOUT = 90.0

# Fields of a rendered pod that are per pod or belong to our operator; Kubeflow sets its own.
_PER_POD_SPEC_FIELDS = ("hostname", "subdomain", "nodeName")


# -- the like-for-like PyTorchJob -------------------------------------------------------------


def _training_pods(children: list[Obj]) -> list[Obj]:
    return sorted(
        (obj for obj in children if obj["kind"] == "Pod"),
        key=lambda pod: pod["metadata"]["name"],
    )


def _podgroup(children: list[Obj]) -> Obj:
    (podgroup,) = (obj for obj in children if obj["kind"] == "PodGroup")
    return podgroup


def _template(pod: Obj) -> Obj:
    spec = copy.deepcopy(pod["spec"])
    for key in _PER_POD_SPEC_FIELDS:
        spec.pop(key, None)
    (container,) = spec["containers"]
    container["name"] = CONTAINER_NAME
    # Rank, world size and rendezvous are per pod; Kubeflow injects its own (MASTER_ADDR, ...).
    container.pop("env", None)
    spec.pop("initContainers", None)
    return {"spec": spec}


def pytorchjob_for(name: str, children: list[Obj]) -> Obj:
    """The PyTorchJob a Kubeflow user would write for the gang `children` (what `render_job`
    returns for one of our TrainingJobs with the compile stage off): Master 1 + Worker N-1 with
    rank 0's pod spec, the PodGroup's queue and minMember. Kubeflow derives the PodGroup's
    minResources from the replicas' requests, which sum to ours."""
    pods = _training_pods(children)
    if not pods:
        raise ValueError(f"{name}: no pods to mirror")
    podgroup = _podgroup(children)
    template = _template(pods[0])
    restart_policy = template["spec"].pop("restartPolicy", "Never")
    replicas: Obj = {
        "Master": {"replicas": 1, "restartPolicy": restart_policy, "template": template}
    }
    if len(pods) > 1:
        replicas["Worker"] = {
            "replicas": len(pods) - 1,
            "restartPolicy": restart_policy,
            "template": copy.deepcopy(template),
        }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "pytorchReplicaSpecs": replicas,
            "runPolicy": {
                "cleanPodPolicy": "None",
                "schedulingPolicy": {
                    "minAvailable": podgroup["spec"]["minMember"],
                    "queue": podgroup["spec"]["queue"],
                },
            },
        },
    }


def pod_names(job: Obj) -> set[str]:
    """The pods Kubeflow creates for `job`: <name>-master-0, <name>-worker-<i>."""
    name = job["metadata"]["name"]
    names = set()
    for replica_type, replica in job["spec"]["pytorchReplicaSpecs"].items():
        for index in range(replica["replicas"]):
            names.add(f"{name}-{replica_type.lower()}-{index}")
    return names


def requests_of(job: Obj) -> dict[str, int]:
    """The integer resources Kubeflow puts in its PodGroup's minResources (CalcPGMinResources:
    per container its requests, and its limits where no request is set, summed over the
    replicas), for comparison with our PodGroup's."""
    total: dict[str, int] = {}
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        for container in replica["template"]["spec"]["containers"]:
            resources = container.get("resources") or {}
            counted = {**resources.get("limits", {}), **resources.get("requests", {})}
            for key, value in counted.items():
                if str(value).isdigit():
                    total[key] = total.get(key, 0) + int(value) * int(replica["replicas"])
    return total


# -- identities and server-side request counts -------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """A ServiceAccount an operator runs as, its token kubeconfig and its FlowSchema."""

    namespace: str
    service_account: str
    flow_schema: str
    kubeconfig: Path


def _ensure(create: Callable[[], object]) -> None:
    try:
        create()
    except Exception as error:
        if not is_status(error, 409):
            raise


def ensure_namespace(clients: Clients, name: str) -> None:
    _ensure(lambda: clients.core.create_namespace({"metadata": {"name": name}}))
    sim.wait_for(
        lambda: clients.core.read_namespaced_service_account("default", name),
        timeout=30,
        description=f"ServiceAccount {name}/default",
    )


def create_identity(
    clients: Clients,
    admin_kubeconfig: Path,
    directory: Path,
    *,
    namespace: str,
    service_account: str,
    cluster_role: str,
) -> Identity:
    """ServiceAccount bound to `cluster_role`, a kubeconfig with a token for it, and a
    FlowSchema (precedence 50: before every default one but `exempt` and `probes`) that
    matches only it and maps to the `exempt` priority level."""
    ensure_namespace(clients, namespace)
    _ensure(
        lambda: clients.core.create_namespaced_service_account(
            namespace, {"metadata": {"name": service_account}}
        )
    )
    binding = f"bench-{namespace}-{service_account}"
    _ensure(
        lambda: clients.custom.create_cluster_custom_object(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": binding},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": cluster_role,
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
                ],
            },
        )
    )
    flow_schema = binding
    _ensure(
        lambda: clients.custom.create_cluster_custom_object(
            "flowcontrol.apiserver.k8s.io",
            "v1",
            "flowschemas",
            {
                "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                "kind": "FlowSchema",
                "metadata": {"name": flow_schema},
                "spec": {
                    "matchingPrecedence": 50,
                    "priorityLevelConfiguration": {"name": "exempt"},
                    "rules": [
                        {
                            "subjects": [
                                {
                                    "kind": "ServiceAccount",
                                    "serviceAccount": {
                                        "name": service_account,
                                        "namespace": namespace,
                                    },
                                }
                            ],
                            "resourceRules": [
                                {
                                    "verbs": ["*"],
                                    "apiGroups": ["*"],
                                    "resources": ["*"],
                                    "clusterScope": True,
                                    "namespaces": ["*"],
                                }
                            ],
                            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                        }
                    ],
                },
            },
        )
    )
    token = clients.core.create_namespaced_service_account_token(
        service_account, namespace, {"spec": {"expirationSeconds": 24 * 3600}}
    ).status.token
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin.get("current-context"))[
        "context"
    ]
    (cluster,) = (c for c in admin["clusters"] if c["name"] == context["cluster"])
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [
            {
                "name": service_account,
                "context": {"cluster": cluster["name"], "user": service_account},
            }
        ],
        "current-context": service_account,
    }
    path = directory / f"kubeconfig-{namespace}-{service_account}.json"
    path.write_text(json.dumps(kubeconfig))  # JSON is YAML: both clients read it
    path.chmod(0o600)
    return Identity(namespace, service_account, flow_schema, path)


class ApiServerCounter:
    """Requests the API server dispatched per FlowSchema, from its own /metrics."""

    def __init__(self, clients: Clients):
        self._clients = clients

    def scrape(self) -> dict[str, int]:
        response = self._clients.api_client.call_api(
            "/metrics",
            "GET",
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        )
        counts: dict[str, int] = {}
        for line in response.data.decode().splitlines():
            if not line.startswith(FLOW_METRIC + "{"):
                continue
            labels, value = line[len(FLOW_METRIC) + 1 :].rsplit("} ", 1)
            fields = dict(part.split("=", 1) for part in labels.split(",") if "=" in part)
            schema = fields.get("flow_schema", "").strip('"')
            counts[schema] = counts.get(schema, 0) + int(float(value))
        return counts

    def count(self, identity: Identity) -> int:
        return self.scrape().get(identity.flow_schema, 0)


# -- Kubeflow's manifests and process ------------------------------------------------------------


def install(clients: Clients, kubeflow: build.KubeflowBuild) -> None:
    """The PyTorchJob CRD and the controller's ClusterRole, from the training-operator module,
    and the (empty) webhook Secret its kustomize base creates."""
    for path in sorted(kubeflow.manifest_dir.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if not document:
                continue
            if document["kind"] == "CustomResourceDefinition":
                _ensure(
                    lambda d=document: clients.apiextensions.create_custom_resource_definition(d)
                )
                sim.wait_for(
                    lambda n=document["metadata"]["name"]: _established(clients, n),
                    timeout=30,
                    description=f"CRD {document['metadata']['name']} Established",
                )
            elif document["kind"] == "ClusterRole":
                _ensure(
                    lambda d=document: clients.custom.create_cluster_custom_object(
                        "rbac.authorization.k8s.io", "v1", "clusterroles", d
                    )
                )
    ensure_namespace(clients, OPERATOR_NAMESPACE)
    _ensure(
        lambda: clients.core.create_namespaced_secret(
            OPERATOR_NAMESPACE, {"metadata": {"name": WEBHOOK_SECRET}}
        )
    )


def _established(clients: Clients, name: str) -> bool:
    crd = clients.apiextensions.read_custom_resource_definition(name)
    return any(
        c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])
    )


def cluster_role_name(kubeflow: build.KubeflowBuild) -> str:
    for path in sorted(kubeflow.manifest_dir.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document and document["kind"] == "ClusterRole":
                return str(document["metadata"]["name"])
    raise RuntimeError(f"no ClusterRole in {kubeflow.manifest_dir}")


def status_kib(pid: int, key: str) -> int:
    """A `/proc/<pid>/status` figure in KiB (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    return 0


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to a process we started, SIGKILL after 20 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _write_self_signed(directory: Path, dns_name: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            f"/CN={dns_name}",
            "-addext",
            f"subjectAltName=DNS:{dns_name}",
            "-keyout",
            str(directory / "tls.key"),
            "-out",
            str(directory / "tls.crt"),
        ],
        check=True,
        capture_output=True,
    )


def argv(binary: Path, *, namespace: str, threads: int, ports: dict[str, int]) -> list[str]:
    return [
        str(binary),
        "--enable-scheme=pytorchjob",
        "--gang-scheduler-name=volcano",
        f"--namespace={namespace}",
        f"--controller-threads={threads}",
        "--leader-elect=false",
        f"--metrics-bind-address=127.0.0.1:{ports['metrics']}",
        f"--health-probe-bind-address=127.0.0.1:{ports['probe']}",
        f"--webhook-server-port={ports['webhook']}",
    ]


class LoggedProcess:
    """A process we started, its output in `log_path`."""

    def __init__(
        self, what: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self.what = what
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
        )

    def check_alive(self) -> None:
        """Raises with the log's tail once the process exited."""
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.what} exited:\n{self.log()[-3000:]}")

    def rss_kib(self, key: str) -> int:
        return status_kib(self.process.pid, key)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.process)
        self._log.close()


class KubeflowOperator(LoggedProcess):
    """One training-operator process watching one namespace."""

    def __init__(
        self,
        kubeflow: build.KubeflowBuild,
        identity: Identity,
        namespace: str,
        log_dir: Path,
        label: str,
        *,
        threads: int,
    ):
        self.ports = {"metrics": free_port(), "probe": free_port(), "webhook": free_port()}
        tmpdir = log_dir / f"kubeflow-tmp-{label}"
        dns_name = f"training-operator.{OPERATOR_NAMESPACE}.svc"
        _write_self_signed(tmpdir / "k8s-webhook-server" / "serving-certs", dns_name)
        self._marker: Path | None = None
        if not (ROTATOR_CERT_DIR / "tls.crt").exists():
            ROTATOR_CERT_DIR.mkdir(parents=True, exist_ok=True)
            marker = ROTATOR_CERT_DIR / "tls.crt"
            marker.write_bytes((tmpdir / "k8s-webhook-server/serving-certs/tls.crt").read_bytes())
            self._marker = marker
        env = {
            **os.environ,
            "KUBECONFIG": str(identity.kubeconfig),
            "MY_POD_NAMESPACE": OPERATOR_NAMESPACE,
            "TMPDIR": str(tmpdir),
        }
        self.argv = argv(kubeflow.binary, namespace=namespace, threads=threads, ports=self.ports)
        super().__init__("training-operator", self.argv, log_dir / f"kubeflow-{label}.log", env)

    def ready(self) -> bool:
        self.check_alive()
        url = f"http://127.0.0.1:{self.ports['probe']}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self) -> None:
        sim.wait_for(self.ready, timeout=HEALTH_TIMEOUT, description="training-operator /readyz")

    def stop(self) -> None:
        super().stop()
        if self._marker is not None:
            with contextlib.suppress(OSError):
                self._marker.unlink()
            with contextlib.suppress(OSError):
                self._marker.parent.rmdir()
                self._marker.parent.parent.rmdir()


def wait_reconciling(clients: Clients, namespace: str, probe: Obj) -> None:
    """The controller is live: a probe PyTorchJob gets its PodGroup; then it is deleted."""
    clients.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, probe)
    name = probe["metadata"]["name"]
    sim.wait_for(
        lambda: clients.custom.get_namespaced_custom_object(
            "scheduling.volcano.sh", "v1beta1", namespace, "podgroups", name
        ),
        timeout=60,
        description=f"training-operator creates PodGroup {namespace}/{name}",
    )
    clients.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            clients.custom.get_namespaced_custom_object(
                "scheduling.volcano.sh", "v1beta1", namespace, "podgroups", name
            )
        except Exception as error:
            if is_status(error, 404):
                return
            raise
        time.sleep(0.2)
