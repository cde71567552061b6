"""The compact per-rank profile file (`rank-<RANK>.trnprof`): writer and streaming reader.

Layout (all integers little-endian):

    file header   magic b"\\x89TRNPRF\\n" | u16 major | u16 minor | u32 json length | u32 crc32
                  | json (the RankHeader as written at start)
    block*        b"BK" | u8 type | u8 codec | u32 stored length | u32 raw length
                  | u32 crc32(type..raw length + stored bytes) | stored bytes

Block types: EVENTS (a self-contained batch of records), SYNC (clock sync points), END (final
counts; its absence means the writer did not finish). Unknown block types are skipped, so a
newer minor version stays readable; a major version this reader does not know is refused.

An EVENTS payload introduces the strings and tracks it uses for the first time (ids are
global to the file), then the record count and the record area. The writer (format 2.0)
writes the area in the column layout of `record_columns`: a base start, then each field of
every record as one column of byte planes (about 11 bytes per record before compression and
3.5 after, against 8.4 and 5.3 for format 1.0 on the same torch.profiler window). The reader
also reads format 1.0, whose area holds one record after another:

    u8 kind | u8 field mask | varint name id | zigzag varint start delta
    | [varint track] [varint duration] [zigzag flow delta] [zigzag value] [u8 precision]
    | [varint depth]

where the delta is against the previous record's start and absent fields mean "zero" (or,
for the track, "same as the previous record"). The area's first byte tells the layouts
apart. In both, deltas restart at every block, so any block decodes with only the string and
track tables that precede it; damage therefore loses the damaged block and what follows,
never what came before.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import IO, Any, Final, TypeVar

from trainium_operator.profiler import record_columns
from trainium_operator.profiler.clock import ClockSyncPoint
from trainium_operator.profiler.events import HOST_DEVICE, Event, EventKind, Precision

MAGIC: Final = b"\x89TRNPRF\n"
FORMAT_MAJOR: Final = 2
FORMAT_MINOR: Final = 0
FORMAT_VERSION: Final = (FORMAT_MAJOR, FORMAT_MINOR)
"""What the writer writes: 2.0, the column layout of records."""
READABLE_MAJORS: Final = (1, 2)
"""Major versions the reader reads: 1.x files keep loading after the writer moved on."""
RANK_FILE_SUFFIX: Final = ".trnprof"

BLOCK_EVENTS: Final = 1
BLOCK_SYNC: Final = 2
BLOCK_END: Final = 3

CODEC_NONE: Final = 0
CODEC_ZLIB: Final = 1

DEFAULT_BLOCK_EVENTS: Final = 32768
"""Records per EVENTS block: bounds the reader's memory and the data lost to one bad block."""

# Bounds the reader enforces before it allocates anything a file asks for. A rank file is
# untrusted input (the UI reads files that training pods of any tenant wrote), so every
# count and length read from one is checked against what the remaining bytes could hold and
# against these caps; a file that exceeds one is refused as corrupt, never allocated.
MAX_HEADER_BYTES: Final = 16 << 20
"""The header JSON (identity, step window, sources, `extra`): a few hundred bytes in practice."""
MAX_BLOCK_STORED_BYTES: Final = 64 << 20
"""One block as stored. The writer's largest (32768 records) is about 1 MiB compressed."""
MAX_BLOCK_RAW_BYTES: Final = 64 << 20
"""One block decompressed: decompression stops here (the block's declared size, at most)."""
MAX_BLOCK_RECORDS: Final = 1 << 20
"""Records in one EVENTS block: the writer refuses `block_events` above it (default 32768)."""
MAX_INFLATION_RATIO: Final = 32
INFLATION_ALLOWANCE_BYTES: Final = 8 << 20
"""A file decompresses to at most MAX_INFLATION_RATIO x its size + INFLATION_ALLOWANCE_BYTES
(checked against the declared sizes before decompressing), so what a reader holds stays
proportional to the bytes on disk; zlib alone allows about 1000x (a "zip bomb"). Measured in
format 2.0: realistic events inflate 2-3x (a training loop's host capture 2.5x, a torch.profiler
window 3.1x, the UI benchmark's synthetic profile 3.1x; in 1.0, 1.5-2x). Only synthetic runs
with no timing jitter compress much better (step markers 4 ms apart to the nanosecond 290x,
identical records 740x); those fit in the allowance up to about 760,000 step markers or 2
million identical records."""
MAX_RANK: Final = 1 << 20
"""Ranks and world sizes above this are corruption: readers index arrays by rank."""
MAX_VARINT_BITS: Final = 64
"""Every varint field is a 64-bit quantity; a longer one is corruption (and a run of
continuation bytes would otherwise build an ever larger integer, quadratically)."""
INT64_MAX: Final = (1 << 63) - 1

_FILE_PREFIX = struct.Struct("<8sHHII")
_BLOCK_HEADER = struct.Struct("<2sBBIII")
_BLOCK_MARK = b"BK"
_MIN_RECORD_BYTES = 4  # kind, mask, name id, start delta: one byte each at least
_MIN_TRACK_BYTES = 3  # thread id, device, name id
_MIN_SYNC_POINT_BYTES = 3  # monotonic, wall, uncertainty

