"""Vectorised interval arithmetic: unions of busy intervals, grouped by track.

Busy time of a device is the length of the union of its kernels, copies and collectives
(overlapping work on two queues is not twice as busy). Groups are merged in one pass by
shifting each group onto its own stretch of the int64 axis so no Python loop runs per group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainium_operator.analysis.columns import I64


@dataclass(frozen=True)
class MergedIntervals:
    """Disjoint, sorted intervals per group: `group[i]` owns [start[i], end[i])."""

    group: I64
    start: I64
    end: I64
    group_count: int

    def lengths(self) -> I64:
        return self.end - self.start

    def total_per_group(self) -> I64:
        totals = np.bincount(self.group, weights=self.lengths(), minlength=self.group_count)
        return np.rint(totals).astype(np.int64)


def _shift_width(starts: I64, ends: I64) -> tuple[int, int]:
    low = int(starts.min())
    high = int(ends.max())
    return low, high - low + 1


def merge_grouped(group: I64, starts: I64, ends: I64, group_count: int) -> MergedIntervals:
    """Union of the intervals [starts, ends) within each group id in 0..group_count-1."""
    empty = np.empty(0, dtype=np.int64)
    if starts.size == 0:
        return MergedIntervals(empty, empty, empty, group_count)
    low, width = _shift_width(starts, ends)
    if group_count * width >= 2**62:
        raise ValueError("profile time span too long to merge intervals in int64")
    offset = group.astype(np.int64) * width - low
    shifted_start = starts + offset
    shifted_end = ends + offset
    order = np.argsort(shifted_start, kind="stable")
    s = shifted_start[order]
    e = shifted_end[order]
    running_end = np.maximum.accumulate(e)
    opens = np.empty(s.size, dtype=bool)
    opens[0] = True
    opens[1:] = s[1:] > running_end[:-1]
    first = np.flatnonzero(opens)
    last = np.append(first[1:] - 1, s.size - 1)
    merged_group = s[first] // width
    merged_offset = merged_group * width - low
    return MergedIntervals(
        group=merged_group,
        start=s[first] - merged_offset,
        end=running_end[last] - merged_offset,
        group_count=group_count,
    )


def covered_before(merged: MergedIntervals, group: I64, times: I64) -> I64:
    """For each (group, time) pair, how much of the group's union lies before `time`."""
    if merged.start.size == 0:
        return np.zeros(times.shape, dtype=np.int64)
    low = int(min(merged.start.min(), times.min()))
    high = int(max(merged.end.max(), times.max()))
    width = high - low + 1
    offset_merged = merged.group * width - low
    s = merged.start + offset_merged
    e = merged.end + offset_merged
    prefix = np.concatenate(([0], np.cumsum(e - s)))
    query = times + group.astype(np.int64) * width - low
    count = np.searchsorted(s, query, side="right")
    previous = np.maximum(count - 1, 0)
    partial = np.clip(query - s[previous], 0, e[previous] - s[previous])
    covered: I64 = np.where(count > 0, prefix[previous] + partial, 0)
    return covered


def coverage_per_bucket(merged: MergedIntervals, edges: I64) -> I64:
    """Busy nanoseconds of every group in every bucket [edges[j], edges[j+1]).

    Returns an array of shape (group_count, len(edges) - 1).
    """
    groups = np.repeat(np.arange(merged.group_count, dtype=np.int64), edges.size)
    times = np.tile(edges, merged.group_count)
    cumulative = covered_before(merged, groups, times).reshape(merged.group_count, edges.size)
    busy: I64 = np.diff(cumulative, axis=1)
    return busy
