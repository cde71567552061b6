"""Vectorised mapping of a rank's monotonic timestamps onto the wall-clock timeline.

Same rule as `trainium_operator.profiler.clock.MonotonicToWall` (the capture side's scalar
mapping), applied to a whole numpy array at once: the wall - monotonic offset is interpolated
linearly between sync points (absorbing drift) and held at the nearest point outside them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trainium_operator.analysis.columns import I64


def monotonic_to_wall(monotonic_ns: I64, sync_points: Sequence[tuple[int, int]]) -> I64:
    """Wall-clock ns for each monotonic ns, given (monotonic ns, wall ns) sync points."""
    if not sync_points:
        raise ValueError("at least one clock sync point is needed to align a rank")
    ordered = sorted(sync_points)
    monos = np.array([p[0] for p in ordered], dtype=np.int64)
    offsets = np.array([p[1] - p[0] for p in ordered], dtype=np.int64)
    base_offset = int(offsets[0])
    if offsets.size == 1 or bool((offsets == base_offset).all()):
        result: I64 = monotonic_ns + base_offset
        return result
    # Interpolate relative to the first point: absolute offsets (~1.7e18 ns) exceed float64's
    # integer precision, their differences (drift, micro- to milliseconds) do not.
    relative_x = (monos - monos[0]).astype(np.float64)
    relative_offsets = (offsets - base_offset).astype(np.float64)
    query = (monotonic_ns - monos[0]).astype(np.float64)
    drift = np.rint(np.interp(query, relative_x, relative_offsets)).astype(np.int64)
    shifted: I64 = monotonic_ns + base_offset + drift
    return shifted