# Field-mask bits of one record.
_HAS_TRACK = 0x01
_HAS_DURATION = 0x02
_HAS_FLOW = 0x04
_HAS_VALUE = 0x08
_HAS_PRECISION = 0x10
_HAS_DEPTH = 0x20
RECORD_OPTIONAL_FIELDS: Final = (
    ("track", _HAS_TRACK),
    ("duration", _HAS_DURATION),
    ("flow", _HAS_FLOW),
    ("value", _HAS_VALUE),
    ("precision", _HAS_PRECISION),
    ("depth", _HAS_DEPTH),
)
"""The optional fields of a record in wire order, with their field-mask bits."""

_KINDS: Final = {int(k): k for k in EventKind}
_PRECISIONS: Final = {int(p): p for p in Precision}


class ProfileFormatError(ValueError):
    """A rank file cannot be read past some byte offset; says which file and where."""

    def __init__(self, path: str | os.PathLike[str], offset: int, reason: str) -> None:
        self.path = os.fspath(path)
        self.offset = offset
        self.reason = reason
        super().__init__(f"{self.path}: byte {offset}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Crosses process boundaries (loading decodes rank files in worker processes); the
        # default would call cls(message) and fail on the missing arguments.
        return (type(self), (self.path, self.offset, self.reason))


class TruncatedProfileError(ProfileFormatError):
    """The file ends in the middle of its header or a block (or before its END block)."""


class CorruptProfileError(ProfileFormatError):
    """Bytes that fail a checksum or do not decode."""


class UnsupportedVersionError(ProfileFormatError):
    """The file was written by an incompatible (different major) format version."""


class NotAProfileError(ProfileFormatError):
    """The file does not start with the rank-file magic."""


@dataclass(frozen=True)
class RankHeader:
    """Identity of the rank that wrote a file, and what the reader learned from the file.

    The writer stores everything at start; `clock_sync`, `dropped_events`, `event_count` and
    `complete` are completed by the reader from the SYNC and END blocks.
    """

    rank: int
    world_size: int = 1
    local_rank: int = 0
    group_rank: int = 0
    node: str = ""
    hostname: str = ""
    pid: int = 0
    job_name: str = ""
    namespace: str = ""
    job_uid: str = ""
    attempt: int = 0
    step_window: tuple[int, int] | None = None
    sources: tuple[str, ...] = ()
    clock_sync: tuple[ClockSyncPoint, ...] = ()
    dropped_events: int = 0
    event_count: int = 0
    complete: bool = False
    format_version: tuple[int, int] = FORMAT_VERSION
    extra: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RankProfile:
    """A whole rank file in memory. `damage` is set when a lenient read stopped early."""

    path: Path
    header: RankHeader
    events: list[Event]
    track_names: dict[tuple[int, int], str]
    damage: ProfileFormatError | None = None


def header_to_json(header: RankHeader) -> dict[str, Any]:
    data = dataclasses.asdict(header)
    data["clock_sync"] = [[p.monotonic_ns, p.wall_ns, p.uncertainty_ns] for p in header.clock_sync]
    data["step_window"] = list(header.step_window) if header.step_window else None
    data["sources"] = list(header.sources)
    data["format_version"] = list(header.format_version)
    data["extra"] = dict(header.extra)
    return data


def int_field(name: str, value: Any, low: int = 0, high: int = INT64_MAX) -> int:
    """`value` if it is an integer in [low, high]; raises ValueError naming the field."""
    # bool is an int subclass; JSON true is not a rank.
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], not {value!r:.80}")
    return value


def str_field(name: str, value: Any) -> str:
    """`value` if it is a string; raises ValueError naming the field."""
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, not {type(value).__name__}")
    return value


def _list_field(name: str, value: Any, length: int | None = None) -> list[Any]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        shape = f"a list of {length}" if length is not None else "a list"
        raise ValueError(f"{name} must be {shape}, not {value!r:.80}")
    return value


def header_from_json(data: Any) -> RankHeader:
    """The RankHeader in `data`; raises ValueError naming the field that has the wrong shape
    (readers index arrays by rank and do arithmetic on the clock points, so each is checked)."""
    if not isinstance(data, Mapping):
        raise ValueError("header is not a JSON object")
    values: dict[str, Any] = {}
    for name in ("rank", "world_size", "local_rank", "group_rank"):
        if name in data:
            values[name] = int_field(name, data[name], 0, MAX_RANK)
    if "rank" not in values:
        raise ValueError("header has no rank")
    for name in ("pid", "attempt", "dropped_events", "event_count"):
        if name in data:
            values[name] = int_field(name, data[name])
    for name in ("node", "hostname", "job_name", "namespace", "job_uid"):
        if name in data:
            values[name] = str_field(name, data[name])
    window = data.get("step_window")
    if window is not None:
        first, last = _list_field("step_window", window, 2)
        values["step_window"] = (
            int_field("step_window", first, -INT64_MAX),
            int_field("step_window", last, -INT64_MAX),
        )
    values["clock_sync"] = tuple(
        ClockSyncPoint(
            *(
                int_field("clock_sync", number, -INT64_MAX)
                for number in _list_field("clock_sync point", point, 3)
            )
        )
        for point in _list_field("clock_sync", data.get("clock_sync", []))
    )
    values["sources"] = tuple(
        str_field("sources", source) for source in _list_field("sources", data.get("sources", []))
    )
    if "complete" in data:
        if not isinstance(data["complete"], bool):
            raise ValueError("complete must be true or false")
        values["complete"] = data["complete"]
    major, minor = _list_field("format_version", data.get("format_version", [*FORMAT_VERSION]), 2)
    values["format_version"] = (
        int_field("format_version", major, 0, 0xFFFF),
        int_field("format_version", minor, 0, 0xFFFF),
    )
    extra = data.get("extra", {})
    if not isinstance(extra, Mapping):
        raise ValueError("extra must be a JSON object")
    values["extra"] = {str(key): str_field(f"extra[{key!r:.40}]", v) for key, v in extra.items()}
    return RankHeader(**values)


