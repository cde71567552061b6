"""The real Kueue of a dev cluster: its API, its controller manager, its webhooks and its queues.

Kueue's controller manager runs as a background process like Volcano's (pid, health-port and log
files in the cluster's state directory, health-checked on /readyz, stopped by `dev down`, started
again by a `dev up` that finds it gone). The dev cluster has no Service a kube-apiserver could
reach (no kube-proxy, KWOK nodes), so Kueue serves its webhooks on 127.0.0.1 and they are
registered by URL, with a certificate for 127.0.0.1 signed by a CA the dev cluster makes: Kueue's
internal cert management signs only for its Service's DNS name. The builders are pure, so tests
check the configuration, the argv and the webhook rewrite without a cluster.
"""

from __future__ import annotations

import base64
import copy
import datetime
import functools
import ipaddress
import os
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from kubernetes.utils import parse_quantity

from trainium_devcluster import build, paths, sim, versions, volcano
from trainium_devcluster.clients import Clients, apply_crds, create_if_missing, is_status
from trainium_operator.api import instance_types
from trainium_operator.api.dra import DRA_QUOTA_RESOURCES, DRIVER_QUOTA_RESOURCES
from trainium_operator.api.kueue import (
    KUEUE_GROUP,
    KUEUE_VERSION,
    MANAGED_FINALIZER,
    QUEUE_NAME_LABEL,
)

GROUP, VERSION = KUEUE_GROUP, KUEUE_VERSION
CONFIG_API_VERSION = "config.kueue.x-k8s.io/v1beta2"
BINARY = "kueue"

CLUSTER_QUEUE = "trainium"
LOCAL_QUEUE = "trainium"
PRIORITY_CLASSES = {"low": 100, "high": 1000}
# Only names the Webhook Service and MultiKueue's Secrets would live in; nothing runs there.
NAMESPACE = "kueue-system"
# The CRDs whose v1beta1 Kueue converts through its webhook (its kustomize patches, crd/patches).
CONVERTED_CRDS = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
CRD_FILE_GLOB = "kueue.x-k8s.io_*.yaml"
WEBHOOK_MANIFEST = "manifests.yaml"
WEBHOOK_HOST = "127.0.0.1"
# Kueue v0.19.2 reads its metrics server's certificate from this fixed path whenever its internal
# cert management is off, and exits without one (cmd/kueue/main.go); nobody verifies it.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")

HEALTH_TIMEOUT = 60.0
# An admitted gang that is not all Ready within this is evicted and requeued (Kueue's default is
# 30 min; KWOK pods are Ready within a second of binding).
PODS_READY_TIMEOUT = "5m"
# Requeueing after such an eviction backs off 10 s, 20 s, ... up to 5 min. No backoffLimitCount:
# reaching it deactivates the Workload, which would be the operator's decision, not the queue's.
REQUEUE_BACKOFF_BASE_SECONDS = 10
REQUEUE_BACKOFF_MAX_SECONDS = 300
CERT_VALIDITY = datetime.timedelta(days=3650)


class KueueError(RuntimeError):
    """Kueue did not start, or its objects could not be set up; the message says where to look."""


# --- pure builders -------------------------------------------------------------------------------


