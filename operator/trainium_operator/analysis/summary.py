"""Per-rank summaries: what the dashboard needs from one rank file, a small fraction of it.

`summarise_rank` decodes one rank file (through `load_rank_file`, so any rank-file format the
loader reads is summarised alike), aligns it onto the wall clock and keeps only the reductions
the dashboard is computed from:

- samples: step markers, CPU samples and annotations, as they are (a few per step);
- operations: kind, name, duration, precision and value of kernels, host ops, memory
  operations and collectives (the exact percentiles of the top-operations table need every
  duration; nothing else of them);
- busy: the union of the rank's device-busy intervals per device (fewer than its events);
- the rank's device-activity breakdown and its launch -> execution latencies;
- its timeline tracks (the track tree, without decoding it again).

`compose` joins summaries into the dashboard's inputs (`report.DashboardInputs`): the same
numbers as the whole profile gives, because every statistic either sums over ranks or is
computed from these reductions by the same functions. `rank_timeline` decodes one rank again
for the timeline, on the same clock alignment its summary used.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from trainium_operator.analysis.clock import monotonic_to_wall
from trainium_operator.analysis.columns import DEVICE_BUSY_KINDS, EventColumns, kind_mask
from trainium_operator.analysis.intervals import merge_grouped
from trainium_operator.analysis.loading import (
    LoadedProfile,
    RankInfo,
    load_rank_file,
    node_name,
    sync_pairs,
)
from trainium_operator.analysis.report import DashboardInputs, device_event_count
from trainium_operator.analysis.stats import ActivityBreakdown, LatencyPairs, activity_breakdown
from trainium_operator.analysis.timeline import TimelineIndex
from trainium_operator.profiler.events import EventKind
from trainium_operator.profiler.manifest import ProfileManifest

SUMMARY_VERSION = 2
"""Bumped whenever what a summary holds, means or how it is stored changes: older stored
summaries are ignored. 2: each integer column in the narrowest type its values fit, start
times as offsets from the rank's first event."""

SAMPLE_KINDS = (EventKind.STEP, EventKind.CPU_UTIL, EventKind.ANNOTATION)
OPERATION_KINDS = (EventKind.KERNEL, EventKind.HOST_OP, EventKind.MEMCPY, EventKind.COLLECTIVE)
_COLUMN_FIELDS = tuple(f.name for f in fields(EventColumns) if f.name != "names")
_PER_FILE = ("rank", "node")  # constant within a rank file: filled in when composing
SECTION_FIELDS: dict[str, tuple[str, ...]] = {
    "samples": tuple(name for name in _COLUMN_FIELDS if name not in _PER_FILE),
    "operations": ("kind", "name", "duration_ns", "precision", "value"),
    "busy": ("kind", "device", "start_ns", "duration_ns"),
}
_DTYPES = {f: np.dtype(t) for f, t in (("kind", "u1"), ("name", "i4"), ("start_ns", "i8"))}
_DTYPES |= {"duration_ns": np.dtype("i8"), "thread_id": np.dtype("i8"), "device": np.dtype("i4")}
_DTYPES |= {"flow_id": np.dtype("u8"), "value": np.dtype("i8"), "precision": np.dtype("u1")}
_DTYPES |= {"depth": np.dtype("i4"), "rank": np.dtype("i4"), "node": np.dtype("i4")}
Section = dict[str, npt.NDArray[Any]]
SyncPairs = tuple[tuple[int, int], ...]


class SummaryError(ValueError):
    """Stored bytes that are not a summary of this version (the caller summarises again)."""


class RankChangedError(RuntimeError):
    """A rank file no longer matches the summary its profile was opened with."""


