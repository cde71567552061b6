"""A replica that starts acting passes every job of its peering at once, not on the standby's
keep-warm timer (PEERING_RECHECK_SECONDS)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from trainium_operator.controller import wiring
from trainium_operator.controller.peering import PeeringGate
from trainium_operator.controller.workqueue import Key, WorkQueue


class _Peering:
    """The peering objects a replica of priority 100 reads: it acts in the namespaces in
    `acting`; elsewhere a live peer of priority 200 outranks it."""

    def __init__(self) -> None:
        self.acting: set[str] = set()
        self.unreadable = False
        self.status = 503

    def get_peering_status(self, name: str, namespace: str | None) -> dict[str, Any]:
        if self.unreadable:
            raise ApiException(status=self.status)
        now = datetime.now(UTC).isoformat()
        peers = {"us": {"priority": 100, "lastseen": now, "lifetime": 60}}
        if namespace not in self.acting:
            peers["them"] = {"priority": 200, "lastseen": now, "lifetime": 60}
        return peers


def _gate(peering: _Peering) -> PeeringGate:
    """A namespaced peering gate of priority 100 that reads afresh every time."""
    ticks = itertools.count(step=10.0)
    return PeeringGate(peering, "tj", 100, clusterwide=False, clock=lambda: next(ticks))  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def _running(
    gate: PeeringGate,
    queue: WorkQueue,
    process: Callable[[Key], Awaitable[float | None]] | None = None,
) -> AsyncIterator[None]:
    """The takeover task (and, given `process`, a queue worker) running until the block ends."""
    tasks = [asyncio.create_task(wiring._wake_on_takeover(gate, queue))]
    if process is not None:
        tasks.append(asyncio.create_task(queue.run_worker(process)))
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def test_the_gate_notes_a_takeover_only_where_a_read_allows_what_the_one_before_refused() -> None:
    peering = _Peering()
    peering.acting = {"acting-from-start"}
    gate = _gate(peering)
    assert gate.may_work("acting-from-start")
    assert not gate.may_work("standby")
    assert gate.took_over() == set(), "acting from its first read is no takeover"
    peering.acting.add("standby")
    assert gate.may_work("standby")
    assert gate.took_over() == {"standby"}
    assert gate.may_work("standby")
    assert gate.took_over() == set(), "each takeover is named once"


def test_a_standby_that_starts_acting_passes_each_of_its_jobs_at_once_and_only_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wiring, "TAKEOVER_CHECK_SECONDS", 0.01)
    peering, queue = _Peering(), WorkQueue()
    gate = _gate(peering)
    passed: list[Key] = []
    jobs: list[Key] = [("team-a", "bert"), ("team-a", "gpt"), ("team-b", "llama")]

    async def process(key: Key) -> float | None:
        passed.append(key)
        return None

    async def scenario() -> None:
        for key in jobs:
            queue.add(key)
        async with _running(gate, queue, process):
            await asyncio.sleep(0.05)
            assert sorted(passed) == sorted(jobs), "each job's first pass, as listed"
            passed.clear()
            await asyncio.sleep(0.05)
            assert passed == [], "standing by, nothing wakes the jobs"
            peering.unreadable = True
            await asyncio.sleep(0.05)
            peering.unreadable = False
            peering.acting.add("team-a")
            await asyncio.sleep(0.05)
            assert sorted(passed) == [("team-a", "bert"), ("team-a", "gpt")]
            passed.clear()
            await asyncio.sleep(0.05)
            assert passed == [], "acting on, no job is passed again for it"

    asyncio.run(scenario())


def test_a_peering_the_replica_may_not_read_is_warned_about_once_per_streak(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(wiring, "TAKEOVER_CHECK_SECONDS", 0.01)
    peering, queue = _Peering(), WorkQueue()
    gate = _gate(peering)
    peering.unreadable, peering.status = True, 403
    queue.known.add(("team-a", "bert"))

    async def scenario() -> None:
        async with _running(gate, queue):
            await asyncio.sleep(0.1)
            peering.unreadable = False
            await asyncio.sleep(0.05)
            peering.unreadable = True
            await asyncio.sleep(0.1)

    with caplog.at_level(logging.WARNING, logger=wiring.log.name):
        asyncio.run(scenario())
    warnings = [r for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(warnings) == 2, "one warning for each of the two streaks, not one a check"


def test_a_replica_acting_from_its_start_passes_each_job_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wiring, "TAKEOVER_CHECK_SECONDS", 0.01)
    peering, queue = _Peering(), WorkQueue()
    peering.acting = {"team-a"}
    gate = _gate(peering)
    passed: list[Key] = []
    jobs: list[Key] = [("team-a", "bert"), ("team-a", "gpt")]

    async def process(key: Key) -> float | None:
        gate.may_work(key[0])  # as a pass asks the gate first (wiring._process)
        passed.append(key)
        return None

    async def scenario() -> None:
        for key in jobs:
            queue.add(key)
        async with _running(gate, queue, process):
            await asyncio.sleep(0.1)

    asyncio.run(scenario())
    assert sorted(passed) == sorted(jobs), "no second pass for a takeover that never happened"
