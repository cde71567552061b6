"""Rank files are untrusted input: every count and length is bounded before the reader
allocates for it, decompression stops at the declared size, and every kind of damage ends in
one exception type (ProfileFormatError) naming the file, never MemoryError, IndexError,
struct.error, AttributeError or RecursionError, and never a large allocation."""

from __future__ import annotations

import json
import struct
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from profiler.profiler_helpers import HEADER, training_like_events
from trainium_operator.analysis.loading import load_rank_file
from trainium_operator.profiler.format import (
    BLOCK_END,
    BLOCK_EVENTS,
    BLOCK_SYNC,
    CODEC_NONE,
    CODEC_ZLIB,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    INFLATION_ALLOWANCE_BYTES,
    MAGIC,
    MAX_BLOCK_RECORDS,
    MAX_HEADER_BYTES,
    MAX_INFLATION_RATIO,
    CorruptProfileError,
    ProfileFormatError,
    RankFileReader,
    RankFileWriter,
    TruncatedProfileError,
    header_to_json,
    read_rank_file,
    read_rank_header,
)

# What reading a small hostile file may allocate at its peak. The files below are a few
# kilobytes; before the bounds each made the reader allocate from 60 MiB to terabytes.
PEAK_BYTES_LIMIT = 16 << 20


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _prefix(body: bytes, length: int | None = None) -> bytes:
    declared = len(body) if length is None else length
    return (
        struct.pack("<8sHHII", MAGIC, FORMAT_MAJOR, FORMAT_MINOR, declared, zlib.crc32(body)) + body
    )


def _header(**changes: Any) -> bytes:
    return _prefix(json.dumps({**header_to_json(HEADER), **changes}).encode())


def _block(
    block_type: int,
    stored: bytes,
    *,
    codec: int = CODEC_NONE,
    raw_len: int | None = None,
    stored_len: int | None = None,
) -> bytes:
    """One block with a valid checksum, so the reader gets past it to the bound under test."""
    meta = struct.pack(
        "<BBII",
        block_type,
        codec,
        len(stored) if stored_len is None else stored_len,
        len(stored) if raw_len is None else raw_len,
    )
    return b"BK" + meta + struct.pack("<I", zlib.crc32(stored, zlib.crc32(meta))) + stored


def _end() -> bytes:
    return _block(BLOCK_END, json.dumps({"dropped_events": 0, "event_count": 0}).encode())


def _events_payload(records: bytes, *, strings: int = 0, tracks: int = 0, count: int) -> bytes:
    return _varint(strings) + _varint(tracks) + _varint(count) + records


def _zeros_compressed(size: int) -> bytes:
    """zlib data of `size` zero bytes, made without holding them."""
    compressor = zlib.compressobj(9)
    chunk = bytes(1 << 20)
    return b"".join(compressor.compress(chunk) for _ in range(size >> 20)) + compressor.flush()


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "rank-0.trnprof"
    path.write_bytes(data)
    return path


def _readers(path: Path) -> Iterator[tuple[str, Callable[[], object]]]:
    """Both decoders over the file: the row reader and the analysis layer's columnar one."""
    yield "rows", lambda: read_rank_file(path)
    yield "columns", lambda: _columns_strict(path)


def _columns_strict(path: Path) -> None:
    load = load_rank_file(path)
    if load.damage:
        raise CorruptProfileError(path, 0, load.damage)


def _refused_within_memory(read: Callable[[], object], match: str) -> ProfileFormatError:
    """`read` raises ProfileFormatError matching `match`, having allocated little."""
    tracemalloc.start()
    try:
        with pytest.raises(ProfileFormatError, match=match) as excinfo:
            read()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES_LIMIT, f"peak {peak:,} bytes while refusing a small file"
    return excinfo.value


# ---------------------------------------------------------------------------------------------
# Header


def test_header_length_beyond_the_file_is_truncation_without_reading_it(tmp_path: Path) -> None:
    body = json.dumps(header_to_json(HEADER)).encode()
    path = _write(tmp_path, _prefix(body, length=MAX_HEADER_BYTES - 1) + body)
    error = _refused_within_memory(lambda: read_rank_header(path), "ends inside its header")
    assert isinstance(error, TruncatedProfileError)
    assert str(path) in str(error)


