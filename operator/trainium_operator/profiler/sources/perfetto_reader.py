"""A small reader of Perfetto TrackEvent traces (`.pftrace`), standard library only.

Neuron Explorer exports processed profiles to Perfetto with `--output-format perfetto`
(`system_profile.pftrace`, `device_profile_model_<id>.pftrace`); what Neuron puts on which
track is not documented, so this module reads only what the Perfetto format itself defines
(protos/perfetto/trace/: trace.proto, trace_packet.proto, track_event/*.proto):

- `Trace.packet = 1`; in a `TracePacket`: `timestamp = 8`, `trusted_packet_sequence_id = 10`,
  `track_event = 11`, `interned_data = 12`, `sequence_flags = 13`,
  `trace_packet_defaults = 59` (its `track_event_defaults = 11` -> `track_uuid = 11`),
  `track_descriptor = 60`;
- `TrackDescriptor`: `uuid = 1`, `name = 2`, `parent_uuid = 5`;
- `TrackEvent`: `type = 9` (1 slice begin, 2 slice end, 3 instant, 4 counter),
  `name_iid = 10`, `track_uuid = 11`, `name = 23`, `counter_value = 30`;
- `InternedData.event_names = 2` of `EventName {iid = 1, name = 2}`, scoped to the packet
  sequence and cleared by `SEQ_INCREMENTAL_STATE_CLEARED` (sequence flag 1).

Begin/end pairs become complete slices per track (the format nests them); an end without a
begin, or a begin never ended, is counted and dropped.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5

SLICE_BEGIN, SLICE_END, INSTANT, COUNTER = 1, 2, 3, 4
_SEQ_INCREMENTAL_STATE_CLEARED = 1


class PerfettoFormatError(ValueError):
    """Bytes that are not a Perfetto protobuf trace."""


@dataclass(frozen=True)
class Slice:
    track_uuid: int
    name: str
    start_ns: int
    duration_ns: int


@dataclass(frozen=True)
class CounterSample:
    track_uuid: int
    timestamp_ns: int
    value: float


@dataclass
class PerfettoTrace:
    track_names: dict[int, str] = field(default_factory=dict)
    track_parents: dict[int, int] = field(default_factory=dict)
    slices: list[Slice] = field(default_factory=list)
    counters: list[CounterSample] = field(default_factory=list)
    unmatched: int = 0  # slice ends without a begin, and begins never ended


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise PerfettoFormatError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise PerfettoFormatError("varint longer than 64 bits")


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of one message."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value, pos = _varint(data, pos)
        elif wire == _FIXED64:
            value = struct.unpack_from("<Q", data, pos)[0] if pos + 8 <= len(data) else -1
            pos += 8
        elif wire == _LENGTH:
            length, pos = _varint(data, pos)
            value = data[pos : pos + length]
            pos += length
        elif wire == _FIXED32:
            value = struct.unpack_from("<I", data, pos)[0] if pos + 4 <= len(data) else -1
            pos += 4
        else:
            raise PerfettoFormatError(f"unsupported wire type {wire} (field {number})")
        if pos > len(data) or number == 0:
            raise PerfettoFormatError("truncated or malformed message")
        yield number, wire, value


def _message(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise PerfettoFormatError("expected an embedded message")
    return value


def _text(value: int | bytes) -> str:
    return _message(value).decode("utf-8", errors="replace")


def _int(value: int | bytes) -> int:
    if isinstance(value, bytes):
        raise PerfettoFormatError("expected an integer field")
    return value


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _default_track(defaults: bytes) -> int | None:
    for number, _, value in fields(defaults):
        if number == 11:  # track_event_defaults
            for inner, _, uuid in fields(_message(value)):
                if inner == 11:
                    return _int(uuid)
    return None


def read_trace(data: bytes) -> PerfettoTrace:
    """Tracks, slices and counters of a TrackEvent trace (PerfettoFormatError if malformed)."""
    trace = PerfettoTrace()
    names: dict[int, dict[int, str]] = {}  # sequence -> iid -> name
    default_track: dict[int, int] = {}  # sequence -> track uuid
    edges: list[tuple[int, int, int, str]] = []  # (track, timestamp, begin/end, name)
    for number, _, packet_value in fields(data):
        if number != 1:
            continue
        packet = _message(packet_value)
        timestamp = 0
        sequence = 0
        event: bytes | None = None
        for field_number, _, value in fields(packet):
            if field_number == 8:
                timestamp = _int(value)
            elif field_number == 10:
                sequence = _int(value)
            elif field_number == 11:
                event = _message(value)
            elif field_number == 13 and _int(value) & _SEQ_INCREMENTAL_STATE_CLEARED:
                names.pop(sequence, None)
            elif field_number == 12:
                interned = names.setdefault(sequence, {})
                for kind, _, entry in fields(_message(value)):
                    if kind == 2:
                        iid, name = 0, ""
                        for part, _, item in fields(_message(entry)):
                            if part == 1:
                                iid = _int(item)
                            elif part == 2:
                                name = _text(item)
                        interned[iid] = name
            elif field_number == 59:
                track = _default_track(_message(value))
                if track is not None:
                    default_track[sequence] = track
            elif field_number == 60:
                uuid, name, parent = 0, "", 0
                for part, _, item in fields(_message(value)):
                    if part == 1:
                        uuid = _int(item)
                    elif part == 2:
                        name = _text(item)
                    elif part == 5:
                        parent = _int(item)
                trace.track_names[uuid] = name
                if parent:
                    trace.track_parents[uuid] = parent
        if event is not None:
            interned = names.get(sequence, {})
            _add_event(
                trace,
                edges,
                event,
                timestamp,
                interned=interned,
                default_track=default_track.get(sequence),
            )
    _pair_slices(trace, edges)
    return trace


def _add_event(
    trace: PerfettoTrace,
    edges: list[tuple[int, int, int, str]],
    event: bytes,
    timestamp: int,
    *,
    interned: dict[int, str],
    default_track: int | None,
) -> None:
    kind, track, name, counter = INSTANT, default_track or 0, "", 0.0
    for number, wire, value in fields(event):
        if number == 9:
            kind = _int(value)
        elif number == 11:
            track = _int(value)
        elif number == 10:
            name = interned.get(_int(value), name)
        elif number == 23:
            name = _text(value)
        elif number == 30 and wire == _VARINT:
            counter = float(_signed(_int(value)))
        elif number == 44 and wire == _FIXED64:
            counter = struct.unpack("<d", struct.pack("<Q", _int(value)))[0]
    if kind == COUNTER:
        trace.counters.append(CounterSample(track, timestamp, counter))
    elif kind == INSTANT:
        trace.slices.append(Slice(track, name, timestamp, 0))
    else:
        edges.append((track, timestamp, kind, name))


def _pair_slices(trace: PerfettoTrace, edges: list[tuple[int, int, int, str]]) -> None:
    """Begin/end pairs as complete slices: per track a stack, since slices nest."""
    stacks: dict[int, list[tuple[str, int]]] = {}
    for track, timestamp, kind, name in edges:  # in file order, as Perfetto requires
        stack = stacks.setdefault(track, [])
        if kind == SLICE_BEGIN:
            stack.append((name, timestamp))
        elif stack:
            begun, start = stack.pop()
            trace.slices.append(Slice(track, begun or name, start, max(timestamp - start, 0)))
        else:
            trace.unmatched += 1
    trace.unmatched += sum(len(stack) for stack in stacks.values())
    trace.slices.sort(key=lambda s: (s.track_uuid, s.start_ns))