def configuration(
    *, webhook_port: int, cert_dir: Path, health_port: int, metrics_port: int
) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2, the version v0.19.2 reads)."""
    return {
        "apiVersion": CONFIG_API_VERSION,
        "kind": "Configuration",
        "namespace": NAMESPACE,
        # Only pods that name a LocalQueue are Kueue's; every other pod is Volcano's or plain.
        "manageJobsWithoutQueueName": False,
        # One manager per dev cluster: no Lease to wait for on a restart.
        "leaderElection": {"leaderElect": False},
        "webhook": {"host": WEBHOOK_HOST, "port": webhook_port, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "internalCertManagement": {"enable": False},
        # All-or-nothing placement of a gang: a quota reservation becomes an admission only once
        # every pod is Ready, and other Workloads wait meanwhile (blockAdmission).
        "waitForPodsReady": {
            "timeout": PODS_READY_TIMEOUT,
            "blockAdmission": True,
            "requeuingStrategy": {
                "timestamp": "Eviction",
                "backoffBaseSeconds": REQUEUE_BACKOFF_BASE_SECONDS,
                "backoffMaxSeconds": REQUEUE_BACKOFF_MAX_SECONDS,
            },
        },
        # Plain pods (pod groups) only: the operator's route; no Job, JobSet or Deployment.
        "integrations": {"frameworks": ["pod"]},
        # The visibility server is an aggregated API server on 0.0.0.0:8082 that needs an
        # APIService and a Service; two clusters on one machine would also clash on the port.
        "featureGates": {"VisibilityOnDemand": False},
        # DRA (gate KueueDRAIntegration, beta and on since v0.18: pkg/features/kube_features.go):
        # devices a pod claims through a ResourceClaimTemplate count against the quota of the
        # resource its DeviceClass maps to (pkg/dra/claims.go; a class with no mapping makes the
        # Workload inadmissible). Mapped to the device plugin's names, so one ClusterQueue quota
        # counts a node group's devices whichever way its nodes publish them.
        "resources": {"deviceClassMappings": dra_device_class_mappings()},
    }


def dra_device_class_mappings() -> list[dict[str, Any]]:
    """Kueue's `resources.deviceClassMappings` (config v1beta2 DeviceClassMapping)."""
    return [
        {"name": resource, "deviceClassNames": [device_class]}
        for resource, device_class in DRA_QUOTA_RESOURCES.items()
    ]


def manager_argv(binary: Path, kubeconfig: Path, config_file: Path) -> list[str]:
    return [
        str(binary),
        f"--config={config_file}",
        f"--kubeconfig={kubeconfig}",
        "--zap-encoder=console",
        "--zap-log-level=2",
    ]


def webhook_base_url(port: int) -> str:
    return f"https://{WEBHOOK_HOST}:{port}"


def _serves_enabled_kinds(webhook: dict[str, Any]) -> bool:
    """Kueue's own kinds and pods: the rest are the integrations this cluster leaves off (Kueue
    would answer them with no-op handlers, but every Job, Deployment or StatefulSet create would
    still pay a round trip, and fail while Kueue is down)."""
    return any(
        GROUP in rule.get("apiGroups", ()) or "pods" in rule.get("resources", ())
        for rule in webhook.get("rules", ())
    )


def _rewrite_webhook(webhook: dict[str, Any], *, base_url: str, ca_bundle: str) -> dict[str, Any]:
    rewritten = copy.deepcopy(webhook)
    path = rewritten["clientConfig"]["service"]["path"]
    rewritten["clientConfig"] = {"url": f"{base_url}{path}", "caBundle": ca_bundle}
    if any("pods" in rule.get("resources", ()) for rule in rewritten.get("rules", ())):
        # Only pods that name a LocalQueue go to Kueue (every pod it manages carries the label;
        # one objectSelector's expressions are ANDed, so pod-group-name cannot be an
        # alternative), so Volcano's pods and every other create skip the round trip.
        rewritten["objectSelector"] = {
            "matchExpressions": [{"key": QUEUE_NAME_LABEL, "operator": "Exists"}]
        }
        # What Kueue's kustomize install adds (config/components/webhook/kustomization.yaml).
        rewritten["namespaceSelector"] = {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system", NAMESPACE],
                }
            ]
        }
    return rewritten


def webhook_configurations(
    manifests: Iterable[dict[str, Any]], *, base_url: str, ca_bundle: str
) -> list[dict[str, Any]]:
    """Kueue's Mutating/ValidatingWebhookConfigurations, named as its kustomize install names
    them, calling `base_url` instead of its Service; failurePolicy as Kueue ships it."""
    configurations = []
    for manifest in manifests:
        configurations.append(
            {
                "apiVersion": manifest["apiVersion"],
                "kind": manifest["kind"],
                "metadata": {"name": f"kueue-{manifest['metadata']['name']}"},
                "webhooks": [
                    _rewrite_webhook(webhook, base_url=base_url, ca_bundle=ca_bundle)
                    for webhook in manifest["webhooks"]
                    if _serves_enabled_kinds(webhook)
                ],
            }
        )
    return configurations


def with_conversion_webhook(
    crd: dict[str, Any], *, base_url: str, ca_bundle: str
) -> dict[str, Any]:
    """The CRD as Kueue's install patches it: v1beta1 <-> v1beta2 converted by Kueue's /convert
    (here by URL); the other CRDs unchanged."""
    plural = crd["spec"]["names"]["plural"]
    if plural not in CONVERTED_CRDS:
        return crd
    patched = copy.deepcopy(crd)
    patched["spec"]["conversion"] = {
        "strategy": "Webhook",
        "webhook": {
            "clientConfig": {"url": f"{base_url}/convert", "caBundle": ca_bundle},
            "conversionReviewVersions": ["v1"],
        },
    }
    return patched


