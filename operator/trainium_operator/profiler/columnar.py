"""Vectorised decoding of a rank file's EVENTS blocks straight into numpy columns.

A record area in the column layout (format 2.0, `record_columns`) maps onto numpy directly:
each column's byte planes are one (width x N) array, combined into 64-bit values, then
prefix-summed (starts, flows) or gathered (tracks).

For the row layout of format 1.0, the row decoder in `format` walks every byte in Python
(about 3 us per event). Here the records of a block are decoded in bulk: every byte of the
record area belongs to a varint (kind, field mask and precision are single bytes below 0x80,
which read as one-byte varints), so all varints are split and assembled with numpy at once; a
short Python loop then only steps from record to record by the length its field mask implies,
and each field is gathered, forward-filled (tracks) or prefix-summed (start and flow deltas)
per column. Either way the result is identical to the row decoder's, which the tests check.

Imported by the analysis layer only: the capture path in training pods never needs numpy
decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from trainium_operator.profiler import record_columns
from trainium_operator.profiler.events import HOST_DEVICE, EventKind, Precision
from trainium_operator.profiler.format import RECORD_OPTIONAL_FIELDS

_FIXED_FIELDS = 4  # kind, mask, name id, start delta
_MAX_VARINT_BYTES = 10
_MASK_LIMIT = 0x80
_ALL_FIELD_BITS = sum(bit for _, bit in RECORD_OPTIONAL_FIELDS)
_RECORD_VARINTS = [_FIXED_FIELDS + bin(mask & _ALL_FIELD_BITS).count("1") for mask in range(128)]
_POPCOUNT = np.array([bin(m).count("1") for m in range(_MASK_LIMIT)], dtype=np.int64)
_VALID_KINDS = np.array(sorted(int(k) for k in EventKind), dtype=np.uint64)
_VALID_PRECISIONS = np.array(sorted(int(p) for p in Precision), dtype=np.uint64)


@dataclass(frozen=True)
class RecordColumns:
    """One block's (or one rank's) events as columns; `name` indexes the file's strings."""

    kind: npt.NDArray[np.uint8]
    name: npt.NDArray[np.int32]
    start_ns: npt.NDArray[np.int64]  # on the rank's monotonic clock
    duration_ns: npt.NDArray[np.int64]
    thread_id: npt.NDArray[np.int64]
    device: npt.NDArray[np.int32]
    flow_id: npt.NDArray[np.uint64]
    value: npt.NDArray[np.int64]
    precision: npt.NDArray[np.uint8]
    depth: npt.NDArray[np.int32]

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    @classmethod
    def concatenate(cls, batches: Sequence[RecordColumns]) -> RecordColumns:
        if not batches:
            return empty_record_columns()
        return cls(
            **{f.name: np.concatenate([getattr(b, f.name) for b in batches]) for f in fields(cls)}
        )


def empty_record_columns() -> RecordColumns:
    return RecordColumns(
        kind=np.zeros(0, np.uint8),
        name=np.zeros(0, np.int32),
        start_ns=np.zeros(0, np.int64),
        duration_ns=np.zeros(0, np.int64),
        thread_id=np.zeros(0, np.int64),
        device=np.zeros(0, np.int32),
        flow_id=np.zeros(0, np.uint64),
        value=np.zeros(0, np.int64),
        precision=np.zeros(0, np.uint8),
        depth=np.zeros(0, np.int32),
    )