def test_header_length_above_the_cap_is_corruption(tmp_path: Path) -> None:
    path = _write(tmp_path, _prefix(b"{}", length=0xFFFF_FFFF) + b"{}")
    error = _refused_within_memory(lambda: read_rank_header(path), "exceeds the limit")
    assert isinstance(error, CorruptProfileError)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"[1, 2]", "not a JSON object"),
        (b"[" * 100_000 + b"]" * 100_000, "bad header"),  # RecursionError in json
        (b'{"rank": "five"}', "rank must be an integer"),
        (b'{"rank": true}', "rank must be an integer"),
        (json.dumps({"rank": 2**40}).encode(), "rank must be an integer"),
        (json.dumps({"rank": 0, "world_size": -1}).encode(), "world_size"),
        (json.dumps({"rank": 0, "clock_sync": [[1, 2]]}).encode(), "clock_sync point"),
        (json.dumps({"rank": 0, "clock_sync": [[1, 2**70, 0]]}).encode(), "clock_sync"),
        (json.dumps({"rank": 0, "step_window": 5}).encode(), "step_window"),
        (json.dumps({"rank": 0, "extra": {"a": [1]}}).encode(), "extra"),
        (json.dumps({"rank": 0, "node": {"x": 1}}).encode(), "node must be a string"),
        (b'{"rank": 0, "node": "\xff\xfe"}', "bad header"),  # not UTF-8
    ],
)
def test_header_of_the_wrong_shape_is_corruption(tmp_path: Path, body: bytes, match: str) -> None:
    path = _write(tmp_path, _prefix(body) + _end())
    with pytest.raises(CorruptProfileError, match=match) as excinfo:
        read_rank_header(path)
    assert str(path) in str(excinfo.value)


def test_header_cut_short_is_truncation(tmp_path: Path) -> None:
    whole = _header() + _end()
    for cut in (3, 12, 20, 40):
        path = _write(tmp_path, whole[:cut])
        with pytest.raises(ProfileFormatError, match=r"header|magic"):
            read_rank_header(path)


# ---------------------------------------------------------------------------------------------
# Blocks and decompression


def test_block_length_beyond_the_file_is_truncation_without_reading_it(tmp_path: Path) -> None:
    stored = b"\x00" * 100
    path = _write(tmp_path, _header() + _block(BLOCK_EVENTS, stored, stored_len=60 << 20))
    for name, read in _readers(path):
        error = _refused_within_memory(read, "ends inside a block")
        assert "100 of 62914560 bytes present" in str(error), name


def test_zip_bomb_block_stops_at_its_declared_size(tmp_path: Path) -> None:
    # 32 MiB of zeros compress to 32 KiB; the block claims 1,000 raw bytes.
    stored = _zeros_compressed(32 << 20)
    path = _write(
        tmp_path, _header() + _block(BLOCK_EVENTS, stored, codec=CODEC_ZLIB, raw_len=1000)
    )
    for _, read in _readers(path):
        _refused_within_memory(read, "decompresses past its declared 1000 bytes")


def test_file_that_would_inflate_far_beyond_its_size_is_refused_before_decompressing(
    tmp_path: Path,
) -> None:
    # One block declaring (truthfully) 60 MiB of records, stored in 60 KiB: within the
    # per-block cap, but a 60 KiB file may not become 60 MiB of events.
    raw_len = 60 << 20
    path = _write(
        tmp_path,
        _header()
        + _block(BLOCK_EVENTS, _zeros_compressed(raw_len), codec=CODEC_ZLIB, raw_len=raw_len)
        + _end(),
    )
    assert path.stat().st_size * MAX_INFLATION_RATIO + INFLATION_ALLOWANCE_BYTES < raw_len
    for _, read in _readers(path):
        _refused_within_memory(read, "decompression bomb")


def test_bad_zlib_data_and_trailing_bytes_are_corruption(tmp_path: Path) -> None:
    raw = _events_payload(b"", count=0)
    for stored in (b"not zlib", zlib.compress(raw)[:-2], zlib.compress(raw) + b"extra"):
        path = _write(
            tmp_path, _header() + _block(BLOCK_EVENTS, stored, codec=CODEC_ZLIB, raw_len=len(raw))
        )
        with pytest.raises(CorruptProfileError, match="zlib"):
            read_rank_file(path)


