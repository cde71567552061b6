"""CPU utilisation and memory samples: taken at step markers, or by the flusher without steps."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

from profiler.profiler_helpers import of_kind, start, stop_and_read
from trainium_operator import profiler
from trainium_operator.profiler.config import StepWindow
from trainium_operator.profiler.events import Event, EventKind
from trainium_operator.profiler.sampler import (
    CPU_NODE,
    CPU_PROCESS,
    MEMORY_NODE_USED,
    MEMORY_RSS,
    read_node_cpu_ticks,
)


def test_busy_process_shows_cpu_use_and_resident_memory(tmp_path: Path) -> None:
    cpu_before = time.process_time_ns()
    rank_file = start(tmp_path, sample_interval_s=0.05)
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:  # keep a core as busy as the machine lets us
        sum(range(1000))
    events = stop_and_read(rank_file).events
    cpu_used_ns = time.process_time_ns() - cpu_before

    cpu = sorted(
        (e for e in of_kind(events, EventKind.CPU_UTIL) if e.name == CPU_PROCESS),
        key=lambda e: e.start_ns,
    )
    rss = [e for e in of_kind(events, EventKind.MEMORY) if e.name == MEMORY_RSS]
    assert len(cpu) >= 5
    # Each sample spans the interval it measured, back to back from the sampler's start:
    # integrated they account for the CPU this process used (the start and stop around the
    # sampler are not covered, hence the lower bound).
    assert all(e.duration_ns > 0 for e in cpu)
    assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(cpu))
    integrated_ns = sum(e.value * e.duration_ns // 1000 for e in cpu)
    assert 0.7 * cpu_used_ns <= integrated_ns <= 1.1 * cpu_used_ns
    assert all(e.value >= 10 * 2**20 for e in rss)  # a Python process is above 10 MiB
    # Local rank 0 also samples the node.
    assert any(e.name == CPU_NODE for e in events)
    assert any(e.name == MEMORY_NODE_USED for e in events)
    assert {e.thread_id for e in cpu + rss} == {0}


def test_node_cpu_is_sampled_at_its_interval_while_process_sampling_idles(
    tmp_path: Path,
) -> None:
    # Outside the step window the process samples every 2 s; the node's counters keep their
    # 1 s interval and the first node sample covers the time from the sampler's start.
    rank_file = start(tmp_path, sample_interval_s=0.2, steps=StepWindow(10_000, 10_001))
    started = time.monotonic_ns()
    time.sleep(2.3)
    events = stop_and_read(rank_file).events
    node = sorted(
        (e for e in of_kind(events, EventKind.CPU_UTIL) if e.name == CPU_NODE),
        key=lambda e: e.start_ns,
    )
    assert len(node) >= 3, [(e.start_ns - started, e.duration_ns) for e in node]
    assert node[0].start_ns - started < 100_000_000, "the first interval opens at the start"
    assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(node))
    assert all(e.duration_ns <= 1_200_000_000 for e in node)


def test_other_local_ranks_leave_node_counters_to_local_rank_zero(tmp_path: Path) -> None:
    rank_file = start(tmp_path, sample_interval_s=0.05, rank=1, local_rank=1, world_size=2)
    time.sleep(0.2)
    names = {e.name for e in stop_and_read(rank_file).events}
    assert CPU_PROCESS in names
    assert CPU_NODE not in names


def test_node_cpu_ticks_parse_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 800 20 0 25 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert read_node_cpu_ticks(stat) == (180, 1000)


def test_profile_reports_the_profilers_own_cpu_use(tmp_path: Path) -> None:
    from trainium_operator.profiler.capture import OVERHEAD_COUNTER

    rank_file = start(tmp_path, sample_interval_s=0.02, sync_interval_s=0.1)
    time.sleep(0.35)
    live = profiler.background_cpu_ns()
    events = stop_and_read(rank_file).events
    overhead = sorted(
        (e for e in of_kind(events, EventKind.COUNTER) if e.name == OVERHEAD_COUNTER),
        key=lambda e: e.start_ns,
    )
    assert live is not None
    assert live > 0
    assert len(overhead) >= 3  # at sync points and at stop
    values = [e.value for e in overhead]
    assert values == sorted(values)  # cumulative
    assert 0 < values[-1] < 350_000_000  # some CPU, far less than the wall time
    assert profiler.background_cpu_ns() is None  # no session any more


def _process_cpu_samples(events: list[Event]) -> list[Event]:
    return sorted(
        (e for e in of_kind(events, EventKind.CPU_UTIL) if e.name == CPU_PROCESS),
        key=lambda e: e.start_ns,
    )


def test_while_steps_run_the_step_markers_take_the_samples(tmp_path: Path) -> None:
    # The flusher sleeps through the test: every sample before the stop comes from step().
    rank_file = start(tmp_path, sample_interval_s=0.05, flush_interval_s=3600.0)
    began = time.monotonic_ns()
    step = 0
    while time.monotonic_ns() - began < 600_000_000:
        profiler.step(step)
        step += 1
        time.sleep(0.005)
    stopped = time.monotonic_ns()
    cpu = _process_cpu_samples(stop_and_read(rank_file).events)

    during = [e for e in cpu if e.end_ns < stopped]
    assert len(during) >= 6, [(e.start_ns - began, e.duration_ns) for e in cpu]
    assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(cpu))
    # A step takes the sample once it is due: intervals of 50 ms plus at most about a step.
    assert all(45_000_000 <= e.duration_ns <= 150_000_000 for e in during[:-1])


def test_without_steps_the_flusher_takes_over_the_samples(tmp_path: Path) -> None:
    # No step() at all: the flusher notices at its first wake and samples at the interval.
    rank_file = start(tmp_path, sample_interval_s=0.05, flush_interval_s=0.3)
    time.sleep(1.2)
    cpu = _process_cpu_samples(stop_and_read(rank_file).events)

    assert len(cpu) >= 10, [e.duration_ns for e in cpu]
    assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(cpu))
    assert cpu[0].duration_ns <= 400_000_000  # the first at the flusher's first wake
    assert sorted(e.duration_ns for e in cpu[1:-1])[len(cpu) // 2] < 100_000_000
