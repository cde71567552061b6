"""A job deleted and created again under the same name while a pass ran is still reconciled."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from trainium_operator.builders.job import LABEL_JOB_NAME, Stage
from trainium_operator.controller import wiring
from trainium_operator.controller.admission_holds import AdmissionHolds
from trainium_operator.controller.cache import ClusterCache
from trainium_operator.controller.job_memory import JobMemories
from trainium_operator.controller.metrics import PassCounts
from trainium_operator.controller.wiring import JobTracker, RunningPasses
from trainium_operator.controller.workqueue import Key, WorkQueue
from trainium_operator.k8s.informer import WatchEvent
from unit.jobs import job_document

KEY: Key = ("team-a", "bert")


def run_one_pass(during: list[str]) -> tuple[list[Key], JobTracker]:
    """Runs one pass of KEY that finds its job gone, with watch events (DELETED / ADDED)
    arriving while it runs; returns the keys the queue hands out next, and the tracker."""
    processed: list[Key] = []
    jobs = JobTracker(WorkQueue(), ClusterCache(), AdmissionHolds())

    async def scenario() -> None:
        queue = jobs.queue
        queue.add(KEY)

        async def process(key: Key) -> float | None:
            processed.append(key)
            if len(processed) == 1:
                for event in during:
                    body = job_document()
                    body["metadata"]["uid"] = f"uid-{event}-{len(processed)}"
                    if event == "ADDED":
                        jobs.cache.on_job(WatchEvent("ADDED", body))
                    else:
                        jobs.cache.on_job(WatchEvent("DELETED", body))
                    jobs.job_changed(KEY, event, (body["metadata"]["uid"], 1, None))
                jobs.job_gone(key)  # what a worker does on JobGoneError
            return None

        worker = asyncio.create_task(queue.run_worker(process))
        await asyncio.sleep(0.05)
        worker.cancel()

    asyncio.run(scenario())
    return processed, jobs


def test_a_job_recreated_during_a_pass_that_found_it_gone_gets_its_own_pass() -> None:
    processed, jobs = run_one_pass(during=["DELETED", "ADDED"])
    assert processed == [KEY, KEY], "the new job was never reconciled"
    assert KEY in jobs.queue.known


def test_a_job_that_is_really_gone_is_forgotten() -> None:
    processed, jobs = run_one_pass(during=["DELETED"])
    assert processed == [KEY]
    assert KEY not in jobs.queue.known


def test_a_deleted_job_whose_pods_remain_gets_one_last_pass_then_is_forgotten() -> None:
    processed: list[Key] = []
    jobs = JobTracker(WorkQueue(), ClusterCache(), AdmissionHolds())
    body = job_document()
    pod = {
        "metadata": {
            "name": "bert-train-0-0",
            "namespace": KEY[0],
            "labels": {LABEL_JOB_NAME: KEY[1]},
            "ownerReferences": [{"uid": body["metadata"]["uid"]}],
        },
        "spec": {},
    }

    async def scenario() -> None:
        async def process(key: Key) -> float | None:
            processed.append(key)
            jobs.job_gone(key)  # the pass deleted the pods and found its job gone
            return None

        worker = asyncio.create_task(jobs.queue.run_worker(process))
        jobs.cache.on_pod(WatchEvent("ADDED", pod))
        jobs.cache.on_job(WatchEvent("DELETED", body))
        jobs.job_changed(KEY, "DELETED", (body["metadata"]["uid"], 1, None))
        await asyncio.sleep(0.05)
        # The pods' own deletion events bring it back no more.
        jobs.wake([KEY])
        await asyncio.sleep(0.05)
        worker.cancel()

    asyncio.run(scenario())
    assert processed == [KEY]
    assert KEY not in jobs.queue.known


class _StandbyGate:
    def may_work(self, namespace: str) -> bool:
        return False


def test_a_standby_replica_forgets_a_deleted_job_instead_of_keeping_its_key_warm() -> None:
    jobs = JobTracker(WorkQueue(), ClusterCache(), AdmissionHolds())
    operator = SimpleNamespace(
        gate=_StandbyGate(),
        passes=RunningPasses(),
        counts=PassCounts(),
        cache=jobs.cache,
        jobs=jobs,
    )
    jobs.queue.add(KEY)  # a deleted job's last pass, queued on every replica
    assert asyncio.run(wiring._process(operator, KEY)) is None  # type: ignore[arg-type]
    assert KEY not in jobs.queue.known
    # A live job's key stays warm on the standby, for when it takes over.
    jobs.cache.on_job(WatchEvent("ADDED", job_document()))
    jobs.queue.add(KEY)
    assert asyncio.run(wiring._process(operator, KEY)) == wiring.PEERING_RECHECK_SECONDS  # type: ignore[arg-type]
    assert KEY in jobs.queue.known


def test_a_deleted_jobs_memory_goes_with_it_but_not_a_successors_of_its_name() -> None:
    memory = JobMemories()
    jobs = JobTracker(WorkQueue(), ClusterCache(), AdmissionHolds(), memory=memory)
    memory.of(KEY, "old-uid").know_gang(Stage.TRAIN, 0)
    jobs.job_changed(KEY, "DELETED", ("old-uid", 1, None))
    assert len(memory) == 0
    memory.of(KEY, "new-uid").know_gang(Stage.TRAIN, 0)
    jobs.job_changed(KEY, "DELETED", ("old-uid", 1, None))  # a late event of the old job
    assert memory.of(KEY, "new-uid").gangs_known == {Stage.TRAIN: 0}
