"""The one place that talks to the Kubernetes API (besides kopf's own watches).

Everything returns and takes plain dicts in API (camelCase) form, the same shape the
builders produce, so the lifecycle never sees client model classes. Creation is idempotent
(AlreadyExists is success) and deletion tolerant (NotFound is success).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol

import urllib3.connection
import urllib3.exceptions
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from trainium_operator.api import kueue, topology
from trainium_operator.api import spec as spec_model
from trainium_operator.api.objects import Obj
from trainium_operator.builders.job import VOLCANO_GROUP, VOLCANO_VERSION

PODGROUPS = "podgroups"
QUEUES = "queues"
NETWORK_POLICIES = "networkpolicies"
WORKLOADS = "workloads"  # Kueue's
LOCAL_QUEUES = "localqueues"  # Kueue's
RESOURCE_CLAIM_TEMPLATES = "resourceclaimtemplates"  # resource.k8s.io/v1 (DRA jobs)
# The resource (plural) of each kind the operator creates, as its requests name it.
# Kueue's topology kinds the topology reconciler writes, by kind.
_KUEUE_TOPOLOGY_KINDS = {
    "Topology": topology.KUEUE_TOPOLOGIES,
    "ResourceFlavor": topology.RESOURCE_FLAVORS,
}
CHILD_RESOURCES = {
    "Pod": "pods",
    "Service": "services",
    "PodGroup": PODGROUPS,
    "NetworkPolicy": NETWORK_POLICIES,
    "ResourceClaimTemplate": RESOURCE_CLAIM_TEMPLATES,
}


@dataclass
class RequestCounter:
    """Counts API requests by verb and resource, for the benchmark and metrics."""

    counts: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, verb: str, resource: str) -> None:
        with self._lock:
            self.counts[f"{verb} {resource}"] += 1

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())


def is_conflict(error: BaseException) -> bool:
    """A write lost a race (stale resourceVersion, object changed meanwhile): just re-read."""
    return isinstance(error, ApiException) and error.status == 409


def is_not_found(error: BaseException) -> bool:
    """The object, or the API serving its kind (a CRD not installed), is not there."""
    return isinstance(error, ApiException) and error.status == 404


# The API server restarting, overloaded or behind a load balancer that is shifting.
_TRANSIENT_STATUSES = frozenset({0, 429, 500, 502, 503, 504})


def is_transient(error: BaseException) -> bool:
    """The API server could not be reached or answered "try again": not the request's fault."""
    if isinstance(error, ApiException):
        return error.status in _TRANSIENT_STATUSES
    return isinstance(error, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


@dataclass(frozen=True, slots=True)
class AdmissionRejection:
    """The API server's admission refused an object for a reason RBAC has nothing to do with."""

    reason: str  # QuotaExceeded | PriorityClassNotFound | ServiceAccountNotFound | ...
    message: str
    fatal: bool  # only a spec change can fix it (an invalid field); else the cluster may


PRIORITY_CLASS_NOT_FOUND = "PriorityClassNotFound"
# (reason, fatal, what identifies it in the API server's message), checked in order.
_ADMISSION_RULES: tuple[tuple[str, bool, str], ...] = (
    ("QuotaExceeded", False, "exceeded quota"),
    ("QuotaExceeded", False, "must specify limits"),
    (PRIORITY_CLASS_NOT_FOUND, False, "no PriorityClass with name"),
    ("ServiceAccountNotFound", False, "error looking up service account"),
    ("PodSecurityRejected", False, "violates PodSecurity"),
    ("LimitRangeRejected", False, "maximum cpu usage per"),
    ("LimitRangeRejected", False, "maximum memory usage per"),
    # Built-in admission plugins on pods: RuntimeClass (a class created later lifts it), pod
    # overhead without a RuntimeClass and Priority's own fields (only the spec can fix those).
    ("RuntimeClassNotFound", False, "pod rejected: RuntimeClass"),
    ("PodRejected", True, "pod rejected:"),
    ("PriorityRejected", True, "must not be provided in pod spec"),
)
# How RBAC words a denial: 'pods is forbidden: User "..." cannot create resource "pods" ...'.
_RBAC_DENIAL = re.compile(r'cannot [a-z]+ resource "')


def admission_rejection(error: BaseException) -> AdmissionRejection | None:
    """What an admission refusal means, or None (an RBAC denial, a conflict, any other error)."""
    if not isinstance(error, ApiException):
        return None
    message = api_error_message(error)
    if error.status in (400, 422):
        # 422: a field's value is invalid; 400: the body could not even be decoded (a boolean
        # field given a list, in pass-through content). Only a spec change can fix either.
        return AdmissionRejection("InvalidPodSpec", message, fatal=True)
    if error.status == 403:
        for reason, fatal, marker in _ADMISSION_RULES:
            if marker in message:
                return AdmissionRejection(reason, message, fatal)
        if "denied the request" in message:  # a validating webhook (Kyverno, Gatekeeper...)
            return AdmissionRejection("AdmissionWebhookRejected", message, fatal=False)
        if not _RBAC_DENIAL.search(message) and not is_namespace_terminating(error):
            # Any other admission plugin or policy: the cluster's rules, which may change.
            return AdmissionRejection("AdmissionRejected", message, fatal=False)
    return None


def is_namespace_terminating(error: BaseException) -> bool:
    """A create refused because its namespace is being deleted (with the job in it)."""
    if not isinstance(error, ApiException) or error.status != 403:
        return False
    try:
        causes = (json.loads(error.body or "{}").get("details") or {}).get("causes") or []
    except (ValueError, AttributeError):
        causes = []
    return any(c.get("reason") == "NamespaceTerminating" for c in causes) or (
        "because it is being terminated" in api_error_message(error)
    )


def never_reached_server(error: BaseException) -> bool:
    """The request was never sent: no connection to the API server could be made (refused, a
    name that does not resolve, a connect timeout). A write that failed so changed nothing.
    urllib3 retries only connection failures for a POST, so its last error being one means
    every try was."""
    if isinstance(error, urllib3.exceptions.MaxRetryError):
        error = error.reason or error
    return isinstance(error, urllib3.exceptions.ConnectTimeoutError)


def is_forbidden(error: BaseException) -> bool:
    """The operator's identity lacks an RBAC permission (not an admission refusal)."""
    return (
        isinstance(error, ApiException)
        and error.status == 403
        and admission_rejection(error) is None
        and not is_namespace_terminating(error)
    )


def api_error_message(error: BaseException) -> str:
    """The API server's own message (e.g. 'pods is forbidden: User ... cannot create ...')."""
    if isinstance(error, ApiException):
        try:
            body = json.loads(error.body or "{}")
        except ValueError:
            body = {}
        return str(body.get("message") or error.reason or error)
    return str(error)


def load_configuration(kubeconfig: str | None = None) -> client.Configuration:
    """The given kubeconfig; else in-cluster config in a pod; else $KUBECONFIG or ~/.kube/config."""
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        return configuration
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        path = os.environ.get("KUBECONFIG") or None
        config.load_kube_config(config_file=path, client_configuration=configuration)
    return configuration


API_CONNECTIONS = 32  # reconcile workers x concurrent creates, without discarded sockets


# TCP keepalive on every API connection: a peer that vanished without a FIN (a NAT or load
# balancer dropping the flow) is found in about a minute instead of never.
KEEPALIVE_SOCKET_OPTIONS: list[tuple[int, int, int]] = [
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    *(
        [
            (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 30),
            (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10),
            (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3),
        ]
        if hasattr(socket, "TCP_KEEPIDLE")
        else []
    ),
]


def load_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    configuration = load_configuration(kubeconfig)
    configuration.connection_pool_maxsize = API_CONNECTIONS
    configuration.socket_options = [
        *urllib3.connection.HTTPConnection.default_socket_options,
        *KEEPALIVE_SOCKET_OPTIONS,
    ]
    return client.ApiClient(configuration)


@dataclass(frozen=True)
class Credentials:
    """What kopf's own watches need to reach the same API server as our client."""

    server: str
    ca_path: str | None
    insecure: bool
    certificate_path: str | None
    private_key_path: str | None
    token: str | None


def credentials(kubeconfig: str | None = None) -> Credentials:
    configuration = load_configuration(kubeconfig)
    header = configuration.api_key.get("authorization") or configuration.api_key.get("BearerToken")
    token = header.removeprefix("Bearer ").strip() if header else None
    return Credentials(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        token=token,
    )


def _drain(response: Any) -> None:
    """Reads a raw (`_preload_content=False`) answer to its end, so its connection goes back
    to the pool for the next request."""
    response.data  # noqa: B018 -- reading it is the point


class Cluster:
    """Typed-enough operations the operator needs, over one ApiClient."""

    def __init__(self, api_client: client.ApiClient, counter: RequestCounter | None = None):
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.resource = client.ResourceV1Api(api_client)
        self.counter = counter or RequestCounter()

    def _to_dict(self, obj: Any) -> Obj:
        result: Obj = self.api_client.sanitize_for_serialization(obj)
        return result

    # -- TrainingJobs ------------------------------------------------------------------
    def get_training_job(self, namespace: str, name: str) -> Obj | None:
        self.counter.add("get", spec_model.PLURAL)
        try:
            result: Obj = self.custom.get_namespaced_custom_object(
                spec_model.GROUP, spec_model.VERSION, namespace, spec_model.PLURAL, name
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return result

    def list_training_jobs(self, namespace: str | None = None) -> list[Obj]:
        self.counter.add("list", spec_model.PLURAL)
        if namespace:
            result = self.custom.list_namespaced_custom_object(
                spec_model.GROUP, spec_model.VERSION, namespace, spec_model.PLURAL
            )
        else:
            result = self.custom.list_cluster_custom_object(
                spec_model.GROUP, spec_model.VERSION, spec_model.PLURAL
            )
        items: list[Obj] = result.get("items", [])
        return items

    def replace_training_job_status(self, job: Obj, status: Obj) -> Obj | None:
        """Writes `status` as the job's whole status (PUT of the status subresource: what the
        state machine dropped is gone from the server too). `job` is the object the status was
        decided on; its resourceVersion makes a concurrent writer's change fail this with 409
        instead of being silently overwritten."""
        self.counter.add("update", f"{spec_model.PLURAL}/status")
        meta = job["metadata"]
        body: Obj = {
            "apiVersion": job.get("apiVersion", f"{spec_model.GROUP}/{spec_model.VERSION}"),
            "kind": job.get("kind", spec_model.KIND),
            "metadata": {
                key: meta[key]
                for key in ("name", "namespace", "uid", "resourceVersion")
                if key in meta
            },
            "spec": job.get("spec") or {},
            "status": status,
        }
        try:
            result: Obj = self.custom.replace_namespaced_custom_object_status(
                spec_model.GROUP,
                spec_model.VERSION,
                meta["namespace"],
                spec_model.PLURAL,
                meta["name"],
                body,
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return result

    def delete_training_job(self, namespace: str, name: str, uid: str | None = None) -> None:
        """Delete a TrainingJob; gone already is fine. With `uid`, only that incarnation: a
        job re-created under the same name (409 on the precondition) is left alone."""
        self.counter.add("delete", spec_model.PLURAL)
        body: Obj = {"propagationPolicy": "Background"}
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            self.custom.delete_namespaced_custom_object(
                spec_model.GROUP, spec_model.VERSION, namespace, spec_model.PLURAL, name, body=body
            )
        except ApiException as error:
            if error.status != 404 and not (uid is not None and error.status == 409):
                raise

    def create_training_job(self, namespace: str, body: Obj) -> Obj:
        """Create a TrainingJob (the TorchX scheduler's submit); ApiException on refusal."""
        self.counter.add("create", spec_model.PLURAL)
        result: Obj = self.custom.create_namespaced_custom_object(
            spec_model.GROUP, spec_model.VERSION, namespace, spec_model.PLURAL, body
        )
        return result

    def patch_training_job(self, namespace: str, name: str, patch: Obj) -> None:
        self.counter.add("patch", spec_model.PLURAL)
        self.custom.patch_namespaced_custom_object(
            spec_model.GROUP, spec_model.VERSION, namespace, spec_model.PLURAL, name, patch
        )

    def set_training_job_annotation(self, namespace: str, name: str, key: str, value: str) -> None:
        """Sets one annotation of a TrainingJob (a merge patch); ApiException on refusal."""
        self.patch_training_job(namespace, name, {"metadata": {"annotations": {key: value}}})

    def remove_training_job_annotation(
        self, namespace: str, name: str, key: str, value: str
    ) -> bool:
        """Removes annotation `key` while it still has `value` (a JSON patch that tests it
        first); whether it was removed (False: another value, gone, or the job gone)."""
        path = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
        self.counter.add("patch", spec_model.PLURAL)
        try:
            self.custom.patch_namespaced_custom_object(
                spec_model.GROUP,
                spec_model.VERSION,
                namespace,
                spec_model.PLURAL,
                name,
                [{"op": "test", "path": path, "value": value}, {"op": "remove", "path": path}],
                _content_type="application/json-patch+json",
            )
        except ApiException as error:
            if error.status in (404, 422):  # gone, or the test failed: nothing of ours to remove
                return False
            raise
        return True

    def pod_log_lines(
        self, namespace: str, name: str, container: str, *, follow: bool
    ) -> Iterator[str]:
        """A pod container's log, line by line (streamed while it runs when follow)."""
        self.counter.add("get", "pods/log")
        # The raw response: with preloaded content this client returns str(bytes) for logs.
        response = self.core.read_namespaced_pod_log(
            name, namespace, container=container, follow=follow, _preload_content=False
        )
        try:
            pending = b""
            for chunk in response.stream():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace") + "\n"
            if pending:
                yield pending.decode(errors="replace")
        finally:
            response.release_conn()

    # -- kopf peering -------------------------------------------------------------------
    def get_peering_status(self, name: str, namespace: str | None) -> dict[str, Any]:
        """The peers kopf records in its (Cluster)KopfPeering object; {} when absent."""
        self.counter.add("get", "kopfpeerings")
        try:
            if namespace is None:
                body = self.custom.get_cluster_custom_object(
                    "kopf.dev", "v1", "clusterkopfpeerings", name
                )
            else:
                body = self.custom.get_namespaced_custom_object(
                    "kopf.dev", "v1", namespace, "kopfpeerings", name
                )
        except ApiException as error:
            if error.status == 404:
                return {}
            raise
        status: dict[str, Any] = body.get("status") or {}
        return status

    # -- the operator's own pod (the health channel's role label) ---------------------------
    def own_pod_label(self, namespace: str, name: str, key: str) -> str | None:
        """The value of label `key` on the operator's own pod (None: unset)."""
        self.counter.add("get", "pods")
        pod = self.core.read_namespaced_pod(name, namespace)
        labels = (pod.metadata.labels if pod.metadata is not None else None) or {}
        value = labels.get(key)
        return str(value) if value is not None else None

    def label_own_pod(self, namespace: str, name: str, key: str, value: str) -> None:
        """Sets one label of the operator's own pod (a merge patch of that label only)."""
        self.counter.add("patch", "pods")
        patch = {"metadata": {"labels": {key: value}}}
        self.core.patch_namespaced_pod(
            name, namespace, patch, _content_type="application/merge-patch+json"
        )

    # -- children ----------------------------------------------------------------------
    def list_pods(self, namespace: str, label_selector: str) -> list[Obj]:
        self.counter.add("list", "pods")
        result = self.core.list_namespaced_pod(namespace, label_selector=label_selector)
        return [self._to_dict(p) for p in result.items]

    def watch_sources(
        self, namespace: str | None, *, kueue_objects: bool = False
    ) -> dict[str, Callable[..., Any]]:
        """The list functions the operator's watches use, for one namespace or (None) all:
        TrainingJobs, and the kinds of their children (filtered by label by the caller); with
        `kueue_objects`, Kueue's Workloads and LocalQueues too."""
        core, custom = self.core, self.custom
        job_api = (spec_model.GROUP, spec_model.VERSION)
        volcano = (VOLCANO_GROUP, VOLCANO_VERSION)
        kueue_api = (kueue.KUEUE_GROUP, kueue.KUEUE_VERSION)
        if namespace is None:
            sources = {
                spec_model.PLURAL: partial(
                    custom.list_cluster_custom_object, *job_api, spec_model.PLURAL
                ),
                "pods": core.list_pod_for_all_namespaces,
                "services": core.list_service_for_all_namespaces,
                NETWORK_POLICIES: self.networking.list_network_policy_for_all_namespaces,
                PODGROUPS: partial(custom.list_cluster_custom_object, *volcano, PODGROUPS),
                WORKLOADS: partial(custom.list_cluster_custom_object, *kueue_api, WORKLOADS),
                LOCAL_QUEUES: partial(custom.list_cluster_custom_object, *kueue_api, LOCAL_QUEUES),
            }
        else:
            sources = {
                spec_model.PLURAL: partial(
                    custom.list_namespaced_custom_object, *job_api, namespace, spec_model.PLURAL
                ),
                "pods": partial(core.list_namespaced_pod, namespace),
                "services": partial(core.list_namespaced_service, namespace),
                NETWORK_POLICIES: partial(
                    self.networking.list_namespaced_network_policy, namespace
                ),
                PODGROUPS: partial(
                    custom.list_namespaced_custom_object, *volcano, namespace, PODGROUPS
                ),
                WORKLOADS: partial(
                    custom.list_namespaced_custom_object, *kueue_api, namespace, WORKLOADS
                ),
                LOCAL_QUEUES: partial(
                    custom.list_namespaced_custom_object, *kueue_api, namespace, LOCAL_QUEUES
                ),
            }
        if not kueue_objects:
            del sources[WORKLOADS], sources[LOCAL_QUEUES]
        return sources

    def node_source(self) -> Callable[..., Any]:
        source: Callable[..., Any] = self.core.list_node
        return source

    def queue_source(self) -> Callable[..., Any]:
        """Volcano queues (cluster-scoped)."""
        return partial(
            self.custom.list_cluster_custom_object, VOLCANO_GROUP, VOLCANO_VERSION, QUEUES
        )

    def create(self, obj: Obj) -> bool:
        """Create a child; False when it already exists (a repeated reconcile)."""
        kind = obj["kind"]
        namespace = obj["metadata"]["namespace"]
        self.counter.add("create", CHILD_RESOURCES.get(kind, kind.lower() + "s"))
        # The answer is not read (the watch brings the object): left raw, a gang's hundreds of
        # pod answers are never turned into client models, which costs CPU on every start.
        raw = {"_preload_content": False}
        sends: dict[str, Callable[[], Any]] = {
            "Pod": lambda: self.core.create_namespaced_pod(namespace, obj, **raw),
            "Service": lambda: self.core.create_namespaced_service(namespace, obj, **raw),
            "NetworkPolicy": lambda: self.networking.create_namespaced_network_policy(
                namespace, obj, **raw
            ),
            "PodGroup": lambda: self.custom.create_namespaced_custom_object(
                VOLCANO_GROUP, VOLCANO_VERSION, namespace, PODGROUPS, obj, **raw
            ),
            "ResourceClaimTemplate": lambda: (
                self.resource.create_namespaced_resource_claim_template(namespace, obj, **raw)
            ),
        }
        if kind not in sends:
            raise ValueError(f"the operator does not create {kind} objects")
        try:
            _drain(sends[kind]())
        except ApiException as error:
            if error.status == 409:
                return False  # ours from an earlier pass, or another owner's of that name
            raise
        return True

    def read_child(self, kind: str, namespace: str, name: str) -> Obj | None:
        """An existing object of a kind the operator creates (to see who owns a name that is
        taken, and why it is still there), or None when it does not exist."""
        self.counter.add("get", CHILD_RESOURCES.get(kind, kind.lower() + "s"))
        try:
            if kind == "Pod":
                found: Any = self.core.read_namespaced_pod(name, namespace)
            elif kind == "Service":
                found = self.core.read_namespaced_service(name, namespace)
            elif kind == "NetworkPolicy":
                found = self.networking.read_namespaced_network_policy(name, namespace)
            elif kind == "ResourceClaimTemplate":
                found = self.resource.read_namespaced_resource_claim_template(name, namespace)
            elif kind == "PodGroup":
                return dict(
                    self.custom.get_namespaced_custom_object(
                        VOLCANO_GROUP, VOLCANO_VERSION, namespace, PODGROUPS, name
                    )
                )
            else:
                raise ValueError(f"the operator does not own {kind} objects")
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return dict(self.core.api_client.sanitize_for_serialization(found))

    def delete_service(self, namespace: str, name: str) -> None:
        self.counter.add("delete", "services")
        try:
            self.core.delete_namespaced_service(name, namespace)
        except ApiException as error:
            if error.status != 404:
                raise

    def delete_network_policy(self, namespace: str, name: str) -> None:
        self.counter.add("delete", NETWORK_POLICIES)
        try:
            self.networking.delete_namespaced_network_policy(name, namespace)
        except ApiException as error:
            if error.status != 404:
                raise

    def delete_pod(self, namespace: str, name: str, *, force: bool, uid: str | None = None) -> None:
        """Deletes a pod (gone already is fine); with `uid`, only that pod: another pod since
        created under its name is left alone (the server's precondition, 409)."""
        self.counter.add("delete", "pods")
        body = {"preconditions": {"uid": uid}} if uid is not None else None
        try:
            _drain(
                self.core.delete_namespaced_pod(
                    name,
                    namespace,
                    grace_period_seconds=0 if force else None,
                    body=body,
                    _preload_content=False,
                )
            )
        except ApiException as error:
            if error.status == 409 and uid is not None:
                return
            if error.status != 404:
                raise

    def release_pod_finalizer(self, namespace: str, name: str, finalizer: str) -> None:
        """Removes one finalizer of a pod, leaving any other (a strategic merge patch's
        deleteFromPrimitiveList: no read, no race with another controller's finalizers)."""
        self.counter.add("patch", "pods")
        patch = {"metadata": {"$deleteFromPrimitiveList/finalizers": [finalizer]}}
        try:
            self.core.patch_namespaced_pod(
                name, namespace, patch, _content_type="application/strategic-merge-patch+json"
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def cordon_node(self, name: str, patch: Obj) -> bool:
        """A JSON merge patch of a node (a straggler's cordon); False when the node is gone."""
        self.counter.add("patch", "nodes")
        try:
            # The generated client would send a dict as a JSON Patch (a list of operations).
            self.core.patch_node(name, patch, _content_type="application/merge-patch+json")
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def delete_podgroup(self, namespace: str, name: str) -> None:
        self.counter.add("delete", PODGROUPS)
        try:
            self.custom.delete_namespaced_custom_object(
                VOLCANO_GROUP, VOLCANO_VERSION, namespace, PODGROUPS, name
            )
        except ApiException as error:
            if error.status != 404:
                raise

    # -- network topology (the opt-in topology reconciler, controller/topology.py) ---------
    # Cluster-scoped objects, listed by the operator's managed-by labels only: nothing it did
    # not create is read back as its own. Volcano's and Kueue's are separate methods, each
    # called only when the operator writes topology for that scheduler (`run --topology`).
    def list_hypernodes(self) -> list[Obj]:
        self.counter.add("list", topology.HYPERNODES)
        result = self.custom.list_cluster_custom_object(
            topology.HYPERNODE_GROUP,
            topology.HYPERNODE_VERSION,
            topology.HYPERNODES,
            label_selector=topology.MANAGED_SELECTOR,
        )
        items: list[Obj] = result.get("items", [])
        return items

    def create_hypernode(self, obj: Obj) -> bool:
        """False when the name is taken (another owner's HyperNode, or ours from a pass whose
        list did not see it yet)."""
        self.counter.add("create", topology.HYPERNODES)
        try:
            self.custom.create_cluster_custom_object(
                topology.HYPERNODE_GROUP, topology.HYPERNODE_VERSION, topology.HYPERNODES, obj
            )
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True

    def replace_hypernode(self, obj: Obj) -> None:
        """PUT under the resourceVersion the pass listed: a concurrent change fails with 409."""
        self.counter.add("update", topology.HYPERNODES)
        self.custom.replace_cluster_custom_object(
            topology.HYPERNODE_GROUP,
            topology.HYPERNODE_VERSION,
            topology.HYPERNODES,
            obj["metadata"]["name"],
            obj,
        )

    def delete_hypernode(self, name: str) -> None:
        self.counter.add("delete", topology.HYPERNODES)
        try:
            self.custom.delete_cluster_custom_object(
                topology.HYPERNODE_GROUP, topology.HYPERNODE_VERSION, topology.HYPERNODES, name
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def list_kueue_topology(self, kind: str) -> list[Obj]:
        """The operator's Kueue Topologies or ResourceFlavors (`kind`)."""
        self.counter.add("list", _KUEUE_TOPOLOGY_KINDS[kind])
        selector = topology.MANAGED_SELECTOR
        lists: dict[str, Callable[[], Any]] = {
            "Topology": lambda: self.custom.list_cluster_custom_object(
                kueue.KUEUE_GROUP,
                kueue.KUEUE_VERSION,
                topology.KUEUE_TOPOLOGIES,
                label_selector=selector,
            ),
            "ResourceFlavor": lambda: self.custom.list_cluster_custom_object(
                kueue.KUEUE_GROUP,
                kueue.KUEUE_VERSION,
                topology.RESOURCE_FLAVORS,
                label_selector=selector,
            ),
        }
        items: list[Obj] = lists[kind]().get("items", [])
        return items

    def create_kueue_topology(self, obj: Obj) -> bool:
        """Creates a Topology or ResourceFlavor; False when the name is taken."""
        kind = obj["kind"]
        self.counter.add("create", _KUEUE_TOPOLOGY_KINDS[kind])
        sends: dict[str, Callable[[], object]] = {
            "Topology": lambda: self.custom.create_cluster_custom_object(
                kueue.KUEUE_GROUP, kueue.KUEUE_VERSION, topology.KUEUE_TOPOLOGIES, obj
            ),
            "ResourceFlavor": lambda: self.custom.create_cluster_custom_object(
                kueue.KUEUE_GROUP, kueue.KUEUE_VERSION, topology.RESOURCE_FLAVORS, obj
            ),
        }
        try:
            sends[kind]()
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True

    def delete_kueue_topology(self, kind: str, name: str) -> None:
        self.counter.add("delete", _KUEUE_TOPOLOGY_KINDS[kind])
        sends: dict[str, Callable[[], object]] = {
            "Topology": lambda: self.custom.delete_cluster_custom_object(
                kueue.KUEUE_GROUP, kueue.KUEUE_VERSION, topology.KUEUE_TOPOLOGIES, name
            ),
            "ResourceFlavor": lambda: self.custom.delete_cluster_custom_object(
                kueue.KUEUE_GROUP, kueue.KUEUE_VERSION, topology.RESOURCE_FLAVORS, name
            ),
        }
        try:
            sends[kind]()
        except ApiException as error:
            if error.status != 404:
                raise


class EventsAPI(Protocol):
    """The one CoreV1Api call made outside `Cluster`'s methods: EventPoster's create."""

    def create_namespaced_event(self, namespace: str, body: Obj) -> object: ...


class ClusterAPI(Protocol):
    """What a reconcile pass calls on the cluster (the Reconciler and its EventPoster):
    `Cluster` over the API server, or the unit tier's in-memory fake."""

    @property
    def counter(self) -> RequestCounter: ...

    @property
    def core(self) -> EventsAPI: ...

    def get_training_job(self, namespace: str, name: str) -> Obj | None: ...

    def replace_training_job_status(self, job: Obj, status: Obj) -> Obj | None: ...

    def delete_training_job(self, namespace: str, name: str, uid: str | None = None) -> None: ...

    def remove_training_job_annotation(
        self, namespace: str, name: str, key: str, value: str
    ) -> bool: ...

    def create(self, obj: Obj) -> bool: ...

    def read_child(self, kind: str, namespace: str, name: str) -> Obj | None: ...

    def delete_service(self, namespace: str, name: str) -> None: ...

    def delete_network_policy(self, namespace: str, name: str) -> None: ...

    def delete_pod(
        self, namespace: str, name: str, *, force: bool, uid: str | None = None
    ) -> None: ...

    def release_pod_finalizer(self, namespace: str, name: str, finalizer: str) -> None: ...

    def delete_podgroup(self, namespace: str, name: str) -> None: ...

    def cordon_node(self, name: str, patch: Obj) -> bool: ...


class TopologyAPI(Protocol):
    """What the topology reconciler calls on the cluster: `Cluster`, or the unit tier's fake."""

    def list_hypernodes(self) -> list[Obj]: ...

    def create_hypernode(self, obj: Obj) -> bool: ...

    def replace_hypernode(self, obj: Obj) -> None: ...

    def delete_hypernode(self, name: str) -> None: ...

    def list_kueue_topology(self, kind: str) -> list[Obj]: ...

    def create_kueue_topology(self, obj: Obj) -> bool: ...

    def delete_kueue_topology(self, kind: str, name: str) -> None: ...


def event_name(involved: Obj) -> str:
    """`<object>.<nanoseconds, hex>` as client-go's recorder names events, plus a random tail, so
    the API server (which lists by name) returns a job's events in the order they happened."""
    return f"{involved['metadata']['name']}.{time.time_ns():016x}{secrets.token_hex(2)}"


def event_micro_time(moment: datetime) -> str:
    """A MicroTime as the API server stores it (RFC 3339, microseconds, UTC)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class EventPoster:
    """Posts core/v1 Events about a TrainingJob (what `kubectl describe tj` shows)."""

    def __init__(self, cluster: ClusterAPI, component: str = "trainium-operator"):
        self.cluster = cluster
        self.component = component

    def post(
        self, involved: Obj, event_type: str, reason: str, message: str, now: datetime
    ) -> None:
        meta = involved["metadata"]
        self.cluster.counter.add("create", "events")
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name(involved), "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved["apiVersion"],
                "kind": involved["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": event_type,
            "reason": reason,
            # The API rejects event messages over 1 KiB.
            "message": message[:1000],
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.component,
            # eventTime alone (microseconds), not first/lastTimestamp (whole seconds): kubectl
            # sorts by lastTimestamp when it is set and its sort is not stable, so two events of
            # one second (GangRunning, then TrainingSucceeded) could show the older state last.
            # An eventTime on a core/v1 Event requires an action.
            "eventTime": event_micro_time(now),
            "action": reason,
        }
        try:
            self.cluster.core.create_namespaced_event(meta["namespace"], body)
        except ApiException as error:
            # An event lost is not worth failing a reconcile over.
            if error.status not in (403, 404, 409, 422):
                raise
