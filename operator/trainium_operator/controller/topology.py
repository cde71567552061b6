"""The opt-in topology reconciler (`run --topology volcano,kueue`, the chart's topology.*):
keeps the schedulers' network topology objects in step with the nodes.

One pass: the nodes from the operator's own node watch (the cache), the objects the operator
wrote before (listed by its managed-by labels), `builders.topology.network_topology` for what
should exist, `lifecycle.topology.plan_writes` for the writes, then the writes. A pass runs
when a node's topology changes (it came, went, or its instance type or a topology label
changed; readiness and status updates do not count), a moment later so that a burst of new
nodes is one pass, and every RESYNC_SECONDS to repair what someone else changed or deleted.
Nothing runs before the node watch has listed every node (a partial list would delete the
HyperNodes of nodes not yet seen), and with several replicas only the working one writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from trainium_operator.api import topology
from trainium_operator.api.instance_types import INSTANCE_TYPE_LABEL
from trainium_operator.api.objects import Obj
from trainium_operator.builders.topology import TopologyObjects, is_trainium, network_topology
from trainium_operator.k8s.client import (
    TopologyAPI,
    api_error_message,
    is_conflict,
    is_forbidden,
    is_not_found,
    is_transient,
)
from trainium_operator.k8s.informer import WatchEvent
from trainium_operator.lifecycle.topology import TopologyWrites, plan_writes

log = logging.getLogger(__name__)
RESYNC_SECONDS = 120.0
DEBOUNCE_SECONDS = 1.0
RETRY_SECONDS = 5.0
NOT_READY_SECONDS = 1.0
# A missing API or permission is the admin's to fix: retried, not hammered.
SETUP_RETRY_SECONDS = 30.0
MAX_NAMED = 8  # names in one log line


def topology_signature(node: Obj) -> tuple[str | None, ...]:
    """What of a node the topology depends on: its instance type and its topology labels."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    keys = [INSTANCE_TYPE_LABEL, *topology.LAYER_LABELS.values(), topology.ULTRASERVER_LABEL]
    return tuple(labels.get(key) for key in keys)


@dataclass
class PassOutcome:
    writes: TopologyWrites
    taken: list[str]  # names another owner's object holds (left alone)
    built: TopologyObjects


