"""A job's children's ordinary events are spaced out: a burst of pod events while a large gang
starts becomes one pass per spacing, not one per event; a job's own change and a pod's end
(a failure to restart from) still start a pass at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from trainium_operator.controller.admission_holds import AdmissionHolds
from trainium_operator.controller.cache import ClusterCache
from trainium_operator.controller.wiring import JobTracker
from trainium_operator.controller.workqueue import Key, WorkQueue

KEY: Key = ("team-a", "bert")


def passes_at(spacing: float, events: Callable[[WorkQueue], None], *, run: float) -> list[float]:
    """Loop times (from the first pass's end) of KEY's passes: one pass, then `events` right
    after it, the queue running for `run` seconds."""
    starts: list[float] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        queue = WorkQueue()
        queue.child_spacing = spacing
        first_done = asyncio.Event()

        async def process(key: Key) -> float | None:
            starts.append(loop.time())
            first_done.set()
            return None

        worker = asyncio.create_task(queue.run_worker(process))
        queue.add(KEY)
        await first_done.wait()
        await asyncio.sleep(0)  # the pass's end is recorded
        events(queue)
        await asyncio.sleep(run)
        worker.cancel()

    asyncio.run(scenario())
    return [start - starts[0] for start in starts]


def test_a_burst_of_child_events_is_one_pass_after_the_spacing() -> None:
    def burst(queue: WorkQueue) -> None:
        for _ in range(100):
            queue.nudge(KEY)

    starts = passes_at(0.2, burst, run=0.5)
    assert len(starts) == 2, f"100 pod events made {len(starts) - 1} passes"
    assert starts[1] >= 0.19, "the pass came before the spacing ran out"


def test_a_jobs_own_change_and_a_pod_ending_start_a_pass_at_once() -> None:
    for wake in (WorkQueue.add, WorkQueue.touch):
        starts = passes_at(5.0, lambda queue, wake=wake: wake(queue, KEY), run=0.1)
        assert len(starts) == 2
        assert starts[1] < 0.1


def test_child_events_of_a_forgotten_job_start_nothing() -> None:
    def gone_then_nudged(queue: WorkQueue) -> None:
        queue.forget(KEY)
        queue.nudge(KEY)

    assert len(passes_at(0.0, gone_then_nudged, run=0.1)) == 1


def test_pod_events_are_spaced_and_a_podgroups_admission_wakes_its_job_at_once() -> None:
    def tracker(queue: WorkQueue) -> JobTracker:
        return JobTracker(queue, ClusterCache(), AdmissionHolds())

    spaced = passes_at(0.2, lambda queue: tracker(queue).wake_spaced([KEY]), run=0.4)
    assert len(spaced) == 2
    assert spaced[1] >= 0.19
    at_once = passes_at(5.0, lambda queue: tracker(queue).wake([KEY]), run=0.1)
    assert len(at_once) == 2, "an admitted gang's pods must not wait for the spacing"
    held = passes_at(5.0, lambda queue: tracker(queue).wake_held([KEY]), run=0.1)
    assert len(held) == 2, "a failed pod's restart must not wait for the spacing"
