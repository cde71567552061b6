"""Loading a profile directory: every rank file, aligned onto one timeline, as columns.

Rank files are decoded block by block straight into numpy columns (`profiler.columnar`), in
worker processes when there are several files (the record walk is Python, so threads would
serialise on the GIL); the parent aligns each rank onto the wall clock and concatenates them,
remapping each rank's string ids onto one table. A damaged rank
file contributes every event before the damage and the damage is reported, never hidden.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from trainium_operator.analysis.clock import monotonic_to_wall
from trainium_operator.analysis.columns import I64, EventColumns
from trainium_operator.profiler.columnar import RecordColumns, decode_record_columns
from trainium_operator.profiler.format import ProfileFormatError, RankFileReader, RankHeader
from trainium_operator.profiler.manifest import (
    ManifestError,
    ProfileManifest,
    discover_rank_files,
    load_manifest,
)


class ProfileLoadError(RuntimeError):
    """The directory holds no readable profile."""


@dataclass(frozen=True)
class RankInfo:
    """One rank file as loaded."""

    rank: int
    node: int  # index into LoadedProfile.nodes
    local_rank: int
    path: Path
    event_count: int
    dropped_events: int
    complete: bool
    aligned: bool  # False when no sync point (its own or its node's) placed it on the timeline
    damage: str | None
    track_names: dict[tuple[int, int], str] = field(default_factory=dict)
    sources: tuple[str, ...] = ()  # the capture sources that ran ("host", "torch", "neuron")
    extra: dict[str, str] = field(default_factory=dict)  # the header's notes (Neuron capture)


@dataclass(frozen=True)
class LoadedProfile:
    """A whole profile in memory. Times in `columns` are ns since `origin_wall_ns`."""

    path: Path
    manifest: ProfileManifest
    manifest_problem: str | None  # why profile.json was not used, when it was not
    nodes: tuple[str, ...]
    ranks: tuple[RankInfo, ...]
    origin_wall_ns: int
    end_ns: int
    columns: EventColumns
    load_seconds: float

    def rank_info(self, rank: int) -> RankInfo | None:
        for info in self.ranks:
            if info.rank == rank:
                return info
        return None

    def warnings(self) -> list[str]:
        return profile_warnings(self.manifest_problem, self.ranks)


def profile_warnings(manifest_problem: str | None, ranks: Sequence[RankInfo]) -> list[str]:
    """What a profile's reader should know before trusting its numbers, rank by rank."""
    notes: list[str] = [manifest_problem] if manifest_problem else []
    for info in ranks:
        if info.damage:
            notes.append(f"rank {info.rank}: {info.damage}")
        elif not info.complete:
            notes.append(f"rank {info.rank}: file has no END block (writer still running?)")
        if info.dropped_events:
            notes.append(f"rank {info.rank}: {info.dropped_events} events dropped at capture")
        if not info.aligned:
            notes.append(f"rank {info.rank}: no clock sync point; timeline position unknown")
    return notes


@dataclass(frozen=True)
class _RankLoad:
    header: RankHeader
    path: Path
    columns: EventColumns  # start_ns on the wall clock when aligned, else raw monotonic
    track_names: dict[tuple[int, int], str]
    damage: str | None


def load_rank_file(path: Path) -> _RankLoad:
    """Decodes one rank file into columns (start times still on the rank's monotonic clock)."""
    damage: str | None = None
    batches: list[RecordColumns] = []
    with RankFileReader(path) as reader:

        def decode(payload: bytes, records_offset: int, count: int) -> RecordColumns:
            return decode_record_columns(
                payload, records_offset, count, len(reader.strings), reader.tracks
            )

        try:
            batches.extend(reader.decoded_blocks(decode))
        except ProfileFormatError as exc:
            damage = str(exc)
        header = reader.header
        track_names = dict(reader.track_names)
        names = tuple(reader.strings)
    records = RecordColumns.concatenate(batches)
    columns = EventColumns(
        **{f.name: getattr(records, f.name) for f in fields(records)},
        rank=np.full(len(records), header.rank, dtype=np.int32),
        node=np.zeros(len(records), dtype=np.int32),
        names=names,
    )
    return _RankLoad(header, path, columns, track_names, damage)


def _decode_all(paths: Sequence[Path], workers: int) -> list[_RankLoad]:
    if workers <= 1 or len(paths) <= 1:
        return [load_rank_file(path) for path in paths]
    # forkserver: the caller may be a threaded server (aiohttp executor); fork would copy
    # its locks mid-use.
    context = multiprocessing.get_context("forkserver")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        return list(pool.map(load_rank_file, paths, chunksize=4))


