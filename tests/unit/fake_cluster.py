"""An in-memory `k8s.client.ClusterAPI` (what `Cluster` is to the API server), for the
reconciler's write-order tier.

It is the seam the Reconciler writes through: every write lands in `writes` in the order it was
made, and, like a watch that delivers at once, reaches the reconciler's cache. Failures are
injected per (verb, kind). Evidence of write order only: that the operator works on a cluster
is shown by the integration tier, never by this fake.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from trainium_operator.api.topology import MANAGED_LABELS
from trainium_operator.controller.cache import ClusterCache
from trainium_operator.k8s.client import RequestCounter
from trainium_operator.k8s.informer import WatchEvent

Obj = dict[str, Any]


def api_error(status: int, message: str, causes: list[Obj] | None = None) -> ApiException:
    """An ApiException as the kubernetes client raises it, with the API server's Status body."""
    error = ApiException(status=status, reason="Forbidden" if status == 403 else "Error")
    body: Obj = {"kind": "Status", "status": "Failure", "message": message, "code": status}
    if causes:
        body["details"] = {"causes": causes}
    error.body = json.dumps(body)
    return error


@dataclass(frozen=True)
class Write:
    verb: str  # create | delete | update | list | status | event | delete-job
    kind: str
    name: str
    detail: str = ""  # the status phase written, the event's type and reason


class _FakeCore:
    """The one CoreV1Api call the reconciler makes directly: EventPoster's create."""

    def __init__(self, cluster: FakeCluster) -> None:
        self._cluster = cluster

    def create_namespaced_event(self, namespace: str, body: Obj) -> None:
        self._cluster.fail_if_refused("create", "Event")
        detail = f"{body['type']} {body['reason']}"
        self._cluster.writes.append(Write("event", "Event", body["involvedObject"]["name"], detail))
        self._cluster.events.append(body)