# ---------------------------------------------------------------------------------------------
# Counts inside a block


def test_block_claiming_2_to_the_40_records_is_refused_before_allocating(tmp_path: Path) -> None:
    payload = _events_payload(b"\x01\x00\x00\x00", count=2**40)
    path = _write(tmp_path, _header() + _block(BLOCK_EVENTS, payload) + _end())
    for _, read in _readers(path):
        _refused_within_memory(read, "1099511627776 records claimed, but only 4 bytes remain")


def test_record_count_above_the_cap_is_refused(tmp_path: Path) -> None:
    count = MAX_BLOCK_RECORDS + 1
    payload = _events_payload(b"\x01\x00\x00\x00" * count, count=count)
    path = _write(tmp_path, _header() + _block(BLOCK_EVENTS, payload) + _end())
    with pytest.raises(CorruptProfileError, match="more than the limit"):
        read_rank_file(path)
    with pytest.raises(ValueError, match="block_events"):
        RankFileWriter(tmp_path / "w.trnprof", HEADER, block_events=count)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (_varint(2**40), "strings claimed"),
        (_varint(0) + _varint(2**40), "tracks claimed"),
        (_varint(1) + _varint(2**40) + b"abc", "bytes claimed"),
        (_varint(1) + _varint(2) + b"\xff\xfe" + _varint(0) + _varint(0), "utf-8"),
    ],
)
def test_table_counts_and_lengths_are_bounded_by_the_block(
    tmp_path: Path, payload: bytes, match: str
) -> None:
    path = _write(tmp_path, _header() + _block(BLOCK_EVENTS, payload) + _end())
    for _, read in _readers(path):
        _refused_within_memory(read, match)


def test_overlong_varint_in_a_record_is_refused_not_grown(tmp_path: Path) -> None:
    # One record whose start delta is 100,000 continuation bytes: without a cap the decoder
    # builds a 700,000-bit integer, quadratically.
    record = b"\x01\x00\x00" + b"\xff" * 100_000 + b"\x01"
    path = _write(tmp_path, _header() + _block(BLOCK_EVENTS, _events_payload(record, count=1)))
    for _, read in _readers(path):
        _refused_within_memory(read, "varint longer than 10 bytes")


# ---------------------------------------------------------------------------------------------
# The column layout of format 2.0


def _column(width: int, planes: bytes = b"") -> bytes:
    return bytes((width,)) + planes


def _one_record_columns(**changes: bytes) -> bytes:
    """The columns of one valid record (kind 1, name "", track 0, start 0), with `changes`."""
    columns = {
        "kind": _column(1, b"\x01"),
        "name": _column(1, b"\x00"),
        "track": _column(1, b"\x00"),
        "start": _column(1, b"\x00"),
        "duration": _column(0),
        "flow": _column(0),
        "value": _column(0),
        "precision": _column(0),
        "depth": _column(0),
    }
    unknown = set(changes) - set(columns)
    assert not unknown, unknown
    columns.update(changes)
    return b"".join(columns.values())


def _column_area(columns: bytes, base: bytes = b"\x00") -> bytes:
    return b"\x80" + base + columns


def _column_block(area: bytes, count: int = 1) -> bytes:
    """An EVENTS payload with one track, (thread 1, host), and `area` as its records."""
    track = _varint(2) + _varint(1) + _varint(0)  # zigzag(1), zigzag(-1), unnamed
    return _varint(0) + _varint(1) + track + _varint(count) + area


def test_a_valid_hand_made_column_block_reads(tmp_path: Path) -> None:
    # The baseline for the cases below: the same block, unchanged, is a profile.
    path = _write(
        tmp_path,
        _header()
        + _block(BLOCK_EVENTS, _column_block(_column_area(_one_record_columns())))
        + _end(),
    )
    for _, read in _readers(path):
        read()
    assert [(e.kind, e.thread_id, e.device) for e in read_rank_file(path).events] == [(1, 1, -1)]