def flavor_name(instance_type: str) -> str:
    return instance_type.replace(".", "-")


def _format_quantity(value: Decimal) -> str:
    if value != value.to_integral_value():
        return f"{int(value * 1000)}m"
    whole = int(value)
    for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20)):
        if whole >= size and whole % size == 0:
            return f"{whole // size}{suffix}"
    return str(whole)


def node_quota(
    nodes: Iterable[dict[str, Any]], slices: Iterable[dict[str, Any]] = ()
) -> dict[str, dict[str, str]]:
    """Per instance type, the sum of its nodes' allocatable resources: every resource any node
    advertises (Kueue refuses a pod requesting a resource its ClusterQueue does not cover), and
    the devices DRA nodes publish in ResourceSlices, under the resource Kueue's
    deviceClassMappings count them as (api/dra.DRA_QUOTA_RESOURCES)."""
    nodes = list(nodes)
    totals: dict[str, dict[str, Decimal]] = {}
    types = {
        n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(
            instance_types.INSTANCE_TYPE_LABEL
        )
        for n in nodes
        if not n["metadata"].get("deletionTimestamp")
    }
    for published in slices:
        spec = published.get("spec") or {}
        resource = DRIVER_QUOTA_RESOURCES.get(spec.get("driver", ""))
        instance_type = types.get(spec.get("nodeName") or "")
        if resource is None or instance_type is None:
            continue
        per_type = totals.setdefault(instance_type, {})
        per_type[resource] = per_type.get(resource, Decimal(0)) + len(spec.get("devices") or [])
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        instance_type = labels.get(instance_types.INSTANCE_TYPE_LABEL)
        if instance_type is None or node["metadata"].get("deletionTimestamp"):
            continue
        per_type = totals.setdefault(instance_type, {})
        for resource, amount in ((node.get("status") or {}).get("allocatable") or {}).items():
            per_type[resource] = per_type.get(resource, Decimal(0)) + parse_quantity(amount)
    return {
        instance_type: {resource: _format_quantity(value) for resource, value in sorted(r.items())}
        for instance_type, r in sorted(totals.items())
    }


def _object(kind: str, metadata: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": metadata, **fields}


def resource_flavor(instance_type: str) -> dict[str, Any]:
    spec = {"nodeLabels": {instance_types.INSTANCE_TYPE_LABEL: instance_type}}
    return _object("ResourceFlavor", {"name": flavor_name(instance_type)}, spec=spec)


def cluster_queue(quota: dict[str, dict[str, str]], *, name: str = CLUSTER_QUEUE) -> dict[str, Any]:
    """One resource group: a flavor per instance type (tried in name order) with that type's
    whole capacity; a type without some resource gets 0 of it. Within the queue a
    higher-priority Workload preempts lower ones."""
    covered = sorted({resource for resources in quota.values() for resource in resources})
    flavors = [
        {
            "name": flavor_name(instance_type),
            "resources": [
                {"name": resource, "nominalQuota": quota[instance_type].get(resource, "0")}
                for resource in covered
            ],
        }
        for instance_type in sorted(quota)
    ]
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "preemption": {"withinClusterQueue": "LowerPriority"},
        "resourceGroups": [{"coveredResources": covered, "flavors": flavors}] if flavors else [],
    }
    return _object("ClusterQueue", {"name": name}, spec=spec)


def local_queue(
    namespace: str, name: str = LOCAL_QUEUE, *, cluster_queue_name: str = CLUSTER_QUEUE
) -> dict[str, Any]:
    metadata = {"name": name, "namespace": namespace}
    return _object("LocalQueue", metadata, spec={"clusterQueue": cluster_queue_name})


def workload_priority_class(name: str, value: int) -> dict[str, Any]:
    return _object(
        "WorkloadPriorityClass",
        {"name": name},
        value=value,
        description=f"dev cluster: {name} priority",
    )


# --- certificates --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Certificates:
    """The dev cluster's CA and Kueue's serving certificate for 127.0.0.1, in PEM files."""

    directory: Path  # also Kueue's webhook certDir: tls.crt and tls.key, as it expects

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "tls.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "tls.key"