@dataclass
class FakeCluster:
    cache: ClusterCache
    writes: list[Write] = field(default_factory=list)
    events: list[Obj] = field(default_factory=list)
    objects: dict[tuple[str, str], Obj] = field(default_factory=dict)  # (kind, name)
    refusals: dict[tuple[str, str], Exception] = field(default_factory=dict)
    counter: RequestCounter = field(default_factory=RequestCounter)
    _version: int = 100

    def __post_init__(self) -> None:
        self.core = _FakeCore(self)

    # -- test controls ---------------------------------------------------------------------
    def refuse(self, verb: str, kind: str, error: Exception) -> None:
        """Every later `verb` of `kind` fails with `error` (until `allow`)."""
        self.refusals[(verb, kind)] = error

    def allow(self, verb: str, kind: str) -> None:
        self.refusals.pop((verb, kind), None)

    def fail_if_refused(self, verb: str, kind: str) -> None:
        error = self.refusals.get((verb, kind))
        if error is not None:
            raise error

    def add_job(self, job: Obj) -> Obj:
        stored = copy.deepcopy(job)
        stored["metadata"]["resourceVersion"] = self._next_version()
        self.objects[("TrainingJob", stored["metadata"]["name"])] = stored
        self.cache.on_job(WatchEvent("ADDED", copy.deepcopy(stored)))
        return stored

    def add_node(self, node: Obj) -> None:
        self.cache.on_node(WatchEvent("ADDED", node))

    def update(self, kind: str, name: str, change: Obj) -> Obj:
        """What another writer (kubelet, Volcano) does: merges `change` into the object."""
        obj = self.objects[(kind, name)]
        _merge(obj, change)
        # As on a real server, every write is a new version of the object.
        obj.setdefault("metadata", {})["resourceVersion"] = self._next_version()
        self._deliver("MODIFIED", obj)
        return obj

    def vanish(self, kind: str, name: str) -> None:
        """Another actor deletes the object (a force delete, garbage collection)."""
        self._deliver("DELETED", self.objects.pop((kind, name)))

    def pods(self) -> list[Obj]:
        return [o for (kind, _), o in self.objects.items() if kind == "Pod"]

    def job(self, name: str) -> Obj:
        return self.objects[("TrainingJob", name)]

    def of(self, verb: str) -> list[Write]:
        return [w for w in self.writes if w.verb == verb]

    # -- k8s.client.ClusterAPI: what the Reconciler calls ------------------------------------
    def create(self, obj: Obj) -> bool:
        kind, name = obj["kind"], obj["metadata"]["name"]
        self.fail_if_refused("create", kind)
        if (kind, name) in self.objects:
            return False
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = self._next_version()
        stored["metadata"].setdefault("creationTimestamp", "2026-12-01T12:00:00Z")
        stored["metadata"].setdefault("uid", f"{kind}-{name}-uid")
        self.objects[(kind, name)] = stored
        self.writes.append(Write("create", kind, name))
        self._deliver("ADDED", stored)
        return True

    def read_child(self, kind: str, namespace: str, name: str) -> Obj | None:
        obj = self.objects.get((kind, name))
        return copy.deepcopy(obj) if obj is not None else None

    def delete_service(self, namespace: str, name: str) -> None:
        self.fail_if_refused("delete", "Service")
        self.writes.append(Write("delete", "Service", name))
        obj = self.objects.pop(("Service", name), None)
        if obj is not None:
            self._deliver("DELETED", obj)

    def delete_network_policy(self, namespace: str, name: str) -> None:
        self.fail_if_refused("delete", "NetworkPolicy")
        self.writes.append(Write("delete", "NetworkPolicy", name))
        obj = self.objects.pop(("NetworkPolicy", name), None)
        if obj is not None:
            self._deliver("DELETED", obj)

    def delete_pod(self, namespace: str, name: str, *, force: bool, uid: str | None = None) -> None:
        self.fail_if_refused("delete", "Pod")
        self.writes.append(Write("delete", "Pod", name, "force" if force else ""))
        current = self.objects.get(("Pod", name))
        if current is not None and uid is not None and current["metadata"].get("uid") != uid:
            return  # the server's precondition: another pod now has the name
        obj = self.objects.pop(("Pod", name), None)
        if obj is not None:
            self._deliver("DELETED", obj)

    def release_pod_finalizer(self, namespace: str, name: str, finalizer: str) -> None:
        self.fail_if_refused("patch", "Pod")
        self.writes.append(Write("patch", "Pod", name, f"-finalizer {finalizer}"))

    def delete_podgroup(self, namespace: str, name: str) -> None:
        self.fail_if_refused("delete", "PodGroup")
        self.writes.append(Write("delete", "PodGroup", name))
        obj = self.objects.pop(("PodGroup", name), None)
        if obj is not None:
            self._deliver("DELETED", obj)

    def cordon_node(self, name: str, patch: Obj) -> bool:
        self.fail_if_refused("patch", "Node")
        self.writes.append(Write("patch", "Node", name))
        return True

    def get_training_job(self, namespace: str, name: str) -> Obj | None:
        obj = self.objects.get(("TrainingJob", name))
        return copy.deepcopy(obj) if obj is not None else None

    def replace_training_job_status(self, job: Obj, status: Obj) -> Obj | None:
        name = job["metadata"]["name"]
        self.fail_if_refused("status", "TrainingJob")
        stored = self.objects.get(("TrainingJob", name))
        if stored is None:
            return None
        version = job["metadata"].get("resourceVersion")
        if version and version != stored["metadata"]["resourceVersion"]:
            raise api_error(409, f"Operation cannot be fulfilled on trainingjobs {name!r}")
        stored["status"] = copy.deepcopy(status)
        stored["metadata"]["resourceVersion"] = self._next_version()
        self.writes.append(Write("status", "TrainingJob", name, str(status.get("phase"))))
        self._deliver("MODIFIED", stored)
        return copy.deepcopy(stored)

    def delete_training_job(self, namespace: str, name: str, uid: str | None = None) -> None:
        self.writes.append(Write("delete-job", "TrainingJob", name))
        obj = self.objects.pop(("TrainingJob", name), None)
        if obj is not None:
            self._deliver("DELETED", obj)

    def remove_training_job_annotation(
        self, namespace: str, name: str, key: str, value: str
    ) -> bool:
        self.fail_if_refused("patch", "TrainingJob")
        job = self.objects.get(("TrainingJob", name))
        annotations = (job or {}).get("metadata", {}).get("annotations") or {}
        if job is None or annotations.get(key) != value:
            return False  # the JSON patch's test failed: another value, or gone
        del annotations[key]
        job["metadata"]["resourceVersion"] = self._next_version()
        self.writes.append(Write("patch", "TrainingJob", name, f"-{key}"))
        self._deliver("MODIFIED", job)
        return True

    # -- k8s.client.TopologyAPI: what the topology reconciler calls ---------------------------
    def add_object(self, obj: Obj) -> Obj:
        """An object someone else wrote (an admin's HyperNode, a chart's ResourceFlavor)."""
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = self._next_version()
        self.objects[(obj["kind"], obj["metadata"]["name"])] = stored
        return stored

    def _managed(self, kind: str) -> list[Obj]:
        self.writes.append(Write("list", kind, ""))
        self.fail_if_refused("list", kind)
        return [
            copy.deepcopy(o)
            for (k, _), o in sorted(self.objects.items())
            if k == kind
            and all(
                (o["metadata"].get("labels") or {}).get(key) == value
                for key, value in MANAGED_LABELS.items()
            )
        ]

    def _create_cluster_object(self, obj: Obj) -> bool:
        kind, name = obj["kind"], obj["metadata"]["name"]
        self.fail_if_refused("create", kind)
        if (kind, name) in self.objects:
            return False
        self.add_object(obj)
        self.writes.append(Write("create", kind, name))
        return True

    def _delete_cluster_object(self, kind: str, name: str) -> None:
        self.fail_if_refused("delete", kind)
        self.writes.append(Write("delete", kind, name))
        self.objects.pop((kind, name), None)

    def list_hypernodes(self) -> list[Obj]:
        return self._managed("HyperNode")

    def create_hypernode(self, obj: Obj) -> bool:
        return self._create_cluster_object(obj)

    def replace_hypernode(self, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        self.fail_if_refused("update", "HyperNode")
        current = self.objects[("HyperNode", name)]
        if obj["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise api_error(409, f"Operation cannot be fulfilled on hypernodes {name!r}")
        self.add_object(obj)
        self.writes.append(Write("update", "HyperNode", name))

    def delete_hypernode(self, name: str) -> None:
        self._delete_cluster_object("HyperNode", name)

    def list_kueue_topology(self, kind: str) -> list[Obj]:
        return self._managed(kind)

    def create_kueue_topology(self, obj: Obj) -> bool:
        return self._create_cluster_object(obj)

    def delete_kueue_topology(self, kind: str, name: str) -> None:
        self._delete_cluster_object(kind, name)

    # -- the instant watch -------------------------------------------------------------------
    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def _deliver(self, event_type: str, obj: Obj) -> None:
        event = WatchEvent(event_type, copy.deepcopy(obj))
        kind = obj["kind"]
        if kind == "TrainingJob":
            self.cache.on_job(event)
        elif kind == "Pod":
            self.cache.on_pod(event)
        elif kind == "PodGroup":
            self.cache.on_podgroup(event)
        elif kind == "Service":
            self.cache.on_service(event)
        elif kind == "NetworkPolicy":
            self.cache.on_network_policy(event)


def _merge(target: Obj, change: Obj) -> None:
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
