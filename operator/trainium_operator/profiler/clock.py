"""Clock sync points: pairs of (monotonic, wall-clock) readings taken at the same instant.

Events carry `time.monotonic_ns()` timestamps because the monotonic clock never jumps. It has
no common epoch across hosts, so each rank also records sync points; mapping a rank's events
through its own sync points puts every rank on the shared wall-clock timeline (node wall
clocks are kept within microseconds of each other by chrony / Amazon Time Sync).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from dataclasses import dataclass

# Readings whose monotonic bracket is wider than this were preempted between the two clock
# reads; a few retries almost always find a tight pair.
_SYNC_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class ClockSyncPoint:
    """The monotonic and wall clocks read at (nearly) the same instant.

    `uncertainty_ns` is half the monotonic interval that bracketed the wall-clock read.
    """

    monotonic_ns: int
    wall_ns: int
    uncertainty_ns: int = 0

    @property
    def offset_ns(self) -> int:
        """wall - monotonic: add it to a monotonic time to get wall-clock time."""
        return self.wall_ns - self.monotonic_ns


def take_sync_point() -> ClockSyncPoint:
    """Read both clocks, keeping the tightest of a few bracketed attempts."""
    best: ClockSyncPoint | None = None
    for _ in range(_SYNC_ATTEMPTS):
        before = time.monotonic_ns()
        wall = time.time_ns()
        after = time.monotonic_ns()
        half = (after - before) // 2
        point = ClockSyncPoint(monotonic_ns=before + half, wall_ns=wall, uncertainty_ns=half)
        if best is None or point.uncertainty_ns < best.uncertainty_ns:
            best = point
    assert best is not None
    return best


class MonotonicToWall:
    """Maps a rank's monotonic times to wall-clock times through its sync points.

    Between two sync points the offset is interpolated linearly, which absorbs clock drift
    (tens of ppm) over long captures; outside them the nearest point's offset is used.
    """

    __slots__ = ("_monos", "_offsets")

    def __init__(self, points: Sequence[ClockSyncPoint]) -> None:
        if not points:
            raise ValueError("at least one clock sync point is needed to map monotonic time")
        ordered = sorted(points, key=lambda p: p.monotonic_ns)
        self._monos = [p.monotonic_ns for p in ordered]
        self._offsets = [p.offset_ns for p in ordered]

    def __call__(self, monotonic_ns: int) -> int:
        monos = self._monos
        offsets = self._offsets
        i = bisect.bisect_right(monos, monotonic_ns)
        if i == 0:
            return monotonic_ns + offsets[0]
        if i == len(monos):
            return monotonic_ns + offsets[-1]
        m0, m1 = monos[i - 1], monos[i]
        o0, o1 = offsets[i - 1], offsets[i]
        offset = o0 + (o1 - o0) * (monotonic_ns - m0) // (m1 - m0)
        return monotonic_ns + offset


class WallToMonotonic:
    """The inverse of MonotonicToWall: places wall-clock times (e.g. from another profiler
    that reports Unix nanoseconds) on a rank's monotonic clock."""

    __slots__ = ("_offsets", "_walls")

    def __init__(self, points: Sequence[ClockSyncPoint]) -> None:
        if not points:
            raise ValueError("at least one clock sync point is needed to map wall-clock time")
        ordered = sorted(points, key=lambda p: p.wall_ns)
        self._walls = [p.wall_ns for p in ordered]
        self._offsets = [p.offset_ns for p in ordered]

    def __call__(self, wall_ns: int) -> int:
        walls = self._walls
        offsets = self._offsets
        i = bisect.bisect_right(walls, wall_ns)
        if i == 0:
            return wall_ns - offsets[0]
        if i == len(walls):
            return wall_ns - offsets[-1]
        w0, w1 = walls[i - 1], walls[i]
        o0, o1 = offsets[i - 1], offsets[i]
        offset = o0 + (o1 - o0) * (wall_ns - w0) // (w1 - w0)
        return wall_ns - offset
