"""Rank files of format 1.0 (written before format 2.0, kept in fixtures/format-1.0) still read
exactly as the 1.0 reader read them, with every reader; new files say they are 2.0."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from profiler.profiler_helpers import (
    HEADER,
    as_events,
    decode_columnar,
    start,
    stop_and_read,
    training_like_events,
)
from trainium_operator import profiler
from trainium_operator.analysis.loading import load_rank_file
from trainium_operator.profiler.events import Event, EventKind, Precision
from trainium_operator.profiler.format import (
    FORMAT_VERSION,
    MAGIC,
    RankFileReader,
    event_row,
    header_from_json,
    iter_events,
    read_rank_file,
    write_rank_file,
)
from trainium_operator.profiler.manifest import load_manifest

FIXTURES = Path(__file__).parent / "fixtures" / "format-1.0"
FORMAT_1_FILES = [FIXTURES / "rank-3.trnprof", FIXTURES / "rank-4.trnprof"]


def _expected() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "expected.json").read_text())
    return data


def _expected_events() -> list[Event]:
    return [
        Event(EventKind(r[0]), r[1], *r[2:8], Precision(r[8]), r[9]) for r in _expected()["rows"]
    ]


def _version_on_disk(path: Path) -> tuple[int, int]:
    major, minor = struct.unpack_from("<HH", path.read_bytes(), len(MAGIC))
    return major, minor


@pytest.mark.parametrize("path", FORMAT_1_FILES, ids=lambda p: p.name)
def test_a_format_1_file_reads_as_the_1_0_reader_read_it(path: Path) -> None:
    assert _version_on_disk(path) == (1, 0)
    expected = _expected()

    profile = read_rank_file(path)

    assert profile.damage is None
    assert [list(event_row(e)) for e in profile.events] == expected["rows"]
    assert profile.header == header_from_json(expected["header"])
    assert profile.header.format_version == (1, 0)
    assert profile.track_names == {
        (int(t), int(d)): name
        for key, name in expected["track_names"].items()
        for t, d in [key.split(",")]
    }
    with RankFileReader(path) as reader:
        assert [list(row) for row in reader.rows()] == expected["rows"]
    assert list(iter_events(path)) == _expected_events()


@pytest.mark.parametrize("path", FORMAT_1_FILES, ids=lambda p: p.name)
def test_the_columnar_decoder_reads_a_format_1_file_identically(path: Path) -> None:
    columns, strings = decode_columnar(path)
    assert as_events(columns, strings) == _expected_events()
    load = load_rank_file(path)
    assert load.damage is None
    assert len(load.columns) == len(_expected()["rows"])


def test_new_files_and_their_manifest_say_format_2_0(tmp_path: Path) -> None:
    assert FORMAT_VERSION == (2, 0)
    path = tmp_path / "rank-0.trnprof"
    events = training_like_events(1_000)
    write_rank_file(path, HEADER, events)
    assert _version_on_disk(path) == (2, 0)
    profile = read_rank_file(path)
    assert profile.events == events
    assert profile.header.format_version == (2, 0)

    rank_file = start(tmp_path / "run")
    with profiler.annotate("step"):
        pass
    stop_and_read(rank_file)
    assert load_manifest(tmp_path / "run").format_version == (2, 0)


def test_a_format_1_file_left_by_an_earlier_session_is_carried_into_the_new_one(
    tmp_path: Path,
) -> None:
    # A worker restarted on a newer profiler continues its rank's file: the 1.0 events are
    # kept, now written as 2.0.
    directory = tmp_path / "run"
    rank_file = directory / "node-a" / "rank-0.trnprof"
    rank_file.parent.mkdir(parents=True)
    shutil.copyfile(FORMAT_1_FILES[0], rank_file)

    started = start(directory)
    assert started == rank_file
    with profiler.annotate("after the restart"):
        pass
    profile = stop_and_read(rank_file)

    assert _version_on_disk(rank_file) == (2, 0)
    assert profile.events[: len(_expected()["rows"])] == _expected_events()
    assert any(e.name == "after the restart" for e in profile.events)
    assert profile.header.dropped_events == 2  # the earlier session's count is carried too
