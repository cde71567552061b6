"""The vectorised block decoder gives exactly what the row decoder gives."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from profiler.profiler_helpers import HEADER, as_events, decode_columnar, training_like_events
from trainium_operator.profiler.events import HOST_DEVICE, Event, EventKind, Precision
from trainium_operator.profiler.format import (
    CODEC_NONE,
    CorruptProfileError,
    RankFileWriter,
    read_rank_file,
    write_rank_file,
)


def awkward_events(count: int, seed: int) -> list[Event]:
    """Every field in every state: absent and present, negative values and backwards time,
    many tracks, large flow ids, every precision, names past one varint byte."""
    rng = random.Random(seed)
    names = [f"name-{i}" for i in range(300)]
    events = []
    t = 10**15
    for _ in range(count):
        t += rng.randint(-5_000, 2_000_000)
        kind = rng.choice(list(EventKind))
        events.append(
            Event(
                kind,
                rng.choice(names),
                t,
                rng.choice([0, rng.randint(1, 10**12)]),
                rng.choice([0, 1, 7, rng.randint(-(2**40), 2**40)]),
                rng.choice([HOST_DEVICE, 0, 31, rng.randint(0, 4000)]),
                rng.choice([0, 0, rng.randint(1, 2**62)]),
                rng.choice([0, rng.randint(-(2**62), 2**62)]),
                rng.choice(list(Precision)),
                rng.choice([0, 0, 1, rng.randint(2, 500)]),
            )
        )
    return events


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_columnar_decoding_equals_the_row_decoder_on_every_field_state(
    tmp_path: Path, seed: int
) -> None:
    events = awkward_events(5_000, seed)
    path = tmp_path / "rank.trnprof"
    with RankFileWriter(path, HEADER, block_events=700) as writer:  # many blocks
        writer.write_events(events)

    columns, strings = decode_columnar(path)

    assert as_events(columns, strings) == read_rank_file(path).events == events


def test_columnar_decoding_equals_the_row_decoder_on_a_training_like_file(
    tmp_path: Path,
) -> None:
    events = training_like_events(20_000)
    path = tmp_path / "rank.trnprof"
    write_rank_file(path, HEADER, events, codec=CODEC_NONE)

    columns, strings = decode_columnar(path)

    assert as_events(columns, strings) == events
    assert columns.start_ns.dtype == np.int64
    assert columns.flow_id.dtype == np.uint64


@pytest.mark.parametrize("read", [read_rank_file, decode_columnar], ids=["events", "columns"])
def test_records_claimed_but_missing_are_corruption_to_either_reader(
    read: Callable[[Path], object], tmp_path: Path
) -> None:
    # A writer bug rather than disk damage: the checksum matches but the records do not parse.
    path = tmp_path / "rank.trnprof"
    with RankFileWriter(path, HEADER, codec=CODEC_NONE) as writer:
        writer._write_block(1, b"\x00\x00\x05\x01\x09")  # claims 5 records, holds half of one
        writer.close()
    with pytest.raises(CorruptProfileError, match="undecodable block"):
        read(path)


@pytest.mark.parametrize(
    ("records", "reason"),
    [
        (bytes([0, 0, 1, 12, 0, 0, 0]), "unknown event kind 12"),
        (bytes([0, 0, 1, 1, 0, 5, 0]), "string id 5 out of range"),
        (bytes([0, 0, 1, 1, 0x10, 0, 0, 99]), "unknown precision"),
        (bytes([0, 0, 1, 1, 0x01, 0, 0, 3]), "track id 3 out of range"),
        (bytes([0, 0, 1, 1, 0, 0, 0, 0]), "trailing bytes"),
        (bytes([0, 0, 1, 1, 0, 0, 0x80]), "inside a varint"),
    ],
)
def test_bad_records_are_corruption_with_the_reason(
    tmp_path: Path, records: bytes, reason: str
) -> None:
    path = tmp_path / "rank.trnprof"
    with RankFileWriter(path, HEADER, codec=CODEC_NONE) as writer:
        writer._write_block(1, records)
        writer.close()
    with pytest.raises(CorruptProfileError, match=reason):
        decode_columnar(path)
