"""Who may reconcile when several replicas run with kopf peering.

kopf pauses its own handlers in an outranked replica, but our work queue also wakes on
timers (requeues, resync); this gate applies kopf's rule to those wake-ups too, reading the
same peering object kopf maintains: a replica works only while its own entry is there and alive
and no live peer outranks it, and (as kopf does) a tie pauses both.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from trainium_operator.k8s.client import Cluster

CACHE_SECONDS = 1.0


def may_work(peers: dict[str, Any], own_priority: int, now: datetime) -> bool:
    """True when the peering holds our own live entry and no live peer outranks us.

    A missing peering object or a missing (or expired) own entry pauses the replica, as kopf
    pauses its handlers then: another replica may be working unseen."""
    return _live_with(peers, own_priority, now) == 1 and not outranked(peers, own_priority, now)


def _live_with(peers: dict[str, Any], priority: int, now: datetime) -> int:
    return sum(
        1
        for info in peers.values()
        if isinstance(info, dict) and _alive(info, now) and int(info.get("priority", 0)) == priority
    )


def _alive(info: dict[str, Any], now: datetime) -> bool:
    lastseen = datetime.fromisoformat(str(info.get("lastseen")).replace("Z", "+00:00"))
    if lastseen.tzinfo is None:
        lastseen = lastseen.replace(tzinfo=UTC)
    return lastseen + timedelta(seconds=int(info.get("lifetime", 60))) > now


def outranked(peers: dict[str, Any], own_priority: int, now: datetime) -> bool:
    """True when a live peer has a higher priority, or another live peer has ours.

    `peers` is the peering object's status: {identity: {priority, lastseen, lifetime}}; our own
    entry is one of those with our priority (priorities are random per replica)."""
    same = 0
    for info in peers.values():
        if not isinstance(info, dict):
            continue
        if not _alive(info, now):
            continue  # dead peer
        priority = int(info.get("priority", 0))
        if priority > own_priority:
            return True
        same += priority == own_priority
    return same > 1


class PeeringGate:
    def __init__(
        self,
        cluster: Cluster,
        name: str,
        priority: int,
        clusterwide: bool,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.cluster = cluster
        self.name = name
        self.priority = priority
        self.clusterwide = clusterwide
        self.clock = clock
        self._cache: dict[str, tuple[float, bool]] = {}
        # Scopes where a fresh read allowed what the read before refused, since took_over().
        self._taken_over: set[str] = set()
        self._lock = threading.Lock()  # may_work runs in the passes' worker threads

    def scope(self, namespace: str) -> str:
        """The peering a job of `namespace` is gated by: the cluster's ("") or its namespace's."""
        return "" if self.clusterwide else namespace

    def may_work(self, namespace: str) -> bool:
        scope = self.scope(namespace)
        cached = self._cache.get(scope)
        if cached is not None and self.clock() - cached[0] < CACHE_SECONDS:
            return cached[1]
        peers = self.cluster.get_peering_status(self.name, None if self.clusterwide else namespace)
        allowed = may_work(peers, self.priority, datetime.now(UTC))
        with self._lock:
            before = self._cache.get(scope)
            if allowed and before is not None and not before[1]:
                self._taken_over.add(scope)
            self._cache[scope] = (self.clock(), allowed)
        return allowed

    def took_over(self) -> set[str]:
        """The scopes this replica started acting in since the last call: a read allowed it
        what the read before refused (a replica acting from its first read took over
        nothing: its jobs' first passes are under way)."""
        with self._lock:
            scopes, self._taken_over = self._taken_over, set()
        return scopes