@dataclass(frozen=True)
class RankSummary:
    """One rank file, reduced to what the dashboard and the track tree need (see module)."""

    rank: int
    node: str
    local_rank: int
    path: str
    event_count: int  # events decoded (up to the first damage)
    dropped_events: int
    complete: bool
    damage: str | None
    track_names: tuple[tuple[int, int, str], ...]
    sources: tuple[str, ...]
    extra: Mapping[str, str]
    own_sync: SyncPairs  # the file's own clock sync points
    points_used: SyncPairs  # what its times were aligned with (empty: raw monotonic)
    first_ns: int | None  # earliest start and latest end, None without events
    last_ns: int | None
    names: tuple[str, ...]
    samples: Section
    operations: Section
    busy: Section
    latency_ns: npt.NDArray[np.int64]
    latency_kernel: npt.NDArray[np.int32]  # the linked kernel's name, into `names`
    launch_total: int
    kernel_total: int
    activity: Mapping[str, int] | None  # None: no device or sync activity in the rank
    device_events: int
    tracks: tuple[Mapping[str, Any], ...]  # the rank's timeline tracks, in display order

    @property
    def aligned(self) -> bool:
        return bool(self.points_used)

    def nbytes(self) -> int:
        arrays = [*self.samples.values(), *self.operations.values(), *self.busy.values()]
        return sum(int(a.nbytes) for a in arrays) + int(self.latency_ns.nbytes) * 2


# ---------------------------------------------------------------- summarising


def _aligned(columns: EventColumns, points: Sequence[tuple[int, int]]) -> EventColumns:
    if not points or not len(columns):
        return columns
    return replace(columns, start_ns=monotonic_to_wall(columns.start_ns, points))


def _section(columns: EventColumns, mask: npt.NDArray[np.bool_], names: Sequence[str]) -> Section:
    return {name: np.ascontiguousarray(getattr(columns, name)[mask]) for name in names}


def _busy_unions(columns: EventColumns) -> Section:
    """The union of the rank's device-busy intervals per device, as KERNEL-kind intervals."""
    busy = (columns.device >= 0) & columns.of_kind(*DEVICE_BUSY_KINDS)
    devices, index = np.unique(columns.device[busy], return_inverse=True)
    merged = merge_grouped(
        index.astype(np.int64),
        columns.start_ns[busy],
        columns.end_ns[busy],
        group_count=int(devices.size),
    )
    return {
        "kind": np.full(merged.start.size, int(EventKind.KERNEL), dtype=np.uint8),
        "device": devices[merged.group].astype(np.int32),
        "start_ns": merged.start.astype(np.int64),
        "duration_ns": merged.lengths().astype(np.int64),
    }


def _track_rows(index: TimelineIndex) -> tuple[dict[str, Any], ...]:
    return tuple(
        {
            "kind": t.kind,
            "label": t.label,
            "device": t.device,
            "thread_id": t.thread_id,
            "rows": t.rows,
            "events": t.event_count,
            "unit": t.unit,
        }
        for t in index.tracks
    )


def _rank_info(summary: RankSummary, node: int) -> RankInfo:
    return RankInfo(
        rank=summary.rank,
        node=node,
        local_rank=summary.local_rank,
        path=Path(summary.path),
        event_count=summary.event_count,
        dropped_events=summary.dropped_events,
        complete=summary.complete,
        aligned=summary.aligned,
        damage=summary.damage,
        track_names={(t, d): name for t, d, name in summary.track_names},
        sources=summary.sources,
        extra=dict(summary.extra),
    )


def _single_rank(
    columns: EventColumns, info: RankInfo, nodes: tuple[str, ...], origin: int
) -> LoadedProfile:
    """One rank on the profile's timeline, as the timeline index expects a profile."""
    columns = replace(
        columns,
        start_ns=columns.start_ns - origin,
        node=np.full(len(columns), info.node, dtype=np.int32),
    )
    return LoadedProfile(
        path=info.path,
        manifest=ProfileManifest(),
        manifest_problem=None,
        nodes=nodes,
        ranks=(info,),
        origin_wall_ns=origin,
        end_ns=int(columns.end_ns.max()) if len(columns) else 0,
        columns=columns,
        load_seconds=0.0,
    )


