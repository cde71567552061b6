"""Summarising a job's profile as soon as its status shows it written, before anyone lists it.

A link to a profile (in a job's status, an event or a chat) is usually opened after the job
wrote it, by someone who never opened the UI's lists: without this, that first open summarises
every rank file while the user waits. So the UI reads the TrainingJob list (the one its pages
share, `ui.job_cache`: no extra reads of the API server beyond one per round) every
`interval` seconds, and offers the profiles that the jobs' statuses name and that hold rank
files to the summarise-ahead queue (`ui.background`): the same queue, cap and single runner as
profiles a listing discovers, so this adds no work of its own beyond looking at the named
directories. Summarising ahead never decides who may see a profile: an open checks the user's
rights as always.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from trainium_operator.ui.profiles import JobInfo, ProfileStore

log = logging.getLogger(__name__)


async def offer_written(store: ProfileStore, jobs: Callable[[], Awaitable[list[JobInfo]]]) -> int:
    """One round: the written profiles of the listed jobs queued ahead (at most as many as
    the queue has room for); how many were queued."""
    room = store.summarise_ahead - len(store.ahead.queued)
    if room <= 0 or store.cache.directory is None:
        return 0  # full, or nowhere to keep what it would compute
    listed = await jobs()
    found = await asyncio.to_thread(store.written, listed, room)
    return store.ahead.offer(found)


async def watch_written(
    store: ProfileStore, jobs: Callable[[], Awaitable[list[JobInfo]]], interval: float
) -> None:
    """Rounds of `offer_written` every `interval` seconds until cancelled; a failed round
    (the API server unreachable) is logged and the next one tries again."""
    while True:
        try:
            queued = await offer_written(store, jobs)
        except Exception as exc:
            log.info("looking for written profiles failed: %s", exc)
        else:
            if queued:
                log.info("%d written profile(s) queued to be summarised ahead", queued)
        await asyncio.sleep(interval)