# ---------------------------------------------------------------------------------------------
# Varints


def _put_varint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _zigzag(value: int) -> int:
    return (value << 1) if value >= 0 else ((-value << 1) - 1)


def _unzigzag(value: int) -> int:
    return (value >> 1) if not value & 1 else -((value + 1) >> 1)


class _Cursor:
    """Reads varints and bytes from one block payload; raises IndexError past the end and
    ValueError for a varint longer than 64 bits."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def varint(self) -> int:
        data = self.data
        pos = self.pos
        byte = data[pos]
        pos += 1
        if byte < 0x80:
            self.pos = pos
            return byte
        result = byte & 0x7F
        shift = 7
        while True:
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos
                return result
            shift += 7
            if shift >= MAX_VARINT_BITS:
                raise ValueError("varint longer than 10 bytes")

    def count(self, what: str, min_bytes: int, cap: int) -> int:
        """A count of items of at least `min_bytes` each, checked against the bytes left
        and `cap` before anyone allocates or loops for it."""
        value = self.varint()
        remaining = len(self.data) - self.pos
        if value * min_bytes > remaining:
            raise ValueError(f"{value} {what} claimed, but only {remaining} bytes remain")
        if value > cap:
            raise ValueError(f"{value} {what} claimed, more than the limit of {cap}")
        return value

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise IndexError(f"{n} bytes claimed, but only {len(self.data) - self.pos} remain")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk


# ---------------------------------------------------------------------------------------------
# Writer


class _Tables:
    """The file's interned strings and tracks; each block carries the entries it adds."""

    def __init__(self) -> None:
        self.string_ids: dict[str, int] = {"": 0}
        self.track_ids: dict[tuple[int, int], int] = {}
        self.track_names: dict[tuple[int, int], str] = {}
        self.new_strings: list[str] = []
        self.new_tracks: list[tuple[int, int, int]] = []

    def string(self, text: str) -> int:
        sid = self.string_ids.get(text)
        if sid is None:
            sid = len(self.string_ids)
            self.string_ids[text] = sid
            self.new_strings.append(text)
        return sid

    def track(self, thread_id: int, device: int) -> int:
        key = (thread_id, device)
        tid = self.track_ids.get(key)
        if tid is None:
            tid = len(self.track_ids)
            self.track_ids[key] = tid
            name_id = self.string(self.track_names.get(key, ""))
            self.new_tracks.append((thread_id, device, name_id))
        return tid

    def string_ids_of(self, names: Sequence[str]) -> list[int]:
        get = self.string_ids.get
        ids = list(map(get, names))
        if None in ids:
            for text in dict.fromkeys(names):  # each distinct name once, in order
                self.string(text)
            ids = list(map(get, names))
        return ids  # type: ignore[return-value]  # every name is interned now

    def track_ids_of(self, thread_ids: Sequence[int], devices: Sequence[int]) -> list[int]:
        count = len(thread_ids)
        if (
            count
            and thread_ids.count(thread_ids[0]) == count
            and devices.count(devices[0]) == count
        ):
            return [self.track(thread_ids[0], devices[0])] * count  # one track: the usual case
        get = self.track_ids.get
        ids = list(map(get, zip(thread_ids, devices, strict=True)))
        if None in ids:
            for thread_id, device in dict.fromkeys(zip(thread_ids, devices, strict=True)):
                self.track(thread_id, device)
            ids = list(map(get, zip(thread_ids, devices, strict=True)))
        return ids  # type: ignore[return-value]  # every track has an id now

    def encode(self, count: int) -> bytearray:
        """The block's new strings and tracks and its record count, then forget them."""
        out = bytearray()
        _put_varint(out, len(self.new_strings))
        for text in self.new_strings:
            raw = text.encode("utf-8")
            _put_varint(out, len(raw))
            out += raw
        _put_varint(out, len(self.new_tracks))
        for thread_id, device, name_id in self.new_tracks:
            _put_varint(out, _zigzag(thread_id))
            _put_varint(out, _zigzag(device))
            _put_varint(out, name_id)
        _put_varint(out, count)
        self.new_strings.clear()
        self.new_tracks.clear()
        return out