class TopologyReconciler:
    def __init__(
        self,
        cluster: TopologyAPI,
        nodes: Callable[[], list[Obj]],
        schedulers: frozenset[str],
    ):
        self.cluster = cluster
        self.nodes = nodes
        self.schedulers = schedulers
        self._lock = threading.Lock()
        self._signatures: dict[str, tuple[str | None, ...]] = {}
        self._reported: tuple[tuple[str, ...], int, int] | None = None

    def node_changed(self, event: WatchEvent) -> bool:
        """Called by the node watch (its own thread): whether this event changes the topology."""
        name = str(event.obj["metadata"]["name"])
        with self._lock:
            before = self._signatures.get(name)
            if event.type == "DELETED":
                self._signatures.pop(name, None)
                return before is not None
            if not is_trainium(event.obj):
                self._signatures.pop(name, None)
                return before is not None
            now = topology_signature(event.obj)
            self._signatures[name] = now
            return before != now

    def existing(self) -> list[Obj]:
        found: list[Obj] = []
        if topology.VOLCANO in self.schedulers:
            found += self.cluster.list_hypernodes()
        if topology.KUEUE in self.schedulers:
            found += self.cluster.list_kueue_topology("Topology")
            found += self.cluster.list_kueue_topology("ResourceFlavor")
        return found

    def sync(self) -> PassOutcome:
        """One pass (blocking: the reconciler's thread). Raises what the API server answered
        but AlreadyExists (a name taken: reported) and NotFound (gone already: fine)."""
        built = network_topology(self.nodes(), self.schedulers)
        self._report(built)
        writes = plan_writes(list(built.objects), self.existing())
        taken: list[str] = []
        # New domains first (lower tiers first), then the parents that list them or no longer
        # do, then the domains nobody lists any more (higher tiers first): a HyperNode never
        # names a member that is not there.
        for obj in writes.create:
            if not self._create(obj):
                taken.append(f"{obj['kind']} {obj['metadata']['name']}")
        for obj in writes.replace:
            self.cluster.replace_hypernode(obj)
        for obj in writes.delete:
            self._delete(obj)
        if not writes.empty:
            log.info("network topology: %s", writes.summary())
        if taken:
            more = f" and {len(taken) - MAX_NAMED} more" if len(taken) > MAX_NAMED else ""
            log.warning(
                "network topology: %s%s exist without the labels %s: another owner's objects, "
                "left alone; delete or rename them for the operator's to be written",
                ", ".join(taken[:MAX_NAMED]),
                more,
                topology.MANAGED_SELECTOR,
            )
        return PassOutcome(writes, taken, built)

    def _create(self, obj: Obj) -> bool:
        if obj["kind"] == "HyperNode":
            return self.cluster.create_hypernode(obj)
        return self.cluster.create_kueue_topology(obj)

    def _delete(self, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if obj["kind"] == "HyperNode":
            self.cluster.delete_hypernode(name)
        else:
            self.cluster.delete_kueue_topology(obj["kind"], name)

    def _report(self, built: TopologyObjects) -> None:
        """Says which Trainium nodes are left out, once per change of that set."""
        seen = (built.left_out, built.left_out_count, built.over_bound)
        if seen == self._reported:
            return
        self._reported = seen
        if built.left_out_count:
            more = built.left_out_count - len(built.left_out)
            log.warning(
                "network topology: %d Trainium node(s) lack a topology label and are left out "
                "(%s%s): EKS labels %s; trn2u nodes also need the Neuron device plugin's %s",
                built.left_out_count,
                ", ".join(built.left_out),
                f" and {more} more" if more > 0 else "",
                ", ".join(topology.LAYER_LABELS.values()),
                topology.ULTRASERVER_LABEL,
            )
        if built.over_bound:
            log.warning(
                "network topology: %d node(s) past the first %d (by name) are left out",
                built.over_bound,
                built.placed,
            )


async def run(
    reconciler: TopologyReconciler,
    changed: asyncio.Event,
    ready: Callable[[], bool],
    may_work: Callable[[], bool],
) -> None:
    """The reconciler's loop: a pass after each topology change (debounced) and every
    RESYNC_SECONDS; a failed pass is retried soon."""
    changed.set()  # the first pass, once the node watch is synced
    while True:
        with contextlib.suppress(TimeoutError):  # the resync
            await asyncio.wait_for(changed.wait(), timeout=RESYNC_SECONDS)
        await asyncio.sleep(DEBOUNCE_SECONDS)
        changed.clear()
        if not ready():
            await asyncio.sleep(NOT_READY_SECONDS)
            changed.set()
            continue
        try:
            if not await asyncio.to_thread(may_work):
                continue  # another replica works
            await asyncio.to_thread(reconciler.sync)
        except Exception as error:
            await asyncio.sleep(_failed(error, reconciler.schedulers))
            changed.set()


def _failed(error: Exception, schedulers: frozenset[str]) -> float:
    """Logs a failed pass as what it is; returns how long to wait before the next."""
    if is_conflict(error) or is_transient(error):
        return RETRY_SECONDS  # a stale list or a busy API server: the next pass reads again
    if is_not_found(error) or is_forbidden(error):
        log.error(
            "network topology: %s; the schedulers' APIs (%s) must be served (HyperNodes: Volcano "
            "v1.12 or newer; Topology, ResourceFlavor: Kueue v1beta2) and the operator granted "
            "them (the chart's topology.*); retrying in %.0f s",
            api_error_message(error),
            ", ".join(sorted(schedulers)),
            SETUP_RETRY_SECONDS,
        )
        return SETUP_RETRY_SECONDS
    log.exception("network topology: the pass failed; retrying")
    return RETRY_SECONDS