def summarise_rank(path: Path, points: Sequence[tuple[int, int]] = ()) -> RankSummary:
    """The summary of one rank file, aligned with its own sync points, or with `points` (its
    node peers') when it has none. Raises what `load_rank_file` raises for a file it refuses;
    damage after the header is recorded, as the loader records it."""
    load = load_rank_file(path)
    own = tuple(sync_pairs(load.header))
    used = own or tuple(points)
    columns = _aligned(load.columns, used)
    header = load.header
    kinds = columns.kind
    samples = kind_mask(kinds, SAMPLE_KINDS)
    operations = kind_mask(kinds, OPERATION_KINDS)
    activity = activity_breakdown(columns)
    pairs = _latency(columns)
    summary = RankSummary(
        rank=header.rank,
        node=node_name(load),
        local_rank=header.local_rank,
        path=str(path),
        event_count=len(columns),
        dropped_events=header.dropped_events,
        complete=header.complete,
        damage=load.damage,
        track_names=tuple((t, d, name) for (t, d), name in sorted(load.track_names.items())),
        sources=tuple(header.sources),
        extra=dict(header.extra),
        own_sync=own,
        points_used=used,
        first_ns=int(columns.start_ns.min()) if len(columns) else None,
        last_ns=int(columns.end_ns.max()) if len(columns) else None,
        names=columns.names,
        samples=_section(columns, samples, SECTION_FIELDS["samples"]),
        operations=_section(columns, operations, SECTION_FIELDS["operations"]),
        busy=_busy_unions(columns),
        latency_ns=pairs.latency_ns.astype(np.int64),
        latency_kernel=pairs.kernel_name.astype(np.int32),
        launch_total=pairs.launch_total,
        kernel_total=pairs.kernel_total,
        activity=next(iter(activity.per_rank_ns.values()), None),
        device_events=device_event_count(columns),
        tracks=(),
    )
    info = _rank_info(summary, 0)
    tracks = _track_rows(TimelineIndex(_single_rank(columns, info, (summary.node,), 0)))
    return replace(summary, tracks=tracks)


def _latency(columns: EventColumns) -> LatencyPairs:
    from trainium_operator.analysis.stats import latency_pairs

    return latency_pairs(columns)


def rank_timeline(
    summary: RankSummary, node: int, nodes: tuple[str, ...], origin: int
) -> TimelineIndex:
    """The timeline index of one rank, decoded again on the clock alignment of its summary;
    RankChangedError when the file no longer holds what the summary saw."""
    load = load_rank_file(Path(summary.path))
    columns = _aligned(load.columns, summary.points_used)
    if len(columns) != summary.event_count:
        raise RankChangedError(
            f"{summary.path} changed since the profile was opened "
            f"({len(columns)} events, {summary.event_count} before): load the profile again"
        )
    index = TimelineIndex(_single_rank(columns, _rank_info(summary, node), nodes, origin))
    if len(index.tracks) != len(summary.tracks):
        raise RankChangedError(f"{summary.path} changed since the profile was opened")
    return index


# ---------------------------------------------------------------- storing


def _meta(summary: RankSummary) -> dict[str, Any]:
    return {
        "version": SUMMARY_VERSION,
        "rank": summary.rank,
        "node": summary.node,
        "local_rank": summary.local_rank,
        "path": summary.path,
        "event_count": summary.event_count,
        "dropped_events": summary.dropped_events,
        "complete": summary.complete,
        "damage": summary.damage,
        "track_names": [list(t) for t in summary.track_names],
        "sources": list(summary.sources),
        "extra": dict(summary.extra),
        "own_sync": [list(p) for p in summary.own_sync],
        "points_used": [list(p) for p in summary.points_used],
        "first_ns": summary.first_ns,
        "last_ns": summary.last_ns,
        "names": list(summary.names),
        "launch_total": summary.launch_total,
        "kernel_total": summary.kernel_total,
        "activity": None if summary.activity is None else dict(summary.activity),
        "device_events": summary.device_events,
        "tracks": [dict(t) for t in summary.tracks],
    }


_NARROW_TYPES = tuple(np.dtype(t) for t in ("u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8"))
"""What a stored integer column may be: each is widened to its field's type when read."""
_OFFSET_FIELDS = frozenset({"start_ns"})  # stored as offsets from `first_ns` (fit 32 bits)


