"""Per-rank summaries: the dashboard they compose is the whole profile's, number for number."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.analysis.loading import load_profile, read_manifest_or_default
from trainium_operator.analysis.report import dashboard, dashboard_of
from trainium_operator.analysis.summary import (
    SECTION_FIELDS,
    SummaryError,
    compose,
    from_bytes,
    summarise_rank,
    to_bytes,
)
from trainium_operator.analysis.timeline import TimelineIndex
from trainium_operator.profiler.manifest import discover_rank_files

SPEC = SyntheticSpec(nodes=2, ranks_per_node=3, steps=5, detailed_steps=(1, 3), kernels_per_step=12)


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("summary") / "p"
    write_synthetic_profile(root, SPEC)
    return root


def composed_from_stored(root: Path) -> object:
    summaries = [from_bytes(to_bytes(summarise_rank(r.path))) for r in discover_rank_files(root)]
    manifest, problem = read_manifest_or_default(root)
    return compose(summaries, root, manifest, problem)


def test_the_dashboard_composed_from_stored_summaries_equals_the_whole_profile_s(
    profile: Path,
) -> None:
    expected = dashboard(load_profile(profile, workers=1))
    composed = composed_from_stored(profile)
    got = dashboard_of(composed.inputs)  # type: ignore[attr-defined]
    for data in (expected, got):
        data["overview"].pop("load_seconds")
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)


def test_the_composed_track_list_is_the_whole_profile_s(profile: Path) -> None:
    index = TimelineIndex(load_profile(profile, workers=1))
    composed = composed_from_stored(profile)
    tracks = composed.tracks  # type: ignore[attr-defined]
    assert [(t["rank"], t["kind"], t["label"], t["rows"], t["events"]) for t in tracks] == [
        (t.rank, t.kind, t.label, t.rows, t.event_count) for t in index.tracks
    ]


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],
        lambda data: data.replace(b'"version": 2', b'"version": 99'),
        lambda data: b"not a summary",
    ],
)
def test_a_damaged_or_foreign_stored_summary_is_refused(profile: Path, damage: object) -> None:
    data = to_bytes(summarise_rank(discover_rank_files(profile)[0].path))
    with pytest.raises(SummaryError):
        from_bytes(damage(data))  # type: ignore[operator]


def test_a_stored_summary_reads_back_in_its_fields_types_and_is_narrower(profile: Path) -> None:
    summary = summarise_rank(discover_rank_files(profile)[0].path)
    data = to_bytes(summary)
    back = from_bytes(data)
    for section in SECTION_FIELDS:
        for name, values in getattr(summary, section).items():
            stored = getattr(back, section)[name]
            assert stored.dtype == values.dtype, (section, name)
            assert np.array_equal(stored, values), (section, name)
    assert np.array_equal(back.latency_ns, summary.latency_ns)
    with np.load(io.BytesIO(data), allow_pickle=False) as stored:
        widths = {key: stored[key].dtype.itemsize for key in stored.files}
    assert widths["operations.duration_ns"] < 8  # narrowed columns, not 8 bytes a value
    assert widths["busy.start_ns"] < 8  # an offset from the rank's first event


@pytest.mark.parametrize(
    ("column", "foreign"),
    [
        ("operations.duration_ns", np.zeros(3, dtype=np.float64)),
        ("busy.start_ns", np.zeros((2, 2), dtype=np.int32)),
        ("samples.kind", np.zeros(3, dtype=np.int16)),
    ],
)
def test_a_stored_column_of_a_foreign_type_or_shape_is_refused(
    profile: Path, column: str, foreign: np.ndarray
) -> None:
    data = to_bytes(summarise_rank(discover_rank_files(profile)[0].path))
    with np.load(io.BytesIO(data), allow_pickle=False) as stored:
        arrays = {key: stored[key] for key in stored.files}
    arrays[column] = foreign
    out = io.BytesIO()
    np.savez(out, **arrays)
    with pytest.raises(SummaryError, match=column):
        from_bytes(out.getvalue())
