"""The operator's view of the cluster, fed by watches, read by the reconciler.

Jobs, their pods, PodGroups, Services and NetworkPolicies, and nodes, kept as the watches
deliver them, with the indexes the operator asks by: a job's children (by the job-name label),
and the jobs with pods on a node (so a node change wakes only those).

A watch lags the API server, so the cache also remembers what the operator itself has just
written and not yet seen come back (a status write's resourceVersion, pods created or deleted).
Until those arrive, `settled` is False and the reconciler waits instead of deciding on a view
older than its own writes: a stale cache can delay a decision, never make a wrong one. An
expectation that never arrives expires after EXPECTATION_SECONDS (a write the server dropped
would otherwise hold the job forever).
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from trainium_operator.api import kueue
from trainium_operator.api.objects import Obj, pod_ended
from trainium_operator.builders.job import LABEL_JOB_NAME, Stage
from trainium_operator.k8s.informer import WatchEvent

Key = tuple[str, str]  # (namespace, job name)
EXPECTATION_SECONDS = 30.0
StoreKey = TypeVar("StoreKey")
RECENT_VERSIONS = 16  # a job's own write may be followed by others before it is expected


def _job_of(obj: Obj) -> Key | None:
    meta = obj["metadata"]
    name = (meta.get("labels") or {}).get(LABEL_JOB_NAME)
    namespace = meta.get("namespace")
    return (namespace, name) if name and namespace else None


def _apply(store: dict[StoreKey, Obj], key: StoreKey, event: WatchEvent) -> Obj | None:
    """Applies a watch event to `store` at `key` (the caller holds the lock); returns the
    object that was there before."""
    if event.type == "DELETED":
        return store.pop(key, None)
    before = store.get(key)
    store[key] = event.obj
    return before


def _queue_state(queue: Obj) -> str | None:
    state = (queue.get("status") or {}).get("state")
    return str(state) if state is not None else None


def _queue_of(job: Obj) -> str:
    scheduling = (job.get("spec") or {}).get("scheduling") or {}
    return str(scheduling.get("queue") or "default")


def _local_queue_of(job: Obj) -> str | None:
    return ((job.get("metadata") or {}).get("labels") or {}).get(kueue.QUEUE_NAME_LABEL)


_STAGES = "|".join(stage.value for stage in Stage)
# A Kueue pod group of ours: <job>-<stage>-<attempt> (api/kueue.group_name).
_GROUP_NAME = re.compile(rf"^(?P<job>[a-z0-9-]+)-(?:{_STAGES})-\d+$")


def _job_of_workload(workload: Obj) -> Key | None:
    """The job whose pod group a Workload is, or None for another's: Kueue names a plain pod
    group's Workload after the group and makes its pods (<group>-<rank>) its owners."""
    meta = workload["metadata"]
    name, namespace = str(meta.get("name")), meta.get("namespace")
    match = _GROUP_NAME.match(name)
    owners = meta.get("ownerReferences") or []
    ours = bool(owners) and all(
        o.get("kind") == "Pod" and str(o.get("name", "")).startswith(name + "-") for o in owners
    )
    return (namespace, match.group("job")) if match and ours and namespace else None