def _narrowed(values: npt.NDArray[Any], base: int = 0) -> npt.NDArray[Any]:
    """`values - base` in the narrowest integer type that holds them: most columns of a rank
    (name ids, precisions, durations, offsets within a window) fit 1 to 4 bytes, not 8."""
    if not values.size:
        return values
    shifted = values - np.asarray(base, dtype=values.dtype) if base else values
    low, high = int(shifted.min()), int(shifted.max())
    for dtype in _NARROW_TYPES[:-2]:
        limits = np.iinfo(dtype)
        if limits.min <= low and high <= limits.max:
            return shifted.astype(dtype)
    return shifted


def to_bytes(summary: RankSummary) -> bytes:
    """The summary as the UI's cache stores it: an uncompressed .npz of narrowed columns,
    read back without inflating anything."""
    base = summary.first_ns or 0
    arrays: dict[str, npt.NDArray[Any]] = {
        "meta": np.frombuffer(json.dumps(_meta(summary)).encode(), dtype=np.uint8),
        "latency_ns": _narrowed(summary.latency_ns),
        "latency_kernel": _narrowed(summary.latency_kernel),
    }
    for section in SECTION_FIELDS:
        for name, values in getattr(summary, section).items():
            arrays[f"{section}.{name}"] = _narrowed(values, base if name in _OFFSET_FIELDS else 0)
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


def _array(stored: Any, key: str, dtype: np.dtype[Any], base: int = 0) -> npt.NDArray[Any]:
    """A stored column widened to `dtype` (`base` added back to an offset column);
    SummaryError for a missing one, or one of another shape or type than `to_bytes` writes."""
    if key not in stored.files:
        raise SummaryError(f"summary lacks {key}")
    values = stored[key]
    allowed = _NARROW_TYPES if dtype.kind in "iu" and dtype.itemsize > 1 else (dtype,)
    if values.dtype not in allowed or values.ndim != 1:
        raise SummaryError(f"summary's {key} is {values.dtype}[{values.ndim}], not {dtype}[1]")
    widened = np.asarray(values).astype(dtype, copy=False)
    return widened + np.asarray(base, dtype=dtype) if base else widened


def _checked_section(stored: Any, section: str, names: int, base: int) -> Section:
    arrays = {
        name: _array(
            stored, f"{section}.{name}", _DTYPES[name], base if name in _OFFSET_FIELDS else 0
        )
        for name in SECTION_FIELDS[section]
    }
    if len({a.size for a in arrays.values()}) > 1:
        raise SummaryError(f"summary's {section} columns differ in length")
    name_ids = arrays.get("name")
    if name_ids is not None and name_ids.size and not 0 <= name_ids.min() <= name_ids.max() < names:
        raise SummaryError(f"summary's {section} names point outside its string table")
    return arrays