def sync_pairs(header: RankHeader) -> list[tuple[int, int]]:
    return [(p.monotonic_ns, p.wall_ns) for p in header.clock_sync]


def _concatenate(loads: Sequence[_RankLoad], node_of: Sequence[int], origin: int) -> EventColumns:
    names: dict[str, int] = {}
    remapped_names = []
    for load in loads:
        lookup = np.array(
            [names.setdefault(name, len(names)) for name in load.columns.names], dtype=np.int32
        )
        remapped_names.append(lookup[load.columns.name] if lookup.size else load.columns.name)

    def joined(field_name: str) -> npt.NDArray[Any]:
        return np.concatenate([getattr(load.columns, field_name) for load in loads])

    nodes = np.concatenate(
        [
            np.full(len(load.columns), node, dtype=np.int32)
            for load, node in zip(loads, node_of, strict=True)
        ]
    )
    start: I64 = joined("start_ns") - origin
    return EventColumns(
        kind=joined("kind"),
        name=np.concatenate(remapped_names),
        start_ns=start,
        duration_ns=joined("duration_ns"),
        thread_id=joined("thread_id"),
        device=joined("device"),
        flow_id=joined("flow_id"),
        value=joined("value"),
        precision=joined("precision"),
        depth=joined("depth"),
        rank=joined("rank"),
        node=nodes,
        names=tuple(names),
    )


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def read_manifest_or_default(root: Path) -> tuple[ProfileManifest, str | None]:
    """profile.json, or an empty manifest named after the directory when it is unusable:
    the rank files alone are enough to analyse a profile (rank 0 may have crashed)."""
    try:
        return load_manifest(root), None
    except ManifestError as exc:
        return ProfileManifest(job_name=root.name), str(exc)


def load_profile(directory: str | os.PathLike[str], workers: int | None = None) -> LoadedProfile:
    """Loads every rank file of the profile at `directory` onto one timeline."""
    began = time.perf_counter()
    root = Path(directory)
    manifest, manifest_problem = read_manifest_or_default(root)
    rank_files = [ref.path for ref in discover_rank_files(root)]
    if not rank_files:
        raise ProfileLoadError(f"{root}: no rank files (<node>/rank-<RANK>.trnprof) found")
    loads = _decode_all(rank_files, default_workers() if workers is None else workers)
    loads.sort(key=lambda load: load.header.rank)

    nodes = sorted({node_name(load) for load in loads})
    node_index = {name: i for i, name in enumerate(nodes)}
    node_sync: dict[str, list[tuple[int, int]]] = {}
    for load in loads:
        node_sync.setdefault(node_name(load), []).extend(sync_pairs(load.header))

    aligned_loads: list[_RankLoad] = []
    aligned_flags: list[bool] = []
    for load in loads:
        # Ranks on one node share CLOCK_MONOTONIC, so a rank that recorded no sync point can
        # borrow its node peers'.
        points = sync_pairs(load.header) or node_sync.get(node_name(load), [])
        aligned = load
        if points and len(load.columns):
            wall = monotonic_to_wall(load.columns.start_ns, points)
            aligned = replace(load, columns=replace(load.columns, start_ns=wall))
        aligned_loads.append(aligned)
        aligned_flags.append(bool(points))

    starts = [int(load.columns.start_ns.min()) for load in aligned_loads if len(load.columns)]
    origin = min(starts) if starts else 0
    columns = _concatenate(
        aligned_loads, [node_index[node_name(load)] for load in aligned_loads], origin
    )
    end = int(columns.end_ns.max()) if len(columns) else 0
    ranks = tuple(
        RankInfo(
            rank=load.header.rank,
            node=node_index[node_name(load)],
            local_rank=load.header.local_rank,
            path=load.path,
            event_count=len(load.columns),
            dropped_events=load.header.dropped_events,
            complete=load.header.complete,
            aligned=aligned,
            damage=load.damage,
            track_names=load.track_names,
            sources=tuple(load.header.sources),
            extra=dict(load.header.extra),
        )
        for load, aligned in zip(aligned_loads, aligned_flags, strict=True)
    )
    return LoadedProfile(
        path=root,
        manifest=manifest,
        manifest_problem=manifest_problem,
        nodes=tuple(nodes),
        ranks=ranks,
        origin_wall_ns=origin,
        end_ns=end,
        columns=columns,
        load_seconds=time.perf_counter() - began,
    )


def node_name(load: _RankLoad) -> str:
    # The header names the node the rank ran on; the directory (same name by the layout
    # contract) covers files written without one.
    return load.header.node or load.path.parent.name or "node"
