"""A replica that starts acting passes every job of its peering at once, not on the standby's
keep-warm timer (PEERING_RECHECK_SECONDS)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from kubernetes.client.exceptions import ApiException

from trainium_operator.controller import wiring
from trainium_operator.controller.peering import took_over
from trainium_operator.controller.workqueue import Key, WorkQueue


class _Gate:
    """Acts in the namespaces in `acting`; a namespaced peering (one per namespace)."""

    def __init__(self) -> None:
        self.acting: set[str] = set()
        self.unreadable = False
        self.status = 503

    def scope(self, namespace: str) -> str:
        return namespace

    def may_work(self, namespace: str) -> bool:
        if self.unreadable:
            raise ApiException(status=self.status)
        return namespace in self.acting


def test_took_over_names_the_scopes_acting_now_and_not_before() -> None:
    assert took_over({}, {"a": True, "b": False}) == {"a"}
    assert took_over({"a": True}, {"a": True}) == set()
    assert took_over({"a": False}, {"a": True}) == {"a"}
    assert took_over({"a": True}, {"a": False}) == set()


def test_a_standby_that_starts_acting_passes_each_of_its_jobs_at_once_and_only_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wiring, "TAKEOVER_CHECK_SECONDS", 0.01)
    gate, queue = _Gate(), WorkQueue()
    passed: list[Key] = []
    jobs: list[Key] = [("team-a", "bert"), ("team-a", "gpt"), ("team-b", "llama")]

    async def process(key: Key) -> float | None:
        passed.append(key)
        return None

    async def scenario() -> None:
        for key in jobs:
            queue.add(key)
        worker = asyncio.create_task(queue.run_worker(process))
        takeover = asyncio.create_task(wiring._wake_on_takeover(gate, queue))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        assert sorted(passed) == sorted(jobs), "each job's first pass, as listed"
        passed.clear()
        await asyncio.sleep(0.05)
        assert passed == [], "standing by, nothing wakes the jobs"
        gate.unreadable = True
        await asyncio.sleep(0.05)
        gate.unreadable = False
        gate.acting.add("team-a")
        await asyncio.sleep(0.05)
        assert sorted(passed) == [("team-a", "bert"), ("team-a", "gpt")]
        passed.clear()
        await asyncio.sleep(0.05)
        assert passed == [], "acting on, no job is passed again for it"
        takeover.cancel()
        worker.cancel()
        await asyncio.gather(takeover, worker, return_exceptions=True)

    asyncio.run(scenario())


def test_a_peering_the_replica_may_not_read_is_warned_about_once_per_streak(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(wiring, "TAKEOVER_CHECK_SECONDS", 0.01)
    gate, queue = _Gate(), WorkQueue()
    gate.unreadable, gate.status = True, 403
    queue.known.add(("team-a", "bert"))

    async def scenario() -> None:
        takeover = asyncio.create_task(wiring._wake_on_takeover(gate, queue))  # type: ignore[arg-type]
        await asyncio.sleep(0.1)
        gate.unreadable = False
        await asyncio.sleep(0.05)
        gate.unreadable = True
        await asyncio.sleep(0.1)
        takeover.cancel()
        await asyncio.gather(takeover, return_exceptions=True)

    with caplog.at_level(logging.WARNING, logger=wiring.log.name):
        asyncio.run(scenario())
    warnings = [r for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(warnings) == 2, "one warning for each of the two streaks, not one a check"
