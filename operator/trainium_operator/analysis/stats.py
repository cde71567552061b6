"""Profile statistics: pure functions from `EventColumns` to small result records.

Everything here is vectorised over the whole profile (sorts, bincounts, searchsorted), so a
million events cost tens of milliseconds per statistic. Percentiles use linear interpolation
between closest ranks, the same definition as `numpy.percentile`'s default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from trainium_operator.analysis.columns import (
    DEVICE_BUSY_KINDS,
    F64,
    I32,
    I64,
    BoolArray,
    EventColumns,
)
from trainium_operator.analysis.intervals import coverage_per_bucket, merge_grouped
from trainium_operator.profiler.events import EventKind, Precision
from trainium_operator.profiler.sampler import CPU_NODE


@dataclass(frozen=True)
class DurationStats:
    count: int
    total_ns: int
    mean_ns: float
    min_ns: int
    p50_ns: float
    p90_ns: float
    p99_ns: float
    max_ns: int


def duration_stats(durations: I64) -> DurationStats:
    if durations.size == 0:
        return DurationStats(0, 0, 0.0, 0, 0.0, 0.0, 0.0, 0)
    p50, p90, p99 = np.percentile(durations, [50, 90, 99])
    return DurationStats(
        count=int(durations.size),
        total_ns=int(durations.sum()),
        mean_ns=float(durations.mean()),
        min_ns=int(durations.min()),
        p50_ns=float(p50),
        p90_ns=float(p90),
        p99_ns=float(p99),
        max_ns=int(durations.max()),
    )


@dataclass(frozen=True)
class Histogram:
    """Counts of values in bins [edges[i], edges[i+1]); the last bin includes its right edge."""

    edges: F64
    counts: I64


def histogram(values: I64, bins: int = 40) -> Histogram:
    if values.size == 0:
        return Histogram(np.zeros(1, dtype=np.float64), np.zeros(0, dtype=np.int64))
    low = float(values.min())
    high = float(values.max())
    if high == low:
        high = low + 1.0
    bin_count = max(1, min(bins, int(values.size)))
    counts, edges = np.histogram(values, bins=bin_count, range=(low, high))
    return Histogram(edges.astype(np.float64), counts.astype(np.int64))


def grouped_percentiles(group_sorted_values: I64, starts: I64, sizes: I64, q: float) -> F64:
    """Percentile q (0-100) of each group, for values sorted within contiguous groups."""
    position = (sizes - 1) * (q / 100.0)
    lower = np.floor(position).astype(np.int64)
    upper = np.minimum(lower + 1, sizes - 1)
    fraction = position - lower
    low_values = group_sorted_values[starts + lower].astype(np.float64)
    high_values = group_sorted_values[starts + upper].astype(np.float64)
    result: F64 = low_values + (high_values - low_values) * fraction
    return result


# ---------------------------------------------------------------- kernels and host ops


OperationOrder = Literal["time", "count"]


@dataclass(frozen=True)
class OperationRow:
    name: str
    count: int  # runs (device kernels) or calls (host ops)
    total_ns: int
    mean_ns: float
    p50_ns: float
    p99_ns: float
    max_ns: int
    share: float  # of the total time of this kind


def top_operations(
    columns: EventColumns,
    limit: int | None = None,
    *,
    kind: EventKind = EventKind.KERNEL,
    order: OperationOrder = "time",
) -> list[OperationRow]:
    """Events of one kind (device kernels by default, or host ops) grouped by name, most
    total time (or most runs) first; ties break by name."""
    mask = columns.of_kind(kind)
    names, durations = _sorted_by_name_and_duration(columns.name[mask], columns.duration_ns[mask])
    if durations.size == 0:
        return []
    starts = np.flatnonzero(np.r_[True, names[1:] != names[:-1]])
    sizes = np.diff(np.r_[starts, names.size])
    totals = np.add.reduceat(durations, starts)
    maxima = durations[starts + sizes - 1]
    p50 = grouped_percentiles(durations, starts, sizes, 50)
    p99 = grouped_percentiles(durations, starts, sizes, 99)
    grand_total = float(durations.sum())
    rows = [
        OperationRow(
            name=columns.names[int(names[starts[i]])],
            count=int(sizes[i]),
            total_ns=int(totals[i]),
            mean_ns=float(totals[i]) / float(sizes[i]),
            p50_ns=float(p50[i]),
            p99_ns=float(p99[i]),
            max_ns=int(maxima[i]),
            share=float(totals[i]) / grand_total if grand_total > 0 else 0.0,
        )
        for i in range(starts.size)
    ]
    return ordered_operations(rows, order)[:limit]


_DURATION_BITS = 42  # 73 minutes: longer durations take the slower two-key sort


def _sorted_by_name_and_duration(names: I32, durations: I64) -> tuple[I32, I64]:
    """Both arrays ordered by (name, duration). One sort of a packed int64 key is several
    times faster than a two-key lexsort: the dashboard of a million events spends it here."""
    if durations.size == 0:
        return names, durations
    fits = int(durations.min()) >= 0 and int(durations.max()) < (1 << _DURATION_BITS)
    if fits and int(names.min()) >= 0 and int(names.max()) < (1 << (62 - _DURATION_BITS)):
        key = np.sort((names.astype(np.int64) << _DURATION_BITS) | durations)
        mask = (1 << _DURATION_BITS) - 1
        return (key >> _DURATION_BITS).astype(names.dtype), key & mask
    ordering = np.lexsort((durations, names))
    return names[ordering], durations[ordering]


def ordered_operations(rows: list[OperationRow], order: OperationOrder) -> list[OperationRow]:
    """Most total time (or most runs) first; the other measure, then the name, break ties."""
    if order == "time":
        return sorted(rows, key=lambda row: (-row.total_ns, -row.count, row.name))
    return sorted(rows, key=lambda row: (-row.count, -row.total_ns, row.name))


# ---------------------------------------------------------------- steps


@dataclass(frozen=True)
class StepRow:
    """One training step across all ranks that reported it."""

    step: int
    ranks: int
    start_ns: int  # earliest rank start on the profile timeline
    end_ns: int  # latest rank end
    min_ns: int
    mean_ns: float
    max_ns: int  # the step time: synchronous training waits for its slowest rank
    slowest_rank: int


@dataclass(frozen=True)
class StepSummary:
    rows: list[StepRow]
    stats: DurationStats  # over the per-step times (max over ranks)
    histogram: Histogram


def step_table(columns: EventColumns) -> list[StepRow]:
    mask = columns.of_kind(EventKind.STEP)
    steps = columns.value[mask]
    if steps.size == 0:
        return []
    durations = columns.duration_ns[mask]
    starts_ns = columns.start_ns[mask]
    ranks = columns.rank[mask]
    order = np.lexsort((durations, steps))
    steps = steps[order]
    durations = durations[order]
    starts_ns = starts_ns[order]
    ranks = ranks[order]
    ends_ns = starts_ns + durations
    first = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
    sizes = np.diff(np.r_[first, steps.size])
    last = first + sizes - 1
    totals = np.add.reduceat(durations, first)
    group_start = np.minimum.reduceat(starts_ns, first)
    group_end = np.maximum.reduceat(ends_ns, first)
    return [
        StepRow(
            step=int(steps[first[i]]),
            ranks=int(sizes[i]),
            start_ns=int(group_start[i]),
            end_ns=int(group_end[i]),
            min_ns=int(durations[first[i]]),
            mean_ns=float(totals[i]) / float(sizes[i]),
            max_ns=int(durations[last[i]]),
            slowest_rank=int(ranks[last[i]]),
        )
        for i in range(first.size)
    ]


def step_summary(columns: EventColumns, bins: int = 30) -> StepSummary:
    rows = step_table(columns)
    times = np.array([row.max_ns for row in rows], dtype=np.int64)
    return StepSummary(rows, duration_stats(times), histogram(times, bins))


@dataclass(frozen=True)
class RankStepMatrix:
    """Step time of every rank (rows) for every step or group of consecutive steps (columns).

    Long runs record a marker for every step; beyond `max_columns` steps, consecutive steps
    are grouped and each cell holds the rank's mean over the group, so the heatmap keeps its
    shape while its size stays bounded. NaN where a rank reported none of the group's steps.
    """

    ranks: I64
    first_step: I64  # per column, the first step of its group
    last_step: I64  # per column, the last step of its group
    duration_ns: F64  # shape (len(ranks), columns)
    relative: F64  # duration / the column's median over ranks: stragglers are > 1


@dataclass(frozen=True)
class StragglerRow:
    rank: int
    node: int
    slowest_count: int  # steps in which this rank was the slowest
    mean_relative: float  # mean of its step time / that step's median over ranks


def rank_step_matrix(columns: EventColumns, max_columns: int = 400) -> RankStepMatrix:
    mask = columns.of_kind(EventKind.STEP)
    steps = columns.value[mask]
    ranks, rank_index = np.unique(columns.rank[mask], return_inverse=True)
    unique_steps, step_index = np.unique(steps, return_inverse=True)
    if unique_steps.size == 0:
        empty_f: F64 = np.zeros((int(ranks.size), 0), dtype=np.float64)
        empty_i: I64 = np.zeros(0, dtype=np.int64)
        return RankStepMatrix(ranks.astype(np.int64), empty_i, empty_i, empty_f, empty_f)
    group_size = -(-int(unique_steps.size) // max_columns)
    group_index = step_index // group_size
    group_count = int(group_index.max()) + 1
    cell = rank_index.astype(np.int64) * group_count + group_index
    size = int(ranks.size) * group_count
    duration = _bucket_means(cell, columns.duration_ns[mask], size).reshape(
        int(ranks.size), group_count
    )
    firsts = unique_steps[::group_size].astype(np.int64)
    lasts = unique_steps[
        np.minimum(np.arange(1, group_count + 1) * group_size, unique_steps.size) - 1
    ]
    with np.errstate(invalid="ignore", divide="ignore"):
        median = np.nanmedian(duration, axis=0) if duration.size else np.zeros(0)
        relative = duration / np.where(median > 0, median, np.nan)
    return RankStepMatrix(
        ranks.astype(np.int64), firsts, lasts.astype(np.int64), duration, relative
    )


def stragglers(columns: EventColumns, matrix: RankStepMatrix, limit: int = 5) -> list[StragglerRow]:
    """Ranks ordered by how much slower than the median rank they usually are."""
    if matrix.duration_ns.size == 0:
        return []
    filled = np.where(np.isnan(matrix.duration_ns), -np.inf, matrix.duration_ns)
    slowest = np.bincount(np.argmax(filled, axis=0), minlength=matrix.ranks.size)
    with np.errstate(invalid="ignore"):
        mean_relative = np.nanmean(
            np.where(np.isfinite(matrix.relative), matrix.relative, np.nan), axis=1
        )
    node_of = np.zeros(int(matrix.ranks.max()) + 1, dtype=np.int64)
    node_of[columns.rank] = columns.node
    order = np.lexsort((matrix.ranks, -slowest, -np.nan_to_num(mean_relative, nan=0.0)))
    return [
        StragglerRow(
            rank=int(matrix.ranks[i]),
            node=int(node_of[matrix.ranks[i]]),
            slowest_count=int(slowest[i]),
            mean_relative=float(mean_relative[i]),
        )
        for i in order[:limit]
    ]


# ---------------------------------------------------------------- precision


@dataclass(frozen=True)
class PrecisionRow:
    precision: str
    count: int
    total_ns: int
    share: float  # of all kernel time


def precision_breakdown(columns: EventColumns) -> list[PrecisionRow]:
    mask = columns.of_kind(EventKind.KERNEL)
    precision = columns.precision[mask]
    durations = columns.duration_ns[mask]
    size = max(int(p) for p in Precision) + 1
    counts = np.bincount(precision, minlength=size)
    totals = np.bincount(precision, weights=durations, minlength=size)
    grand = float(totals.sum())
    rows = [
        PrecisionRow(
            precision=Precision(value).name,
            count=int(counts[value]),
            total_ns=round(float(totals[value])),
            share=float(totals[value]) / grand if grand > 0 else 0.0,
        )
        for value in range(size)
        if counts[value] > 0
    ]
    return sorted(rows, key=lambda row: -row.total_ns)


# ---------------------------------------------------------------- activity


ACTIVITY_CATEGORIES = ("compute", "collective", "memcpy", "sync", "idle")
DEVICE_ACTIVE_CATEGORIES = ("compute", "collective", "memcpy")


@dataclass(frozen=True)
class ActivityBreakdown:
    """Device time of every rank split into exclusive categories.

    Overlaps are attributed by priority compute > collective > memcpy; `sync` is time the
    device was idle while its host thread waited in a SYNC; `idle` is the rest of the
    rank's capture window (first to last device or sync activity).
    """

    totals_ns: dict[str, int]
    per_rank_ns: dict[int, dict[str, int]]

    def shares(self) -> dict[str, float]:
        grand = sum(self.totals_ns.values())
        return {key: (value / grand if grand else 0.0) for key, value in self.totals_ns.items()}

    def device_active_ns(self) -> int:
        """Device time doing work (compute, collectives, memory operations)."""
        return sum(self.totals_ns[key] for key in DEVICE_ACTIVE_CATEGORIES)

    def device_idle_ns(self) -> int:
        """Device time idle within the capture window, waiting on the host or not."""
        return sum(self.totals_ns.values()) - self.device_active_ns()


def _rank_union(columns: EventColumns, mask: BoolArray, rank_index: I64, count: int) -> I64:
    merged = merge_grouped(
        rank_index[mask], columns.start_ns[mask], columns.end_ns[mask], group_count=count
    )
    return merged.total_per_group()


def activity_breakdown(columns: EventColumns) -> ActivityBreakdown:
    on_device = columns.device >= 0
    compute = on_device & columns.of_kind(EventKind.KERNEL)
    collective = on_device & columns.of_kind(EventKind.COLLECTIVE)
    memcpy = on_device & columns.of_kind(EventKind.MEMCPY)
    sync = columns.of_kind(EventKind.SYNC)
    relevant = compute | collective | memcpy | sync
    ranks, rank_index = np.unique(columns.rank, return_inverse=True)
    rank_index = rank_index.astype(np.int64)
    count = int(ranks.size)
    if count == 0 or not relevant.any():
        return ActivityBreakdown(dict.fromkeys(ACTIVITY_CATEGORIES, 0), {})
    union_compute = _rank_union(columns, compute, rank_index, count)
    union_with_collective = _rank_union(columns, compute | collective, rank_index, count)
    union_device = _rank_union(columns, compute | collective | memcpy, rank_index, count)
    union_all = _rank_union(columns, relevant, rank_index, count)
    window_start = np.full(count, np.iinfo(np.int64).max, dtype=np.int64)
    window_end = np.full(count, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(window_start, rank_index[relevant], columns.start_ns[relevant])
    np.maximum.at(window_end, rank_index[relevant], columns.end_ns[relevant])
    has_window = window_end >= window_start
    window = np.where(has_window, window_end - window_start, 0)
    parts = {
        "compute": union_compute,
        "collective": union_with_collective - union_compute,
        "memcpy": union_device - union_with_collective,
        "sync": union_all - union_device,
        "idle": window - union_all,
    }
    per_rank = {
        int(ranks[i]): {key: int(values[i]) for key, values in parts.items()}
        for i in range(count)
        if has_window[i]
    }
    totals = {key: int(values[has_window].sum()) for key, values in parts.items()}
    return ActivityBreakdown(totals, per_rank)


# ---------------------------------------------------------------- transfers


@dataclass(frozen=True)
class TransferRow:
    """Memory operations (or collectives) of one name: how many, how long, how much data."""

    name: str
    count: int
    total_ns: int
    bytes: int
    share: float  # of the time of all operations of this kind
    gbytes_per_s: float  # bytes / summed duration


def transfer_breakdown(
    columns: EventColumns, kind: EventKind = EventKind.MEMCPY
) -> list[TransferRow]:
    """The memory-operation mix (MEMCPY, by default) or the collective mix, most time first."""
    mask = columns.of_kind(kind)
    names = columns.name[mask]
    if names.size == 0:
        return []
    size = len(columns.names)
    counts = np.bincount(names, minlength=size)
    totals = np.bincount(names, weights=columns.duration_ns[mask], minlength=size)
    moved = np.bincount(names, weights=columns.value[mask], minlength=size)
    grand = float(totals.sum())
    rows = [
        TransferRow(
            name=columns.names[int(i)],
            count=int(counts[i]),
            total_ns=round(float(totals[i])),
            bytes=round(float(moved[i])),
            share=float(totals[i]) / grand if grand > 0 else 0.0,
            gbytes_per_s=float(moved[i]) / float(totals[i]) if totals[i] > 0 else 0.0,
        )
        for i in np.flatnonzero(counts)
    ]
    return sorted(rows, key=lambda row: (-row.total_ns, row.name))


# ---------------------------------------------------------------- utilisation


@dataclass(frozen=True)
class UtilisationSeries:
    """Device busy fraction (0..1) per time bucket, per device and averaged per node, plus
    host CPU utilisation (in cores) averaged per bucket over the node's samples."""

    bucket_start_ns: I64
    bucket_ns: int
    devices: list[tuple[int, int]]  # (node index, device index), the rows of `device_busy`
    device_busy: F64  # shape (len(devices), buckets)
    node_busy: F64  # shape (nodes, buckets): mean over the node's devices
    node_cpu_cores: F64  # shape (nodes, buckets), see `node_cpu_over_time`