def certificates(cluster: paths.ClusterPaths) -> Certificates:
    return Certificates(cluster.state_dir / "kueue-certs")


# cryptography is imported where it is used: it comes with the dev extras, and `dev status` or
# `dev down` need none of it.


def _private_key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    pem: bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return pem


def issue_certificates(
    common_name: str, *, now: datetime.datetime, issuer: tuple[bytes, bytes] | None = None
) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM): a CA when `issuer` is None, else a serving certificate for
    127.0.0.1 signed by `issuer` (its certificate PEM and key PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # An hour back: a clock a little behind ours must not find it not yet valid.
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + CERT_VALIDITY)
    )
    if issuer is None:
        builder = builder.issuer_name(subject).add_extension(
            x509.BasicConstraints(ca=True, path_length=0), critical=True
        )
        signing_key: Any = key
    else:
        ca_cert = x509.load_pem_x509_certificate(issuer[0])
        signing_key = serialization.load_pem_private_key(issuer[1], password=None)
        builder = (
            builder.issuer_name(ca_cert.subject)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(WEBHOOK_HOST))]),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        )
    certificate = builder.sign(signing_key, hashes.SHA256())
    return certificate.public_bytes(serialization.Encoding.PEM), _private_key_pem(key)


def _write_private(path: Path, data: bytes) -> None:
    """Written whole or not at all (a reader never sees half a PEM), readable by us only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "wb") as file:
        file.write(data)
    os.replace(scratch, path)


def ensure_certificates(cluster: paths.ClusterPaths) -> Certificates:
    """The cluster's CA and serving certificate, made once and kept with the cluster's state,
    so the caBundle registered with the API server stays valid across Kueue restarts."""
    certs = certificates(cluster)
    now = datetime.datetime.now(datetime.UTC)
    if not (certs.ca_cert.is_file() and certs.ca_key.is_file()):
        ca_pem, ca_key_pem = issue_certificates("trainium dev cluster CA", now=now)
        _write_private(certs.ca_key, ca_key_pem)
        _write_private(certs.ca_cert, ca_pem)
        certs.serving_cert.unlink(missing_ok=True)
    if not (certs.serving_cert.is_file() and certs.serving_key.is_file()):
        issuer = (certs.ca_cert.read_bytes(), certs.ca_key.read_bytes())
        cert_pem, key_pem = issue_certificates(WEBHOOK_HOST, now=now, issuer=issuer)
        _write_private(certs.serving_key, key_pem)
        _write_private(certs.serving_cert, cert_pem)
    return certs


def ensure_metrics_certificate(directory: Path = METRICS_CERT_DIR) -> None:
    """Kueue's metrics server certificate at the one path it reads; made once per machine and
    shared by every dev cluster (the metrics endpoint is local and nobody checks its issuer)."""
    if (directory / "tls.crt").is_file() and (directory / "tls.key").is_file():
        return
    cert_pem, key_pem = issue_certificates(
        "kueue metrics (trainium dev cluster)", now=datetime.datetime.now(datetime.UTC)
    )
    try:
        _write_private(directory / "tls.key", key_pem)
        _write_private(directory / "tls.crt", cert_pem)
    except OSError as error:
        raise KueueError(
            f"Kueue {versions.KUEUE_VERSION} needs a metrics certificate in {directory} "
            f"(a fixed path when its internal cert management is off) and it cannot be "
            f"written: {error}"
        ) from error


def ca_bundle(certs: Certificates) -> str:
    return base64.b64encode(certs.ca_cert.read_bytes()).decode()


# --- the process ---------------------------------------------------------------------------------


def daemon(cluster: paths.ClusterPaths) -> volcano.Daemon:
    return volcano.Daemon(BINARY, cluster)


def config_file(cluster: paths.ClusterPaths) -> Path:
    return cluster.state_dir / "kueue-config.yaml"


def ready(cluster: paths.ClusterPaths) -> bool:
    """/readyz answers 200 once Kueue's webhook server listens (its own readiness check)."""
    return volcano.healthy(daemon(cluster), "/readyz")


