"""The capture API: annotations, begin/end, decorator, steps, threads, disabled mode."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from profiler.profiler_helpers import (
    NODE,
    make_config,
    of_kind,
    ranges_by_name,
    start,
    stop_and_read,
)
from trainium_operator import profiler
from trainium_operator.profiler import capture
from trainium_operator.profiler.config import StepWindow
from trainium_operator.profiler.events import HOST_DEVICE, EventKind


def test_nested_annotations_record_depth_and_containment(tmp_path: Path) -> None:
    rank_file = start(tmp_path)
    with profiler.annotate("outer"):
        with profiler.annotate("middle"), profiler.annotate("inner"):
            time.sleep(0.001)
        with profiler.annotate("sibling"):
            pass
    found = ranges_by_name(stop_and_read(rank_file).events)

    outer, middle, inner, sibling = (found[n][0] for n in ("outer", "middle", "inner", "sibling"))
    assert [outer.depth, middle.depth, inner.depth, sibling.depth] == [0, 1, 2, 1]
    assert outer.start_ns <= middle.start_ns <= inner.start_ns
    assert inner.end_ns <= middle.end_ns <= sibling.start_ns <= sibling.end_ns <= outer.end_ns
    assert inner.duration_ns >= 1_000_000
    assert {e.thread_id for e in (outer, middle, inner, sibling)} == {threading.get_native_id()}
    assert all(e.device == HOST_DEVICE for e in (outer, middle, inner, sibling))


def test_annotation_closes_when_the_body_raises(tmp_path: Path) -> None:
    rank_file = start(tmp_path)
    with pytest.raises(KeyError), profiler.annotate("failing"):
        raise KeyError("boom")
    with profiler.annotate("after"):
        pass
    found = ranges_by_name(stop_and_read(rank_file).events)
    assert len(found["failing"]) == 1
    assert found["after"][0].depth == 0


def _open_range(name: str) -> profiler.AnnotationHandle:
    return profiler.annotation_begin(name)


def _close_range(handle: profiler.AnnotationHandle) -> None:
    profiler.annotation_end(handle)


def test_begin_and_end_in_different_functions_record_one_range(tmp_path: Path) -> None:
    rank_file = start(tmp_path)
    handle = _open_range("data_loading")
    time.sleep(0.002)
    _close_range(handle)
    _close_range(handle)  # a second end is ignored
    found = ranges_by_name(stop_and_read(rank_file).events)
    assert len(found["data_loading"]) == 1
    assert found["data_loading"][0].duration_ns >= 2_000_000


def test_overlapping_begin_end_ranges_leave_depth_balanced(tmp_path: Path) -> None:
    rank_file = start(tmp_path)
    first = profiler.annotation_begin("first")
    second = profiler.annotation_begin("second")
    profiler.annotation_end(first)
    profiler.annotation_end(second)
    with profiler.annotate("later"):
        pass
    found = ranges_by_name(stop_and_read(rank_file).events)
    assert (found["first"][0].depth, found["second"][0].depth) == (0, 1)
    assert found["later"][0].depth == 0


def test_range_ended_on_another_thread_stays_on_the_beginning_thread(tmp_path: Path) -> None:
    rank_file = start(tmp_path)
    handle = profiler.annotation_begin("handed_over")
    closer = threading.Thread(target=profiler.annotation_end, args=(handle,))
    closer.start()
    closer.join()
    found = ranges_by_name(stop_and_read(rank_file).events)
    assert found["handed_over"][0].thread_id == threading.get_native_id()


def test_decorator_records_each_call_and_keeps_the_function(tmp_path: Path) -> None:
    @profiler.annotate("compute")
    def compute(x: int, *, scale: int = 2) -> int:
        """Doubles."""
        return x * scale

    rank_file = start(tmp_path)
    results = [compute(i, scale=3) for i in range(5)]
    found = ranges_by_name(stop_and_read(rank_file).events)
    assert results == [0, 3, 6, 9, 12]
    assert compute.__name__ == "compute"
    assert compute.__doc__ == "Doubles."
    assert len(found["compute"]) == 5


def test_decorator_applied_before_start_records_after_start(tmp_path: Path) -> None:
    @profiler.annotate("early")
    def work() -> None:
        pass

    work()  # profiling off: nothing to record
    rank_file = start(tmp_path)
    work()
    assert len(ranges_by_name(stop_and_read(rank_file).events)["early"]) == 1


def test_disabled_profiler_records_nothing_and_writes_nothing(tmp_path: Path) -> None:
    config = make_config(tmp_path, enabled=False)
    assert profiler.start_profiling(config) is False
    assert not profiler.is_enabled()

    @profiler.annotate("decorated")
    def value() -> int:
        return 7

    with profiler.annotate("ctx") as ann:
        assert isinstance(ann, profiler.Annotation)
    handle = profiler.annotation_begin("range")
    profiler.annotation_end(handle)
    profiler.step(1)
    assert value() == 7
    assert profiler.stop_profiling(wait=True)
    assert list(tmp_path.iterdir()) == []


def test_an_annotation_outside_the_window_is_shared_and_keeps_nothing() -> None:
    shared = profiler.annotate("idle")
    assert profiler.annotate("idle") is shared  # no object per call
    with profiler.annotate("idle"):  # the first use of a name creates its shared annotation
        pass
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for _ in range(10_000):
            with profiler.annotate("idle") as ann:
                pass
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ann is shared
    assert isinstance(ann, profiler.Annotation)
    assert after - before < 100  # the loop's last counter, not 10,000 of anything


def test_an_exception_passes_through_an_idle_annotation() -> None:
    with pytest.raises(KeyError, match="boom"), profiler.annotate("idle"):
        raise KeyError("boom")


def test_an_annotation_kept_from_before_the_window_records_inside_it(tmp_path: Path) -> None:
    # annotate() outside the window hands out one shared object per name; a caller who keeps
    # it and uses it once profiling runs gets ranges as from a new annotation, also nested
    # and on several threads at once.
    outer, inner = profiler.annotate("kept outer"), profiler.annotate("kept inner")
    rank_file = start(tmp_path)

    def work() -> None:
        for _ in range(50):
            with outer, inner, inner:
                pass

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    work()
    for thread in threads:
        thread.join()
    found = ranges_by_name(stop_and_read(rank_file).events)

    assert len(found["kept outer"]) == 4 * 50
    assert len(found["kept inner"]) == 2 * 4 * 50
    assert {e.depth for e in found["kept outer"]} == {0}
    assert {e.depth for e in found["kept inner"]} == {1, 2}
    assert len({e.thread_id for e in found["kept outer"]}) == 4
    by_thread = {}
    for event in found["kept outer"] + found["kept inner"]:
        by_thread.setdefault(event.thread_id, []).append(event)
    for events in by_thread.values():  # every inner range lies within an outer one
        outers = [e for e in events if e.name == "kept outer"]
        for e in events:
            assert any(o.start_ns <= e.start_ns and e.end_ns <= o.end_ns for o in outers)
    with outer:  # after the stop: nothing recorded, nothing raised
        pass


def test_names_made_per_call_do_not_grow_the_shared_annotations_without_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(capture, "_shared_annotations", {})
    monkeypatch.setattr(capture, "MAX_SHARED_ANNOTATIONS", 10)
    for i in range(100):
        with profiler.annotate(f"batch {i}"):
            pass
    assert len(capture._shared_annotations) == 10
    assert profiler.annotate("batch 99") is not profiler.annotate("batch 99")


def test_disabled_by_environment_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINIUM_PROFILE", raising=False)
    assert profiler.start_profiling() is False
    assert profiler.current_config() is None


def test_threads_record_on_their_own_tracks(tmp_path: Path) -> None:
    rank_file = start(tmp_path)
    thread_ids: dict[str, int] = {}
    barrier = threading.Barrier(4)

    def worker(name: str) -> None:
        thread_ids[name] = threading.get_native_id()
        barrier.wait()
        for _ in range(200):
            with profiler.annotate(name), profiler.annotate(name + ".inner"):
                pass

    threads = [threading.Thread(target=worker, args=(f"w{i}",), name=f"w{i}") for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result = stop_and_read(rank_file)
    found = ranges_by_name(result.events)

    assert result.header.dropped_events == 0
    for name, tid in thread_ids.items():
        assert len(found[name]) == 200
        assert len(found[name + ".inner"]) == 200
        assert {e.thread_id for e in found[name]} == {tid}
        assert {e.depth for e in found[name + ".inner"]} == {1}
        assert result.track_names[(tid, HOST_DEVICE)] == name


def test_steps_are_recorded_for_the_whole_run_but_annotations_only_in_the_window(
    tmp_path: Path,
) -> None:
    rank_file = start(tmp_path, steps=StepWindow(3, 4))
    for n in range(8):
        profiler.step(n)
        with profiler.annotate("work"):
            time.sleep(0.001)
    events = stop_and_read(rank_file).events
    steps = sorted(of_kind(events, EventKind.STEP), key=lambda e: e.value)
    work = ranges_by_name(events)["work"]

    assert [s.value for s in steps] == list(range(8))
    assert all(s.duration_ns >= 1_000_000 for s in steps)
    for earlier, later in itertools.pairwise(steps):
        assert earlier.end_ns == later.start_ns  # consecutive, no gaps
    in_window = [s for s in steps if s.value in (3, 4)]
    assert len(work) == 2
    for step_event, ann in zip(in_window, sorted(work, key=lambda e: e.start_ns), strict=True):
        assert step_event.start_ns <= ann.start_ns <= ann.end_ns <= step_event.end_ns


def test_detail_capture_follows_the_window(tmp_path: Path) -> None:
    start(tmp_path, steps=StepWindow(2, 2))
    seen = []
    for n in range(4):
        profiler.step(n)
        seen.append(profiler.is_capturing_detail())
    assert seen == [False, False, True, False]
    assert profiler.is_enabled()


def test_start_twice_keeps_the_first_session(tmp_path: Path) -> None:
    rank_file = start(tmp_path)
    assert profiler.start_profiling(make_config(tmp_path / "other"))
    with profiler.annotate("x"):
        pass
    assert len(ranges_by_name(stop_and_read(rank_file).events)["x"]) == 1
    assert not (tmp_path / "other").exists()


def test_stop_returns_before_the_flush_finishes(tmp_path: Path) -> None:
    # A flush interval far longer than the test: only stop's own final flush writes the file,
    # and stop_profiling() must not wait for it.
    rank_file = start(tmp_path, flush_interval_s=3600.0)
    for _ in range(20_000):
        with profiler.annotate("busy"):
            pass
    began = time.perf_counter()
    assert profiler.stop_profiling()
    returned_after = time.perf_counter() - began
    assert profiler.wait_for_flush(timeout=30)
    assert returned_after < 0.05
    assert len(ranges_by_name(stop_and_read(rank_file).events)["busy"]) == 20_000


def test_environment_configures_rank_identity_and_layout(tmp_path: Path) -> None:
    profile_dir = tmp_path / "profiles" / "team" / "llama" / "2"
    script = (
        "from trainium_operator import profiler\n"
        "assert profiler.start_profiling()\n"
        "for i in range(3):\n"
        "    profiler.step(i)\n"
        "    with profiler.annotate('fwd'):\n"
        "        pass\n"
        "profiler.stop_profiling()\n"  # no wait: the exit hook must finish the file
    )
    env = {
        **os.environ,
        "TRAINIUM_PROFILE": "1",
        "TRAINIUM_PROFILE_DIR": str(profile_dir),
        "TRAINIUM_PROFILE_STEPS": "1:2",
        "TRAINIUM_NODE_NAME": "ip-10-0-0-7",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "GROUP_RANK": "0",
        "WORLD_SIZE": "1",
        "TRAINIUM_PROFILE_SOURCES": "none",
    }
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)

    from trainium_operator.profiler.format import read_rank_file
    from trainium_operator.profiler.manifest import load_manifest

    profile = read_rank_file(profile_dir / "ip-10-0-0-7" / "rank-0.trnprof")
    manifest = load_manifest(profile_dir)
    assert profile.header.complete
    assert (profile.header.namespace, profile.header.job_name, profile.header.attempt) == (
        "team",
        "llama",
        2,
    )
    assert profile.header.step_window == (1, 2)
    assert len(ranges_by_name(profile.events)["fwd"]) == 2
    assert manifest.finished
    assert [r.file for r in manifest.ranks] == ["ip-10-0-0-7/rank-0.trnprof"]


def test_forked_child_does_not_write_into_the_parents_profile(tmp_path: Path) -> None:
    rank_file = start(tmp_path)
    pid = os.fork()
    if pid == 0:  # child: must see profiling off, and must not touch the parent's file
        code = 0 if not profiler.is_enabled() else 1
        with profiler.annotate("child"):
            pass
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    with profiler.annotate("parent"):
        pass
    found = ranges_by_name(stop_and_read(rank_file).events)
    assert os.waitstatus_to_exitcode(status) == 0
    assert "child" not in found
    assert len(found["parent"]) == 1


def test_rank_file_lands_under_node_directory(tmp_path: Path) -> None:
    rank_file = start(tmp_path, rank=3, world_size=4)
    stop_and_read(rank_file)
    assert rank_file == tmp_path / NODE / "rank-3.trnprof"
    assert rank_file.exists()


def test_sigterm_still_leaves_a_complete_file(tmp_path: Path) -> None:
    script = (
        "import os, signal\n"
        "from trainium_operator import profiler\n"
        "assert profiler.start_profiling()\n"
        "for i in range(3):\n"
        "    profiler.step(i)\n"
        "    with profiler.annotate('work'):\n"
        "        pass\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "raise SystemExit('not reached: SIGTERM must still terminate the process')\n"
    )
    env = {
        **os.environ,
        "TRAINIUM_PROFILE": "1",
        "TRAINIUM_PROFILE_DIR": str(tmp_path),
        "TRAINIUM_NODE_NAME": "n",
        "TRAINIUM_PROFILE_SOURCES": "none",
        "TRAINIUM_PROFILE_FLUSH_MS": "600000",  # only the SIGTERM flush can write the events
    }
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=120, check=False)

    from trainium_operator.profiler.format import read_rank_file

    profile = read_rank_file(tmp_path / "n" / "rank-0.trnprof")
    assert done.returncode == -15
    assert profile.header.complete
    assert len(ranges_by_name(profile.events)["work"]) == 3
    assert [e.value for e in of_kind(profile.events, EventKind.STEP)] == [0, 1]


def test_sigterm_handler_is_ours_only_while_profiling(tmp_path: Path) -> None:
    import signal

    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    rank_file = start(tmp_path)
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    stop_and_read(rank_file)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_program_sigterm_handler_is_left_alone(tmp_path: Path) -> None:
    import signal

    def own_handler(signum: int, frame: object) -> None:
        pass

    previous = signal.signal(signal.SIGTERM, own_handler)
    try:
        rank_file = start(tmp_path)
        assert signal.getsignal(signal.SIGTERM) is own_handler
        stop_and_read(rank_file)
        assert signal.getsignal(signal.SIGTERM) is own_handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_second_session_continues_the_rank_file(tmp_path: Path) -> None:
    rank_file = start(tmp_path)
    with profiler.annotate("first"):
        pass
    profiler.stop_profiling()  # no wait: the next start must not race the background flush
    start(tmp_path)
    with profiler.annotate("second"):
        pass
    result = stop_and_read(rank_file)
    found = ranges_by_name(result.events)
    assert (len(found["first"]), len(found["second"])) == (1, 1)
    assert result.header.complete
    assert result.header.extra["earlier_pids"] == str(os.getpid())
    assert len(result.header.clock_sync) >= 4  # both sessions' start and stop points
    assert not list(rank_file.parent.glob(".*previous"))


def test_a_restarted_worker_keeps_what_the_crashed_one_wrote(tmp_path: Path) -> None:
    from trainium_operator.profiler.events import Event
    from trainium_operator.profiler.format import RankFileWriter, RankHeader

    rank_file = tmp_path / NODE / "rank-0.trnprof"
    crashed = RankFileWriter(rank_file, RankHeader(rank=0, node=NODE, pid=12345))
    for block in range(2):
        crashed.write_events(
            [Event(EventKind.STEP, "step", 1_000 * n, 500, value=n) for n in (block, block + 5)]
        )
    crashed._file.close()  # type: ignore[union-attr]  # killed: no END block
    data = rank_file.read_bytes()
    rank_file.write_bytes(data[:-3])  # and its last block half-written

    start(tmp_path)
    profiler.step(10)
    result = stop_and_read(rank_file)
    steps = sorted(e.value for e in of_kind(result.events, EventKind.STEP))
    assert result.header.complete
    assert result.header.extra["earlier_pids"] == "12345"
    assert steps == [0, 5, 10]  # the intact first block survives, the torn second does not


def test_an_unreadable_earlier_file_is_replaced(tmp_path: Path) -> None:
    rank_file = tmp_path / NODE / "rank-0.trnprof"
    rank_file.parent.mkdir(parents=True)
    rank_file.write_bytes(b"not a profile at all")
    start(tmp_path)
    with profiler.annotate("fresh"):
        pass
    result = stop_and_read(rank_file)
    assert len(ranges_by_name(result.events)["fresh"]) == 1
    assert "earlier_pids" not in result.header.extra
