"""A job refused by admission waits for a change that can lift the refusal, not for a timer."""

from __future__ import annotations

import sys
import threading
import time

from support.clock import FakeClock
from trainium_operator.controller.admission_holds import (
    RACED_RETRY_SECONDS,
    RECHECK_SECONDS,
    AdmissionHolds,
)


def test_a_held_job_is_not_reconciled_until_released() -> None:
    holds = AdmissionHolds(FakeClock())
    assert holds.remaining(("a", "job")) is None
    assert holds.hold(("a", "job"), "QuotaExceeded", holds.mark("a")) == RECHECK_SECONDS
    assert holds.remaining(("a", "job")) == RECHECK_SECONDS
    assert holds.release(("a", "job"))
    assert holds.remaining(("a", "job")) is None
    assert not holds.release(("a", "job"))


def test_a_hold_expires_at_the_recheck_for_causes_no_watch_sees() -> None:
    clock = FakeClock()
    holds = AdmissionHolds(clock)
    holds.hold(("a", "job"), "AdmissionWebhookRejected", holds.mark("a"))
    clock.now += RECHECK_SECONDS - 1
    assert holds.remaining(("a", "job")) == 1
    clock.now += 1
    assert holds.remaining(("a", "job")) is None
    assert len(holds) == 0


# Two namespaces, each with a job held for its quota and one for a missing priority class.
HELD = [
    ("a", "one", "QuotaExceeded"),
    ("a", "two", "PriorityClassNotFound"),
    ("b", "three", "QuotaExceeded"),
    ("b", "four", "PriorityClassNotFound"),
]


def holding(jobs: list[tuple[str, str, str]]) -> AdmissionHolds:
    """Holds of each (namespace, name, reason), taken after its namespace's mark."""
    holds = AdmissionHolds(FakeClock())
    for namespace, name, reason in jobs:
        holds.hold((namespace, name), reason, holds.mark(namespace))
    return holds


def test_a_namespace_change_releases_only_that_namespaces_jobs() -> None:
    holds = holding(HELD)
    assert sorted(holds.release_namespace("a")) == [("a", "one"), ("a", "two")]
    assert holds.remaining(("b", "three")) is not None
    assert len(holds) == 2


def test_a_priority_class_releases_only_jobs_that_named_a_missing_one() -> None:
    holds = holding(HELD)
    assert sorted(holds.release_reason("PriorityClassNotFound")) == [("a", "two"), ("b", "four")]
    assert len(holds) == 2


def test_a_change_seen_while_the_refused_pass_ran_means_a_quick_retry_not_a_hold() -> None:
    holds = AdmissionHolds(FakeClock())
    namespace_mark = holds.mark("a")
    holds.release_namespace("a")  # the quota was raised while the create was being refused
    assert holds.hold(("a", "job"), "QuotaExceeded", namespace_mark) == RACED_RETRY_SECONDS
    assert holds.remaining(("a", "job")) is None
    cluster_mark = holds.mark("a")
    holds.release_reason("PriorityClassNotFound")
    assert holds.hold(("a", "job"), "PriorityClassNotFound", cluster_mark) == RACED_RETRY_SECONDS
    assert holds.remaining(("a", "job")) is None


def test_holds_taken_by_worker_threads_while_the_loop_releases_a_namespace_never_break_either() -> (
    None
):
    # Reconcile passes hold jobs from worker threads; the handlers release namespaces on the
    # event loop. Unlocked, the release's walk over the holds raced the inserts ("dictionary
    # changed size during iteration") and the watch handler failed.
    holds = AdmissionHolds()
    stop = threading.Event()
    errors: list[BaseException] = []

    def hold_many() -> None:
        index = 0
        while not stop.is_set():
            index += 1
            holds.hold(("team", f"job-{index}"), "Quota", holds.mark("team"))

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    worker = threading.Thread(target=hold_many)
    worker.start()
    try:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            try:
                holds.release_namespace("team")
                holds.release_reason("Quota")
            except RuntimeError as error:
                errors.append(error)
                break
    finally:
        stop.set()
        worker.join()
        sys.setswitchinterval(previous)
    assert errors == []
