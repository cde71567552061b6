"""A job deleted and created again under the same name while a pass ran is still reconciled."""

from __future__ import annotations

import asyncio

from trainium_operator.controller.handlers import Runtime, _job_changed, job_gone
from trainium_operator.controller.workqueue import Key, WorkQueue
from trainium_operator.k8s.informer import WatchEvent
from unit.jobs import job_document

KEY: Key = ("team-a", "bert")


def run_one_pass(runtime: Runtime, during: list[str]) -> list[Key]:
    """Runs one pass of KEY that finds its job gone, with watch events (DELETED / ADDED)
    arriving while it runs; returns the keys the queue hands out next."""
    processed: list[Key] = []

    async def scenario() -> None:
        queue = runtime.queue = WorkQueue()
        queue.add(KEY)

        async def process(key: Key) -> float | None:
            processed.append(key)
            if len(processed) == 1:
                for event in during:
                    body = job_document()
                    body["metadata"]["uid"] = f"uid-{event}-{len(processed)}"
                    if event == "ADDED":
                        runtime.cache.on_job(WatchEvent("ADDED", body))
                    else:
                        runtime.cache.on_job(WatchEvent("DELETED", body))
                    _job_changed(runtime, KEY, event, (body["metadata"]["uid"], 1, None))
                job_gone(runtime, key)  # what the handler does on JobGoneError
            return None

        worker = asyncio.create_task(queue.run_worker(process))
        await asyncio.sleep(0.05)
        worker.cancel()

    asyncio.run(scenario())
    return processed


def test_a_job_recreated_during_a_pass_that_found_it_gone_gets_its_own_pass() -> None:
    runtime = Runtime()
    processed = run_one_pass(runtime, during=["DELETED", "ADDED"])
    assert processed == [KEY, KEY], "the new job was never reconciled"
    assert runtime.queue is not None
    assert KEY in runtime.queue.known


def test_a_job_that_is_really_gone_is_forgotten() -> None:
    runtime = Runtime()
    processed = run_one_pass(runtime, during=["DELETED"])
    assert processed == [KEY]
    assert runtime.queue is not None
    assert KEY not in runtime.queue.known