Row = tuple[int, str, int, int, int, int, int, int, int, int]
"""An event as a plain tuple in Event's field order: (kind, name, start_ns, duration_ns,
thread_id, device, flow_id, value, precision, depth). The capture path builds these directly
from its ring records; constructing frozen Event objects there would cost several times more."""


@dataclass(frozen=True, slots=True)
class EventBatch:
    """Events as columns in `Row` field order, one list per field: what the writer encodes.

    Built from rows by `batch_of_rows`, or directly by the capture path, which then never
    builds a tuple per event."""

    kind: list[int]
    name: list[str]
    start_ns: list[int]
    duration_ns: list[int]
    thread_id: list[int]
    device: list[int]
    flow_id: list[int]
    value: list[int]
    precision: list[int]
    depth: list[int]

    def __len__(self) -> int:
        return len(self.kind)

    def columns(self) -> tuple[list[Any], ...]:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def part(self, first: int, end: int) -> EventBatch:
        return EventBatch(*(column[first:end] for column in self.columns()))

    @classmethod
    def concatenate(cls, batches: Sequence[EventBatch]) -> EventBatch:
        if len(batches) == 1:
            return batches[0]
        return cls(
            *(
                list(chain.from_iterable(c))
                for c in zip(*(b.columns() for b in batches), strict=True)
            )
        )


def batch_of_rows(rows: Sequence[Row]) -> EventBatch:
    if not rows:
        return EventBatch([], [], [], [], [], [], [], [], [], [])
    return EventBatch(*map(list, zip(*rows, strict=True)))


BatchT = TypeVar("BatchT", bound=Sized)
RecordDecoder = Callable[[bytes, int, int], BatchT]
"""Decodes the records of one EVENTS block: (payload, records offset, record count). The
record area at the offset is in either layout: its first byte tells which."""


event_row: Callable[[Event], Row] = operator.attrgetter(
    "kind",
    "name",
    "start_ns",
    "duration_ns",
    "thread_id",
    "device",
    "flow_id",
    "value",
    "precision",
    "depth",
)

row_track_order: Callable[[Row], tuple[int, int, int]] = operator.itemgetter(5, 4, 2)
"""Sort key grouping rows by track, then time: fewer track switches and small deltas."""


def encode_batch_payload(tables: _Tables, batch: EventBatch) -> bytes:
    """Encode one EVENTS block payload (uncompressed), updating the file's tables."""
    durations = batch.duration_ns
    if min(durations, default=0) < 0:
        at = next(i for i, d in enumerate(durations) if d < 0)
        raise ValueError(f"negative duration in event {batch.name[at]!r} at {batch.start_ns[at]}")
    names = tables.string_ids_of(batch.name)
    tracks = tables.track_ids_of(batch.thread_id, batch.device)
    area = record_columns.encode_area(
        kind=batch.kind,
        name=names,
        name_top=len(tables.string_ids) - 1,
        track=tracks,
        track_top=len(tables.track_ids) - 1,
        start=batch.start_ns,
        duration=durations,
        flow=batch.flow_id,
        value=batch.value,
        precision=batch.precision,
        depth=batch.depth,
    )
    head = tables.encode(len(batch))
    head += area
    return bytes(head)


def encode_rows_payload(tables: _Tables, rows: Sequence[Row]) -> bytes:
    """Encode one EVENTS block payload (uncompressed), updating the file's tables."""
    return encode_batch_payload(tables, batch_of_rows(rows))


def encode_events_payload(tables: _Tables, events: Sequence[Event]) -> bytes:
    """Encode one EVENTS block payload (uncompressed), updating the file's tables."""
    return encode_rows_payload(tables, [event_row(e) for e in events])


