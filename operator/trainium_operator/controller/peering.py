"""Who may reconcile when several replicas run with kopf peering.

kopf pauses its own handlers in an outranked replica, but our work queue also wakes on
timers (requeues, resync); this gate applies kopf's rule to those wake-ups too, reading the
same peering object kopf maintains: a replica works only while no live peer outranks it, and
(as kopf does) a tie pauses both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from trainium_operator.k8s.client import Cluster

CACHE_SECONDS = 1.0


def outranked(peers: dict[str, Any], own_priority: int, now: datetime) -> bool:
    """True when a live peer has a higher priority, or another live peer has ours.

    `peers` is the peering object's status: {identity: {priority, lastseen, lifetime}}; our own
    entry is one of those with our priority (priorities are random per replica)."""
    same = 0
    for info in peers.values():
        if not isinstance(info, dict):
            continue
        lastseen = datetime.fromisoformat(str(info.get("lastseen")).replace("Z", "+00:00"))
        if lastseen.tzinfo is None:
            lastseen = lastseen.replace(tzinfo=UTC)
        if lastseen + timedelta(seconds=int(info.get("lifetime", 60))) <= now:
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

    def may_work(self, namespace: str) -> bool:
        scope = "" if self.clusterwide else namespace
        cached = self._cache.get(scope)
        if cached is not None and self.clock() - cached[0] < CACHE_SECONDS:
            return cached[1]
        peers = self.cluster.get_peering_status(self.name, None if self.clusterwide else namespace)
        allowed = not outranked(peers, self.priority, datetime.now(UTC))
        self._cache[scope] = (self.clock(), allowed)
        return allowed
