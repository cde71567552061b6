"""Loading real rank files, the timeline index and the Perfetto export, on written profiles."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.analysis.loading import load_profile
from trainium_operator.analysis.perfetto import ExportOptions, export_perfetto, flow_uuid
from trainium_operator.analysis.stats import step_table
from trainium_operator.analysis.timeline import TimelineIndex
from trainium_operator.profiler.clock import ClockSyncPoint
from trainium_operator.profiler.events import Event, EventKind, Precision
from trainium_operator.profiler.format import RankHeader, write_rank_file

pb = pytest.importorskip(
    "perfetto.protos.perfetto.trace.perfetto_trace_pb2",
    reason="the perfetto package (dev extra) ships the official trace schema",
)

WALL = 1_767_225_600_000_000_000


def write_rank(root: Path, node: str, rank: int, mono_epoch: int, events: list[Event]) -> None:
    header = RankHeader(
        rank=rank, node=node, local_rank=rank % 2, clock_sync=(ClockSyncPoint(mono_epoch, WALL),)
    )
    write_rank_file(root / node / f"rank-{rank}.trnprof", header, events)


@pytest.fixture
def two_node_profile(tmp_path: Path) -> Path:
    """Two nodes whose monotonic clocks differ by 10 s; the same wall instant on both."""
    for node, epoch in (("node-a", 1_000_000_000), ("node-b", 11_000_000_000)):
        for rank in (0, 1) if node == "node-a" else (2, 3):
            write_rank(
                tmp_path,
                node,
                rank,
                epoch,
                [
                    Event(EventKind.STEP, "step", epoch + 1000, 5000, 1, value=7),
                    Event(EventKind.LAUNCH, "nrt_execute", epoch + 1100, 50, 1, flow_id=9, depth=1),
                    Event(
                        EventKind.KERNEL,
                        "gemm",
                        epoch + 1400,
                        2000,
                        0,
                        rank % 2,
                        flow_id=9,
                        precision=Precision.BF16,
                    ),
                ],
            )
    return tmp_path


def test_ranks_on_different_nodes_line_up_through_their_sync_points(two_node_profile: Path) -> None:
    profile = load_profile(two_node_profile, workers=1)

    steps = profile.columns.of_kind(EventKind.STEP)
    assert profile.nodes == ("node-a", "node-b")
    assert sorted(profile.columns.rank[steps].tolist()) == [0, 1, 2, 3]
    assert set(profile.columns.start_ns[steps].tolist()) == {0}
    assert profile.origin_wall_ns == WALL + 1000
    assert profile.end_ns == 5000
    assert profile.warnings() == [f"{two_node_profile / 'profile.json'}: no profile manifest"]


def test_damaged_rank_file_keeps_events_before_the_damage_and_reports_it(
    two_node_profile: Path,
) -> None:
    path = two_node_profile / "node-b" / "rank-3.trnprof"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 10])

    profile = load_profile(two_node_profile, workers=1)

    rank3 = profile.rank_info(3)
    assert rank3 is not None
    assert rank3.damage is not None
    assert "rank-3.trnprof" in rank3.damage
    assert any(note.startswith("rank 3:") for note in profile.warnings())


def test_parallel_and_serial_loading_give_identical_columns(tmp_path: Path) -> None:
    write_synthetic_profile(tmp_path, SyntheticSpec(nodes=2, ranks_per_node=2, kernels_per_step=8))

    serial = load_profile(tmp_path, workers=1).columns
    parallel = load_profile(tmp_path, workers=2).columns

    assert serial.names == parallel.names
    np.testing.assert_array_equal(serial.start_ns, parallel.start_ns)
    np.testing.assert_array_equal(serial.name, parallel.name)


def test_synthetic_profile_steps_line_up_across_nodes_despite_different_clocks(
    tmp_path: Path,
) -> None:
    spec = SyntheticSpec(
        nodes=2, ranks_per_node=2, kernels_per_step=8, steps=6, detailed_steps=(1, 3)
    )
    write_synthetic_profile(tmp_path, spec)

    rows = step_table(load_profile(tmp_path, workers=1).columns)

    assert [row.step for row in rows] == list(range(6))
    assert all(row.ranks == 4 for row in rows)
    # Per-rank skew in the generator is < 0.2 ms; misalignment would be seconds.
    assert all(row.end_ns - row.start_ns - row.max_ns < 1_000_000 for row in rows)


@pytest.fixture
def small_index(tmp_path: Path) -> TimelineIndex:
    spec = SyntheticSpec(
        nodes=2, ranks_per_node=2, kernels_per_step=16, steps=6, detailed_steps=(1, 3)
    )
    write_synthetic_profile(tmp_path, spec)
    return TimelineIndex(load_profile(tmp_path, workers=1))


def test_timeline_tree_is_node_then_rank_then_tracks(small_index: TimelineIndex) -> None:
    tree = small_index.tree()

    assert len(tree) == 2
    assert [rank["rank"] for rank in tree[0]["ranks"]] == [0, 1]
    kinds = [track["kind"] for track in tree[0]["ranks"][0]["tracks"]]
    assert kinds[0] == "steps"
    assert {"host", "device", "counter"} <= set(kinds)
    assert sum(track.event_count for track in small_index.tracks) == len(small_index.columns)


def test_window_returns_wide_events_whole_and_folds_narrow_ones(small_index: TimelineIndex) -> None:
    device = next(
        t for t in small_index.tracks if t.kind == "device" and t.label.endswith("compute")
    )
    end = small_index.profile.end_ns

    overview = small_index.window(0, end, 100, [device.id])["tracks"][0]
    zoomed_in = small_index.window(0, end, 1_000_000, [device.id])["tracks"][0]

    assert sum(overview["agg"]["count"]) + len(overview["ids"]) == device.event_count
    assert len(zoomed_in["ids"]) == device.event_count  # 1 px < any kernel at this width
    assert zoomed_in["agg"]["count"] == []


def test_window_only_returns_events_overlapping_it(small_index: TimelineIndex) -> None:
    host = next(t for t in small_index.tracks if t.kind == "host" and t.rows > 1)
    start, end = 200_000_000, 210_000_000

    track = small_index.window(start, end, 10_000, [host.id])["tracks"][0]

    for event_start, duration in zip(track["start"], track["dur"], strict=True):
        assert event_start < end
        assert event_start + duration > start


def test_event_detail_links_a_kernel_to_its_launch(small_index: TimelineIndex) -> None:
    kernel_position = int(np.flatnonzero(small_index.kind == EventKind.KERNEL)[0])

    detail = small_index.event(kernel_position)

    assert detail is not None
    assert detail["kind"] == "KERNEL"
    assert detail["linked"]["kind"] == "LAUNCH"
    assert detail["linked"]["launch_latency_ns"] > 0
    assert small_index.event(len(small_index.columns)) is None


def parse_trace(path: Path) -> object:
    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    return trace


def test_perfetto_export_parses_with_the_official_schema_and_keeps_every_event(
    small_index: TimelineIndex, tmp_path: Path
) -> None:
    result = export_perfetto(small_index, tmp_path / "trace.perfetto-trace")
    trace = parse_trace(result.path)

    packets = list(trace.packet)  # type: ignore[attr-defined]
    events = [p.track_event for p in packets if p.HasField("track_event")]
    types = Counter(pb.TrackEvent.Type.Name(e.type) for e in events)
    spans = int((small_index.columns.duration_ns > 0).sum())
    assert types["TYPE_SLICE_BEGIN"] == types["TYPE_SLICE_END"]
    assert (
        types["TYPE_COUNTER"]
        == result.counters
        == int(np.isin(small_index.columns.kind, [EventKind.CPU_UTIL, EventKind.MEMORY]).sum())
    )
    assert types["TYPE_SLICE_BEGIN"] + types["TYPE_INSTANT"] == result.slices
    assert types["TYPE_SLICE_BEGIN"] == spans
    assert result.bytes_written == result.path.stat().st_size


def test_perfetto_export_builds_a_node_process_tree_with_rank_tracks(
    small_index: TimelineIndex, tmp_path: Path
) -> None:
    trace = parse_trace(export_perfetto(small_index, tmp_path / "t.pftrace").path)

    descriptors = [p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")]  # type: ignore[attr-defined]
    processes = {d.uuid: d.process.process_name for d in descriptors if d.HasField("process")}
    assert sorted(processes.values()) == list(small_index.profile.nodes)
    children = [d for d in descriptors if not d.HasField("process")]
    assert all(d.parent_uuid in processes for d in children)
    threads = [d.thread.thread_name for d in children if d.HasField("thread")]
    assert "rank 0 · python main" in threads
    assert any(d.name == "rank 3 · NeuronCore 1 compute" for d in children)
    used = {p.track_event.track_uuid for p in trace.packet if p.HasField("track_event")}  # type: ignore[attr-defined]
    assert used <= {d.uuid for d in descriptors}


def test_perfetto_slices_nest_per_track_and_names_are_interned_before_use(
    small_index: TimelineIndex, tmp_path: Path
) -> None:
    trace = parse_trace(export_perfetto(small_index, tmp_path / "t.pftrace").path)

    defined: dict[int, set[int]] = {}
    open_slices: dict[int, list[int]] = {}
    last_time: dict[int, int] = {}
    for packet in trace.packet:  # type: ignore[attr-defined]
        if not packet.HasField("track_event"):
            continue
        sequence = packet.trusted_packet_sequence_id
        names = defined.setdefault(sequence, set())
        names.update(n.iid for n in packet.interned_data.event_names)
        event = packet.track_event
        assert packet.timestamp >= last_time.get(sequence, 0)
        last_time[sequence] = packet.timestamp
        stack = open_slices.setdefault(event.track_uuid, [])
        if event.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            assert event.name_iid in names
            stack.append(packet.timestamp)
        elif event.type == pb.TrackEvent.TYPE_SLICE_END:
            assert stack, "END without BEGIN"
            assert stack.pop() <= packet.timestamp
    assert all(not stack for stack in open_slices.values())


def test_perfetto_flows_join_each_launch_to_its_kernel(
    small_index: TimelineIndex, tmp_path: Path
) -> None:
    trace = parse_trace(export_perfetto(small_index, tmp_path / "t.pftrace").path)

    starts: set[int] = set()
    ends: set[int] = set()
    for packet in trace.packet:  # type: ignore[attr-defined]
        starts.update(packet.track_event.flow_ids)
        ends.update(packet.track_event.terminating_flow_ids)
    launches = int((small_index.columns.kind == EventKind.LAUNCH).sum())
    assert len(starts) == launches
    assert starts == ends
    assert flow_uuid(0, 1) in starts
    assert flow_uuid(1, 1) in starts


def test_perfetto_export_of_a_step_range_and_ranks_keeps_only_that(
    small_index: TimelineIndex, tmp_path: Path
) -> None:
    rows = {row.step: row for row in step_table(small_index.columns)}
    options = ExportOptions(first_step=2, last_step=2, ranks=frozenset({1}))

    result = export_perfetto(small_index, tmp_path / "t.pftrace", options)
    trace = parse_trace(result.path)

    assert result.window_ns == (rows[2].start_ns, rows[2].end_ns)
    origin = small_index.profile.origin_wall_ns
    times = [p.timestamp - origin for p in trace.packet if p.HasField("track_event")]  # type: ignore[attr-defined]
    assert times
    sequences = {p.trusted_packet_sequence_id for p in trace.packet if p.HasField("track_event")}  # type: ignore[attr-defined]
    assert sequences == {3}
    full = export_perfetto(small_index, tmp_path / "full.pftrace")
    assert result.slices < full.slices / 4