class RankFileWriter:
    """Streams one rank's events into a rank file, block by block.

    Not thread-safe: the profiler drives it from its single flusher thread. Every block is
    flushed to the OS as soon as it is written, so a crash loses at most the unwritten tail.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        header: RankHeader,
        *,
        codec: int = CODEC_ZLIB,
        compression_level: int = 6,
        block_events: int = DEFAULT_BLOCK_EVENTS,
    ) -> None:
        if codec not in (CODEC_NONE, CODEC_ZLIB):
            raise ValueError(f"unknown codec {codec}")
        if not 0 < block_events <= MAX_BLOCK_RECORDS:
            raise ValueError(
                f"block_events must be in 1..{MAX_BLOCK_RECORDS} (readers refuse more)"
            )
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._codec = codec
        self._level = compression_level
        self._block_events = block_events
        self._tables = _Tables()
        self._file: IO[bytes] | None = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self.event_count = 0
        self.raw_bytes = 0  # encoded record bytes before compression, for size reporting
        header_json = json.dumps(header_to_json(header), separators=(",", ":")).encode("utf-8")
        prefix = _FILE_PREFIX.pack(
            MAGIC, FORMAT_MAJOR, FORMAT_MINOR, len(header_json), zlib.crc32(header_json)
        )
        self._write(prefix + header_json)

    def name_track(self, thread_id: int, device: int, name: str) -> None:
        """Give a track (thread, device stream) a display name; call before its first event."""
        self._tables.track_names[(thread_id, device)] = name

    def write_events(self, events: Sequence[Event]) -> None:
        self.write_rows([event_row(e) for e in events])

    def write_rows(self, rows: Sequence[Row]) -> None:
        """Write events given as `Row` tuples, in blocks of at most `block_events`."""
        for start in range(0, len(rows), self._block_events):
            self.write_batch(batch_of_rows(rows[start : start + self._block_events]))

    def write_batch(self, batch: EventBatch) -> None:
        """Write events given as columns, in blocks of at most `block_events`."""
        size = self._block_events
        for start in range(0, len(batch), size):
            chunk = batch if len(batch) <= size else batch.part(start, start + size)
            payload = encode_batch_payload(self._tables, chunk)
            self.raw_bytes += len(payload)
            self.event_count += len(chunk)
            self._write_block(BLOCK_EVENTS, payload)

    def write_sync_points(self, points: Iterable[ClockSyncPoint]) -> None:
        out = bytearray()
        pts = list(points)
        _put_varint(out, len(pts))
        for p in pts:
            _put_varint(out, p.monotonic_ns)
            _put_varint(out, p.wall_ns)
            _put_varint(out, p.uncertainty_ns)
        self._write_block(BLOCK_SYNC, bytes(out))

    def close(self, *, dropped_events: int = 0) -> None:
        """Write the END block and close; the file is `complete` only after this."""
        if self._file is None:
            return
        end = {"dropped_events": dropped_events, "event_count": self.event_count}
        self._write_block(BLOCK_END, json.dumps(end).encode("utf-8"))
        self._file.close()
        self._file = None

    def __enter__(self) -> RankFileWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _write_block(self, block_type: int, payload: bytes) -> None:
        codec = self._codec
        stored = zlib.compress(payload, self._level) if codec == CODEC_ZLIB else payload
        meta = struct.pack("<BBII", block_type, codec, len(stored), len(payload))
        crc = zlib.crc32(stored, zlib.crc32(meta))
        self._write(_BLOCK_MARK + meta + struct.pack("<I", crc) + stored)

    def _write(self, data: bytes) -> None:
        if self._file is None:
            raise ValueError(f"{self.path}: writer is closed")
        self._file.write(data)
        self._file.flush()


def write_rank_file(
    path: str | os.PathLike[str],
    header: RankHeader,
    events: Iterable[Event],
    *,
    track_names: Mapping[tuple[int, int], str] | None = None,
    codec: int = CODEC_ZLIB,
    dropped_events: int | None = None,
) -> int:
    """Write a complete rank file in one go; returns its size in bytes."""
    with RankFileWriter(path, header, codec=codec) as writer:
        for (thread_id, device), name in (track_names or {}).items():
            writer.name_track(thread_id, device, name)
        batch: list[Event] = []
        for ev in events:
            batch.append(ev)
            if len(batch) >= DEFAULT_BLOCK_EVENTS:
                writer.write_events(batch)
                batch = []
        writer.write_events(batch)
        writer.close(
            dropped_events=header.dropped_events if dropped_events is None else dropped_events
        )
    return Path(path).stat().st_size


# ---------------------------------------------------------------------------------------------
# Reader


class RankFileReader:
    """Reads a rank file block by block.

    `header` is available after construction (it raises for a bad magic, a version mismatch
    or a damaged header). Iterating `events()` yields every record of every good block and then
    raises a ProfileFormatError at the first damage; `clock_sync`, `dropped_events` and
    `complete` reflect the blocks read so far.
    """

    def __init__(self, path: str | os.PathLike[str], file: IO[bytes] | None = None) -> None:
        """`file`: an already open file to read instead of opening `path` (which then only
        names it in errors); closed with the reader."""
        self.path = Path(path)
        self._file: IO[bytes] = file or open(self.path, "rb")  # noqa: SIM115 - closed in close()
        try:
            # Every length in the file is checked against the bytes that are really there.
            self._size = os.fstat(self._file.fileno()).st_size
            self._inflated = 0
            self._initial_header = self._read_header()
        except BaseException:
            self._file.close()
            raise
        self.clock_sync: list[ClockSyncPoint] = list(self._initial_header.clock_sync)
        self.dropped_events = 0
        self.end_event_count = 0
        self.complete = False
        self.events_read = 0
        self.strings: list[str] = [""]
        self.tracks: list[tuple[int, int]] = []
        self.track_names: dict[tuple[int, int], str] = {}

    @property
    def header(self) -> RankHeader:
        return dataclasses.replace(
            self._initial_header,
            clock_sync=tuple(self.clock_sync),
            dropped_events=self.dropped_events,
            event_count=self.end_event_count if self.complete else self.events_read,
            complete=self.complete,
        )

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RankFileReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _error(self, cls: type[ProfileFormatError], offset: int, reason: str) -> ProfileFormatError:
        return cls(self.path, offset, reason)

    def _read_header(self) -> RankHeader:
        prefix = self._file.read(_FILE_PREFIX.size)
        if len(prefix) < len(MAGIC) or prefix[: len(MAGIC)] != MAGIC[: len(prefix)]:
            raise self._error(NotAProfileError, 0, "not a trainium profile rank file (bad magic)")
        if len(prefix) < _FILE_PREFIX.size:
            raise self._error(TruncatedProfileError, len(prefix), "file ends inside its header")
        _, major, minor, length, crc = _FILE_PREFIX.unpack(prefix)
        if major not in READABLE_MAJORS:
            readable = " and ".join(f"{m}.x" for m in READABLE_MAJORS)
            raise self._error(
                UnsupportedVersionError,
                len(MAGIC),
                f"format version {major}.{minor} is not supported by this reader "
                f"(reads {readable})",
            )
        if length > MAX_HEADER_BYTES:
            raise self._error(
                CorruptProfileError,
                len(MAGIC) + 4,
                f"header length {length} exceeds the limit of {MAX_HEADER_BYTES} bytes",
            )
        present = self._bytes_from(_FILE_PREFIX.size, length)
        if length > present:
            raise self._error(
                TruncatedProfileError,
                _FILE_PREFIX.size + present,
                f"file ends inside its header ({present} of {length} bytes present)",
            )
        body = self._file.read(length)
        if len(body) < length:
            raise self._error(
                TruncatedProfileError, _FILE_PREFIX.size + len(body), "file ends inside its header"
            )
        if zlib.crc32(body) != crc:
            raise self._error(CorruptProfileError, _FILE_PREFIX.size, "header checksum mismatch")
        try:
            data = json.loads(body)
            header = header_from_json(data)
        except (ValueError, TypeError, RecursionError) as exc:
            # UnicodeDecodeError and JSONDecodeError are ValueErrors; deep nesting recurses.
            raise self._error(
                CorruptProfileError, _FILE_PREFIX.size, f"bad header: {exc!s:.200}"
            ) from exc
        return dataclasses.replace(header, format_version=(major, minor))

    def blocks(self) -> Iterator[tuple[int, int, bytes]]:
        """Yield (offset, type, payload) for each intact block; raise at the first damage."""
        f = self._file
        end_seen = False
        while True:
            offset = f.tell()
            head = f.read(_BLOCK_HEADER.size)
            if not head:
                if not end_seen:
                    raise self._error(
                        TruncatedProfileError,
                        offset,
                        "file ends without its END block (writer still running or crashed)",
                    )
                return
            if len(head) < _BLOCK_HEADER.size:
                raise self._error(TruncatedProfileError, offset, "file ends inside a block header")
            mark, block_type, codec, stored_len, raw_len, crc = _BLOCK_HEADER.unpack(head)
            if mark != _BLOCK_MARK:
                raise self._error(CorruptProfileError, offset, "block marker missing")
            if stored_len > MAX_BLOCK_STORED_BYTES or raw_len > MAX_BLOCK_RAW_BYTES:
                raise self._error(
                    CorruptProfileError,
                    offset,
                    f"implausible block length ({stored_len} stored, {raw_len} raw; limits "
                    f"{MAX_BLOCK_STORED_BYTES} and {MAX_BLOCK_RAW_BYTES})",
                )
            present = self._bytes_from(offset + _BLOCK_HEADER.size, stored_len)
            if stored_len > present:
                raise self._error(
                    TruncatedProfileError,
                    offset,
                    f"file ends inside a block ({present} of {stored_len} bytes present)",
                )
            self._inflated += raw_len
            if self._inflated > MAX_INFLATION_RATIO * self._size + INFLATION_ALLOWANCE_BYTES:
                raise self._error(
                    CorruptProfileError,
                    offset,
                    f"blocks decompress to more than {MAX_INFLATION_RATIO}x the file's "
                    f"{self._size} bytes (a decompression bomb, not a profile)",
                )
            stored = f.read(stored_len)
            if len(stored) < stored_len:
                raise self._error(
                    TruncatedProfileError,
                    offset,
                    f"file ends inside a block ({len(stored)} of {stored_len} bytes present)",
                )
            if zlib.crc32(stored, zlib.crc32(head[2:12])) != crc:
                raise self._error(CorruptProfileError, offset, "block checksum mismatch")
            if codec == CODEC_ZLIB:
                payload = self._inflate(stored, raw_len, offset)
            elif codec == CODEC_NONE:
                payload = stored
            else:
                raise self._error(CorruptProfileError, offset, f"unknown codec {codec}")
            if len(payload) != raw_len:
                raise self._error(CorruptProfileError, offset, "block size mismatch")
            end_seen = end_seen or block_type == BLOCK_END
            yield offset, block_type, payload

    def _bytes_from(self, offset: int, wanted: int) -> int:
        """How many bytes the file holds from `offset` (at least `wanted` if it has them). A
        file still being written may have grown since it was opened: look again first."""
        if self._size - offset < wanted:
            self._size = os.fstat(self._file.fileno()).st_size
        return max(self._size - offset, 0)

    def _inflate(self, stored: bytes, raw_len: int, offset: int) -> bytes:
        """The block's zlib data, decompressed to at most its declared `raw_len` bytes."""
        inflater = zlib.decompressobj()
        try:
            # max_length 0 would mean "unbounded": one byte more than declared shows excess.
            payload = inflater.decompress(stored, raw_len + 1)
        except zlib.error as exc:
            raise self._error(CorruptProfileError, offset, f"bad zlib data: {exc}") from exc
        if len(payload) > raw_len or inflater.unconsumed_tail:
            raise self._error(
                CorruptProfileError,
                offset,
                f"block decompresses past its declared {raw_len} bytes",
            )
        if not inflater.eof or inflater.unused_data:
            raise self._error(
                CorruptProfileError, offset, "bad zlib data: incomplete stream or trailing bytes"
            )
        return payload

    def events(self) -> Iterator[Event]:
        """Every event, block by block; raises ProfileFormatError at the first damage."""
        kinds = _KINDS
        precisions = _PRECISIONS
        for rows in self.row_blocks():
            for kind, name, start, dur, tid, dev, flow, value, prec, depth in rows:
                yield Event(
                    kinds[kind], name, start, dur, tid, dev, flow, value, precisions[prec], depth
                )

    def rows(self) -> Iterator[Row]:
        """Every event as a plain `Row` tuple: 3-4x cheaper than `events()` for bulk analysis."""
        for rows in self.row_blocks():
            yield from rows

    def row_blocks(self) -> Iterator[list[Row]]:
        """The rows of each EVENTS block in turn (SYNC and END blocks update the reader)."""
        return self.decoded_blocks(self._decode_rows)

    def decoded_blocks(self, decode: RecordDecoder[BatchT]) -> Iterator[BatchT]:
        """Each EVENTS block decoded by `decode(payload, records_offset, record_count)`, after
        the block's new strings and tracks are added to `strings` and `tracks`. A decoder that
        raises IndexError/ValueError marks the block corrupt, like the built-in one."""
        for offset, block_type, payload in self.blocks():
            try:
                if block_type == BLOCK_EVENTS:
                    records_offset, count = self._decode_tables(payload)
                    batch = decode(payload, records_offset, count)
                elif block_type == BLOCK_SYNC:
                    self._decode_sync(payload)
                    continue
                elif block_type == BLOCK_END:
                    self._decode_end(payload)
                    continue
                else:
                    continue  # a block type from a newer minor version
            except (IndexError, ValueError, KeyError, TypeError, ArithmeticError) as exc:
                # Also what a caller's decoder raises (numpy: ValueError/IndexError/OverflowError).
                raise self._error(
                    CorruptProfileError, offset, f"undecodable block: {exc!r:.300}"
                ) from exc
            except RecursionError as exc:
                raise self._error(
                    CorruptProfileError, offset, "undecodable block: too deep"
                ) from exc
            self.events_read += len(batch)
            yield batch

    def _decode_end(self, payload: bytes) -> None:
        end = json.loads(payload)
        if not isinstance(end, dict):
            raise ValueError("END block is not a JSON object")
        self.dropped_events = int_field("dropped_events", end.get("dropped_events", 0))
        self.end_event_count = int_field("event_count", end.get("event_count", self.events_read))
        self.complete = True

    def _decode_sync(self, payload: bytes) -> None:
        cur = _Cursor(payload)
        for _ in range(cur.count("sync points", _MIN_SYNC_POINT_BYTES, len(payload))):
            point = ClockSyncPoint(cur.varint(), cur.varint(), cur.varint())
            if max(point.monotonic_ns, point.wall_ns, point.uncertainty_ns) > INT64_MAX:
                raise ValueError("clock sync point outside the 64-bit range")
            self.clock_sync.append(point)

    def _decode_tables(self, payload: bytes) -> tuple[int, int]:
        """Adds the block's new strings and tracks; returns (records offset, record count)."""
        cur = _Cursor(payload)
        varint = cur.varint
        strings = self.strings
        for _ in range(cur.count("strings", 1, len(payload))):
            strings.append(cur.take(varint()).decode("utf-8"))
        tracks = self.tracks
        for _ in range(cur.count("tracks", _MIN_TRACK_BYTES, len(payload))):
            thread_id = _unzigzag(varint())
            device = _unzigzag(varint())
            name = strings[varint()]
            tracks.append((thread_id, device))
            if name:
                self.track_names[(thread_id, device)] = name
        count = cur.count("records", _MIN_RECORD_BYTES, MAX_BLOCK_RECORDS)
        return cur.pos, count

    def _decode_rows(self, payload: bytes, records_offset: int, count: int) -> list[Row]:
        if count and payload[records_offset] == record_columns.COLUMNS_LAYOUT:
            return self._decode_column_rows(payload, records_offset, count)
        return self._decode_record_rows(payload, records_offset, count)

    def _decode_column_rows(self, payload: bytes, records_offset: int, count: int) -> list[Row]:
        """Rows of a record area in the column layout (format 2.0)."""
        base, spans = record_columns.column_spans(payload, records_offset, count)
        kinds, names, tracks, starts, durations, flows, values, precisions, depths = (
            record_columns.column_values(payload, span, count) for span in spans
        )
        unknown = set(kinds).difference(_KINDS)
        if unknown:
            raise ValueError(f"unknown event kind {min(unknown)}")
        if max(names) >= len(self.strings):
            raise ValueError(f"string id {max(names)} out of range")
        if max(tracks) >= len(self.tracks):
            raise ValueError(f"track id {max(tracks)} out of range")
        if not set(precisions).issubset(_PRECISIONS):
            raise ValueError("unknown precision")
        thread_of = [thread_id for thread_id, _ in self.tracks]
        device_of = [device for _, device in self.tracks]
        return list(
            zip(
                kinds,
                map(self.strings.__getitem__, names),
                record_columns.starts_of(starts, base),
                durations,
                map(thread_of.__getitem__, tracks),
                map(device_of.__getitem__, tracks),
                record_columns.flows_of(flows),
                record_columns.unzigzag_all(values) if any(values) else values,
                precisions,
                depths,
                strict=True,
            )
        )

    def _decode_record_rows(self, payload: bytes, records_offset: int, count: int) -> list[Row]:
        """Rows of a record area in the row layout (format 1.0)."""
        cur = _Cursor(payload)
        cur.pos = records_offset
        varint = cur.varint
        strings = self.strings
        tracks = self.tracks
        data = payload
        pos = records_offset
        kinds = _KINDS
        precisions = _PRECISIONS
        out: list[Row] = []
        append = out.append
        prev_start = 0
        prev_flow = 0
        thread_id, device = 0, HOST_DEVICE

        # Varints are decoded inline: a call per field would double the cost of a record.
        for _ in range(count):
            kind = data[pos]
            if kind not in kinds:
                raise ValueError(f"unknown event kind {kind}")
            mask = data[pos + 1]
            pos += 2
            # name id
            byte = data[pos]
            pos += 1
            if byte < 0x80:
                name = strings[byte]
            else:
                value = byte & 0x7F
                shift = 7
                while True:
                    byte = data[pos]
                    pos += 1
                    value |= (byte & 0x7F) << shift
                    if byte < 0x80:
                        break
                    shift += 7
                    if shift >= MAX_VARINT_BITS:
                        raise ValueError("varint longer than 10 bytes")
                name = strings[value]
            # start delta
            value = 0
            shift = 0
            while True:
                byte = data[pos]
                pos += 1
                value |= (byte & 0x7F) << shift
                if byte < 0x80:
                    break
                shift += 7
                if shift >= MAX_VARINT_BITS:
                    raise ValueError("varint longer than 10 bytes")
            prev_start += (value >> 1) if not value & 1 else -((value + 1) >> 1)
            duration = flow = val = depth = precision = 0
            if mask:
                cur.pos = pos
                if mask & _HAS_TRACK:
                    thread_id, device = tracks[varint()]
                if mask & _HAS_DURATION:
                    duration = varint()
                if mask & _HAS_FLOW:
                    delta = varint()
                    prev_flow += (delta >> 1) if not delta & 1 else -((delta + 1) >> 1)
                    flow = prev_flow
                if mask & _HAS_VALUE:
                    val = _unzigzag(varint())
                if mask & _HAS_PRECISION:
                    precision = data[cur.pos]
                    if precision not in precisions:
                        raise ValueError(f"unknown precision {precision}")
                    cur.pos += 1
                if mask & _HAS_DEPTH:
                    depth = varint()
                pos = cur.pos
            append(
                (kind, name, prev_start, duration, thread_id, device, flow, val, precision, depth)
            )
        if pos != len(payload):
            raise ValueError(f"{len(payload) - pos} trailing bytes after the records")
        return out