def bucket_edges(start_ns: int, end_ns: int, buckets: int) -> I64:
    span = max(end_ns - start_ns, 1)
    width = -(-span // buckets)
    return start_ns + width * np.arange(buckets + 1, dtype=np.int64)


def utilisation_over_time(
    columns: EventColumns,
    node_count: int,
    start_ns: int,
    end_ns: int,
    buckets: int = 200,
) -> UtilisationSeries:
    edges = bucket_edges(start_ns, end_ns, buckets)
    width = int(edges[1] - edges[0])
    busy = (columns.device >= 0) & columns.of_kind(*DEVICE_BUSY_KINDS)
    device_key = columns.node[busy].astype(np.int64) * 65536 + columns.device[busy]
    keys, key_index = np.unique(device_key, return_inverse=True)
    merged = merge_grouped(
        key_index.astype(np.int64),
        columns.start_ns[busy],
        columns.end_ns[busy],
        group_count=int(keys.size),
    )
    device_busy = coverage_per_bucket(merged, edges).astype(np.float64) / width
    device_nodes = (keys // 65536).astype(np.int64)
    node_busy = np.zeros((node_count, buckets), dtype=np.float64)
    device_counts = np.bincount(device_nodes, minlength=node_count)
    np.add.at(node_busy, device_nodes, device_busy)
    node_busy = node_busy / np.maximum(device_counts, 1)[:, None]

    cpu = node_cpu_over_time(columns, node_count, edges)
    return UtilisationSeries(
        bucket_start_ns=edges[:-1],
        bucket_ns=width,
        devices=[(int(k // 65536), int(k % 65536)) for k in keys],
        device_busy=device_busy,
        node_busy=node_busy,
        node_cpu_cores=cpu,
    )


def _bucket_means(cell: I64, values: I64, size: int) -> F64:
    sums = np.bincount(cell, weights=values, minlength=size)
    counts = np.bincount(cell, minlength=size)
    with np.errstate(invalid="ignore", divide="ignore"):
        means: F64 = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return means


def _time_weighted_means(
    row: I64, starts: I64, ends: I64, values: I64, *, edges: I64, rows: int
) -> F64:
    """Per row and bucket, the mean of the samples' values weighted by how long each sample's
    range [start, end) overlaps the bucket; NaN where no range covers it. Shape (rows, buckets).

    A sample spanning many buckets (a long sampling interval in a short profile) fills them
    all: full buckets go through a difference array, the partial first and last directly."""
    buckets = int(edges.size) - 1
    width = int(edges[1] - edges[0])
    low, high = int(edges[0]), int(edges[-1])
    start = np.clip(starts, low, high)
    end = np.clip(ends, low, high)
    keep = end > start
    row, start, end = row[keep].astype(np.int64), start[keep], end[keep]
    value = values[keep].astype(np.float64)
    first = (start - low) // width
    last = (end - 1 - low) // width
    stride = buckets + 1
    weighted_diff = np.zeros(rows * stride, dtype=np.float64)
    weight_diff = np.zeros(rows * stride, dtype=np.float64)
    inner = last > first + 1
    opens = row[inner] * stride + first[inner] + 1
    closes = row[inner] * stride + last[inner]
    np.add.at(weighted_diff, opens, value[inner] * width)
    np.add.at(weighted_diff, closes, -value[inner] * width)
    np.add.at(weight_diff, opens, float(width))
    np.add.at(weight_diff, closes, -float(width))
    weighted = np.cumsum(weighted_diff.reshape(rows, stride), axis=1)[:, :buckets]
    weight = np.cumsum(weight_diff.reshape(rows, stride), axis=1)[:, :buckets]
    head = np.minimum(end, low + (first + 1) * width) - start
    np.add.at(weighted, (row, first), value * head)
    np.add.at(weight, (row, first), head.astype(np.float64))
    tail = last > first
    tail_overlap = end[tail] - (low + last[tail] * width)
    np.add.at(weighted, (row[tail], last[tail]), value[tail] * tail_overlap)
    np.add.at(weight, (row[tail], last[tail]), tail_overlap.astype(np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        means: F64 = np.where(weight > 0, weighted / np.maximum(weight, 1e-300), np.nan)
    return means


def _sample_means(
    row: I64, starts: I64, durations: I64, values: I64, *, edges: I64, rows: int
) -> F64:
    """Per row and bucket, the mean CPU utilisation of the samples: time-weighted over the
    ranges samples span; an older profile's instant samples average in the bucket they fall
    in (where no range covers it)."""
    buckets = int(edges.size) - 1
    width = int(edges[1] - edges[0])
    ranged = durations > 0
    over_ranges = _time_weighted_means(
        row[ranged],
        starts[ranged],
        starts[ranged] + durations[ranged],
        values[ranged],
        edges=edges,
        rows=rows,
    )
    instant = ~ranged
    bucket = (starts[instant] - int(edges[0])) // width
    inside = (bucket >= 0) & (bucket < buckets)
    at_instants = _bucket_means(
        row[instant][inside].astype(np.int64) * buckets + bucket[inside],
        values[instant][inside],
        rows * buckets,
    ).reshape(rows, buckets)
    means: F64 = np.where(np.isnan(over_ranges), at_instants, over_ranges)
    return means


def node_cpu_over_time(columns: EventColumns, node_count: int, edges: I64) -> F64:
    """Busy CPU cores per node and time bucket, shape (nodes, buckets), NaN without samples.

    A node's own samples (`cpu.node`, taken by its local rank 0) count when present: they
    include everything on the host. Otherwise the training processes' samples are averaged
    per rank and bucket and summed over the node's ranks. A sample counts in every bucket its
    measured interval overlaps, weighted by the overlap.
    """
    buckets = int(edges.size) - 1
    samples = np.flatnonzero(columns.of_kind(EventKind.CPU_UTIL))
    starts = columns.start_ns[samples]
    durations = columns.duration_ns[samples]
    values = columns.value[samples]
    nodes = columns.node[samples].astype(np.int64)
    ranks = columns.rank[samples].astype(np.int64)
    is_node_sample = columns.name[samples] == columns.name_id(CPU_NODE)

    node = is_node_sample
    node_level = _sample_means(
        nodes[node], starts[node], durations[node], values[node], edges=edges, rows=node_count
    )

    process = ~is_node_sample
    rank_ids, rank_index = np.unique(ranks[process], return_inverse=True)
    per_rank = _sample_means(
        rank_index.astype(np.int64),
        starts[process],
        durations[process],
        values[process],
        edges=edges,
        rows=int(rank_ids.size),
    )
    rank_node = np.zeros(int(rank_ids.size), dtype=np.int64)
    rank_node[rank_index] = nodes[process]
    summed = np.zeros((node_count, buckets), dtype=np.float64)
    reported = np.zeros((node_count, buckets), dtype=np.bool_)
    np.add.at(summed, rank_node, np.nan_to_num(per_rank, nan=0.0))
    np.logical_or.at(reported, rank_node, ~np.isnan(per_rank))
    process_level = np.where(reported, summed, np.nan)

    has_node_samples = np.bincount(nodes[is_node_sample], minlength=node_count) > 0
    cores: F64 = np.where(has_node_samples[:, None], node_level, process_level) / 1000.0
    return cores


@dataclass(frozen=True)
class CpuActivity:
    """Host CPU time per node, integrated from the utilisation samples (core-nanoseconds)."""

    process_active_ns: I64  # the training processes, summed over the node's ranks
    node_active_ns: I64  # the whole host, from `cpu.node` samples (0 where none)
    sampled_ns: I64  # the time span the node's training-process samples cover
    host_sampled_ns: I64  # the time span the node's `cpu.node` samples cover (0 where none)

    def mean_cores(self) -> tuple[F64, F64]:
        """(training processes, whole host) average busy cores per node, each over the span
        its own samples cover."""
        process_span = np.maximum(self.sampled_ns, 1).astype(np.float64)
        host_span = np.maximum(self.host_sampled_ns, 1).astype(np.float64)
        return self.process_active_ns / process_span, self.node_active_ns / host_span


def _span_per_node(nodes: I64, starts: I64, ends: I64, node_count: int) -> I64:
    first = np.full(node_count, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(node_count, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, nodes, starts)
    np.maximum.at(last, nodes, ends)
    span: I64 = np.where(last > first, last - first, 0)
    return span


def cpu_activity(columns: EventColumns, node_count: int) -> CpuActivity:
    """The active time is the sum of value x the interval each sample measured: its own range
    (the sampler records it), or, in older profiles of instant samples, the time since the
    previous sample of the same series (whose first sample then only opens it)."""
    mask = columns.of_kind(EventKind.CPU_UTIL)
    index = np.flatnonzero(mask)
    is_node_sample = columns.name[index] == columns.name_id(CPU_NODE)
    order = np.lexsort((columns.start_ns[index], is_node_sample, columns.rank[index]))
    index = index[order]
    is_node_sample = is_node_sample[order]
    series = columns.rank[index].astype(np.int64) * 2 + is_node_sample
    times = columns.start_ns[index]
    durations = columns.duration_ns[index]
    continues = np.r_[False, series[1:] == series[:-1]]
    previous = np.r_[times[:1], times[:-1]]
    starts = np.where(durations > 0, times, np.where(continues, previous, times))
    ends = np.where(durations > 0, times + durations, times)
    core_ns = columns.value[index] * (ends - starts) // 1000
    nodes = columns.node[index].astype(np.int64)
    process, host = ~is_node_sample, is_node_sample
    process_active = np.bincount(nodes[process], weights=core_ns[process], minlength=node_count)
    node_active = np.bincount(nodes[host], weights=core_ns[host], minlength=node_count)
    return CpuActivity(
        process_active_ns=process_active.astype(np.int64),
        node_active_ns=node_active.astype(np.int64),
        sampled_ns=_span_per_node(nodes[process], starts[process], ends[process], node_count),
        host_sampled_ns=_span_per_node(nodes[host], starts[host], ends[host], node_count),
    )


# ---------------------------------------------------------------- launch latency


@dataclass(frozen=True)
class LaunchLatency:
    """Time from a host launch's start to the start of the device execution it launched."""

    stats: DurationStats
    histogram: Histogram
    matched: int
    unmatched_launches: int
    unmatched_kernels: int
    slowest: list[tuple[int, str, int]]  # (rank, kernel name, latency ns), worst first


def launch_pairs(columns: EventColumns) -> tuple[I64, I64]:
    """Indices (launch, kernel) of events that share a rank and a non-zero flow id."""
    launch = columns.of_kind(EventKind.LAUNCH) & (columns.flow_id != 0)
    kernel = columns.of_kind(EventKind.KERNEL) & (columns.flow_id != 0)
    candidates = np.flatnonzero(launch | kernel)
    if candidates.size == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty
    is_kernel = kernel[candidates].astype(np.int8)
    order = np.lexsort((is_kernel, columns.flow_id[candidates], columns.rank[candidates]))
    ordered = candidates[order]
    flows = columns.flow_id[ordered]
    ranks = columns.rank[ordered]
    kinds = is_kernel[order]
    same = (flows[1:] == flows[:-1]) & (ranks[1:] == ranks[:-1])
    pair = same & (kinds[:-1] == 0) & (kinds[1:] == 1)
    first = np.flatnonzero(pair)
    return ordered[first].astype(np.int64), ordered[first + 1].astype(np.int64)


@dataclass(frozen=True)
class LatencyPairs:
    """The launch -> execution latency of every linked pair, in `launch_pairs` order (rank,
    then flow id), with the kernel's rank and name: what `launch_latency` reduces. Pairs never
    span ranks, so a profile's pairs are its ranks' pairs concatenated in rank order."""

    latency_ns: I64
    rank: I32
    kernel_name: I32  # indexes `names`
    names: tuple[str, ...]
    launch_total: int  # launches with a flow id, linked or not
    kernel_total: int  # kernels with a flow id, linked or not


def latency_pairs(columns: EventColumns) -> LatencyPairs:
    launches, kernels = launch_pairs(columns)
    return LatencyPairs(
        latency_ns=columns.start_ns[kernels] - columns.start_ns[launches],
        rank=columns.rank[kernels],
        kernel_name=columns.name[kernels],
        names=columns.names,
        launch_total=int((columns.of_kind(EventKind.LAUNCH) & (columns.flow_id != 0)).sum()),
        kernel_total=int((columns.of_kind(EventKind.KERNEL) & (columns.flow_id != 0)).sum()),
    )


def launch_latency(columns: EventColumns, bins: int = 40, slowest: int = 10) -> LaunchLatency:
    return latency_of_pairs(latency_pairs(columns), bins, slowest)


def latency_of_pairs(pairs: LatencyPairs, bins: int = 40, slowest: int = 10) -> LaunchLatency:
    latency = pairs.latency_ns
    worst = np.argsort(-latency, kind="stable")[:slowest]
    return LaunchLatency(
        stats=duration_stats(latency),
        histogram=histogram(latency, bins),
        matched=int(latency.size),
        unmatched_launches=pairs.launch_total - int(latency.size),
        unmatched_kernels=pairs.kernel_total - int(latency.size),
        slowest=[
            (int(pairs.rank[i]), pairs.names[int(pairs.kernel_name[i])], int(latency[i]))
            for i in worst
        ],
    )


# ---------------------------------------------------------------- annotations


@dataclass(frozen=True)
class AnnotationRow:
    name: str
    stats: DurationStats


def annotation_table(columns: EventColumns) -> list[AnnotationRow]:
    """Every custom annotation name with its duration statistics, most total time first."""
    mask = columns.of_kind(EventKind.ANNOTATION)
    names = columns.name[mask]
    durations = columns.duration_ns[mask]
    rows = [
        AnnotationRow(columns.names[int(name)], duration_stats(durations[names == name]))
        for name in np.unique(names)
    ]
    return sorted(rows, key=lambda row: (-row.stats.total_ns, row.name))


def annotation_histogram(columns: EventColumns, name: str, bins: int = 40) -> Histogram:
    index = columns.name_id(name)
    mask = columns.of_kind(EventKind.ANNOTATION) & (columns.name == index)
    return histogram(columns.duration_ns[mask], bins)
