"""The long-running Volcano-compatible gang scheduler of the dev cluster (see `gang` for semantics).

Level-triggered: watches on pods, nodes, PodGroups, queues and claims only wake the loop; every
session lists the current state and runs the pure `gang.plan_scheduling`, then binds pods through
the pods/binding subresource and writes PodGroup/Queue status, pod conditions and Events. A lost
watch or a failed write costs nothing but a retry in the next session.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import watch

from trainium_operator.devcluster import gang
from trainium_operator.devcluster.clients import Clients, clients_for, is_status

LOG = logging.getLogger("trainium.gang-scheduler")
GROUP = "scheduling.volcano.sh"
VERSION = "v1beta1"
COMPONENT = "volcano"  # the event source a Volcano user would see
RESYNC_SECONDS = 5.0
DEBOUNCE_SECONDS = 0.05


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _dicts(api_client: Any, items: list[Any]) -> list[dict[str, Any]]:
    return [api_client.sanitize_for_serialization(item) for item in items]


@dataclass
class Snapshot:
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    podgroups: list[dict[str, Any]]
    queues: list[dict[str, Any]]
    bound_claims: set[tuple[str, str]]


def take_snapshot(clients: Clients) -> Snapshot:
    api = clients.api_client
    claims = clients.core.list_persistent_volume_claim_for_all_namespaces().items
    return Snapshot(
        nodes=_dicts(api, clients.core.list_node().items),
        pods=_dicts(api, clients.core.list_pod_for_all_namespaces().items),
        podgroups=clients.custom.list_cluster_custom_object(GROUP, VERSION, "podgroups")["items"],
        queues=clients.custom.list_cluster_custom_object(GROUP, VERSION, "queues")["items"],
        bound_claims={
            (claim.metadata.namespace, claim.metadata.name)
            for claim in claims
            if claim.status and claim.status.phase == "Bound"
        },
    )


@dataclass
class GangScheduler:
    clients: Clients
    # (kind, namespace, name, reason) -> last message posted, so unchanged news is not re-posted.
    posted: dict[tuple[str, str, str, str], str] = field(default_factory=dict)
    instance: str = field(default_factory=lambda: f"trainium-gang-{uuid.uuid4().hex[:8]}")

    def session(self) -> gang.SchedulingPlan:
        snapshot = take_snapshot(self.clients)
        if self._ensure_implicit_podgroups(snapshot):
            snapshot = take_snapshot(self.clients)
        plan = gang.plan_scheduling(
            nodes=snapshot.nodes,
            pods=snapshot.pods,
            podgroups=snapshot.podgroups,
            queues=snapshot.queues,
            bound_claims=snapshot.bound_claims,
            now=_now(),
        )
        pods_by_key = {gang.pod_key(pod): pod for pod in snapshot.pods}
        self._bind(plan, pods_by_key)
        self._write_podgroup_status(plan)
        self._write_queue_status(plan)
        self._mark_unschedulable(plan, pods_by_key)
        self._post_events(plan, pods_by_key, snapshot)
        self._forget_deleted(snapshot)
        return plan

    def _forget_deleted(self, snapshot: Snapshot) -> None:
        """Drops event memory of deleted objects, so a long-lived cluster stays lean."""
        alive = {("Pod", *gang.pod_key(pod)) for pod in snapshot.pods} | {
            ("PodGroup", pg["metadata"]["namespace"], pg["metadata"]["name"])
            for pg in snapshot.podgroups
        }
        for key in [key for key in self.posted if key[:3] not in alive]:
            del self.posted[key]

    def _ensure_implicit_podgroups(self, snapshot: Snapshot) -> bool:
        """Volcano's podgroup controller: a volcano pod without a group gets one of minMember 1."""
        existing = {
            (pg["metadata"]["namespace"], pg["metadata"]["name"]) for pg in snapshot.podgroups
        }
        changed = False
        for pod in snapshot.pods:
            if not gang.is_gang_pod(pod) or gang.group_of(pod) or not gang.is_pending_unbound(pod):
                continue
            podgroup = gang.implicit_podgroup(pod)
            namespace, name = pod["metadata"]["namespace"], podgroup["metadata"]["name"]
            try:
                if (namespace, name) not in existing:
                    self.clients.custom.create_namespaced_custom_object(
                        GROUP, VERSION, namespace, "podgroups", podgroup
                    )
                    existing.add((namespace, name))
                self.clients.core.patch_namespaced_pod(
                    pod["metadata"]["name"],
                    namespace,
                    {"metadata": {"annotations": {gang.GROUP_NAME_ANNOTATION: name}}},
                )
                changed = True
            except Exception as error:
                if not is_status(error, 404, 409):
                    raise
        return changed

    def _bind(self, plan: gang.SchedulingPlan, pods: dict[gang.PodKey, dict[str, Any]]) -> None:
        for (namespace, name), node in sorted(plan.bindings.items()):
            body = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
            try:
                # _preload_content=False: the client cannot deserialise the Binding it gets back.
                self.clients.core.create_namespaced_pod_binding(
                    name, namespace, body, _preload_content=False
                )
            except Exception as error:
                if is_status(error, 404, 409, 422):
                    LOG.info("bind %s/%s -> %s skipped: %s", namespace, name, node, error)
                    continue
                raise
            LOG.info("bound %s/%s to %s", namespace, name, node)
            self._event(
                pods.get((namespace, name)),
                gang.EventIntent(
                    "Pod",
                    namespace,
                    name,
                    "Normal",
                    "Scheduled",
                    f"Successfully assigned {namespace}/{name} to {node}",
                ),
            )

    def _write_podgroup_status(self, plan: gang.SchedulingPlan) -> None:
        for (namespace, name), status in plan.podgroup_status.items():
            try:
                # The PodGroup CRD has no status subresource (as in Volcano); patch the object.
                self.clients.custom.patch_namespaced_custom_object(
                    GROUP, VERSION, namespace, "podgroups", name, {"status": status}
                )
            except Exception as error:
                if not is_status(error, 404, 409):
                    raise

    def _write_queue_status(self, plan: gang.SchedulingPlan) -> None:
        for name, status in plan.queue_status.items():
            try:
                self.clients.custom.patch_cluster_custom_object_status(
                    GROUP, VERSION, "queues", name, {"status": status}
                )
            except Exception as error:
                if not is_status(error, 404, 409):
                    raise

    def _mark_unschedulable(
        self, plan: gang.SchedulingPlan, pods: dict[gang.PodKey, dict[str, Any]]
    ) -> None:
        """PodScheduled=False/Unschedulable, which autoscalers and `kubectl describe` read."""
        for key, message in plan.unschedulable_pods.items():
            pod = pods.get(key)
            if pod is None:
                continue
            current: dict[str, Any] = next(
                (
                    c
                    for c in (pod.get("status") or {}).get("conditions") or []
                    if c.get("type") == "PodScheduled"
                ),
                {},
            )
            if current.get("status") == "False" and current.get("message") == message:
                continue
            condition = {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": _now(),
            }
            try:
                self.clients.core.patch_namespaced_pod_status(
                    key[1], key[0], {"status": {"conditions": [condition]}}
                )
            except Exception as error:
                if not is_status(error, 404, 409, 422):
                    raise

    def _post_events(
        self,
        plan: gang.SchedulingPlan,
        pods: dict[gang.PodKey, dict[str, Any]],
        snapshot: Snapshot,
    ) -> None:
        podgroups = {
            (pg["metadata"]["namespace"], pg["metadata"]["name"]): pg for pg in snapshot.podgroups
        }
        for intent in plan.events:
            source = (pods if intent.kind == "Pod" else podgroups).get(
                (intent.namespace, intent.name)
            )
            self._event(source, intent)

    def _event(self, involved: dict[str, Any] | None, intent: gang.EventIntent) -> None:
        if involved is None:
            return
        key = (intent.kind, intent.namespace, intent.name, intent.reason)
        if self.posted.get(key) == intent.message:
            return
        now = _now()
        api_version = "v1" if intent.kind == "Pod" else f"{GROUP}/{VERSION}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{intent.name}.{uuid.uuid4().hex[:16]}",
                "namespace": intent.namespace,
            },
            "involvedObject": {
                "apiVersion": api_version,
                "kind": intent.kind,
                "name": intent.name,
                "namespace": intent.namespace,
                "uid": involved["metadata"].get("uid"),
                "resourceVersion": involved["metadata"].get("resourceVersion"),
            },
            "type": intent.type,
            "reason": intent.reason,
            "message": intent.message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.clients.core.create_namespaced_event(intent.namespace, body)
            self.posted[key] = intent.message
        except Exception as error:
            if not is_status(error, 403, 404, 409):
                raise


