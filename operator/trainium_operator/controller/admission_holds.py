"""Jobs whose child the API server's admission refused for a cause the cluster may lift.

A refused create is not retried on a timer: the job is held until something that can change
the answer changes (its spec; a ResourceQuota, LimitRange or ServiceAccount in its namespace;
its Namespace's Pod Security labels; a PriorityClass) and then tried once more at once. A long
recheck covers causes no watch sees (an admission webhook's policy). Pure bookkeeping; the
handlers feed it watch events on the event loop and the reconciler asks it from its worker
threads, so every method runs under one lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

Key = tuple[str, str]  # (namespace, name)

# An admission webhook's policy (Kyverno, Gatekeeper) can change without any object we watch.
RECHECK_SECONDS = 600.0


# A change seen while the refused pass ran: try again soon instead of holding past it.
RACED_RETRY_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Mark:
    """What had changed when a pass started; `hold` compares it with what has changed since."""

    namespace_changes: int
    cluster_changes: int


@dataclass(frozen=True, slots=True)
class Hold:
    reason: str
    until: float  # monotonic


class AdmissionHolds:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[Key, Hold] = {}
        self._namespace_changes: dict[str, int] = {}
        self._cluster_changes = 0

    def mark(self, namespace: str) -> Mark:
        with self._lock:
            return self._mark(namespace)

    def _mark(self, namespace: str) -> Mark:
        return Mark(self._namespace_changes.get(namespace, 0), self._cluster_changes)

    def hold(self, key: Key, reason: str, since: Mark) -> float:
        """Holds `key`, refused by a pass that started at `since`; returns the seconds until
        it is tried again (soon, if something changed while that pass ran)."""
        with self._lock:
            if self._mark(key[0]) != since:
                return RACED_RETRY_SECONDS
            self._held[key] = Hold(reason, self._clock() + RECHECK_SECONDS)
            return RECHECK_SECONDS

    def remaining(self, key: Key) -> float | None:
        """Seconds the job stays held, or None when it may be reconciled now."""
        with self._lock:
            hold = self._held.get(key)
            if hold is None:
                return None
            left = hold.until - self._clock()
            if left <= 0:
                del self._held[key]
                return None
            return left

    def release(self, key: Key) -> bool:
        with self._lock:
            return self._held.pop(key, None) is not None

    def release_namespace(self, namespace: str) -> list[Key]:
        """Releases the namespace's held jobs (a quota, limit range, account or label changed)."""
        with self._lock:
            self._namespace_changes[namespace] = self._namespace_changes.get(namespace, 0) + 1
            keys = [key for key in self._held if key[0] == namespace]
            for key in keys:
                del self._held[key]
            return keys

    def release_reason(self, reason: str) -> list[Key]:
        """Releases the jobs held for `reason` in any namespace (a PriorityClass appeared)."""
        with self._lock:
            self._cluster_changes += 1
            keys = [key for key, hold in self._held.items() if hold.reason == reason]
            for key in keys:
                del self._held[key]
            return keys

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)
