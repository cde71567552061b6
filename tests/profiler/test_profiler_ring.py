"""Bounded per-thread record buffers: order across drains, overflow and the dropped-event
count."""

from __future__ import annotations

import threading
from pathlib import Path

from profiler.profiler_helpers import ranges_by_name, start, stop_and_read
from trainium_operator import profiler
from trainium_operator.profiler.capture import RECORD_FIELDS, Record, ThreadRing


def _ring(capacity: int) -> ThreadRing:
    return ThreadRing(capacity, threading.current_thread(), threading.get_native_id())


def _records(flat: list[object]) -> list[tuple[object, ...]]:
    """Drained items regrouped into records."""
    assert len(flat) % RECORD_FIELDS == 0
    return [tuple(flat[i : i + RECORD_FIELDS]) for i in range(0, len(flat), RECORD_FIELDS)]


def _record(name: str) -> Record:
    return (1, name, 0, 0, 0, 0, 7)


def test_ring_hands_over_records_in_order_across_drains() -> None:
    ring = _ring(16)
    drained = []
    for batch in range(10):  # 10 x 7 records through room for 16
        for i in range(7):
            ring.push(_record(f"r{batch}.{i}"))
        drained.extend(_records(ring.drain()))
    assert [r[1] for r in drained] == [f"r{b}.{i}" for b in range(10) for i in range(7)]
    assert all(r == _record(r[1]) for r in drained)  # every field, in order
    assert ring.dropped == 0
    assert ring.drain() == []
    assert ring.buf == []  # drained records are not kept alive by the ring


def test_full_ring_drops_new_records_and_counts_them() -> None:
    ring = _ring(16)
    for i in range(40):
        ring.push(_record(str(i)))
    kept = _records(ring.drain())
    assert [r[1] for r in kept] == [str(i) for i in range(16)]
    assert ring.dropped == 24
    assert ring.buf == []
    ring.push(_record("after"))  # space again once drained
    assert [r[1] for r in _records(ring.drain())] == ["after"]


def test_overflow_between_flushes_is_reported_in_the_file(tmp_path: Path) -> None:
    # The flusher sleeps far longer than the test, so nothing drains until stop.
    rank_file = start(tmp_path, ring_events=64, flush_interval_s=3600.0)
    for _ in range(1_000):
        with profiler.annotate("hot"):
            pass
    result = stop_and_read(rank_file)
    assert len(ranges_by_name(result.events)["hot"]) == 64
    assert result.header.dropped_events == 1_000 - 64
    assert result.header.complete


def test_each_thread_has_its_own_ring_budget(tmp_path: Path) -> None:
    rank_file = start(tmp_path, ring_events=64, flush_interval_s=3600.0)

    def burst(name: str, count: int) -> None:
        for _ in range(count):
            with profiler.annotate(name):
                pass

    quiet = threading.Thread(target=burst, args=("quiet", 10))
    noisy = threading.Thread(target=burst, args=("noisy", 500))
    quiet.start()
    noisy.start()
    quiet.join()
    noisy.join()
    result = stop_and_read(rank_file)
    found = ranges_by_name(result.events)
    assert len(found["quiet"]) == 10  # the noisy thread's overflow costs it nothing
    assert len(found["noisy"]) == 64
    assert result.header.dropped_events == 500 - 64
