"""The TrainingJob list shared by every request of the UI, refreshed at most every few seconds.

Every open page polls the job list; a LIST of every TrainingJob per request would let any
authenticated user drive the API server (and the UI's memory) with a loop. So the list is read
once per `ttl` seconds, concurrent requests in that time share one read (also when it fails),
and each request filters the shared list by its own user's namespaces afterwards.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from trainium_operator.ui.profiles import JobInfo, JobLister

JOB_LIST_TTL_S = 2.0  # below the page's 5 s poll, so every poll sees a newer list


class SharedJobList:
    """A JobLister's result, shared for `ttl` seconds; one read in flight at a time."""

    def __init__(
        self,
        lister: JobLister,
        ttl: float = JOB_LIST_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lister, self.ttl, self.clock = lister, ttl, clock
        self._stored: tuple[float, list[JobInfo] | BaseException] | None = None
        self._lock = asyncio.Lock()

    def _fresh(self) -> list[JobInfo] | BaseException | None:
        if self._stored is None or self.clock() - self._stored[0] >= self.ttl:
            return None
        return self._stored[1]

    async def __call__(self) -> list[JobInfo]:
        """The jobs (a copy of the shared list), or the shared read's error raised again."""
        async with self._lock:  # requests arriving during a read wait for it, not read again
            outcome = self._fresh()
            if outcome is None:
                try:
                    outcome = await self.lister()
                except Exception as exc:  # shared too: a failing API server is not hammered
                    outcome = exc
                self._stored = (self.clock(), outcome)
        if isinstance(outcome, BaseException):
            raise outcome.with_traceback(None)  # one stored error, its traceback not grown
        return list(outcome)