def from_bytes(data: bytes) -> RankSummary:
    """A stored summary, checked for shape and bounds; SummaryError for anything else."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as stored:
            meta = json.loads(_array(stored, "meta", np.dtype("u1")).tobytes())
            if not isinstance(meta, dict) or meta.get("version") != SUMMARY_VERSION:
                raise SummaryError("summary of another version")
            names = tuple(str(n) for n in meta["names"])
            base = int(meta["first_ns"] or 0)
            sections = {s: _checked_section(stored, s, len(names), base) for s in SECTION_FIELDS}
            latency = _array(stored, "latency_ns", np.dtype("i8"))
            kernel = _array(stored, "latency_kernel", np.dtype("i4"))
    except SummaryError:
        raise
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:
        raise SummaryError(f"unreadable summary: {exc!r:.200}") from exc
    if latency.size != kernel.size or (
        kernel.size and not 0 <= kernel.min() <= kernel.max() < len(names)
    ):
        raise SummaryError("summary's latencies do not match their kernels")
    try:
        return RankSummary(
            rank=int(meta["rank"]),
            node=str(meta["node"]),
            local_rank=int(meta["local_rank"]),
            path=str(meta["path"]),
            event_count=int(meta["event_count"]),
            dropped_events=int(meta["dropped_events"]),
            complete=bool(meta["complete"]),
            damage=None if meta["damage"] is None else str(meta["damage"]),
            track_names=tuple((int(t), int(d), str(n)) for t, d, n in meta["track_names"]),
            sources=tuple(str(s) for s in meta["sources"]),
            extra={str(k): str(v) for k, v in meta["extra"].items()},
            own_sync=tuple((int(m), int(w)) for m, w in meta["own_sync"]),
            points_used=tuple((int(m), int(w)) for m, w in meta["points_used"]),
            first_ns=None if meta["first_ns"] is None else int(meta["first_ns"]),
            last_ns=None if meta["last_ns"] is None else int(meta["last_ns"]),
            names=names,
            samples=sections["samples"],
            operations=sections["operations"],
            busy=sections["busy"],
            latency_ns=latency,
            latency_kernel=kernel,
            launch_total=int(meta["launch_total"]),
            kernel_total=int(meta["kernel_total"]),
            activity=None
            if meta["activity"] is None
            else {str(k): int(v) for k, v in meta["activity"].items()},
            device_events=int(meta["device_events"]),
            tracks=tuple(dict(t) for t in meta["tracks"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SummaryError(f"summary with a bad field: {exc!r:.200}") from exc


# ---------------------------------------------------------------- composing


@dataclass(frozen=True)
class ComposedProfile:
    """A profile as its summaries give it: the dashboard's inputs, and where each rank's
    tracks sit in the profile's track list (ranks in node, then rank order)."""

    inputs: DashboardInputs
    summaries: tuple[RankSummary, ...]  # in track order
    node_of: tuple[int, ...]  # per summary, its node's index in inputs.nodes
    track_offset: tuple[int, ...]  # per summary, the id of its first track
    tracks: tuple[Mapping[str, Any], ...]  # every track, with its id, node and rank
    name_lookup: tuple[npt.NDArray[np.int32], ...]  # per summary, its name ids -> the profile's

    @property
    def origin_wall_ns(self) -> int:
        return self.inputs.origin_wall_ns

    def nbytes(self) -> int:
        inputs = self.inputs
        columns = (inputs.samples, inputs.operations, inputs.busy)
        return sum(c.nbytes() for c in columns) + int(inputs.latency.latency_ns.nbytes) * 3


def node_sync_points(summaries: Sequence[RankSummary]) -> dict[str, SyncPairs]:
    """Every node's own sync points, pooled: a rank without any borrows its node's (ranks of
    one node share its CLOCK_MONOTONIC)."""
    pooled: dict[str, list[tuple[int, int]]] = {}
    for summary in summaries:
        pooled.setdefault(summary.node, []).extend(summary.own_sync)
    return {node: tuple(points) for node, points in pooled.items()}


def _joined(
    summaries: Sequence[RankSummary],
    section: str,
    *,
    lookups: Sequence[npt.NDArray[np.int32]],
    node_of: Sequence[int],
    origin: int,
    names: tuple[str, ...],
) -> EventColumns:
    parts: list[Section] = [getattr(s, section) for s in summaries]
    sizes = [next(iter(p.values())).size if p else 0 for p in parts]
    total = sum(sizes)

    def field(name: str) -> npt.NDArray[Any]:
        dtype = _DTYPES[name]
        if name == "rank":
            return np.repeat(np.array([s.rank for s in summaries], dtype=dtype), sizes)
        if name == "node":
            return np.repeat(np.array(node_of, dtype=dtype), sizes)
        if name not in SECTION_FIELDS[section]:
            return np.zeros(total, dtype=dtype)
        if name == "name":
            return np.concatenate(
                [lookup[p["name"]] for p, lookup in zip(parts, lookups, strict=True)]
                or [np.zeros(0, dtype=dtype)]
            ).astype(dtype)
        joined = np.concatenate([p[name] for p in parts] or [np.zeros(0, dtype=dtype)])
        return joined - origin if name == "start_ns" else joined

    values = {name: field(name) for name in _COLUMN_FIELDS}
    return EventColumns(**values, names=names)


