"""The column layout of an EVENTS block's records (format 2.0): encoder and stdlib decoder.

    u8 0x80 (the layout mark) | zigzag varint base start | 9 columns, each one of
        dense:  u8 W | W byte planes of N bytes
        sparse: u8 0x80|W | N presence bytes (0 or 1) | W byte planes of K bytes

A column holds one unsigned integer per record, stored as byte planes: plane i holds byte i
(least significant first) of every value, and W is the fewest bytes the block's largest
value needs. Similar bytes thus stand together (the high planes of small numbers are runs of
zeros), which zlib compresses far better than interleaved records, and both encoding and
decoding run in C (`array`, slicing) rather than a Python loop per byte. A column that is
mostly zero (values, flows of host ranges) may be sparse: a presence byte per record, then
only its K non-zero values, so one wide value (a memory sample's byte count) does not widen
every record.

Columns, in order (minimum..maximum width):

    kind (1..1) | name: string id (1..8) | track: track id (1..8)
    | start: zigzag(start - previous record's start; the base for the first) (1..8)
    | duration (0..8) | flow: 0 = none, else zigzag(flow - previous flow in the block) + 1 (0..8)
    | value: zigzag (0..8) | precision (0..1) | depth (0..8)

The minimum widths make every record cost at least 4 bytes before compression, as in the
row layout of format 1.0, so the reader's bound on records per byte stays the same; only
columns whose minimum is 0 may be sparse. A
format 1.0 record area starts with a record's kind, always below 0x80, so the first byte
tells the two layouts apart.

This module knows nothing of strings and tracks: the writer maps them to ids first and the
reader maps ids back (and checks them).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import lshift, sub
from typing import Final

COLUMNS_LAYOUT: Final = 0x80
"""First byte of a record area in the column layout."""

COLUMN_WIDTHS: Final = (
    ("kind", 1, 1),
    ("name", 1, 8),
    ("track", 1, 8),
    ("start", 1, 8),
    ("duration", 0, 8),
    ("flow", 0, 8),
    ("value", 0, 8),
    ("precision", 0, 1),
    ("depth", 0, 8),
)
"""Each column's name and its minimum and maximum width in bytes, in wire order."""

MIN_RECORD_BYTES: Final = sum(low for _, low, _ in COLUMN_WIDTHS)
SPARSE: Final = 0x80
"""Flag in a column's width byte: only the non-zero values are stored."""
MAX_FLOW_ID: Final = (1 << 63) - 1
_UINT64_LIMIT = 1 << 64
_MAX_VARINT_BITS = 64

# array typecodes by the widest plane count they hold; sizes are fixed on every platform
# CPython supports ('I' is 4 bytes wherever int is 32 bits, which all of them are).
_TYPECODES: Final = ((1, "B"), (2, "H"), (4, "I"), (8, "Q"))
_BIG_ENDIAN = sys.byteorder == "big"


def _typecode(width: int) -> str:
    return next(code for size, code in _TYPECODES if size >= width)


# ---------------------------------------------------------------------------------------------
# Encoding


def zigzag_all(values: Sequence[int]) -> list[int]:
    """Signed 64-bit integers as unsigned ones, small magnitudes small (0, -1, 1, -2...)."""
    if min(values, default=0) >= 0:
        return list(map(lshift, values, repeat(1)))
    # Outside the signed 64-bit range the result falls outside 0..2^64-1 and packing refuses it.
    return [(v << 1) ^ (v >> 63) for v in values]


def start_deltas(starts: Sequence[int], base: int) -> list[int]:
    """Each start minus the one before it (the first minus `base`), zigzagged."""
    # map() stops at the shorter input: `starts` itself.
    return zigzag_all(list(map(sub, starts, [base, *starts])))