def _ready(node: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


@dataclass(frozen=True, slots=True)
class PodChange:
    """A pod event's job, and whether it needs a pass at once: a pod that failed or finished,
    vanished, or is being deleted by someone else, and the end of a wave of deletions (the
    job's last deleting pod gone: a restart's next gang may start). Anything else (its
    scheduling, readiness, the operator's own deletes coming back) waits for the spaced pass
    (WorkQueue.nudge): a gang's hundreds of such events would otherwise each cost a pass over
    the whole gang, taking CPU from the API server and the nodes the job waits for."""

    key: Key
    urgent: bool
    # It brought the last of the operator's own writes a pass is waiting to see
    # (`ClusterCache.settled`): that pass can run now, as for JobChange.
    settles_wait: bool = False


@dataclass(frozen=True, slots=True)
class JobChange:
    """A job event's key, and whether it brought the last of the operator's own writes a pass
    is waiting to see (`ClusterCache.settled`): that pass can run now."""

    key: Key
    settles_wait: bool


def _deleting(pod: Obj) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def _urgent(event: WatchEvent, before: Obj | None, ours: bool, others: Iterable[Obj]) -> bool:
    """Whether a pod event needs its job's pass at once (PodChange). `before`: the pod as the
    cache held it; `ours`: the operator deleted it and has not seen that come back;
    `others`: the job's other pods now."""
    was_deleting = before is not None and _deleting(before)
    if event.type == "DELETED":
        return not was_deleting or not any(_deleting(p) and not pod_ended(p) for p in others)
    if pod_ended(event.obj) and (before is None or not pod_ended(before)):
        return True
    return _deleting(event.obj) and not was_deleting and not ours


@dataclass
class _Expected:
    """What the operator wrote for one job and has not seen in the watches yet."""

    job_version: str | None = None
    present: set[str] = field(default_factory=set)  # pods created
    gone: set[str] = field(default_factory=set)  # pods deleted
    since: float = 0.0

    def empty(self) -> bool:
        return self.job_version is None and not self.present and not self.gone


class ClusterCache:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[Key, Obj] = {}
        self._pods: dict[Key, dict[str, Obj]] = {}
        self._podgroups: dict[Key, dict[str, Obj]] = {}
        self._services: dict[Key, Obj] = {}  # by (namespace, service name)
        self._network_policies: dict[Key, Obj] = {}  # by (namespace, policy name)
        self._nodes: dict[str, Obj] = {}
        self._queues: dict[str, Obj] = {}
        self._workloads: dict[Key, dict[str, Obj]] = {}  # Kueue's, by the job they are of
        self._local_queues: dict[Key, Obj] = {}  # Kueue's, by (namespace, name)
        self._pods_on_node: dict[str, set[tuple[Key, str]]] = {}
        self._expected: dict[Key, _Expected] = {}
        self._recent_versions: dict[Key, deque[str]] = {}
        # The uids of deleted jobs whose pods are still held (dropped with their last pod).
        self._gone_uids: dict[Key, set[str]] = {}
        # Jobs whose pass found the cache behind the operator's own writes and waits for them.
        self._waiting: set[Key] = set()

    # -- fed by the watches -------------------------------------------------------------
    def on_job(self, event: WatchEvent) -> JobChange:
        meta = event.obj["metadata"]
        key = (meta["namespace"], meta["name"])
        settles_wait = False
        with self._lock:
            if event.type == "DELETED":
                self._jobs.pop(key, None)
                self._expected.pop(key, None)
                self._waiting.discard(key)
                self._recent_versions.pop(key, None)
                if key in self._pods and meta.get("uid"):
                    self._gone_uids.setdefault(key, set()).add(meta["uid"])
            else:
                self._jobs[key] = event.obj
                recent = self._recent_versions.setdefault(key, deque(maxlen=RECENT_VERSIONS))
                recent.append(str(meta.get("resourceVersion")))
                expected = self._expected.get(key)
                if expected is not None and expected.job_version == meta.get("resourceVersion"):
                    expected.job_version = None
                    settles_wait = self._drop_if_met(key)
        return JobChange(key, settles_wait)

    def on_pod(self, event: WatchEvent) -> PodChange | None:
        key = _job_of(event.obj)
        if key is None:
            return None
        meta = event.obj["metadata"]
        name = meta["name"]
        node = (event.obj.get("spec") or {}).get("nodeName")
        with self._lock:
            pods = self._pods.setdefault(key, {})
            old = pods.get(name)
            old_node = (old.get("spec") or {}).get("nodeName") if old else None
            if old_node and (old_node != node or event.type == "DELETED"):
                self._pods_on_node.get(old_node, set()).discard((key, name))
            expected = self._expected.get(key)
            ours = expected is not None and name in expected.gone
            settles_wait = False
            if event.type == "DELETED":
                pods.pop(name, None)
                if not pods:
                    self._pods.pop(key, None)
                    self._gone_uids.pop(key, None)
            else:
                pods[name] = event.obj
                if node:
                    self._pods_on_node.setdefault(node, set()).add((key, name))
            if expected is not None:
                if event.type != "DELETED":
                    expected.present.discard(name)
                if event.type == "DELETED" or meta.get("deletionTimestamp"):
                    expected.gone.discard(name)
                settles_wait = self._drop_if_met(key)
            others = self._pods.get(key, {})
            urgent = _urgent(event, old, ours, (p for n, p in others.items() if n != name))
        return PodChange(key, urgent, settles_wait)

    def on_podgroup(self, event: WatchEvent) -> Key | None:
        return self._on_child(self._podgroups, event)

    def on_service(self, event: WatchEvent) -> Key | None:
        return self._on_named(self._services, event)

    def on_network_policy(self, event: WatchEvent) -> Key | None:
        return self._on_named(self._network_policies, event)

    def _on_named(self, store: dict[Key, Obj], event: WatchEvent) -> Key | None:
        """A child kept by its own name (one per job): stores it; returns its job."""
        meta = event.obj["metadata"]
        with self._lock:
            _apply(store, (meta["namespace"], meta["name"]), event)
        return _job_of(event.obj)

    def on_node(self, event: WatchEvent) -> list[Key]:
        """Stores the node; returns the jobs with pods on it when its readiness changed."""
        name = event.obj["metadata"]["name"]
        with self._lock:
            before = _apply(self._nodes, name, event)
            was_ready = before is not None and _ready(before)
            is_ready = event.type != "DELETED" and _ready(event.obj)
            if was_ready == is_ready and before is not None:
                return []
            return sorted({job for job, _pod in self._pods_on_node.get(name, set())})

    def on_queue(self, event: WatchEvent) -> list[Key]:
        """Stores the Volcano queue; returns the jobs naming it when it appeared, went or
        changed state (not on Volcano's frequent updates of its counts)."""
        name = event.obj["metadata"]["name"]
        with self._lock:
            before = _apply(self._queues, name, event)
            state = None if event.type == "DELETED" else _queue_state(event.obj)
            if before is not None and event.type != "DELETED" and _queue_state(before) == state:
                return []
            return sorted(key for key, job in self._jobs.items() if _queue_of(job) == name)

    def on_workload(self, event: WatchEvent) -> Key | None:
        """Stores a Kueue Workload of one of our pod groups (any other is dropped); returns
        its job."""
        return self._on_child(self._workloads, event, _job_of_workload(event.obj))

    def on_local_queue(self, event: WatchEvent) -> list[Key]:
        """Stores the LocalQueue; returns the jobs labelled with it (a queue created late, or
        deleted, changes what they wait for)."""
        meta = event.obj["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        with self._lock:
            _apply(self._local_queues, (namespace, name), event)
            return sorted(
                key
                for key, job in self._jobs.items()
                if key[0] == namespace and _local_queue_of(job) == name
            )

    def _on_child(
        self, store: dict[Key, dict[str, Obj]], event: WatchEvent, job: Key | None = None
    ) -> Key | None:
        key = job or _job_of(event.obj)
        if key is None:
            return None
        name = event.obj["metadata"]["name"]
        with self._lock:
            children = store.setdefault(key, {})
            if event.type == "DELETED":
                children.pop(name, None)
                if not children:
                    store.pop(key, None)
            else:
                children[name] = event.obj
        return key

    # -- the operator's own writes --------------------------------------------------------
    def expect(
        self,
        key: Key,
        *,
        job_version: str | None = None,
        created: Iterable[str] = (),
        deleted: Iterable[str] = (),
    ) -> None:
        with self._lock:
            expected = self._expected.setdefault(key, _Expected())
            if job_version is not None:
                seen = job_version in self._recent_versions.get(key, ())
                expected.job_version = None if seen else job_version
            pods = self._pods.get(key, {})
            expected.present |= {n for n in created if n not in pods}
            expected.gone |= {n for n in deleted if n in pods and not _deleting(pods[n])}
            expected.since = self._clock()
            self._drop_if_met(key)

    def settled(self, key: Key) -> bool:
        """True when the cache has seen every write the operator made for `key`. When not,
        the event that brings the last of them says so (`settles_wait`)."""
        with self._lock:
            expected = self._expected.get(key)
            if expected is None:
                return True
            if self._clock() - expected.since > EXPECTATION_SECONDS:
                del self._expected[key]
                self._waiting.discard(key)
                return True
            self._waiting.add(key)
            return False

    def _drop_if_met(self, key: Key) -> bool:
        """Drops `key`'s expectation once every write in it was seen; True if a pass waits
        for exactly that."""
        expected = self._expected.get(key)
        if expected is None or not expected.empty():
            return False
        del self._expected[key]
        if key in self._waiting:
            self._waiting.discard(key)
            return True
        return False

    # -- read by the reconciler -----------------------------------------------------------
    def job(self, key: Key) -> Obj | None:
        with self._lock:
            return self._jobs.get(key)

    def pods(self, key: Key) -> list[Obj]:
        with self._lock:
            return list(self._pods.get(key, {}).values())

    def orphaned_pods(self, key: Key) -> list[Obj]:
        """The pods of `key` whose owner, a job the watch saw deleted, is gone: garbage
        collection's to delete, and safe for anyone to (a uid is never reused)."""
        with self._lock:
            gone = self._gone_uids.get(key, set())
            return [
                pod
                for pod in self._pods.get(key, {}).values()
                if any(
                    ref.get("uid") in gone for ref in pod["metadata"].get("ownerReferences") or []
                )
            ]

    def pod(self, namespace: str, name: str) -> Obj | None:
        """A pod of any job by its name (the pods held are only the operator's children)."""
        with self._lock:
            for (pod_namespace, _job), pods in self._pods.items():
                if pod_namespace == namespace and name in pods:
                    return pods[name]
        return None

    def podgroups(self, key: Key) -> list[Obj]:
        with self._lock:
            return list(self._podgroups.get(key, {}).values())

    def service(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._services.get((namespace, name))

    def network_policy(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._network_policies.get((namespace, name))

    def workloads(self, key: Key) -> list[Obj]:
        with self._lock:
            return list(self._workloads.get(key, {}).values())

    def local_queue(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._local_queues.get((namespace, name))

    def queue(self, name: str) -> Obj | None:
        with self._lock:
            return self._queues.get(name)

    def nodes(self) -> list[Obj]:
        with self._lock:
            return list(self._nodes.values())

    def sizes(self) -> dict[str, int]:
        with self._lock:
            return {
                "jobs": len(self._jobs),
                "pods": sum(len(p) for p in self._pods.values()),
                "podgroups": sum(len(g) for g in self._podgroups.values()),
                "services": len(self._services),
                "networkpolicies": len(self._network_policies),
                "nodes": len(self._nodes),
                "queues": len(self._queues),
                "workloads": sum(len(w) for w in self._workloads.values()),
                "localqueues": len(self._local_queues),
                "expectations": len(self._expected),
            }
