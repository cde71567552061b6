"""Statistics on small hand-made profiles whose answers are worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainium_operator.analysis.columns import EventColumns, columns_from_events
from trainium_operator.analysis.stats import (
    activity_breakdown,
    annotation_histogram,
    annotation_table,
    cpu_activity,
    launch_latency,
    precision_breakdown,
    rank_step_matrix,
    step_summary,
    step_table,
    stragglers,
    top_operations,
    transfer_breakdown,
    utilisation_over_time,
)
from trainium_operator.profiler.events import Event, EventKind, Precision
from trainium_operator.profiler.sampler import CPU_NODE, CPU_PROCESS


def kernel(name: str, start: int, duration: int, **fields: int) -> Event:
    return Event(EventKind.KERNEL, name, start, duration, device=fields.pop("device", 0), **fields)


def columns(*ranks: list[Event], nodes: list[int] | None = None) -> EventColumns:
    node_of = nodes or [0] * len(ranks)
    return columns_from_events((rank, node_of[rank], events) for rank, events in enumerate(ranks))


def test_top_operations_rank_by_total_time_with_counts_percentiles_and_share() -> None:
    cols = columns(
        [
            kernel("matmul", 0, 10),
            kernel("matmul", 20, 30),
            kernel("matmul", 60, 20),
            kernel("softmax", 100, 40),
        ]
    )

    rows = top_operations(cols)

    assert [row.name for row in rows] == ["matmul", "softmax"]
    matmul = rows[0]
    assert (matmul.count, matmul.total_ns, matmul.max_ns) == (3, 60, 30)
    assert matmul.mean_ns == pytest.approx(20.0)
    assert matmul.p50_ns == pytest.approx(20.0)
    assert matmul.p99_ns == pytest.approx(np.percentile([10, 20, 30], 99))
    assert matmul.share == pytest.approx(0.6)
    assert rows[1].share == pytest.approx(0.4)


def test_top_operations_limit_keeps_the_most_expensive() -> None:
    cols = columns([kernel("a", 0, 1), kernel("b", 0, 5), kernel("c", 0, 3)])

    assert [row.name for row in top_operations(cols, limit=2)] == ["b", "c"]


def test_top_operations_ignore_host_annotations_with_the_same_name() -> None:
    cols = columns([kernel("x", 0, 5), Event(EventKind.ANNOTATION, "x", 0, 500)])

    assert top_operations(cols)[0].total_ns == 5


def test_step_table_takes_the_slowest_rank_as_the_step_time() -> None:
    rank0 = [
        Event(EventKind.STEP, "step", 0, 100, value=1),
        Event(EventKind.STEP, "step", 100, 50, value=2),
    ]
    rank1 = [
        Event(EventKind.STEP, "step", 5, 120, value=1),
        Event(EventKind.STEP, "step", 125, 40, value=2),
    ]

    rows = step_table(columns(rank0, rank1))

    assert [(r.step, r.ranks, r.min_ns, r.max_ns, r.slowest_rank) for r in rows] == [
        (1, 2, 100, 120, 1),
        (2, 2, 40, 50, 0),
    ]
    assert rows[0].mean_ns == pytest.approx(110.0)
    assert (rows[0].start_ns, rows[0].end_ns) == (0, 125)


def test_step_histogram_counts_every_step() -> None:
    steps = [
        Event(EventKind.STEP, "step", i * 1000, 100 if i < 8 else 900, value=i) for i in range(10)
    ]

    summary = step_summary(columns(steps), bins=4)

    assert int(summary.histogram.counts.sum()) == 10
    assert summary.histogram.counts[0] == 8
    assert summary.histogram.counts[-1] == 2
    assert summary.stats.max_ns == 900
    assert summary.stats.p50_ns == pytest.approx(100.0)


def test_precision_breakdown_weights_by_kernel_time() -> None:
    cols = columns(
        [
            kernel("a", 0, 30, precision=Precision.BF16),
            kernel("b", 0, 10, precision=Precision.FP32),
            kernel("c", 0, 60, precision=Precision.BF16),
        ]
    )

    rows = {row.precision: row for row in precision_breakdown(cols)}

    assert set(rows) == {"BF16", "FP32"}
    assert rows["BF16"].total_ns == 90
    assert rows["BF16"].count == 2
    assert rows["BF16"].share == pytest.approx(0.9)
    assert rows["FP32"].share == pytest.approx(0.1)


def test_activity_breakdown_splits_device_time_by_priority_and_finds_sync_and_idle() -> None:
    # Window 0..100. Compute 0..30, collective 20..50 (20..30 overlaps compute),
    # memcpy 45..60, host sync 70..80 with the device idle, nothing 60..70 and 80..100.
    events = [
        kernel("k", 0, 30),
        Event(EventKind.COLLECTIVE, "all_reduce", 20, 30, device=0),
        Event(EventKind.MEMCPY, "h2d", 45, 15, device=0),
        Event(EventKind.SYNC, "mark_step", 70, 10),
        kernel("k", 95, 5),
    ]

    breakdown = activity_breakdown(columns(events))

    assert breakdown.totals_ns == {
        "compute": 35,
        "collective": 20,
        "memcpy": 10,
        "sync": 10,
        "idle": 25,
    }
    assert sum(breakdown.shares().values()) == pytest.approx(1.0)


def test_activity_breakdown_is_per_rank() -> None:
    breakdown = activity_breakdown(
        columns([kernel("k", 0, 10)], [kernel("k", 0, 10), kernel("k", 20, 10)])
    )

    assert breakdown.per_rank_ns[0] == {
        "compute": 10,
        "collective": 0,
        "memcpy": 0,
        "sync": 0,
        "idle": 0,
    }
    assert breakdown.per_rank_ns[1]["compute"] == 20
    assert breakdown.per_rank_ns[1]["idle"] == 10


def test_utilisation_counts_overlapping_queues_once_and_averages_devices_per_node() -> None:
    # Node 0 device 0: busy 0..50 on two overlapping queues; device 1: busy 50..100.
    # Node 1 device 0: busy the whole 0..100.
    rank0 = [kernel("a", 0, 50, thread_id=1), kernel("b", 10, 30, thread_id=2)]
    rank1 = [kernel("a", 50, 50, device=1)]
    rank2 = [Event(EventKind.MEMCPY, "copy", 0, 100, device=0)]

    series = utilisation_over_time(
        columns(rank0, rank1, rank2, nodes=[0, 0, 1]), 2, 0, 100, buckets=2
    )

    assert series.devices == [(0, 0), (0, 1), (1, 0)]
    np.testing.assert_allclose(series.device_busy, [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    np.testing.assert_allclose(series.node_busy, [[0.5, 0.5], [1.0, 1.0]])


def test_utilisation_reports_cpu_cores_per_bucket_and_nan_without_samples() -> None:
    samples = [
        Event(EventKind.CPU_UTIL, "cpu", 10, value=2000),
        Event(EventKind.CPU_UTIL, "cpu", 20, value=4000),
    ]

    series = utilisation_over_time(columns(samples), 1, 0, 100, buckets=2)

    assert series.node_cpu_cores[0, 0] == pytest.approx(3.0)
    assert math.isnan(series.node_cpu_cores[0, 1])


def test_launch_latency_pairs_launch_and_kernel_by_flow_within_a_rank() -> None:
    rank0 = [
        Event(EventKind.LAUNCH, "nrt_execute", 0, 5, flow_id=1),
        kernel("k1", 100, 10, flow_id=1),
        Event(EventKind.LAUNCH, "nrt_execute", 10, 5, flow_id=2),
        kernel("k2", 310, 10, flow_id=2),
        Event(EventKind.LAUNCH, "nrt_execute", 20, 5, flow_id=3),  # never ran
    ]
    # Same flow id on another rank must not pair with rank 0's launch.
    rank1 = [kernel("k1", 50, 10, flow_id=3)]

    latency = launch_latency(columns(rank0, rank1))

    assert latency.matched == 2
    assert latency.stats.mean_ns == pytest.approx(200.0)
    assert latency.stats.max_ns == 300
    assert latency.unmatched_launches == 1
    assert latency.unmatched_kernels == 1
    assert latency.slowest[0] == (0, "k2", 300)


def test_annotation_table_and_histogram_per_name() -> None:
    events = [Event(EventKind.ANNOTATION, "forward", i * 100, 10 + i) for i in range(5)]
    events += [Event(EventKind.ANNOTATION, "backward", 1000, 500)]
    cols = columns(events)

    rows = annotation_table(cols)
    forward_histogram = annotation_histogram(cols, "forward", bins=2)

    assert [row.name for row in rows] == ["backward", "forward"]
    assert rows[1].stats.count == 5
    assert rows[1].stats.total_ns == 60
    assert forward_histogram.counts.tolist() == [2, 3]
    assert annotation_histogram(cols, "missing").counts.size == 0


def test_clock_alignment_interpolates_drift_between_sync_points_and_holds_outside() -> None:
    from trainium_operator.analysis.clock import monotonic_to_wall

    wall_epoch = 1_700_000_000_000_000_000
    # Offset grows by 1000 ns over 1e6 ns of monotonic time (1000 ppm of drift).
    points = [(1_000_000, wall_epoch), (2_000_000, wall_epoch + 1_000_000 + 1000)]
    mono = np.array([0, 1_000_000, 1_500_000, 2_000_000, 3_000_000], dtype=np.int64)

    wall = monotonic_to_wall(mono, points) - wall_epoch

    assert wall.tolist() == [-1_000_000, 0, 500_500, 1_001_000, 2_001_000]


def test_top_operations_by_count_puts_the_most_frequent_first() -> None:
    cols = columns([kernel("big", 0, 100), kernel("tiny", 0, 1), kernel("tiny", 5, 1)])

    assert [row.name for row in top_operations(cols, order="time")] == ["big", "tiny"]
    assert [row.name for row in top_operations(cols, order="count")] == ["tiny", "big"]


def test_top_operations_of_host_ops_ignore_device_kernels() -> None:
    cols = columns(
        [
            Event(EventKind.HOST_OP, "aten::mm", 0, 30),
            Event(EventKind.HOST_OP, "aten::mm", 40, 10),
            Event(EventKind.HOST_OP, "aten::add", 60, 5),
            kernel("aten::mm", 0, 999),
        ]
    )

    rows = top_operations(cols, kind=EventKind.HOST_OP)

    assert [(row.name, row.count, row.total_ns) for row in rows] == [
        ("aten::mm", 2, 40),
        ("aten::add", 1, 5),
    ]


def step(number: int, start: int, duration: int) -> Event:
    return Event(EventKind.STEP, "step", start, duration, value=number)


def test_rank_step_matrix_shows_a_straggler_as_slower_than_the_median() -> None:
    fast = [step(1, 0, 100), step(2, 100, 100)]
    also_fast = [step(1, 0, 100), step(2, 100, 120)]
    slow = [step(1, 0, 150), step(2, 150, 180)]
    cols = columns(fast, also_fast, slow, nodes=[0, 0, 1])

    matrix = rank_step_matrix(cols)

    assert matrix.ranks.tolist() == [0, 1, 2]
    assert matrix.first_step.tolist() == [1, 2]
    np.testing.assert_allclose(matrix.duration_ns, [[100, 100], [100, 120], [150, 180]])
    np.testing.assert_allclose(matrix.relative, [[1.0, 100 / 120], [1.0, 1.0], [1.5, 1.5]])
    worst = stragglers(cols, matrix)[0]
    assert (worst.rank, worst.node, worst.slowest_count) == (2, 1, 2)
    assert worst.mean_relative == pytest.approx(1.5)


def test_rank_step_matrix_groups_consecutive_steps_beyond_the_column_limit() -> None:
    rank0 = [step(n, 100 * n, 10 * n) for n in range(10)]
    rank1 = [step(n, 100 * n, 10) for n in range(0, 10, 2)]  # only even steps

    matrix = rank_step_matrix(columns(rank0, rank1), max_columns=4)

    # 10 steps in groups of 3: [0,1,2] [3,4,5] [6,7,8] [9]
    assert matrix.first_step.tolist() == [0, 3, 6, 9]
    assert matrix.last_step.tolist() == [2, 5, 8, 9]
    np.testing.assert_allclose(matrix.duration_ns[0], [10, 40, 70, 90])
    np.testing.assert_allclose(matrix.duration_ns[1][:3], [10, 10, 10])
    assert math.isnan(matrix.duration_ns[1][3])


def test_transfer_breakdown_gives_count_bytes_share_and_bandwidth_per_operation() -> None:
    cols = columns(
        [
            Event(EventKind.MEMCPY, "host_to_device", 0, 1000, device=0, value=4000),
            Event(EventKind.MEMCPY, "host_to_device", 2000, 1000, device=0, value=4000),
            Event(EventKind.MEMCPY, "device_to_host", 5000, 500, device=0, value=100),
            Event(EventKind.COLLECTIVE, "all_reduce", 0, 9999, device=0, value=1 << 20),
        ]
    )

    rows = transfer_breakdown(cols)

    assert [(r.name, r.count, r.total_ns, r.bytes) for r in rows] == [
        ("host_to_device", 2, 2000, 8000),
        ("device_to_host", 1, 500, 100),
    ]
    assert rows[0].share == pytest.approx(0.8)
    assert rows[0].gbytes_per_s == pytest.approx(4.0)  # 8000 bytes in 2000 ns
    assert [r.name for r in transfer_breakdown(cols, EventKind.COLLECTIVE)] == ["all_reduce"]


def cpu_sample(name: str, at: int, per_mille: int) -> Event:
    return Event(EventKind.CPU_UTIL, name, at, value=per_mille)


def test_node_cpu_sums_the_training_processes_of_a_node_without_node_samples() -> None:
    rank0 = [cpu_sample(CPU_PROCESS, 10, 1000), cpu_sample(CPU_PROCESS, 20, 3000)]
    rank1 = [cpu_sample(CPU_PROCESS, 15, 500)]

    series = utilisation_over_time(columns(rank0, rank1), 1, 0, 100, buckets=2)

    # rank 0 averages 2 cores in the first bucket, rank 1 half a core: 2.5 cores
    assert series.node_cpu_cores[0, 0] == pytest.approx(2.5)
    assert math.isnan(series.node_cpu_cores[0, 1])


def test_node_cpu_prefers_the_whole_host_samples_when_the_node_has_them() -> None:
    rank0 = [cpu_sample(CPU_PROCESS, 10, 1000), cpu_sample(CPU_NODE, 10, 24000)]
    rank1 = [cpu_sample(CPU_PROCESS, 10, 1000)]
    rank2 = [cpu_sample(CPU_PROCESS, 10, 700)]  # on node 1, which has no node samples

    series = utilisation_over_time(
        columns(rank0, rank1, rank2, nodes=[0, 0, 1]), 2, 0, 100, buckets=1
    )

    assert series.node_cpu_cores[:, 0].tolist() == pytest.approx([24.0, 0.7])


def node_0_activity(ranks: EventColumns) -> dict[str, float]:
    """cpu_activity's figures for node 0 of a one-node profile's columns."""
    activity = cpu_activity(ranks, 1)
    process_cores, host_cores = activity.mean_cores()
    assert len(activity.sampled_ns) == 1, "one node"
    return {
        "process_active_ns": float(activity.process_active_ns[0]),
        "node_active_ns": float(activity.node_active_ns[0]),
        "sampled_ns": float(activity.sampled_ns[0]),
        "host_sampled_ns": float(activity.host_sampled_ns[0]),
        "process_cores": float(process_cores[0]),
        "host_cores": float(host_cores[0]),
    }


def test_cpu_activity_integrates_each_sample_over_the_interval_it_covers() -> None:
    # rank 0: 2 cores for 100 ns then 4 cores for 50 ns -> 400 core-ns; the whole host
    # 10 cores for 150 ns; rank 1 (same node): 1 core for 100 ns.
    rank0 = [
        cpu_sample(CPU_PROCESS, 0, 9999),  # opens the series: covers nothing known
        cpu_sample(CPU_PROCESS, 100, 2000),
        cpu_sample(CPU_PROCESS, 150, 4000),
        cpu_sample(CPU_NODE, 0, 9999),
        cpu_sample(CPU_NODE, 150, 10000),
    ]
    rank1 = [cpu_sample(CPU_PROCESS, 0, 1), cpu_sample(CPU_PROCESS, 100, 1000)]

    assert node_0_activity(columns(rank0, rank1)) == pytest.approx(
        {
            "process_active_ns": 400 + 100,
            "node_active_ns": 1500,
            "sampled_ns": 150,
            "host_sampled_ns": 150,
            "process_cores": 500 / 150,
            "host_cores": 10.0,
        }
    )


def cpu_range(name: str, start: int, end: int, per_mille: int) -> Event:
    """A sample as the sampler records it: the mean over the interval it measured."""
    return Event(EventKind.CPU_UTIL, name, start, end - start, value=per_mille)


def test_a_cpu_sample_fills_every_bucket_its_interval_overlaps_weighted_by_the_overlap() -> None:
    # The whole host: 2 cores over 0..60, then 4 cores over 60..100 (buckets of 25 ns).
    rank0 = [cpu_range(CPU_NODE, 0, 60, 2000), cpu_range(CPU_NODE, 60, 100, 4000)]

    series = utilisation_over_time(columns(rank0), 1, 0, 100, buckets=4)

    # 50..75 holds 10 ns of 2 cores and 15 ns of 4 cores
    assert series.node_cpu_cores[0].tolist() == pytest.approx([2.0, 2.0, 3.2, 4.0])


def test_cpu_activity_counts_first_intervals_and_averages_host_and_processes_on_own_spans() -> None:
    # Rank 0 (local rank 0) samples itself and the host from 0; rank 1 starts later, at 40.
    rank0 = [
        cpu_range(CPU_PROCESS, 0, 100, 1000),
        cpu_range(CPU_NODE, 0, 60, 3000),
        cpu_range(CPU_NODE, 60, 100, 2000),
    ]
    rank1 = [cpu_range(CPU_PROCESS, 40, 140, 1000)]

    assert node_0_activity(columns(rank0, rank1)) == pytest.approx(
        {
            "process_active_ns": 200,
            "node_active_ns": 180 + 80,
            "sampled_ns": 140,
            "host_sampled_ns": 100,
            "process_cores": 200 / 140,
            "host_cores": 2.6,
        }
    )
