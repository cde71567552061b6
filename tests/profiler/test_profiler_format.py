"""The rank file format: round trip, size, streaming, damage and version handling."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from profiler.profiler_helpers import HEADER, as_events, decode_columnar, training_like_events
from trainium_operator.profiler.clock import ClockSyncPoint
from trainium_operator.profiler.events import HOST_DEVICE, Event, EventKind, Precision
from trainium_operator.profiler.format import (
    CODEC_NONE,
    FORMAT_MAJOR,
    MAGIC,
    CorruptProfileError,
    NotAProfileError,
    ProfileFormatError,
    RankFileReader,
    RankFileWriter,
    TruncatedProfileError,
    UnsupportedVersionError,
    encode_events_payload,
    iter_events,
    read_rank_file,
    read_rank_header,
    write_rank_file,
)


def test_round_trip_keeps_every_field_and_the_header(tmp_path: Path) -> None:
    events = [
        Event(EventKind.ANNOTATION, "forward", 10, 5, 123, HOST_DEVICE, 0, 0, Precision.UNKNOWN, 2),
        Event(EventKind.KERNEL, "nc_exec_running", 8, 0, 1, 31, 2**40, 0, Precision.FP8, 0),
        Event(EventKind.COUNTER, "temperature", 2**62, 0, -5, HOST_DEVICE, 0, -17),
        Event(EventKind.MEMCPY, "nrt_tensor_write ☃", 3, 2**45, 0, 0, 1, 2**50),
        Event(EventKind.STEP, "step", 0, 1, 2**63 - 1, HOST_DEVICE, value=99),
    ]
    path = tmp_path / "rank-5.trnprof"
    write_rank_file(path, HEADER, events, track_names={(1, 31): "NC31 exec"}, dropped_events=3)

    profile = read_rank_file(path)
    assert profile.events == events
    assert profile.track_names == {(1, 31): "NC31 exec"}
    assert profile.damage is None
    assert profile.header.complete
    assert profile.header.dropped_events == 3
    assert profile.header.event_count == len(events)
    assert profile.header.clock_sync == HEADER.clock_sync
    assert profile.header.node == "ip-10-1-2-3"
    assert profile.header.step_window == (10, 20)
    assert profile.header.extra == {"note": "ünïcode"}


def test_every_field_at_the_edges_of_its_range_round_trips(tmp_path: Path) -> None:
    top = 2**63 - 1
    events = [
        Event(EventKind.COUNTER, "top", top - 5, 0, 2**62, HOST_DEVICE, top, top),
        Event(
            EventKind.COUNTER, "bottom", 0, top, -(2**62), 2**31 - 1, 1, -(2**63), depth=2**31 - 1
        ),
        Event(EventKind.KERNEL, "precise", 1, 1, 0, 0, top, 1, Precision.MIXED, 1),
        Event(EventKind.ANNOTATION, "back in time", -(2**62), 0),
    ]
    path = tmp_path / "rank.trnprof"
    write_rank_file(path, HEADER, events)
    assert read_rank_file(path).events == events
    columns, strings = decode_columnar(path)
    assert as_events(columns, strings) == events


@pytest.mark.parametrize(
    ("event", "match"),
    [
        (Event(EventKind.COUNTER, "v", 0, value=2**63), "value column cannot hold"),
        (Event(EventKind.COUNTER, "v", 0, value=-(2**63) - 1), "value column cannot hold"),
        (Event(EventKind.KERNEL, "f", 0, flow_id=2**63), "flow ids must be in"),
        (Event(EventKind.KERNEL, "f", 0, flow_id=-1), "flow ids must be in"),
        (Event(EventKind.ANNOTATION, "d", 0, depth=-1), "depth column cannot hold -1"),
        (Event(EventKind.ANNOTATION, "p", 0, precision=300), "precision column cannot hold 300"),  # type: ignore[arg-type]
        (Event(EventKind.ANNOTATION, "s", 2**63), "outside the signed 64-bit range"),
    ],
)
def test_a_field_outside_64_bits_is_refused_at_write_naming_it(
    tmp_path: Path, event: Event, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        write_rank_file(tmp_path / "r.trnprof", HEADER, [event])


def test_round_trip_across_many_blocks_and_sync_points(tmp_path: Path) -> None:
    events = training_like_events(20_000)
    path = tmp_path / "rank.trnprof"
    with RankFileWriter(path, HEADER, block_events=1_000) as writer:
        for start in range(0, len(events), 3_000):
            writer.write_events(events[start : start + 3_000])
            writer.write_sync_points([ClockSyncPoint(start, 10**18 + start, 1)])
        writer.close(dropped_events=0)
    profile = read_rank_file(path)
    assert profile.events == events
    assert len(profile.header.clock_sync) == 1 + 7


def test_encoding_is_at_most_16_bytes_per_event_before_compression() -> None:
    from trainium_operator.profiler.format import _Tables

    events = training_like_events(50_000)
    payload = encode_events_payload(_Tables(), events)
    assert len(payload) / len(events) <= 16


def test_reader_streams_block_by_block(tmp_path: Path) -> None:
    events = training_like_events(5_000)
    path = tmp_path / "rank.trnprof"
    with RankFileWriter(path, HEADER, block_events=500) as writer:
        writer.write_events(events)
        writer.close()
    with RankFileReader(path) as reader:
        stream = reader.events()
        first = [next(stream) for _ in range(10)]
        # Only the first block has been read from disk so far.
        assert reader._file.tell() < path.stat().st_size // 5
        rest = list(stream)
    assert first + rest == events


def test_iter_events_yields_the_same_events_as_read(tmp_path: Path) -> None:
    events = training_like_events(3_000)
    path = tmp_path / "rank.trnprof"
    write_rank_file(path, HEADER, events)
    assert list(iter_events(path)) == events


def _blocks_file(tmp_path: Path, codec: int = 1) -> tuple[Path, list[Event]]:
    events = training_like_events(4_000, seed=3)
    path = tmp_path / "rank-1.trnprof"
    with RankFileWriter(path, HEADER, block_events=1_000, codec=codec) as writer:
        writer.write_events(events)
        writer.close()
    return path, events


def _block_offsets(path: Path) -> list[int]:
    with RankFileReader(path) as reader:
        return [offset for offset, _, _ in reader.blocks()]


def _block_spans(path: Path) -> list[tuple[int, int]]:
    """(start, end) byte offsets of each block of an intact file."""
    starts = _block_offsets(path)
    return list(zip(starts, [*starts[1:], path.stat().st_size], strict=True))


@pytest.mark.parametrize("cut_fraction", [0.05, 0.3, 0.55, 0.8, 0.99])
def test_truncated_file_names_file_and_offset_and_keeps_earlier_blocks(
    tmp_path: Path, cut_fraction: float
) -> None:
    path, events = _blocks_file(tmp_path)
    event_blocks = _block_spans(path)[:4]  # 4 blocks of 1,000 events, then the END block
    data = path.read_bytes()
    cut = int(len(data) * cut_fraction)
    path.write_bytes(data[:cut])

    with pytest.raises(TruncatedProfileError) as excinfo:
        read_rank_file(path)
    assert str(path) in str(excinfo.value)
    assert f"byte {excinfo.value.offset}" in str(excinfo.value)
    assert excinfo.value.offset <= cut

    partial = read_rank_file(path, strict=False)
    assert isinstance(partial.damage, TruncatedProfileError)
    assert not partial.header.complete
    # Every event of every block that ends before the cut is still there, in order.
    whole_blocks = sum(1 for _, end in event_blocks if end <= cut)
    assert partial.events == events[: 1_000 * whole_blocks]


def test_file_cut_exactly_between_blocks_reports_the_missing_end(tmp_path: Path) -> None:
    path, events = _blocks_file(tmp_path)
    offsets = _block_offsets(path)
    data = path.read_bytes()
    path.write_bytes(data[: offsets[2]])
    with pytest.raises(TruncatedProfileError, match="without its END block") as excinfo:
        list(iter_events(path))
    assert excinfo.value.offset == offsets[2]
    assert read_rank_file(path, strict=False).events == events[:2_000]


@pytest.mark.parametrize("block", [0, 1, 2])
def test_corrupt_block_is_reported_at_its_offset_and_earlier_blocks_survive(
    tmp_path: Path, block: int
) -> None:
    path, events = _blocks_file(tmp_path)
    offsets = _block_offsets(path)
    data = bytearray(path.read_bytes())
    data[offsets[block] + 40] ^= 0xFF  # inside the compressed payload
    path.write_bytes(bytes(data))

    with pytest.raises(CorruptProfileError, match="checksum") as excinfo:
        read_rank_file(path)
    assert excinfo.value.offset == offsets[block]
    assert excinfo.value.path == str(path)
    assert read_rank_file(path, strict=False).events == events[: 1_000 * block]


def test_corrupt_block_length_is_caught(tmp_path: Path) -> None:
    path, _ = _blocks_file(tmp_path)
    offsets = _block_offsets(path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, offsets[1] + 4, 0x7FFF_FFFF)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptProfileError, match="implausible block length") as excinfo:
        read_rank_file(path)
    assert excinfo.value.offset == offsets[1]


def test_corrupt_header_is_reported(tmp_path: Path) -> None:
    path, _ = _blocks_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[30] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptProfileError, match="header checksum") as excinfo:
        read_rank_header(path)
    assert excinfo.value.offset == 20


def test_other_major_version_is_refused_clearly(tmp_path: Path) -> None:
    path, _ = _blocks_file(tmp_path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<H", data, len(MAGIC), FORMAT_MAJOR + 1)
    path.write_bytes(bytes(data))
    with pytest.raises(UnsupportedVersionError) as excinfo:
        read_rank_file(path, strict=False)
    message = str(excinfo.value)
    assert str(path) in message
    assert f"format version {FORMAT_MAJOR + 1}.0 is not supported" in message


def test_newer_minor_version_with_unknown_blocks_is_readable(tmp_path: Path) -> None:
    path = tmp_path / "rank.trnprof"
    events = training_like_events(100)
    with RankFileWriter(path, HEADER) as writer:
        writer.write_events(events)
        writer._write_block(200, b"a block type from the future")
        writer.close()
    data = bytearray(path.read_bytes())
    struct.pack_into("<H", data, len(MAGIC) + 2, 7)  # minor 7
    path.write_bytes(bytes(data))
    profile = read_rank_file(path)
    assert profile.events == events
    assert profile.header.format_version == (FORMAT_MAJOR, 7)


def test_a_file_that_is_not_a_profile_is_named(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.trnprof"
    path.write_text('{"traceEvents": []}')
    with pytest.raises(NotAProfileError, match="bad magic"):
        read_rank_file(path)
    empty = tmp_path / "rank-1.trnprof"
    empty.write_bytes(b"")
    with pytest.raises(ProfileFormatError):
        read_rank_file(empty)


def test_compressed_size_is_small_for_realistic_events(tmp_path: Path) -> None:
    events = training_like_events(50_000)
    path = tmp_path / "rank.trnprof"
    size = write_rank_file(path, HEADER, events)
    assert size / len(events) < 8


def test_uncompressed_codec_round_trips(tmp_path: Path) -> None:
    path, events = _blocks_file(tmp_path, codec=CODEC_NONE)
    assert read_rank_file(path).events == events


def test_negative_duration_is_rejected_at_write(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="negative duration"):
        write_rank_file(tmp_path / "r.trnprof", HEADER, [Event(EventKind.ANNOTATION, "x", 10, -1)])


def test_checksum_covers_the_block_type(tmp_path: Path) -> None:
    path, _ = _blocks_file(tmp_path)
    offsets = _block_offsets(path)
    data = bytearray(path.read_bytes())
    data[offsets[0] + 2] = 2  # EVENTS -> SYNC
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptProfileError, match="checksum"):
        read_rank_file(path)


def test_rows_carry_the_same_values_as_events(tmp_path: Path) -> None:
    events = training_like_events(2_000)
    path = tmp_path / "rank.trnprof"
    write_rank_file(path, HEADER, events)
    with RankFileReader(path) as reader:
        rows = list(reader.rows())
        assert reader.complete
    assert [Event(EventKind(r[0]), *r[1:8], Precision(r[8]), r[9]) for r in rows] == events


def test_unknown_event_kind_is_corruption_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "rank.trnprof"
    with RankFileWriter(path, HEADER, codec=CODEC_NONE) as writer:
        # no strings, no tracks, one record of kind 250
        writer._write_block(1, bytes([0, 0, 1, 250, 0, 0, 0]))
        writer.close()
    with pytest.raises(CorruptProfileError, match="unknown event kind 250"):
        read_rank_file(path)
