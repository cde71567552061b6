"""Clock sync points put ranks with unrelated monotonic clocks on one wall-clock timeline."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from trainium_operator.profiler.clock import (
    ClockSyncPoint,
    MonotonicToWall,
    WallToMonotonic,
    take_sync_point,
)
from trainium_operator.profiler.events import Event, EventKind
from trainium_operator.profiler.format import RankFileWriter, RankHeader, read_rank_file

WALL_START = 1_800_000_000_000_000_000


def _rank_file(
    path: Path, rank: int, mono_offset: int, drift_ppm: int, event_walls: list[int]
) -> None:
    """A rank whose monotonic clock reads wall - mono_offset, running drift_ppm fast."""

    def mono(wall: int) -> int:
        elapsed = wall - WALL_START
        return WALL_START - mono_offset + elapsed + elapsed * drift_ppm // 1_000_000

    sync = [ClockSyncPoint(mono(w), w) for w in (WALL_START, WALL_START + 60 * 10**9)]
    header = RankHeader(rank=rank, world_size=2, clock_sync=(sync[0],))
    with RankFileWriter(path, header) as writer:
        writer.write_events(
            [
                Event(EventKind.STEP, "step", mono(w), 1_000, value=i)
                for i, w in enumerate(event_walls)
            ]
        )
        writer.write_sync_points(sync[1:])
        writer.close()


def test_two_ranks_with_different_monotonic_offsets_line_up(tmp_path: Path) -> None:
    # The same three instants seen by two hosts: one booted ~11 days ago, one 5 s ago, and
    # the second host's oscillator runs 50 ppm fast.
    walls = [WALL_START + 1_000, WALL_START + 30 * 10**9, WALL_START + 59 * 10**9]
    _rank_file(
        tmp_path / "rank-0.trnprof",
        0,
        mono_offset=WALL_START - 10**15,
        drift_ppm=0,
        event_walls=walls,
    )
    _rank_file(
        tmp_path / "rank-1.trnprof",
        1,
        mono_offset=WALL_START - 5 * 10**9,
        drift_ppm=50,
        event_walls=walls,
    )

    placed = []
    for rank in (0, 1):
        profile = read_rank_file(tmp_path / f"rank-{rank}.trnprof")
        to_wall = MonotonicToWall(profile.header.clock_sync)
        placed.append([to_wall(e.start_ns) for e in profile.events])

    raw0 = [e.start_ns for e in read_rank_file(tmp_path / "rank-0.trnprof").events]
    raw1 = [e.start_ns for e in read_rank_file(tmp_path / "rank-1.trnprof").events]
    assert abs(raw0[0] - raw1[0]) > 10**14  # unaligned, they are days apart
    for a, b, wall in zip(placed[0], placed[1], walls, strict=True):
        assert abs(a - b) <= 1  # aligned, the same instant to the nanosecond
        assert abs(a - wall) <= 1


def test_without_drift_correction_the_drifting_rank_would_be_off() -> None:
    # Guards the previous test: a single start point would misplace the 59 s event by ~3 us.
    start = ClockSyncPoint(1_000, WALL_START)
    late = ClockSyncPoint(1_000 + 60 * 10**9 + 3_000_000, WALL_START + 60 * 10**9)
    event_mono = 1_000 + 59 * 10**9 + 59 * 50_000
    one_point = MonotonicToWall([start])(event_mono)
    two_points = MonotonicToWall([start, late])(event_mono)
    assert abs(one_point - (WALL_START + 59 * 10**9)) > 2_000_000
    assert abs(two_points - (WALL_START + 59 * 10**9)) < 100_000


def test_wall_to_monotonic_inverts_monotonic_to_wall() -> None:
    points = [
        ClockSyncPoint(10**12, WALL_START),
        ClockSyncPoint(10**12 + 10**10, WALL_START + 10**10 + 700),
    ]
    to_wall = MonotonicToWall(points)
    to_mono = WallToMonotonic(points)
    for mono in (10**12 - 5, 10**12 + 4_000_000_000, 10**12 + 10**10 + 99):
        assert abs(to_mono(to_wall(mono)) - mono) <= 1


def test_mapping_needs_a_sync_point() -> None:
    with pytest.raises(ValueError, match="sync point"):
        MonotonicToWall([])


def test_sync_point_reads_both_clocks_at_one_instant() -> None:
    before_wall = time.time_ns()
    point = take_sync_point()
    after_wall = time.time_ns()
    assert before_wall <= point.wall_ns <= after_wall
    assert point.uncertainty_ns < 1_000_000
    assert abs((time.monotonic_ns() + point.offset_ns) - time.time_ns()) < 5_000_000


def test_capture_records_sync_points_at_start_periodically_and_at_stop(tmp_path: Path) -> None:
    from profiler.profiler_helpers import start, stop_and_read

    rank_file = start(tmp_path, sync_interval_s=0.05, flush_interval_s=0.02)
    time.sleep(0.3)
    header = stop_and_read(rank_file).header
    monos = [p.monotonic_ns for p in header.clock_sync]
    assert len(monos) >= 4
    assert monos == sorted(monos)
    assert monos[-1] - monos[0] >= 250_000_000


RANK_SCRIPT = """
import sys, time
from trainium_operator import profiler
assert profiler.start_profiling()
for i in range(6):
    profiler.step(i)
    if i == 3:
        print(time.time_ns())  # this process's wall clock as step 3 begins
    time.sleep(0.02)
profiler.stop_profiling(wait=True, timeout=60)
"""


def test_two_rank_processes_land_on_one_timeline(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from trainium_operator.profiler.events import EventKind
    from trainium_operator.profiler.manifest import discover_rank_files, load_manifest

    procs = []
    for rank, node in ((0, "node-a"), (1, "node-b")):
        env = {
            **os.environ,
            "TRAINIUM_PROFILE": "1",
            "TRAINIUM_PROFILE_DIR": str(tmp_path),
            "TRAINIUM_NODE_NAME": node,
            "TRAINIUM_PROFILE_SOURCES": "none",
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "GROUP_RANK": str(rank),
            "WORLD_SIZE": "2",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RANK_SCRIPT], env=env, stdout=subprocess.PIPE, text=True
            )
        )
    printed = [int(p.communicate(timeout=120)[0].strip()) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]

    refs = discover_rank_files(tmp_path)
    assert [(r.rank, r.node) for r in refs] == [(0, "node-a"), (1, "node-b")]
    assert load_manifest(tmp_path).world_size == 2
    for ref, wall_at_step3 in zip(refs, printed, strict=True):
        profile = read_rank_file(ref.path)
        step3 = next(e for e in profile.events if e.kind == EventKind.STEP and e.value == 3)
        placed = MonotonicToWall(profile.header.clock_sync)(step3.start_ns)
        assert len(profile.header.clock_sync) >= 2  # start and stop
        # Right order, and close: the gap is just the two statements between (and preemption)
        assert 0 <= wall_at_step3 - placed < 50_000_000