def iter_events(path: str | os.PathLike[str]) -> Iterator[Event]:
    """Stream the events of a rank file; raises ProfileFormatError after the last good block."""
    with RankFileReader(path) as reader:
        yield from reader.events()


def read_rank_file(path: str | os.PathLike[str], *, strict: bool = True) -> RankProfile:
    """Read a whole rank file.

    strict=True raises ProfileFormatError on any damage (including a missing END block).
    strict=False returns everything readable before the damage, with `damage` set; a file
    whose header itself is unreadable still raises.
    """
    events: list[Event] = []
    damage: ProfileFormatError | None = None
    with RankFileReader(path) as reader:
        try:
            events.extend(reader.events())
        except ProfileFormatError as exc:
            if strict:
                raise
            damage = exc
        return RankProfile(
            path=Path(path),
            header=reader.header,
            events=events,
            track_names=dict(reader.track_names),
            damage=damage,
        )


def read_rank_header(path: str | os.PathLike[str]) -> RankHeader:
    """The header as written at start (no sync points after the first, no final counts)."""
    with RankFileReader(path) as reader:
        return reader.header


__all__ = [
    "FORMAT_VERSION",
    "RANK_FILE_SUFFIX",
    "RECORD_OPTIONAL_FIELDS",
    "CorruptProfileError",
    "NotAProfileError",
    "ProfileFormatError",
    "RankFileReader",
    "RankFileWriter",
    "RankHeader",
    "RankProfile",
    "RecordDecoder",
    "Row",
    "TruncatedProfileError",
    "UnsupportedVersionError",
    "event_row",
    "iter_events",
    "read_rank_file",
    "read_rank_header",
    "write_rank_file",
]