def load_manifests(manifest_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Kueue's CRDs and its two webhook configurations, as copied from its module."""

    # libyaml when PyYAML has it: the Workload CRD alone is 1.4 MB, 1.3 s in pure Python.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    def documents(path: Path) -> list[dict[str, Any]]:
        return [doc for doc in yaml.load_all(path.read_text(), Loader=loader) if doc]

    crds = [doc for path in sorted(manifest_dir.glob(CRD_FILE_GLOB)) for doc in documents(path)]
    webhook_file = manifest_dir / WEBHOOK_MANIFEST
    if not crds or not webhook_file.is_file():
        raise KueueError(f"no Kueue manifests in {manifest_dir}; run `trainium-operator dev build`")
    return crds, documents(webhook_file)


def _apply_webhook_configuration(clients: Clients, body: dict[str, Any]) -> None:
    admission = _admission_api(clients)
    kind = body["kind"]
    name = body["metadata"]["name"]
    read, create, replace = (
        (
            admission.read_mutating_webhook_configuration,
            admission.create_mutating_webhook_configuration,
            admission.replace_mutating_webhook_configuration,
        )
        if kind == "MutatingWebhookConfiguration"
        else (
            admission.read_validating_webhook_configuration,
            admission.create_validating_webhook_configuration,
            admission.replace_validating_webhook_configuration,
        )
    )
    try:
        existing = read(name)
    except Exception as error:
        if not is_status(error, 404):
            raise
        create(body)
        return
    replace(
        name,
        {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": existing.metadata.resource_version},
        },
    )


def _admission_api(clients: Clients) -> Any:
    from kubernetes import client

    return client.AdmissionregistrationV1Api(clients.api_client)


def install_api(
    clients: Clients, manifest_dir: Path, *, webhook_port: int, certs: Certificates
) -> None:
    """Kueue's CRDs (Established before its manager starts) and its webhooks, all calling
    127.0.0.1:`webhook_port` with the cluster's CA."""
    crds, webhook_manifests = load_manifests(manifest_dir)
    base_url, bundle = webhook_base_url(webhook_port), ca_bundle(certs)
    apply_crds(
        clients,
        [with_conversion_webhook(crd, base_url=base_url, ca_bundle=bundle) for crd in crds],
    )
    for body in webhook_configurations(webhook_manifests, base_url=base_url, ca_bundle=bundle):
        _apply_webhook_configuration(clients, body)


def start(cluster: paths.ClusterPaths, toolchain: build.Toolchain, clients: Clients) -> int:
    """Starts Kueue unless it runs (then it is left alone) and waits until it is ready; a new
    start gets new ports, so its API and webhooks are installed again first. Returns its pid."""
    manager = daemon(cluster)
    process: subprocess.Popen[bytes] | None = None
    pid = volcano.running_pid(manager)
    if pid is None:
        certs = ensure_certificates(cluster)
        ensure_metrics_certificate()
        webhook_port, health_port = volcano.free_port(), volcano.free_port()
        config = configuration(
            webhook_port=webhook_port,
            cert_dir=certs.directory,
            health_port=health_port,
            metrics_port=volcano.free_port(),
        )
        install_api(clients, toolchain.kueue_manifest_dir, webhook_port=webhook_port, certs=certs)
        config_file(cluster).write_text(yaml.safe_dump(config, sort_keys=False))
        argv = manager_argv(toolchain.binary(BINARY), cluster.kubeconfig, config_file(cluster))
        process = volcano.launch(manager, argv, healthz_port=health_port)
        pid = process.pid
    failure = volcano.wait_healthy(
        manager, process, deadline=time.monotonic() + HEALTH_TIMEOUT, endpoint="/readyz"
    )
    if failure:
        raise KueueError(failure)
    return pid


def stop(cluster: paths.ClusterPaths, *, timeout: float = 10.0) -> bool:
    return volcano.stop_daemon(daemon(cluster), timeout=timeout)


# --- queues --------------------------------------------------------------------------------------


def api_installed(clients: Clients) -> bool:
    try:
        clients.apiextensions.read_custom_resource_definition(f"clusterqueues.{GROUP}")
    except Exception as error:
        if is_status(error, 404):
            return False
        raise
    return True


def _create_cluster_object(clients: Clients, plural: str, body: dict[str, Any]) -> bool:
    return create_if_missing(
        functools.partial(clients.custom.create_cluster_custom_object, GROUP, VERSION, plural, body)
    )


def sync_cluster_queue(clients: Clients, *, attempts: int = 5) -> dict[str, dict[str, str]]:
    """Sets the ClusterQueue's quota to the capacity of the nodes there now (a flavor per
    instance type, created if new); call it whenever nodes are added or removed. Does nothing on
    a cluster without Kueue's API. Returns the quota per instance type."""
    if not api_installed(clients):
        return {}
    nodes = [
        clients.api_client.sanitize_for_serialization(n) for n in clients.core.list_node().items
    ]
    slices = [
        clients.api_client.sanitize_for_serialization(s)
        for s in clients.resource.list_resource_slice().items
    ]
    quota = node_quota(nodes, slices)
    for instance_type in quota:
        _create_cluster_object(clients, "resourceflavors", resource_flavor(instance_type))
    wanted = cluster_queue(quota)
    for attempt in range(attempts):
        if _create_cluster_object(clients, "clusterqueues", wanted):
            return quota
        existing = clients.custom.get_cluster_custom_object(
            GROUP, VERSION, "clusterqueues", CLUSTER_QUEUE
        )
        if existing.get("spec", {}).get("resourceGroups") == wanted["spec"]["resourceGroups"]:
            return quota
        existing["spec"]["resourceGroups"] = wanted["spec"]["resourceGroups"]
        try:
            clients.custom.replace_cluster_custom_object(
                GROUP, VERSION, "clusterqueues", CLUSTER_QUEUE, existing
            )
        except Exception as error:
            # Kueue writes the queue's status meanwhile: read it again.
            if is_status(error, 409) and attempt + 1 < attempts:
                continue
            raise
        return quota
    return quota


def _active(found: dict[str, Any]) -> bool:
    conditions = (found.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Active" and c.get("status") == "True" for c in conditions)


def create_queues(clients: Clients, *, timeout: float = 30) -> dict[str, dict[str, str]]:
    """The WorkloadPriorityClasses, a ResourceFlavor per instance type and the ClusterQueue
    (quota: the nodes' capacity), Active once Kueue has seen its flavors."""
    for name, value in PRIORITY_CLASSES.items():
        _create_cluster_object(
            clients, "workloadpriorityclasses", workload_priority_class(name, value)
        )
    quota = sync_cluster_queue(clients)
    sim.wait_for(
        lambda: clients.custom.get_cluster_custom_object(
            GROUP, VERSION, "clusterqueues", CLUSTER_QUEUE
        ),
        until=_active,
        timeout=timeout,
        description=f"ClusterQueue {CLUSTER_QUEUE} Active",
    )
    return quota


def ensure_local_queue(
    clients: Clients, namespace: str, name: str = LOCAL_QUEUE, *, timeout: float = 30
) -> None:
    """A LocalQueue `name` in `namespace` pointing at the ClusterQueue `trainium`, Active."""
    create_if_missing(
        functools.partial(
            clients.custom.create_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "localqueues",
            local_queue(namespace, name),
        )
    )
    sim.wait_for(
        lambda: clients.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "localqueues", name
        ),
        until=_active,
        timeout=timeout,
        description=f"LocalQueue {namespace}/{name} Active",
    )


def strip_finalizers(core: Any, namespace: str, pods: Iterable[Any]) -> list[str]:
    """Removes Kueue's finalizer from these pods (V1Pod objects) so a forced delete completes
    without Kueue; returns the names patched. A pod changed meanwhile is skipped (the patch's
    test fails) or already gone; both are fine for a clean-up."""
    patched = []
    for pod in pods:
        finalizers = list(pod.metadata.finalizers or ())
        if MANAGED_FINALIZER not in finalizers:
            continue
        index = finalizers.index(MANAGED_FINALIZER)
        patch = [
            {"op": "test", "path": f"/metadata/finalizers/{index}", "value": MANAGED_FINALIZER},
            {"op": "remove", "path": f"/metadata/finalizers/{index}"},
        ]
        try:
            core.patch_namespaced_pod(pod.metadata.name, namespace, patch)
        except Exception as error:
            if not is_status(error, 404, 409, 422):
                raise
            continue
        patched.append(pod.metadata.name)
    return patched


def read_workload(custom: Any, namespace: str, name: str) -> dict[str, Any]:
    """A Kueue Workload as the API server returns it (CustomObjectsApi `custom`)."""
    found: dict[str, Any] = custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "workloads", name
    )
    return found


def condition(found: dict[str, Any], kind: str) -> dict[str, Any]:
    """The condition `kind` of a Kueue object's status, or {} when it has none."""
    for entry in (found.get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return dict(entry)
    return {}