def _unzigzag(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    result: npt.NDArray[np.int64] = (values >> np.uint64(1)).astype(np.int64) ^ -(
        values & np.uint64(1)
    ).astype(np.int64)
    return result


def _varints(area: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint64]:
    """Every varint in `area`, which must end with a complete one."""
    last_byte = area < 0x80
    if not last_byte[-1]:
        raise ValueError("records end inside a varint")
    ends = np.flatnonzero(last_byte)
    begins = np.empty_like(ends)
    begins[0] = 0
    begins[1:] = ends[:-1] + 1
    lengths = ends - begins + 1
    if int(lengths.max()) > _MAX_VARINT_BYTES:
        raise ValueError("varint longer than 10 bytes")
    shift = (np.arange(area.size) - np.repeat(begins, lengths)) * 7
    parts = (area & 0x7F).astype(np.uint64) << shift.astype(np.uint64)
    values: npt.NDArray[np.uint64] = np.add.reduceat(parts, begins)
    return values


def decode_record_columns(
    payload: bytes,
    records_offset: int,
    count: int,
    string_count: int,
    tracks: Sequence[tuple[int, int]],
) -> RecordColumns:
    """Decodes the `count` records at `records_offset` of an EVENTS block payload, in either
    layout (the area's first byte says which).

    Raises ValueError or IndexError for records that do not decode, as the row decoder does.
    """
    columns = count and records_offset < len(payload)
    if columns and payload[records_offset] == record_columns.COLUMNS_LAYOUT:
        return _decode_column_layout(payload, records_offset, count, string_count, tracks)
    area = np.frombuffer(payload, dtype=np.uint8, offset=records_offset)
    if count == 0:
        if area.size:
            raise ValueError(f"{area.size} trailing bytes after the records")
        return empty_record_columns()
    if area.size == 0:
        raise ValueError("records missing")
    values = _varints(area)

    # Step from record to record: its field mask says how many varints it holds.
    as_list = values.tolist()
    lengths = _RECORD_VARINTS
    record_starts = [0] * count
    position = 0
    for i in range(count):
        record_starts[i] = position
        position += lengths[as_list[position + 1]]
    if position != len(as_list):
        raise ValueError(
            "trailing bytes after the records"
            if position < len(as_list)
            else "records run past the block"
        )
    first = np.array(record_starts, dtype=np.int64)

    kind = values[first]
    if not np.isin(kind, _VALID_KINDS).all():
        raise ValueError(f"unknown event kind {int(kind[~np.isin(kind, _VALID_KINDS)][0])}")
    mask = values[first + 1].astype(np.int64)
    name = values[first + 2]
    if count and int(name.max()) >= string_count:
        raise IndexError(f"string id {int(name.max())} out of range")
    start = np.cumsum(_unzigzag(values[first + 3]))

    optional: dict[str, tuple[npt.NDArray[np.bool_], npt.NDArray[np.uint64]]] = {}
    for field_name, bit in RECORD_OPTIONAL_FIELDS:
        present = (mask & bit) != 0
        where = first + _FIXED_FIELDS + _POPCOUNT[mask & (bit - 1)]
        optional[field_name] = (present, np.where(present, values[np.where(present, where, 0)], 0))

    zero = np.uint64(0)
    has_track, track_index = optional["track"]
    if has_track.any() and int(track_index[has_track].max()) >= len(tracks):
        raise IndexError(f"track id {int(track_index[has_track].max())} out of range")
    # A record without a track field continues the previous record's track.
    last_with_track = np.maximum.accumulate(np.where(has_track, np.arange(count), -1))
    track_thread = np.array([t for t, _ in tracks] or [0], dtype=np.int64)
    track_device = np.array([d for _, d in tracks] or [0], dtype=np.int64)
    carried = track_index[np.maximum(last_with_track, 0)].astype(np.int64)
    thread_id = np.where(last_with_track >= 0, track_thread[carried], 0)
    device = np.where(last_with_track >= 0, track_device[carried], HOST_DEVICE)

    has_flow, flow_delta = optional["flow"]
    flow = np.where(has_flow, np.cumsum(np.where(has_flow, _unzigzag(flow_delta), 0)), 0)

    has_precision, precision = optional["precision"]
    if not np.isin(precision[has_precision], _VALID_PRECISIONS).all():
        raise ValueError("unknown precision")

    has_value, raw_value = optional["value"]
    return RecordColumns(
        kind=kind.astype(np.uint8),
        name=name.astype(np.int32),
        start_ns=start,
        duration_ns=optional["duration"][1].astype(np.int64),
        thread_id=thread_id,
        device=device.astype(np.int32),
        flow_id=flow.astype(np.int64).view(np.uint64),
        value=np.where(has_value, _unzigzag(raw_value), 0),
        precision=np.where(has_precision, precision, zero).astype(np.uint8),
        depth=optional["depth"][1].astype(np.int32),
    )


def _column(payload: bytes, span: record_columns.ColumnSpan, count: int) -> npt.NDArray[np.uint64]:
    """One column's values: its byte planes, least significant first, combined."""
    stored = count if span.presence < 0 else span.present
    values = np.zeros(stored, dtype=np.uint64)
    planes = np.frombuffer(payload, dtype=np.uint8, count=span.width * stored, offset=span.offset)
    for i, plane in enumerate(planes.reshape(span.width, stored)):
        values |= plane.astype(np.uint64) << np.uint64(8 * i)
    if span.presence < 0:
        return values
    present = np.frombuffer(payload, dtype=np.uint8, count=count, offset=span.presence) != 0
    full = np.zeros(count, dtype=np.uint64)
    full[present] = values
    return full


def _decode_column_layout(
    payload: bytes,
    records_offset: int,
    count: int,
    string_count: int,
    tracks: Sequence[tuple[int, int]],
) -> RecordColumns:
    base, spans = record_columns.column_spans(payload, records_offset, count)
    kind, name, track, start, duration, flow, value, precision, depth = (
        _column(payload, span, count) for span in spans
    )
    if not np.isin(kind, _VALID_KINDS).all():
        raise ValueError(f"unknown event kind {int(kind[~np.isin(kind, _VALID_KINDS)].min())}")
    if int(name.max()) >= string_count:
        raise ValueError(f"string id {int(name.max())} out of range")
    if int(track.max()) >= len(tracks):
        raise ValueError(f"track id {int(track.max())} out of range")
    if not np.isin(precision, _VALID_PRECISIONS).all():
        raise ValueError("unknown precision")
    track_index = track.astype(np.int64)
    track_thread = np.array([t for t, _ in tracks], dtype=np.int64)
    track_device = np.array([d for _, d in tracks], dtype=np.int64)
    has_flow = flow != 0
    flow_delta = _unzigzag(flow[has_flow] - np.uint64(1))
    flows = np.zeros(count, dtype=np.uint64)
    flows[has_flow] = np.cumsum(flow_delta).view(np.uint64)
    return RecordColumns(
        kind=kind.astype(np.uint8),
        name=name.astype(np.int32),
        start_ns=np.cumsum(_unzigzag(start)) + np.int64(base),
        duration_ns=duration.astype(np.int64),
        thread_id=track_thread[track_index],
        device=track_device[track_index].astype(np.int32),
        flow_id=flows,
        value=_unzigzag(value),
        precision=precision.astype(np.uint8),
        depth=depth.astype(np.int32),
    )
