"""A keyed work queue: each job is reconciled by one worker at a time, never twice at once.

Watch events for a job, its pods and nodes only mark the job dirty; a burst of pod events
becomes one reconcile. Failed passes retry with capped exponential backoff, so bad luck
with the API server never crashes the operator or spins it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable

Key = tuple[str, str]  # (namespace, name)
log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 60.0
# The least time between the end of a job's pass and the next pass its children's events start.
# While a large gang starts, Volcano rewrites the scheduling condition of every pod it has not
# placed yet at each of its sessions: hundreds of pod events a second, each worth a pass over
# the whole gang otherwise, CPU taken from the scheduler on the same machine.
CHILD_SPACING_SECONDS = 0.5


class RetryableError(Exception):
    """A pass that failed for a passing reason (the API server restarting): retried with the
    same backoff, logged on one line instead of with a traceback."""


class WorkQueue:
    def __init__(self) -> None:
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._active: set[Key] = set()
        self._dirty_while_active: set[Key] = set()
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._failures: dict[Key, int] = {}
        self._ended: dict[Key, float] = {}  # when each job's last pass ended (loop time)
        self._nudged_while_active: set[Key] = set()
        self.known: set[Key] = set()
        self.child_spacing = CHILD_SPACING_SECONDS

    def add(self, key: Key) -> None:
        self.known.add(key)
        if key in self._active:
            self._dirty_while_active.add(key)
            return
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def touch(self, key: Key) -> None:
        """Marks a known job dirty; a child's event never resurrects a deleted job's key."""
        if key in self.known:
            self.add(key)

    def nudge(self, key: Key) -> None:
        """A child of a known job changed: a pass, but not sooner than `child_spacing` after
        the job's last one ended (a burst of child events becomes one pass per spacing)."""
        if key not in self.known:
            return
        if key in self._active:
            self._nudged_while_active.add(key)
            return
        ended = self._ended.get(key)
        wait = 0.0 if ended is None else ended + self.child_spacing - _now()
        if wait > 0:
            self.add_after(key, wait)
        else:
            self.add(key)

    def add_after(self, key: Key, seconds: float) -> None:
        timer = self._timers.get(key)
        loop = asyncio.get_running_loop()
        when = loop.time() + seconds
        if timer is not None and timer.when() <= when:
            return  # an earlier wake-up is already planned
        if timer is not None:
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.touch(key)

    def forget(self, key: Key) -> None:
        self.known.discard(key)
        self._failures.pop(key, None)
        self._ended.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    async def run_worker(self, process: Callable[[Key], Awaitable[float | None]]) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            try:
                requeue_after = await process(key)
            except asyncio.CancelledError:
                raise
            except Exception:
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                delay = min(MAX_BACKOFF_SECONDS, 0.5 * 2 ** (failures - 1))
                error = sys.exc_info()[1]
                if isinstance(error, RetryableError):
                    log.warning("reconcile of %s/%s: %s; retrying in %.1fs", *key, error, delay)
                else:
                    log.exception("reconcile of %s/%s failed; retrying in %.1fs", *key, delay)
                self.add_after(key, delay)
            else:
                self._failures.pop(key, None)
                if requeue_after is not None:
                    self.add_after(key, requeue_after)
            finally:
                self._active.discard(key)
                self._ended[key] = _now()
                nudged = key in self._nudged_while_active
                self._nudged_while_active.discard(key)
                if key in self._dirty_while_active:
                    self._dirty_while_active.discard(key)
                    self.touch(key)
                elif nudged:
                    self.nudge(key)
                self._queue.task_done()


def _now() -> float:
    return asyncio.get_running_loop().time()
