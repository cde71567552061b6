"""profile.json and discovery of rank files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainium_operator.profiler.clock import ClockSyncPoint
from trainium_operator.profiler.format import RankHeader, write_rank_file
from trainium_operator.profiler.manifest import (
    MANIFEST_NAME,
    ManifestError,
    ManifestRank,
    ProfileManifest,
    discover_rank_files,
    load_manifest,
    manifest_from_rank_files,
    write_manifest,
)


def test_manifest_round_trips(tmp_path: Path) -> None:
    manifest = ProfileManifest(
        job_name="llama",
        namespace="ml",
        uid="abc-123",
        attempt=2,
        created="2026-11-30T10:00:00Z",
        world_size=64,
        nodes=("ip-1", "ip-2"),
        ranks=(ManifestRank(0, "ip-1", 0, "ip-1/rank-0.trnprof"),),
        step_window=(5, 9),
        clock_sync=(ClockSyncPoint(10, 20, 1),),
        finished=True,
        extra={"k": "v"},
    )
    path = write_manifest(tmp_path, manifest)
    assert path == tmp_path / MANIFEST_NAME
    assert load_manifest(tmp_path) == manifest
    assert not list(tmp_path.glob(".profile.*"))  # no temporary file left behind


def test_missing_or_malformed_manifest_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=f"{tmp_path}/profile.json: no profile manifest"):
        load_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ManifestError, match="unreadable"):
        load_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({"ranks": [{"node": "x"}]}))
    with pytest.raises(ManifestError, match="malformed"):
        load_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({"schema": 99}))
    with pytest.raises(ManifestError, match="newer"):
        load_manifest(tmp_path)


def _rank(tmp_path: Path, node: str, rank: int, local_rank: int) -> None:
    write_rank_file(
        tmp_path / node / f"rank-{rank}.trnprof",
        RankHeader(rank=rank, local_rank=local_rank, world_size=40, node=node),
        [],
    )


def test_discovery_finds_rank_files_in_rank_order_and_ignores_the_rest(tmp_path: Path) -> None:
    _rank(tmp_path, "ip-b", 33, 1)
    _rank(tmp_path, "ip-a", 2, 2)
    _rank(tmp_path, "ip-b", 32, 0)
    (tmp_path / "ip-a" / "neuron").mkdir()
    (tmp_path / "ip-a" / "rank-x.trnprof").write_text("")
    (tmp_path / "ip-a" / ".rank-2.trnprof.merge").write_text("")
    (tmp_path / "rank-9.trnprof").write_text("")  # not under a node directory
    found = discover_rank_files(tmp_path)
    assert [(r.rank, r.node) for r in found] == [(2, "ip-a"), (32, "ip-b"), (33, "ip-b")]
    assert discover_rank_files(tmp_path / "absent") == []


def test_manifest_from_rank_files_lists_what_is_on_disk(tmp_path: Path) -> None:
    _rank(tmp_path, "ip-b", 33, 1)
    _rank(tmp_path, "ip-a", 2, 2)
    (tmp_path / "ip-a" / "rank-7.trnprof").write_bytes(b"garbage")
    manifest = manifest_from_rank_files(tmp_path, ProfileManifest(job_name="j"))
    assert manifest.job_name == "j"
    assert manifest.nodes == ("ip-a", "ip-b")
    assert [(r.rank, r.local_rank, r.file) for r in manifest.ranks] == [
        (2, 2, "ip-a/rank-2.trnprof"),
        (7, 0, "ip-a/rank-7.trnprof"),  # damaged, still listed
        (33, 1, "ip-b/rank-33.trnprof"),
    ]