def _name_lookups(
    summaries: Sequence[RankSummary],
) -> tuple[list[npt.NDArray[np.int32]], tuple[str, ...]]:
    table: dict[str, int] = {}
    lookups = [
        np.array([table.setdefault(name, len(table)) for name in s.names], dtype=np.int32)
        for s in summaries
    ]
    return lookups, tuple(table)


def _activity(summaries: Sequence[RankSummary]) -> ActivityBreakdown:
    from trainium_operator.analysis.stats import ACTIVITY_CATEGORIES

    per_rank = {s.rank: dict(s.activity) for s in summaries if s.activity is not None}
    totals = {key: sum(parts[key] for parts in per_rank.values()) for key in ACTIVITY_CATEGORIES}
    return ActivityBreakdown(totals, dict(sorted(per_rank.items())))


def compose(
    summaries: Sequence[RankSummary],
    path: Path,
    manifest: ProfileManifest,
    manifest_problem: str | None,
    load_seconds: float = 0.0,
) -> ComposedProfile:
    """The profile that `load_profile` would give, as far as the dashboard and the track
    tree see it, from its ranks' summaries."""
    by_rank = sorted(summaries, key=lambda s: s.rank)
    nodes = tuple(sorted({s.node for s in by_rank}))
    node_index = {name: i for i, name in enumerate(nodes)}
    firsts = [s.first_ns for s in by_rank if s.first_ns is not None]
    origin = min(firsts) if firsts else 0
    lasts = [s.last_ns for s in by_rank if s.last_ns is not None]
    end = max(lasts) - origin if lasts else 0
    node_of = [node_index[s.node] for s in by_rank]
    lookups, names = _name_lookups(by_rank)
    samples = _joined(
        by_rank, "samples", lookups=lookups, node_of=node_of, origin=origin, names=names
    )
    busy = _joined(by_rank, "busy", lookups=lookups, node_of=node_of, origin=origin, names=names)
    cpu = samples.of_kind(EventKind.CPU_UTIL)
    busy_and_cpu = EventColumns(
        **{
            name: np.concatenate([getattr(busy, name), getattr(samples, name)[cpu]])
            for name in _COLUMN_FIELDS
        },
        names=names,
    )
    latency = LatencyPairs(
        latency_ns=np.concatenate([s.latency_ns for s in by_rank]),
        rank=np.repeat(
            np.array([s.rank for s in by_rank], dtype=np.int32),
            [s.latency_ns.size for s in by_rank],
        ),
        kernel_name=np.concatenate(
            [lookup[s.latency_kernel] for s, lookup in zip(by_rank, lookups, strict=True)]
        ).astype(np.int32),
        names=names,
        launch_total=sum(s.launch_total for s in by_rank),
        kernel_total=sum(s.kernel_total for s in by_rank),
    )
    ranks = tuple(_rank_info(s, node) for s, node in zip(by_rank, node_of, strict=True))
    inputs = DashboardInputs(
        path=path,
        manifest=manifest,
        manifest_problem=manifest_problem,
        nodes=nodes,
        ranks=ranks,
        origin_wall_ns=origin,
        end_ns=end,
        events=sum(s.event_count for s in by_rank),
        load_seconds=load_seconds,
        samples=samples,
        operations=_joined(
            by_rank, "operations", lookups=lookups, node_of=node_of, origin=origin, names=names
        ),
        busy=busy_and_cpu,
        activity=_activity(by_rank),
        latency=latency,
        device_events=sum(s.device_events for s in by_rank),
    )
    # The timeline lists tracks by node, then rank (the order the whole-profile index sorts).
    order = sorted(range(len(by_rank)), key=lambda i: (node_of[i], by_rank[i].rank))
    offsets: list[int] = []
    tracks: list[dict[str, Any]] = []
    for i in order:
        offsets.append(len(tracks))
        for track in by_rank[i].tracks:
            tracks.append({**track, "id": len(tracks), "node": node_of[i], "rank": by_rank[i].rank})
    return ComposedProfile(
        inputs=inputs,
        summaries=tuple(by_rank[i] for i in order),
        node_of=tuple(node_of[i] for i in order),
        track_offset=tuple(offsets),
        tracks=tuple(tracks),
        name_lookup=tuple(lookups[i] for i in order),
    )
