"""Clock sync points: pairs of (monotonic, wall-clock) readings taken at the same instant.

Events carry `time.monotonic_ns()` timestamps because the monotonic clock never jumps. It has
no common epoch across hosts, so each rank also records sync points; mapping a rank's events
through its own sync points puts every rank on the shared wall-clock timeline (node wall
clocks are kept within microseconds of each other by chrony / Amazon Time Sync).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

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


class _SyncInterpolation:
    """Maps times on one clock to the other through a rank's sync points.

    Between two sync points the offset is interpolated linearly, which absorbs clock drift
    (tens of ppm) over long captures; outside them the nearest point's offset is used.
    """

    __slots__ = ("_offsets", "_times")
    # +1 adds the wall-minus-monotonic offset (monotonic to wall), -1 subtracts it.
    _SIGN: ClassVar[int] = 1

    def __init__(
        self, points: Sequence[ClockSyncPoint], time_of: Callable[[ClockSyncPoint], int], clock: str
    ) -> None:
        if not points:
            raise ValueError(f"at least one clock sync point is needed to map {clock} time")
        ordered = sorted(points, key=time_of)
        self._times = [time_of(p) for p in ordered]
        self._offsets = [p.offset_ns for p in ordered]

    def __call__(self, time_ns: int) -> int:
        times = self._times
        offsets = self._offsets
        i = bisect.bisect_right(times, time_ns)
        if i == 0:
            offset = offsets[0]
        elif i == len(times):
            offset = offsets[-1]
        else:
            t0, t1 = times[i - 1], times[i]
            o0, o1 = offsets[i - 1], offsets[i]
            offset = o0 + (o1 - o0) * (time_ns - t0) // (t1 - t0)
        return time_ns + self._SIGN * offset


class MonotonicToWall(_SyncInterpolation):
    """Maps a rank's monotonic times to wall-clock times through its sync points."""

    __slots__ = ()

    def __init__(self, points: Sequence[ClockSyncPoint]) -> None:
        super().__init__(points, lambda p: p.monotonic_ns, "monotonic")


class WallToMonotonic(_SyncInterpolation):
    """The inverse of MonotonicToWall: places wall-clock times (e.g. from another profiler
    that reports Unix nanoseconds) on a rank's monotonic clock."""

    __slots__ = ()
    _SIGN = -1

    def __init__(self, points: Sequence[ClockSyncPoint]) -> None:
        super().__init__(points, lambda p: p.wall_ns, "wall-clock")
