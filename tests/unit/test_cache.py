"""The watch-fed cache: indexes by job and node, and no decision on a view older than our writes."""

from __future__ import annotations

from typing import Any

from support.clock import FakeClock
from trainium_operator.builders.job import LABEL_JOB_NAME
from trainium_operator.controller.cache import EXPECTATION_SECONDS, ClusterCache
from trainium_operator.k8s.informer import WatchEvent


def pod(name: str, job: str, node: str | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": {LABEL_JOB_NAME: job}, **meta},
        "spec": {"nodeName": node} if node else {},
    }


def node(name: str, ready: bool) -> dict[str, Any]:
    status = "True" if ready else "Unknown"
    return {
        "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": status}]},
    }


def job(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": version}}


def test_pods_are_indexed_by_their_job_label() -> None:
    cache = ClusterCache()
    change = cache.on_pod(WatchEvent("ADDED", pod("a-0", "a")))
    assert change is not None
    assert change.key == ("ns", "a")
    cache.on_pod(WatchEvent("ADDED", pod("b-0", "b")))
    assert [p["metadata"]["name"] for p in cache.pods(("ns", "a"))] == ["a-0"]
    cache.on_pod(WatchEvent("DELETED", pod("a-0", "a")))
    assert cache.pods(("ns", "a")) == []


def test_a_pod_without_the_job_label_is_not_ours_and_wakes_nobody() -> None:
    cache = ClusterCache()
    stranger = {"metadata": {"name": "x", "namespace": "ns", "labels": {}}, "spec": {}}
    assert cache.on_pod(WatchEvent("ADDED", stranger)) is None


def test_a_node_turning_not_ready_wakes_only_the_jobs_with_pods_on_it() -> None:
    cache = ClusterCache()
    for name in ("n1", "n2"):
        cache.on_node(WatchEvent("ADDED", node(name, True)))
    cache.on_pod(WatchEvent("ADDED", pod("a-0", "a", "n1")))
    cache.on_pod(WatchEvent("ADDED", pod("b-0", "b", "n2")))
    assert cache.on_node(WatchEvent("MODIFIED", node("n1", True))) == []  # a heartbeat
    assert cache.on_node(WatchEvent("MODIFIED", node("n1", False))) == [("ns", "a")]
    assert cache.on_node(WatchEvent("DELETED", node("n2", False))) == [("ns", "b")]
    assert [n["metadata"]["name"] for n in cache.nodes()] == ["n1"]


def test_a_pod_that_left_a_node_is_no_longer_woken_by_it() -> None:
    cache = ClusterCache()
    cache.on_node(WatchEvent("ADDED", node("n1", True)))
    cache.on_pod(WatchEvent("ADDED", pod("a-0", "a", "n1")))
    cache.on_pod(WatchEvent("DELETED", pod("a-0", "a", "n1")))
    assert cache.on_node(WatchEvent("MODIFIED", node("n1", False))) == []


def test_a_status_write_is_awaited_until_the_watch_delivers_its_version() -> None:
    cache = ClusterCache()
    key = ("ns", "j")
    cache.on_job(WatchEvent("ADDED", job("j", "1")))
    cache.expect(key, job_version="2")
    assert not cache.settled(key)
    assert cache.on_job(WatchEvent("MODIFIED", job("j", "2"))).settles_wait is True
    assert cache.settled(key)
    # Not waited for: the echo of a status write wakes nobody.
    cache.expect(key, job_version="3")
    assert cache.on_job(WatchEvent("MODIFIED", job("j", "3"))).settles_wait is False


def test_a_write_the_watch_delivered_before_it_was_expected_does_not_hold_the_job() -> None:
    cache = ClusterCache()
    key = ("ns", "j")
    cache.on_job(WatchEvent("MODIFIED", job("j", "2")))
    cache.on_job(WatchEvent("MODIFIED", job("j", "3")))  # someone else wrote after us
    cache.expect(key, job_version="2")
    assert cache.settled(key)


def test_created_and_deleted_pods_are_awaited_until_seen() -> None:
    cache = ClusterCache()
    key = ("ns", "a")
    cache.on_pod(WatchEvent("ADDED", pod("a-0-0", "a")))
    cache.expect(key, created=["a-1-0"], deleted=["a-0-0"])
    assert not cache.settled(key)
    cache.on_pod(WatchEvent("ADDED", pod("a-1-0", "a")))
    assert not cache.settled(key)
    terminating = pod("a-0-0", "a", deletionTimestamp="2026-12-01T00:00:00Z")
    change = cache.on_pod(WatchEvent("MODIFIED", terminating))
    assert cache.settled(key)
    # The pass that found the cache behind its writes runs as soon as the last arrives; the
    # operator's own delete coming back is no reason to release an admission hold.
    assert change is not None
    assert (change.settles_wait, change.urgent) == (True, False)


GONE = "2026-12-01T00:00:00Z"


def status(phase: str) -> dict[str, Any]:
    return {"status": {"phase": phase}}


def urgent(cache: ClusterCache, kind: str, obj: dict[str, Any]) -> bool:
    change = cache.on_pod(WatchEvent(kind, obj))
    assert change is not None
    return change.urgent


def test_a_pod_failing_or_finishing_wakes_its_job_at_once_but_its_later_changes_do_not() -> None:
    cache = ClusterCache()
    assert urgent(cache, "ADDED", pod("a-0-0", "a")) is False
    assert urgent(cache, "MODIFIED", pod("a-0-0", "a") | status("Running")) is False
    assert urgent(cache, "MODIFIED", pod("a-0-0", "a") | status("Failed")) is True
    assert urgent(cache, "MODIFIED", pod("a-0-0", "a") | status("Failed")) is False
    # First seen already finished (after an operator start): at once.
    assert urgent(cache, "ADDED", pod("a-0-1", "a") | status("Succeeded")) is True


def test_a_pod_someone_else_deletes_or_that_vanishes_wakes_its_job_at_once() -> None:
    cache = ClusterCache()
    cache.on_pod(WatchEvent("ADDED", pod("a-0-0", "a")))
    cache.on_pod(WatchEvent("ADDED", pod("a-0-1", "a")))
    assert urgent(cache, "MODIFIED", pod("a-0-0", "a", deletionTimestamp=GONE)) is True
    assert urgent(cache, "DELETED", pod("a-0-1", "a")) is True  # force-deleted, unseen going


def test_the_operators_own_deletes_are_spaced_until_the_last_deleting_pod_is_gone() -> None:
    cache = ClusterCache()
    key = ("ns", "a")
    for rank in range(3):
        cache.on_pod(WatchEvent("ADDED", pod(f"a-0-{rank}", "a")))
    cache.on_pod(WatchEvent("ADDED", pod("a-0-9", "a") | status("Failed")))  # kept for logs
    cache.expect(key, deleted=["a-0-0", "a-0-1", "a-0-2"])
    for rank in range(3):
        going = pod(f"a-0-{rank}", "a", deletionTimestamp=GONE)
        assert urgent(cache, "MODIFIED", going) is False
    assert urgent(cache, "DELETED", pod("a-0-0", "a", deletionTimestamp=GONE)) is False
    assert urgent(cache, "DELETED", pod("a-0-1", "a", deletionTimestamp=GONE)) is False
    # The wave's last: the restart's next gang may be created now.
    assert urgent(cache, "DELETED", pod("a-0-2", "a", deletionTimestamp=GONE)) is True


def test_a_deleting_pod_that_turns_failed_is_not_waited_for() -> None:
    cache = ClusterCache()
    cache.expect(("ns", "a"), deleted=[])
    for rank in range(2):
        cache.on_pod(WatchEvent("ADDED", pod(f"a-0-{rank}", "a", deletionTimestamp=GONE)))
    stopped = pod("a-0-1", "a", deletionTimestamp=GONE) | status("Failed")
    assert urgent(cache, "MODIFIED", stopped) is True
    # Nothing live is deleting any more once a-0-0 goes: at once.
    assert urgent(cache, "DELETED", pod("a-0-0", "a", deletionTimestamp=GONE)) is True


def test_an_expectation_that_never_arrives_expires() -> None:
    clock = FakeClock(100.0)
    cache = ClusterCache(clock)
    cache.expect(("ns", "a"), created=["a-0-0"])
    assert not cache.settled(("ns", "a"))
    clock.now += EXPECTATION_SECONDS + 1
    assert cache.settled(("ns", "a"))


def test_a_deleted_job_drops_its_expectations() -> None:
    cache = ClusterCache()
    cache.on_job(WatchEvent("ADDED", job("j", "1")))
    cache.expect(("ns", "j"), job_version="5")
    cache.on_job(WatchEvent("DELETED", job("j", "6")))
    assert cache.settled(("ns", "j"))
    assert cache.job(("ns", "j")) is None


def queue(name: str, state: str | None, pending: int = 0) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"state": state, "pending": pending}}