@pytest.mark.parametrize(
    ("area", "match"),
    [
        (
            _column_area(_one_record_columns(kind=_column(2, b"\x01\x00"))),
            "kind column width 2 is outside 1..1",
        ),
        (
            _column_area(_one_record_columns(name=_column(9, bytes(9)))),
            "name column width 9 is outside 1..8",
        ),
        (
            _column_area(_one_record_columns(name=_column(0x81, b"\x01\x01"))),
            "name column cannot be sparse",
        ),
        (
            _column_area(_one_record_columns(value=_column(0x81, b"\x02\x05"))),
            "presence bytes other than 0 and 1",
        ),
        (
            _column_area(_one_record_columns(value=_column(0x88, b"\x01\x05"))),
            "value column claims 8 bytes, but only 3 remain",
        ),
        (
            _column_area(_one_record_columns(depth=_column(8, b"\x05"))),
            "depth column claims 8 bytes, but only 1 remain",
        ),
        (_column_area(_one_record_columns() + b"\x00\x00"), "2 trailing bytes after the records"),
        (_column_area(_one_record_columns(kind=_column(1, b"\x63"))), "unknown event kind 99"),
        (_column_area(_one_record_columns(name=_column(1, b"\x05"))), "string id 5 out of range"),
        (_column_area(_one_record_columns(track=_column(1, b"\x03"))), "track id 3 out of range"),
        (_column_area(_one_record_columns(precision=_column(1, b"\x09"))), "unknown precision"),
        (
            _column_area(_one_record_columns(), base=b"\xff" * 12 + b"\x01"),
            "varint longer than 10 bytes",
        ),
        (_column_area(_one_record_columns()[:-1]), "record area ends before its depth column"),
    ],
)
def test_a_hostile_column_block_is_refused_with_its_reason(
    tmp_path: Path, area: bytes, match: str
) -> None:
    path = _write(tmp_path, _header() + _block(BLOCK_EVENTS, _column_block(area)) + _end())
    for name, read in _readers(path):
        error = _refused_within_memory(read, match)
        assert str(path) in str(error), name


def test_column_widths_are_checked_against_the_block_before_allocating(tmp_path: Path) -> None:
    # 100,000 records at 4 bytes each fit the block, but the duration column then claims
    # 8 bytes for each of them: refused from the width and count, before any column is read.
    count = 100_000
    planes = bytes(count)
    columns = (
        _column(1, b"\x01" * count)
        + _column(1, planes)
        + _column(1, planes)
        + _column(1, planes)
        + _column(8)
    )
    path = _write(
        tmp_path,
        _header() + _block(BLOCK_EVENTS, _column_block(_column_area(columns), count)) + _end(),
    )
    for _, read in _readers(path):
        _refused_within_memory(read, "duration column claims 800000 bytes, but only 0 remain")


def test_sync_points_are_bounded_and_64_bit(tmp_path: Path) -> None:
    for payload, match in (
        (_varint(2**40), "sync points claimed"),
        (_varint(1) + _varint(2**65) + _varint(1) + _varint(0), "64-bit"),
    ):
        path = _write(tmp_path, _header() + _block(BLOCK_SYNC, payload) + _end())
        with pytest.raises(CorruptProfileError, match=match):
            read_rank_file(path)


@pytest.mark.parametrize(
    ("end", "match"),
    [
        (b"[]", "not a JSON object"),
        (b'{"event_count": "many"}', "event_count"),
        (b'{"dropped_events": -1}', "dropped_events"),
        (b"[" * 50_000, "undecodable"),
    ],
)
def test_end_block_of_the_wrong_shape_is_corruption(tmp_path: Path, end: bytes, match: str) -> None:
    path = _write(tmp_path, _header() + _block(BLOCK_END, end))
    with pytest.raises(CorruptProfileError, match=match):
        read_rank_file(path)


def test_a_real_file_still_reads_with_every_bound_in_place(tmp_path: Path) -> None:
    events = training_like_events(20_000, seed=11)
    path = tmp_path / "rank-5.trnprof"
    with RankFileWriter(path, HEADER) as writer:
        writer.write_events(events)
        writer.close()
    assert read_rank_file(path).events == events
    with RankFileReader(path) as reader:
        assert sum(len(rows) for rows in reader.row_blocks()) == len(events)
    assert len(load_rank_file(path).columns) == len(events)