def flow_deltas(flows: Sequence[int]) -> list[int]:
    """The flow column (of flows that are not all zero): 0 for no flow, else
    zigzag(flow - the previous flow) + 1."""
    if min(flows) < 0 or max(flows) > MAX_FLOW_ID:
        raise ValueError(f"flow ids must be in 0..{MAX_FLOW_ID}")
    out: list[int] = []
    append = out.append
    previous = 0
    for flow in flows:
        if flow:
            delta = flow - previous
            previous = flow
            append(((delta << 1) ^ (delta >> 63)) + 1)
        else:
            append(0)
    return out


def _planes(values: Sequence[int], width: int) -> bytes:
    if width == 1:
        return bytes(values)
    packed = array(_typecode(width), values)
    if _BIG_ENDIAN:
        packed.byteswap()
    data = packed.tobytes()
    size = packed.itemsize
    return b"".join([data[i::size] for i in range(width)])


def pack_column(
    name: str,
    values: Sequence[int],
    min_width: int,
    max_width: int = 8,
    *,
    top: int | None = None,
    may_be_sparse: bool = False,
) -> bytes:
    """One column: its width byte and its byte planes (sparse when `may_be_sparse` and that
    is smaller). `top`: the largest value, when the caller knows it. Raises ValueError naming
    the column for a value that is negative or wider than `max_width` bytes."""
    if top is None:
        top = max(values, default=0)
    # A negative top has a bit length too: packing it below raises, as for any negative value.
    width = max((top.bit_length() + 7) >> 3, min_width)
    if width > max_width:
        raise ValueError(f"the {name} column cannot hold {top}: wider than {max_width} bytes")
    if width == 0:
        if values.count(0) != len(values):
            raise ValueError(f"the {name} column cannot hold {min(values)}: negative")
        return b"\x00"
    count = len(values)
    try:
        if may_be_sparse and width > 1:
            present = count - values.count(0)
            if count + present * width < count * width:
                nonzero = list(filter(None, values))
                return bytes((SPARSE | width,)) + bytes(map(bool, values)) + _planes(nonzero, width)
        return bytes((width,)) + _planes(values, width)
    except (OverflowError, ValueError) as exc:  # a negative value: array() and bytes() refuse it
        raise ValueError(f"the {name} column cannot hold {min(values)}: negative") from exc


_ZERO_COLUMN: Final = b"\x00"


def encode_area(
    *,
    kind: Sequence[int],
    name: Sequence[int],
    name_top: int,
    track: Sequence[int],
    track_top: int,
    start: Sequence[int],
    duration: Sequence[int],
    flow: Sequence[int],
    value: Sequence[int],
    precision: Sequence[int],
    depth: Sequence[int],
) -> bytes:
    """The record area of `len(kind)` records, given ids for names and tracks (and the
    largest id each could be)."""
    base = start[0] if start else 0
    zigzag_base = (base << 1) ^ (base >> 63)
    if not 0 <= zigzag_base < _UINT64_LIMIT:
        raise ValueError(f"start {base} is outside the signed 64-bit range")
    head = bytearray((COLUMNS_LAYOUT,))
    while zigzag_base > 0x7F:
        head.append((zigzag_base & 0x7F) | 0x80)
        zigzag_base >>= 7
    head.append(zigzag_base)
    # Columns that are all zero (flows, values and precision of host ranges) cost one byte.
    return b"".join(
        (
            bytes(head),
            pack_column("kind", kind, 1, 1),
            pack_column("name", name, 1, top=name_top),
            pack_column("track", track, 1, top=track_top),
            pack_column("start", start_deltas(start, base), 1),
            pack_column("duration", duration, 0),
            pack_column("flow", flow_deltas(flow), 0, may_be_sparse=True)
            if any(flow)
            else _ZERO_COLUMN,
            pack_column("value", zigzag_all(value), 0, may_be_sparse=True)
            if any(value)
            else _ZERO_COLUMN,
            pack_column("precision", precision, 0, 1) if any(precision) else _ZERO_COLUMN,
            pack_column("depth", depth, 0),
        )
    )


# ---------------------------------------------------------------------------------------------
# Decoding