def test_a_queue_changing_state_wakes_the_jobs_naming_it_but_its_counts_do_not() -> None:
    cache = ClusterCache()
    waiting = job("w", "1")
    waiting["spec"] = {"scheduling": {"queue": "test"}}
    cache.on_job(WatchEvent("ADDED", waiting))
    cache.on_job(WatchEvent("ADDED", job("elsewhere", "1")))  # the default queue
    assert cache.on_queue(WatchEvent("ADDED", queue("test", None))) == [("ns", "w")]
    assert cache.on_queue(WatchEvent("MODIFIED", queue("test", "Open"))) == [("ns", "w")]
    assert cache.on_queue(WatchEvent("MODIFIED", queue("test", "Open", pending=3))) == []
    assert cache.queue("test") is not None
    assert cache.on_queue(WatchEvent("DELETED", queue("test", "Open"))) == [("ns", "w")]
    assert cache.queue("test") is None


def owned(name: str, job_name: str, owner_uid: str) -> dict[str, Any]:
    return pod(name, job_name, uid=f"{name}-uid", ownerReferences=[{"uid": owner_uid}])


def test_only_pods_of_a_job_seen_deleted_are_orphans_and_the_record_goes_with_its_last_pod() -> (
    None
):
    cache = ClusterCache()
    key = ("ns", "a")
    old = {"metadata": {"name": "a", "namespace": "ns", "uid": "old", "resourceVersion": "1"}}
    cache.on_pod(WatchEvent("ADDED", owned("a-0-0", "a", "old")))
    assert cache.orphaned_pods(key) == []  # its job was never seen deleted
    cache.on_job(WatchEvent("ADDED", old))
    cache.on_job(WatchEvent("DELETED", old))
    # Re-created under the same name: its pod (a new owner uid) is no orphan.
    cache.on_pod(WatchEvent("ADDED", owned("a-1-0", "a", "new")))
    assert [p["metadata"]["name"] for p in cache.orphaned_pods(key)] == ["a-0-0"]
    cache.on_pod(WatchEvent("DELETED", owned("a-0-0", "a", "old")))
    cache.on_pod(WatchEvent("DELETED", owned("a-1-0", "a", "new")))
    # A later pod owned by that uid (none can be: a uid is never reused) would be no orphan.
    cache.on_pod(WatchEvent("ADDED", owned("a-0-0", "a", "old")))
    assert cache.orphaned_pods(key) == []