WatchList = Callable[..., Any]


def _watch_forever(
    list_call: WatchList, args: tuple[Any, ...], wake: threading.Event, stop: threading.Event
) -> None:
    """Wakes the scheduler on every change; reconnects after any error (level-triggered: safe)."""
    backoff = 0.5
    while not stop.is_set():
        watcher = watch.Watch()
        try:
            for _ in watcher.stream(list_call, *args, timeout_seconds=60, _request_timeout=70):
                wake.set()
                if stop.is_set():
                    break
            backoff = 0.5
        except Exception as error:
            LOG.debug("watch %s ended: %s", getattr(list_call, "__name__", list_call), error)
            stop.wait(backoff)
            backoff = min(backoff * 2, 5.0)
        finally:
            watcher.stop()


def run(kubeconfig: Path, *, resync_seconds: float = RESYNC_SECONDS) -> None:
    """Runs until SIGTERM/SIGINT."""
    stop = threading.Event()
    wake = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        LOG.info("signal %d: stopping", signum)
        stop.set()
        wake.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    scheduler = GangScheduler(clients_for(kubeconfig))
    watched: list[tuple[WatchList, tuple[Any, ...]]] = []
    for make in (
        lambda c: (c.core.list_pod_for_all_namespaces, ()),
        lambda c: (c.core.list_node, ()),
        lambda c: (c.core.list_persistent_volume_claim_for_all_namespaces, ()),
        lambda c: (c.custom.list_cluster_custom_object, (GROUP, VERSION, "podgroups")),
        lambda c: (c.custom.list_cluster_custom_object, (GROUP, VERSION, "queues")),
    ):
        watched.append(make(clients_for(kubeconfig)))  # one connection pool per watch
    for list_call, args in watched:
        threading.Thread(
            target=_watch_forever, args=(list_call, args, wake, stop), daemon=True
        ).start()
    LOG.info(
        "gang scheduler %s started (scheduler name %r)", scheduler.instance, gang.SCHEDULER_NAME
    )
    while not stop.is_set():
        wake.wait(resync_seconds)
        time.sleep(DEBOUNCE_SECONDS)  # let a burst of events land in one session
        wake.clear()
        if stop.is_set():
            break
        try:
            scheduler.session()
        except Exception:
            LOG.exception("scheduling session failed; retrying")
            stop.wait(1.0)
    LOG.info("gang scheduler stopped")


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--resync-seconds", type=float, default=RESYNC_SECONDS)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run(args.kubeconfig, resync_seconds=args.resync_seconds)


if __name__ == "__main__":
    main()