@dataclass(frozen=True, slots=True)
class ColumnSpan:
    """Where one column is in the payload: its values' planes start at `offset`; a sparse
    column's presence bytes (one per record) start at `presence`, else `presence` is -1."""

    name: str
    offset: int
    width: int
    presence: int = -1
    present: int = 0  # how many values a sparse column stores


def column_spans(payload: bytes, offset: int, count: int) -> tuple[int, list[ColumnSpan]]:
    """The base start and the span of every column of the area at `offset`, which must end
    the payload. Raises ValueError with the reason for any width, length or byte that does
    not fit; nothing is allocated for a length before it is checked."""
    size = len(payload)
    if offset >= size or payload[offset] != COLUMNS_LAYOUT:
        raise ValueError("record area does not start with the column layout mark")
    pos = offset + 1
    base = 0
    shift = 0
    while True:
        if pos >= size:
            raise ValueError("record area ends inside its base start")
        byte = payload[pos]
        pos += 1
        base |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
        if shift >= _MAX_VARINT_BITS:
            raise ValueError("varint longer than 10 bytes")
    if base >= _UINT64_LIMIT:
        raise ValueError("base start outside the 64-bit range")
    spans: list[ColumnSpan] = []
    for name, low, high in COLUMN_WIDTHS:
        if pos >= size:
            raise ValueError(f"record area ends before its {name} column")
        tag = payload[pos]
        pos += 1
        width = tag & ~SPARSE
        if not low <= width <= high:
            raise ValueError(f"{name} column width {width} is outside {low}..{high}")
        if tag & SPARSE:
            if low or not width:
                raise ValueError(f"{name} column cannot be sparse")
            if count > size - pos:
                raise ValueError(
                    f"{name} column claims {count} presence bytes, but only {size - pos} remain"
                )
            presence = payload[pos : pos + count]
            absent = presence.count(0)
            if absent + presence.count(1) != count:
                raise ValueError(f"{name} column has presence bytes other than 0 and 1")
            span = ColumnSpan(name, pos + count, width, pos, count - absent)
            pos += count
            length = span.present * width
        else:
            span = ColumnSpan(name, pos, width)
            length = width * count
        if length > size - pos:
            raise ValueError(f"{name} column claims {length} bytes, but only {size - pos} remain")
        spans.append(span)
        pos += length
    if pos != size:
        raise ValueError(f"{size - pos} trailing bytes after the records")
    return (base >> 1) ^ -(base & 1), spans


def _plane_values(planes: bytes, width: int, count: int) -> list[int]:
    if width == 1:
        return list(planes)
    code = _typecode(width)
    size = array(code).itemsize
    interleaved = bytearray(size * count)
    for i in range(width):
        interleaved[i::size] = planes[i * count : (i + 1) * count]
    values = array(code)
    values.frombytes(interleaved)
    if _BIG_ENDIAN:
        values.byteswap()
    return values.tolist()


def column_values(payload: bytes, span: ColumnSpan, count: int) -> list[int]:
    """The unsigned values of one column, one per record (all zero for width 0)."""
    width = span.width
    if width == 0:
        return [0] * count
    stored = count if span.presence < 0 else span.present
    values = _plane_values(payload[span.offset : span.offset + width * stored], width, stored)
    if span.presence < 0:
        return values
    stored_values = iter(values)
    presence = payload[span.presence : span.presence + count]
    return [next(stored_values) if present else 0 for present in presence]


def unzigzag_all(values: list[int]) -> list[int]:
    return [(v >> 1) ^ -(v & 1) for v in values]


def starts_of(deltas: list[int], base: int) -> list[int]:
    """Absolute starts from the start column."""
    starts = list(accumulate(unzigzag_all(deltas), initial=base))
    del starts[0]
    return starts


def flows_of(column: list[int]) -> list[int]:
    """Flow ids from the flow column."""
    if not any(column):
        return column
    out: list[int] = []
    append = out.append
    previous = 0
    for stored in column:
        if stored:
            delta = stored - 1
            previous += (delta >> 1) ^ -(delta & 1)
            append(previous)
        else:
            append(0)
    return out
