"""Export a loaded profile as a Perfetto TrackEvent protobuf trace (opens in ui.perfetto.dev).

Written with a small hand-rolled protobuf encoder (field numbers from Perfetto's
`perfetto_trace.proto`; the tests parse the output back with Perfetto's own generated
schema), streaming packet by packet, so a million events need neither the protobuf runtime
nor the whole trace in memory.

Track tree: one process per node (named after the node) holding, per rank, a thread track
per host thread and custom tracks for the step markers, each NeuronCore queue and the CPU /
memory counters. Slices are BEGIN/END pairs (the native format has no complete events);
launch -> execution arrows are flows (`flow_ids` on the launch, `terminating_flow_ids` on
the device execution). Names are interned per rank sequence.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from trainium_operator.analysis.columns import I64
from trainium_operator.analysis.stats import step_table
from trainium_operator.analysis.timeline import TimelineIndex, Track
from trainium_operator.profiler.events import EventKind, Precision

# Field numbers (perfetto/protos/perfetto/trace/...).
_TRACE_PACKET = 1
_PKT_TIMESTAMP = 8
_PKT_SEQUENCE_ID = 10
_PKT_TRACK_EVENT = 11
_PKT_INTERNED_DATA = 12
_PKT_SEQUENCE_FLAGS = 13
_PKT_TRACK_DESCRIPTOR = 60
_PKT_FIRST_ON_SEQUENCE = 87
_TD_UUID = 1
_TD_NAME = 2
_TD_PROCESS = 3
_TD_THREAD = 4
_TD_PARENT_UUID = 5
_TD_COUNTER = 8
_TD_CHILD_ORDERING = 11
_TD_SIBLING_ORDER_RANK = 12
_PD_PID = 1
_PD_PROCESS_NAME = 6
_THD_PID = 1
_THD_TID = 2
_THD_THREAD_NAME = 5
_CD_UNIT_NAME = 6
_TE_DEBUG_ANNOTATIONS = 4
_TE_TYPE = 9
_TE_NAME_IID = 10
_TE_TRACK_UUID = 11
_TE_DOUBLE_COUNTER_VALUE = 44
_TE_FLOW_IDS = 47
_TE_TERMINATING_FLOW_IDS = 48
_DA_UINT_VALUE = 3
_DA_STRING_VALUE = 6
_DA_NAME = 10
_ID_EVENT_NAMES = 2
_EN_IID = 1
_EN_NAME = 2

_TYPE_SLICE_BEGIN = 1
_TYPE_SLICE_END = 2
_TYPE_INSTANT = 3
_TYPE_COUNTER = 4
_SEQ_INCREMENTAL_STATE_CLEARED = 1
_SEQ_NEEDS_INCREMENTAL_STATE = 2
_CHILD_ORDERING_EXPLICIT = 3

_WIRE_VARINT = 0
_WIRE_FIXED64 = 1
_WIRE_LEN = 2

_DESCRIPTOR_SEQUENCE = 1  # track descriptors; rank r's events use sequence r + 2
_FLOW_RANK_SHIFT = 44


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint((field << 3) | wire)


def _uint(field: int, value: int) -> bytes:
    return _tag(field, _WIRE_VARINT) + _varint(value)


def _fixed64(field: int, value: int) -> bytes:
    return _tag(field, _WIRE_FIXED64) + int(value).to_bytes(8, "little")


def _double(field: int, value: float) -> bytes:
    return _tag(field, _WIRE_FIXED64) + np.float64(value).tobytes()


def _bytes(field: int, payload: bytes) -> bytes:
    return _tag(field, _WIRE_LEN) + _varint(len(payload)) + payload


def _string(field: int, text: str) -> bytes:
    return _bytes(field, text.encode("utf-8"))


def _packet(payload: bytes) -> bytes:
    return _bytes(_TRACE_PACKET, payload)


@dataclass(frozen=True)
class ExportOptions:
    first_step: int | None = None
    last_step: int | None = None
    ranks: frozenset[int] | None = None


@dataclass(frozen=True)
class ExportResult:
    path: Path
    bytes_written: int
    slices: int
    counters: int
    flows: int
    tracks: int
    window_ns: tuple[int, int]


def flow_uuid(rank: int, flow_id: int) -> int:
    """Trace-wide flow id: rank files number their flows independently."""
    return ((rank + 1) << _FLOW_RANK_SHIFT) | (flow_id & ((1 << _FLOW_RANK_SHIFT) - 1))


def export_window(index: TimelineIndex, options: ExportOptions) -> tuple[int, int]:
    """Profile-timeline window covering the chosen steps (the whole profile by default)."""
    start, end = 0, index.profile.end_ns
    if options.first_step is None and options.last_step is None:
        return start, end
    rows = step_table(index.columns)
    chosen = [
        row
        for row in rows
        if (options.first_step is None or row.step >= options.first_step)
        and (options.last_step is None or row.step <= options.last_step)
    ]
    if not chosen:
        raise ValueError("no step markers in the chosen step range")
    return min(row.start_ns for row in chosen), max(row.end_ns for row in chosen)


class _Sequence:
    """Per-rank packet sequence: interning state for event names."""

    def __init__(self, sequence_id: int) -> None:
        self.id_field = _uint(_PKT_SEQUENCE_ID, sequence_id)
        self.interned: dict[int, int] = {}
        self.started = False

    def wrap(self, timestamp: int, event: bytes, name_id: int, names: tuple[str, ...]) -> bytes:
        """One packet; interns `name_id` (when >= 0) on first use, in emission order."""
        interned = b""
        if name_id >= 0:
            iid = self.interned.get(name_id)
            if iid is None:
                iid = len(self.interned) + 1
                self.interned[name_id] = iid
                entry = _uint(_EN_IID, iid) + _string(_EN_NAME, names[name_id])
                interned = _bytes(_PKT_INTERNED_DATA, _bytes(_ID_EVENT_NAMES, entry))
            event += _uint(_TE_NAME_IID, iid)
        body = _uint(_PKT_TIMESTAMP, timestamp) + _bytes(_PKT_TRACK_EVENT, event) + self.id_field
        body += interned
        if not self.started:
            self.started = True
            flags = _SEQ_INCREMENTAL_STATE_CLEARED | _SEQ_NEEDS_INCREMENTAL_STATE
            body += _uint(_PKT_SEQUENCE_FLAGS, flags) + _uint(_PKT_FIRST_ON_SEQUENCE, 1)
        else:
            body += _uint(_PKT_SEQUENCE_FLAGS, _SEQ_NEEDS_INCREMENTAL_STATE)
        return _packet(body)


# (time on the profile timeline, TrackEvent fields except the name, name id or -1)
_Pending = tuple[int, bytes, int]


class PerfettoExporter:
    def __init__(self, index: TimelineIndex, options: ExportOptions | None = None) -> None:
        self.index = index
        self.options = options or ExportOptions()
        self.window = export_window(index, self.options)
        self.origin = index.profile.origin_wall_ns
        self.slices = 0
        self.counters = 0
        self.flows = 0
        self.track_count = 0

    # ------------------------------------------------------------------ descriptors

    def _uuid(self, track: Track, row: int = 0) -> int:
        return ((track.id + 1) << 5) | row

    def _node_uuid(self, node: int) -> int:
        return (1 << 62) | (node + 1)

    def _descriptor(self, payload: bytes) -> bytes:
        self.track_count += 1
        return _packet(
            _bytes(_PKT_TRACK_DESCRIPTOR, payload) + _uint(_PKT_SEQUENCE_ID, _DESCRIPTOR_SEQUENCE)
        )

    def _descriptors(self, tracks: list[Track]) -> Iterator[bytes]:
        profile = self.index.profile
        for node in sorted({track.node for track in tracks}):
            process = _uint(_PD_PID, node + 1) + _string(_PD_PROCESS_NAME, profile.nodes[node])
            yield self._descriptor(
                _uint(_TD_UUID, self._node_uuid(node))
                + _bytes(_TD_PROCESS, process)
                + _uint(_TD_CHILD_ORDERING, _CHILD_ORDERING_EXPLICIT)
            )
        for order, track in enumerate(tracks):
            for row in self._rows_of(track):
                yield self._descriptor(self._track_descriptor(track, row, order))

    def _rows_of(self, track: Track) -> range:
        # Host rows nest on one track; overlapping device work gets its own track per row.
        return range(track.rows) if track.kind == "device" else range(1)

    def _track_descriptor(self, track: Track, row: int, order: int) -> bytes:
        label = f"rank {track.rank} · {track.label}" + (f" (overlap {row})" if row else "")
        body = _uint(_TD_UUID, self._uuid(track, row)) + _uint(
            _TD_PARENT_UUID, self._node_uuid(track.node)
        )
        if track.kind == "host":
            thread = (
                _uint(_THD_PID, track.node + 1)
                + _uint(_THD_TID, self._tid(track))
                + _string(_THD_THREAD_NAME, label)
            )
            body += _bytes(_TD_THREAD, thread)
        else:
            body += _string(_TD_NAME, label)
        if track.kind == "counter":
            body += _bytes(_TD_COUNTER, _string(_CD_UNIT_NAME, track.unit) if track.unit else b"")
        return body + _uint(_TD_SIBLING_ORDER_RANK, order * 4 + row)

    def _tid(self, track: Track) -> int:
        # Ranks reuse small thread ids; Perfetto wants a tid to name one thread.
        return 1_000_000 + track.id

    # ------------------------------------------------------------------ events

    def _positions(self, track: Track) -> I64:
        index = self.index
        first = int(index.track_start[track.id])
        last = int(index.track_end[track.id])
        start, end = self.window
        positions = np.arange(first, last, dtype=np.int64)
        keep = (index.end[positions] >= start) & (index.start[positions] <= end)
        return positions[keep]

    def _slice_packets(self, track: Track, row: int) -> Iterator[_Pending]:
        """Slices of one track row in time order, as a proper tree (what BEGIN/END needs)."""
        index = self.index
        columns = index.columns
        positions = self._positions(track)
        rows = index.depth[positions]
        lane = positions if track.kind != "device" else positions[rows == row]
        # Parents begin before their children at equal starts: longest first.
        lane = lane[np.lexsort((-index.duration[lane], index.start[lane]))]
        track_field = _uint(_TE_TRACK_UUID, self._uuid(track, row))
        open_ends: list[int] = []
        for position in lane.tolist():
            start = int(index.start[position])
            while open_ends and open_ends[-1] <= start:
                yield self._end(open_ends.pop(), track_field)
            column = int(index.order[position])
            duration = int(index.duration[position])
            end = start + duration
            if open_ends and end > open_ends[-1]:
                end = open_ends[-1]  # improperly nested input: clip to stay a tree
            event = track_field + self._annotations(column) + self._flow(column)
            name_id = int(columns.name[column])
            self.slices += 1
            if duration == 0:
                yield start, _uint(_TE_TYPE, _TYPE_INSTANT) + event, name_id
                continue
            yield start, _uint(_TE_TYPE, _TYPE_SLICE_BEGIN) + event, name_id
            open_ends.append(end)
        while open_ends:
            yield self._end(open_ends.pop(), track_field)

    def _end(self, end: int, track_field: bytes) -> _Pending:
        return end, _uint(_TE_TYPE, _TYPE_SLICE_END) + track_field, -1

    def _annotations(self, column: int) -> bytes:
        columns = self.index.columns
        kind = int(columns.kind[column])
        value = int(columns.value[column])
        out = b""
        if kind == EventKind.STEP:
            out += _bytes(
                _TE_DEBUG_ANNOTATIONS, _string(_DA_NAME, "step") + _uint(_DA_UINT_VALUE, value)
            )
        elif kind in (EventKind.MEMCPY, EventKind.COLLECTIVE) and value:
            out += _bytes(
                _TE_DEBUG_ANNOTATIONS, _string(_DA_NAME, "bytes") + _uint(_DA_UINT_VALUE, value)
            )
        precision = int(columns.precision[column])
        if precision:
            out += _bytes(
                _TE_DEBUG_ANNOTATIONS,
                _string(_DA_NAME, "precision")
                + _string(_DA_STRING_VALUE, Precision(precision).name),
            )
        return out

    def _flow(self, column: int) -> bytes:
        index = self.index
        position = int(index.sorted_position[column])
        if index.partner[position] < 0:
            return b""
        columns = index.columns
        flow = flow_uuid(int(columns.rank[column]), int(columns.flow_id[column]))
        if int(columns.kind[column]) == EventKind.LAUNCH:
            self.flows += 1
            return _fixed64(_TE_FLOW_IDS, flow)
        return _fixed64(_TE_TERMINATING_FLOW_IDS, flow)

    def _counter_packets(self, track: Track) -> Iterator[_Pending]:
        index = self.index
        positions = self._positions(track)
        values = index.columns.value[index.order[positions]].astype(np.float64)
        if track.unit == "cores":
            values /= 1000.0
        track_field = _uint(_TE_TRACK_UUID, self._uuid(track))
        counter_type = _uint(_TE_TYPE, _TYPE_COUNTER)
        for start, value in zip(index.start[positions].tolist(), values.tolist(), strict=True):
            self.counters += 1
            yield start, counter_type + track_field + _double(_TE_DOUBLE_COUNTER_VALUE, value), -1

    def packets(self) -> Iterator[bytes]:
        tracks = [
            track
            for track in self.index.tracks
            if self.options.ranks is None or track.rank in self.options.ranks
        ]
        yield from self._descriptors(tracks)
        by_rank: dict[int, list[Track]] = {}
        for track in tracks:
            by_rank.setdefault(track.rank, []).append(track)
        origin = self.origin
        names = self.index.columns.names
        for rank, rank_tracks in sorted(by_rank.items()):
            sequence = _Sequence(rank + 2)
            streams: list[Iterator[_Pending]] = [
                self._counter_packets(track) for track in rank_tracks if track.kind == "counter"
            ]
            streams += [
                self._slice_packets(track, row)
                for track in rank_tracks
                if track.kind != "counter"
                for row in self._rows_of(track)
            ]
            # Names are interned when a packet is emitted, so merging tracks by time can never
            # emit a use of a name before its definition.
            for start, event, name_id in heapq.merge(*streams, key=lambda item: item[0]):
                yield sequence.wrap(origin + start, event, name_id, names)

    def write(self, out: BinaryIO) -> int:
        written = 0
        buffer: list[bytes] = []
        size = 0
        for packet in self.packets():
            buffer.append(packet)
            size += len(packet)
            if size >= 1 << 20:
                out.write(b"".join(buffer))
                written += size
                buffer, size = [], 0
        out.write(b"".join(buffer))
        return written + size


def export_perfetto(
    index: TimelineIndex, destination: str | os.PathLike[str], options: ExportOptions | None = None
) -> ExportResult:
    exporter = PerfettoExporter(index, options)
    path = Path(destination)
    temporary = path.with_name(path.name + ".partial")
    with open(temporary, "wb") as out:
        written = exporter.write(out)
    temporary.replace(path)
    return ExportResult(
        path=path,
        bytes_written=written,
        slices=exporter.slices,
        counters=exporter.counters,
        flows=exporter.flows,
        tracks=exporter.track_count,
        window_ns=exporter.window,
    )
