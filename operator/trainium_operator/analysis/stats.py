"""Profile statistics: pure functions from `EventColumns` to small result records.

Everything here is vectorised over the whole profile (sorts, bincounts, searchsorted), so a
million events cost tens of milliseconds per statistic. Percentiles use linear interpolation
between closest ranks, the same definition as `numpy.percentile`'s default.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainium_operator.analysis.columns import (
    DEVICE_BUSY_KINDS,
    F64,
    I64,
    BoolArray,
    EventColumns,
)
from trainium_operator.analysis.intervals import coverage_per_bucket, merge_grouped
from trainium_operator.profiler.events import EventKind, Precision


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


# ---------------------------------------------------------------- top kernels


@dataclass(frozen=True)
class KernelRow:
    name: str
    count: int
    total_ns: int
    mean_ns: float
    p50_ns: float
    p99_ns: float
    max_ns: int
    share: float  # of all kernel time


def top_kernels(columns: EventColumns, limit: int | None = None) -> list[KernelRow]:
    """Device kernels grouped by name, most total time first."""
    mask = columns.of_kind(EventKind.KERNEL)
    names = columns.name[mask]
    durations = columns.duration_ns[mask]
    if durations.size == 0:
        return []
    order = np.lexsort((durations, names))
    names = names[order]
    durations = durations[order]
    starts = np.flatnonzero(np.r_[True, names[1:] != names[:-1]])
    sizes = np.diff(np.r_[starts, names.size])
    totals = np.add.reduceat(durations, starts)
    maxima = durations[starts + sizes - 1]
    p50 = grouped_percentiles(durations, starts, sizes, 50)
    p99 = grouped_percentiles(durations, starts, sizes, 99)
    grand_total = float(durations.sum())
    ranking = np.lexsort((names[starts], -totals))
    if limit is not None:
        ranking = ranking[:limit]
    return [
        KernelRow(
            name=columns.names[int(names[starts[i]])],
            count=int(sizes[i]),
            total_ns=int(totals[i]),
            mean_ns=float(totals[i]) / float(sizes[i]),
            p50_ns=float(p50[i]),
            p99_ns=float(p99[i]),
            max_ns=int(maxima[i]),
            share=float(totals[i]) / grand_total if grand_total > 0 else 0.0,
        )
        for i in ranking
    ]


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
    node_cpu_cores: F64  # shape (nodes, buckets): NaN where the node has no sample


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

    samples = columns.of_kind(EventKind.CPU_UTIL)
    sample_bucket = (columns.start_ns[samples] - start_ns) // width
    inside = (sample_bucket >= 0) & (sample_bucket < buckets)
    cell = columns.node[samples][inside].astype(np.int64) * buckets + sample_bucket[inside]
    sums = np.bincount(cell, weights=columns.value[samples][inside], minlength=node_count * buckets)
    counts = np.bincount(cell, minlength=node_count * buckets)
    with np.errstate(invalid="ignore", divide="ignore"):
        cpu = np.where(counts > 0, sums / np.maximum(counts, 1) / 1000.0, np.nan)
    return UtilisationSeries(
        bucket_start_ns=edges[:-1],
        bucket_ns=width,
        devices=[(int(k // 65536), int(k % 65536)) for k in keys],
        device_busy=device_busy,
        node_busy=node_busy,
        node_cpu_cores=cpu.reshape(node_count, buckets),
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


def launch_latency(columns: EventColumns, bins: int = 40, slowest: int = 10) -> LaunchLatency:
    launches, kernels = launch_pairs(columns)
    latency = columns.start_ns[kernels] - columns.start_ns[launches]
    launch_total = int((columns.of_kind(EventKind.LAUNCH) & (columns.flow_id != 0)).sum())
    kernel_total = int((columns.of_kind(EventKind.KERNEL) & (columns.flow_id != 0)).sum())
    worst = np.argsort(-latency, kind="stable")[:slowest]
    return LaunchLatency(
        stats=duration_stats(latency),
        histogram=histogram(latency, bins),
        matched=int(latency.size),
        unmatched_launches=launch_total - int(latency.size),
        unmatched_kernels=kernel_total - int(latency.size),
        slowest=[
            (
                int(columns.rank[kernels[i]]),
                columns.names[int(columns.name[kernels[i]])],
                int(latency[i]),
            )
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
