"""Summarising profiles ahead of their first open, in the background.

When the UI discovers a profile (the profile list, or the live job list naming one), it queues
it here; one profile at a time is summarised and its dashboard composed into the UI's summary
cache, so that opening it later reads one stored document instead of every rank file. The
work is bounded: at most `max_queued` profiles wait (more are offered again by a later
listing), one runs at a time, and the runner yields its worker processes to any profile a user
is opening. A profile is summarised again only when its files changed, and a profile still
being written at most every RESUMMARISE_AFTER_S seconds (or at once when it finishes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

RESUMMARISE_AFTER_S = 300.0
log = logging.getLogger(__name__)


@dataclass
class Progress:
    """How far an open or a background summary has got (written by its worker thread)."""

    phase: str = "waiting"  # waiting | downloading | summarising | composing | done
    done: int = 0  # rank files summarised (read from the cache or computed)
    total: int = 0  # rank files of the profile

    def as_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "done": self.done, "total": self.total}


@dataclass(frozen=True)
class Discovered:
    """A profile as a listing saw it: its store key and what changes when its files do."""

    key: str
    fingerprint: Hashable = None  # None: not known (the job list names only the profile)
    finished: bool = False


@dataclass
class _Seen:
    fingerprint: Hashable
    finished: bool
    started: float


def due(previous: _Seen | None, found: Discovered, now: float) -> bool:
    """Whether a discovered profile is to be summarised (again)."""
    if previous is None:
        return True
    if found.fingerprint is None or found.fingerprint == previous.fingerprint:
        return False  # unchanged, or nothing new known about it
    if found.finished and not previous.finished:
        return True  # its last window is written: summarise the final files now
    return now - previous.started >= RESUMMARISE_AFTER_S


Runner = Callable[[str, Progress, threading.Event], Awaitable[None]]


@dataclass
class BackgroundSummaries:
    """The queue of profiles to summarise ahead and its single runner task.

    `run(key, progress, stop)` summarises one profile (stopping soon after `stop` is set);
    `busy(key)` says a user is opening or has opened it, which makes background work on it
    pointless. Every method runs on the event loop."""

    run: Runner
    busy: Callable[[str], bool]
    max_queued: int
    clock: Callable[[], float] = time.monotonic
    queued: OrderedDict[str, Discovered] = field(default_factory=OrderedDict)
    states: dict[str, str] = field(default_factory=dict)  # queued|summarising|ready|error
    progress: dict[str, Progress] = field(default_factory=dict)
    _seen: dict[str, _Seen] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None
    _current: tuple[str, asyncio.Future[None]] | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def offer(self, found: Iterable[Discovered]) -> int:
        """Queues the profiles that are due, in the order given, while there is room; how
        many were queued."""
        added = 0
        now = self.clock()
        for item in found:
            if len(self.queued) >= self.max_queued:
                break  # the rest is offered again by a later listing
            if not self.wants(item, now):
                continue
            self._seen[item.key] = _Seen(item.fingerprint, item.finished, now)
            self.queued[item.key] = item
            self.states[item.key] = "queued"
            added += 1
        if added and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._drain())
        return added

    def wants(self, item: Discovered, now: float | None = None) -> bool:
        """Whether `item` would be queued: not queued or running, not being opened, and due."""
        if item.key in self.queued or self.running(item.key) or self.busy(item.key):
            return False
        return due(self._seen.get(item.key), item, self.clock() if now is None else now)

    def running(self, key: str) -> bool:
        return self._current is not None and self._current[0] == key

    def status(self, key: str) -> dict[str, Any] | None:
        state = self.states.get(key)
        if state is None:
            return None
        progress = self.progress.get(key)
        return {"state": state, **(progress.as_dict() if progress else {})}

    def withdraw(self, key: str) -> None:
        """A user opens the profile: it is no longer queued (the open summarises it)."""
        if self.queued.pop(key, None) is not None:
            self.states.pop(key, None)

    async def settled(self, key: str) -> None:
        """Waits for the background summary of `key` if one is running (`progress` shows
        how far it is); never raises."""
        if self._current is not None and self._current[0] == key:
            await asyncio.wait([self._current[1]])

    async def _drain(self) -> None:
        while self.queued and not self._stop.is_set():
            key, _ = self.queued.popitem(last=False)
            if self.busy(key):
                self.states.pop(key, None)
                continue
            progress = Progress()
            self.progress[key] = progress
            self.states[key] = "summarising"
            job = asyncio.ensure_future(self.run(key, progress, self._stop))
            self._current = (key, job)
            try:
                await asyncio.shield(job)
            except asyncio.CancelledError:
                self._stop.set()
                await asyncio.wait([job])
                if not job.cancelled():
                    job.exception()  # retrieved: it stopped because the UI is stopping
                raise
            except Exception as exc:  # one bad profile; the others are still summarised
                log.info("summarising %s ahead failed: %s", key, exc)
                self.states[key] = "error"
            else:
                self.states[key] = "ready"
            finally:
                self._current = None
                self.progress.pop(key, None)

    async def close(self) -> None:
        """Stops the runner: the profile being summarised stops at its next rank file."""
        self._stop.set()
        self.queued.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
