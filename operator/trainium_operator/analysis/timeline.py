"""Timeline index: events grouped into display tracks, with windowed level-of-detail queries.

The browser never sees the raw profile. It asks for a time window at a pixel width for the
tracks on screen; each track answers with the events at least a pixel wide (bounded by the
width, not by the event count) plus, per pixel column, the busy fraction and count of the
narrower events it folded together. A million events therefore cost the same to draw at any
zoom, and every query is a pair of binary searches per track plus a bincount.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

import numpy as np

from trainium_operator.analysis.columns import I64, EventColumns, kind_mask
from trainium_operator.analysis.loading import LoadedProfile
from trainium_operator.analysis.stats import launch_pairs
from trainium_operator.profiler.events import EventKind, Precision

STEPS, HOST, DEVICE, COUNTER = 0, 1, 2, 3
TRACK_KINDS = ("steps", "host", "device", "counter")
_SAMPLE_KINDS = (EventKind.CPU_UTIL, EventKind.MEMORY, EventKind.COUNTER)
_DEVICE_KINDS = (EventKind.KERNEL, EventKind.MEMCPY, EventKind.COLLECTIVE)
MAX_DEPTH = 15
MAX_EVENTS_PER_TRACK = 20_000  # a safety net: at most ~width events can be a pixel wide
MAX_FLOWS = 5_000
MAX_WIDTH_PX = 8192
MAX_WINDOW_TRACKS = 1024  # distinct tracks one window query may name
# Events, folded cells and counter samples in one answer (tens of MB of JSON at most): a
# track that would pass it is left out and named in the answer's "omitted".
MAX_WINDOW_ITEMS = 400_000
# Clock conversion rounds each rank's times independently; overlaps this small are not real.
_OVERLAP_TOLERANCE_NS = 100


@dataclass(frozen=True)
class Track:
    id: int
    node: int
    rank: int
    kind: str  # one of TRACK_KINDS
    label: str
    device: int
    thread_id: int
    rows: int  # nesting levels drawn
    event_count: int
    unit: str = ""  # counters: what the values mean


def _counter_unit(kind: int) -> str:
    if kind == EventKind.CPU_UTIL:
        return "cores"
    if kind == EventKind.MEMORY:
        return "bytes"
    return ""


class TimelineIndex:
    """Events of a loaded profile sorted by (track, start), with per-track lookups."""

    def __init__(self, profile: LoadedProfile) -> None:
        self.profile = profile
        columns = profile.columns
        self.columns = columns
        kind = columns.kind
        sample = kind_mask(kind, _SAMPLE_KINDS)
        device = (columns.device >= 0) & kind_mask(kind, _DEVICE_KINDS)
        category = np.full(len(columns), HOST, dtype=np.int64)
        category[kind == EventKind.STEP] = STEPS
        category[device] = DEVICE
        category[sample] = COUNTER
        device_key = np.where(category == DEVICE, columns.device, -1).astype(np.int64)
        thread_key = np.where(category == STEPS, 0, columns.thread_id).astype(np.int64)
        thread_key[sample] = 0
        counter_key = np.where(sample, columns.name, -1).astype(np.int64)
        order = np.lexsort(
            (
                columns.start_ns,
                counter_key,
                thread_key,
                device_key,
                category,
                columns.rank,
                columns.node,
            )
        )
        self.order = order  # sorted position -> column index
        keys = np.stack(
            [
                columns.node[order],
                columns.rank[order],
                category[order],
                device_key[order],
                thread_key[order],
                counter_key[order],
            ]
        )
        boundary = (
            np.r_[True, (keys[:, 1:] != keys[:, :-1]).any(axis=0)]
            if order.size
            else np.zeros(0, bool)
        )
        self.track_start = np.flatnonzero(boundary).astype(np.int64)
        self.track_end = np.r_[self.track_start[1:], order.size].astype(np.int64)
        self.start = columns.start_ns[order]
        self.duration = columns.duration_ns[order]
        self.end = self.start + self.duration
        self.name = columns.name[order]
        self.kind = columns.kind[order]
        track_of = np.zeros(order.size, dtype=np.int64)
        if order.size:
            track_of[self.track_start[1:]] = 1
            track_of = np.cumsum(track_of)
        self.track_of = track_of
        self.depth = self._rows(columns, order, category[order])
        self.tracks = self._describe_tracks(keys)

    # Built when first asked for: a summary needs only the track list.
    @cached_property
    def sorted_position(self) -> I64:
        """Column index -> sorted position."""
        position = np.empty(self.order.size, dtype=np.int64)
        position[self.order] = np.arange(self.order.size)
        return position

    @cached_property
    def partner(self) -> I64:
        """Sorted position -> its launch's kernel or its kernel's launch (-1: none)."""
        launches, kernels = launch_pairs(self.columns)
        partner = np.full(self.order.size, -1, dtype=np.int64)
        partner[self.sorted_position[launches]] = self.sorted_position[kernels]
        partner[self.sorted_position[kernels]] = self.sorted_position[launches]
        return partner

    # ------------------------------------------------------------------ construction

    def _rows(self, columns: EventColumns, order: I64, category: I64) -> I64:
        depth = np.clip(columns.depth[order], 0, MAX_DEPTH).astype(np.int64)
        depth[category != HOST] = 0
        # Device queues may overlap (a copy under a collective): put an event that starts
        # before everything earlier on its track has ended on a second row.
        device = np.flatnonzero(category == DEVICE)
        if device.size > 1:
            ends = self._segment_prefix_max(self.end, self.track_of)
            previous_end = np.r_[np.iinfo(np.int64).min, ends[:-1]]
            same_track = np.r_[False, self.track_of[1:] == self.track_of[:-1]]
            overlapped = same_track & (self.start < previous_end - _OVERLAP_TOLERANCE_NS)
            depth[device] = overlapped[device].astype(np.int64)
        return depth

    @staticmethod
    def _segment_prefix_max(values: I64, segment: I64) -> I64:
        if values.size == 0:
            return values.copy()
        low = int(values.min())
        width = int(values.max()) - low + 1
        shifted = values - low + segment * width
        result: I64 = np.maximum.accumulate(shifted) - segment * width + low
        return result

    @cached_property
    def max_end(self) -> I64:
        """Per sorted position, the latest end on its track up to it (window lookups)."""
        return self._segment_prefix_max(self.end, self.track_of)

    def _describe_tracks(self, keys: I64) -> list[Track]:
        tracks: list[Track] = []
        profile = self.profile
        for track_id, (first, last) in enumerate(
            zip(self.track_start, self.track_end, strict=True)
        ):
            node, rank, category, device, thread, counter = (int(v) for v in keys[:, first])
            info = profile.rank_info(rank)
            names = info.track_names if info else {}
            if category == STEPS:
                label = "Steps"
            elif category == HOST:
                label = names.get((thread, -1)) or f"Thread {thread}"
            elif category == DEVICE:
                label = names.get((thread, device)) or f"NeuronCore {device} · queue {thread}"
            else:
                label = self.columns.names[counter]
            rows = int(self.depth[first:last].max()) + 1 if category in (HOST, DEVICE) else 1
            unit = _counter_unit(int(self.kind[first])) if category == COUNTER else ""
            tracks.append(
                Track(
                    id=track_id,
                    node=node,
                    rank=rank,
                    kind=TRACK_KINDS[category],
                    label=label,
                    device=device,
                    thread_id=thread,
                    rows=rows,
                    event_count=int(last - first),
                    unit=unit,
                )
            )
        return tracks

    # ------------------------------------------------------------------ queries

    def tree(self) -> list[dict[str, Any]]:
        """node -> rank -> tracks, in display order."""
        nodes: list[dict[str, Any]] = []
        for track in self.tracks:
            if not nodes or nodes[-1]["index"] != track.node:
                nodes.append(
                    {"index": track.node, "name": self.profile.nodes[track.node], "ranks": []}
                )
            ranks = nodes[-1]["ranks"]
            if not ranks or ranks[-1]["rank"] != track.rank:
                info = self.profile.rank_info(track.rank)
                ranks.append(
                    {"rank": track.rank, "local_rank": info.local_rank if info else 0, "tracks": []}
                )
            ranks[-1]["tracks"].append(
                {
                    "id": track.id,
                    "kind": track.kind,
                    "label": track.label,
                    "device": track.device,
                    "rows": track.rows,
                    "events": track.event_count,
                    "unit": track.unit,
                }
            )
        return nodes

    def window(
        self,
        start_ns: int,
        end_ns: int,
        width_px: int,
        track_ids: list[int],
        max_items: int = MAX_WINDOW_ITEMS,
    ) -> dict[str, Any]:
        """What the tracks show between start_ns and end_ns drawn `width_px` wide: each track
        once (repeats are ignored), at most `max_items` events, cells and samples in all."""
        end_ns = max(end_ns, start_ns + 1)
        width_px = int(min(max(width_px, 1), MAX_WIDTH_PX))
        ns_per_px = (end_ns - start_ns) / width_px
        out_tracks = []
        omitted: list[int] = []
        budget = max_items
        visible_flow_ends: list[I64] = []
        for track_id in dict.fromkeys(track_ids):
            if not 0 <= track_id < len(self.tracks):
                continue
            track = self.tracks[track_id]
            first = int(self.track_start[track_id])
            last = int(self.track_end[track_id])
            if track.kind == "counter":
                samples = self._counter_window(track, start_ns, end_ns, width_px)
                if len(samples["t"]) > budget:
                    omitted.append(track_id)
                    continue
                budget -= len(samples["t"])
                out_tracks.append(samples)
                continue
            lo = first + int(np.searchsorted(self.max_end[first:last], start_ns, side="right"))
            hi = first + int(np.searchsorted(self.start[first:last], end_ns, side="left"))
            positions = np.arange(lo, max(lo, hi), dtype=np.int64)
            positions = positions[self.end[positions] > start_ns] if positions.size else positions
            wide = self.duration[positions] >= ns_per_px
            shown = positions[wide]
            most = min(MAX_EVENTS_PER_TRACK, budget)
            if shown.size > most:
                keep = np.argsort(-self.duration[shown], kind="stable")[:most]
                shown = np.sort(shown[keep])
            folded = self._fold(positions[~wide], start_ns, ns_per_px, width_px)
            items = int(shown.size) + len(folded["px"])
            if items > budget:
                omitted.append(track_id)
                continue
            budget -= items
            visible_flow_ends.append(shown[self.partner[shown] >= 0])
            entry: dict[str, Any] = {}
            if track.kind == "steps":
                entry["value"] = self.columns.value[self.order[shown]].tolist()
            out_tracks.append(
                entry
                | {
                    "id": track_id,
                    "ids": shown.tolist(),
                    "start": self.start[shown].tolist(),
                    "dur": self.duration[shown].tolist(),
                    "name": self.name[shown].tolist(),
                    "kind": self.kind[shown].tolist(),
                    "row": self.depth[shown].tolist(),
                    "agg": folded,
                }
            )
        return {
            "start": start_ns,
            "end": end_ns,
            "width": width_px,
            "tracks": out_tracks,
            "omitted": omitted,
            "flows": self._flows(visible_flow_ends),
        }

    def _fold(
        self, positions: I64, start_ns: int, ns_per_px: float, width_px: int
    ) -> dict[str, list[int]]:
        if positions.size == 0:
            return {"px": [], "row": [], "busy": [], "count": [], "name": []}
        clipped_start = np.maximum(self.start[positions], start_ns)
        px = ((clipped_start - start_ns) / ns_per_px).astype(np.int64)
        px = np.clip(px, 0, width_px - 1)
        rows = self.depth[positions]
        cell = rows * width_px + px
        cells, inverse, counts = np.unique(cell, return_inverse=True, return_counts=True)
        busy_ns = np.bincount(inverse, weights=self.duration[positions])
        busy = np.minimum(np.rint(1000.0 * busy_ns / ns_per_px), 1000).astype(np.int64)
        # Name of the longest folded event per cell, to colour it like its dominant work.
        by_length = np.lexsort((self.duration[positions], inverse))
        last_of_cell = by_length[np.r_[inverse[by_length][1:] != inverse[by_length][:-1], True]]
        return {
            "px": (cells % width_px).tolist(),
            "row": (cells // width_px).tolist(),
            "busy": busy.tolist(),
            "count": counts.tolist(),
            "name": self.name[positions[last_of_cell]].tolist(),
        }

    def _counter_window(
        self, track: Track, start_ns: int, end_ns: int, width_px: int
    ) -> dict[str, Any]:
        first = int(self.track_start[track.id])
        last = int(self.track_end[track.id])
        lo = first + int(np.searchsorted(self.start[first:last], start_ns, side="left"))
        hi = first + int(np.searchsorted(self.start[first:last], end_ns, side="right"))
        # One sample either side so the line reaches the window edges.
        lo = max(first, lo - 1)
        hi = min(last, hi + 1)
        order_positions = self.order[lo:hi]
        times = self.start[lo:hi]
        values = self.columns.value[order_positions].astype(np.float64)
        if track.unit == "cores":
            values = values / 1000.0
        if times.size > 2 * width_px:
            px = np.clip(
                ((times - start_ns) * width_px) // max(end_ns - start_ns, 1), 0, width_px - 1
            )
            cells, inverse = np.unique(px, return_inverse=True)
            sums = np.bincount(inverse, weights=values)
            counts = np.bincount(inverse)
            low = np.full(cells.size, np.inf)
            high = np.full(cells.size, -np.inf)
            np.minimum.at(low, inverse, values)
            np.maximum.at(high, inverse, values)
            bucket_time = start_ns + (cells * (end_ns - start_ns)) // width_px
            return {
                "id": track.id,
                "t": bucket_time.tolist(),
                "v": (sums / counts).tolist(),
                "min": low.tolist(),
                "max": high.tolist(),
            }
        return {"id": track.id, "t": times.tolist(), "v": values.tolist()}

    def _flows(self, ends: list[I64]) -> list[list[int]]:
        """[launch id, launch track, launch ts, kernel id, kernel track, kernel ts] per arrow."""
        if not ends:
            return []
        positions = np.unique(np.concatenate(ends))
        launch_side = np.where(
            self.kind[positions] == EventKind.LAUNCH, positions, self.partner[positions]
        )
        launch_side = np.unique(launch_side)[:MAX_FLOWS]
        kernel_side = self.partner[launch_side]
        arrows: list[list[int]] = np.stack(
            [
                launch_side,
                self.track_of[launch_side],
                self.start[launch_side],
                kernel_side,
                self.track_of[kernel_side],
                self.start[kernel_side],
            ],
            axis=1,
        ).tolist()
        return arrows

    def event(self, event_id: int) -> dict[str, Any] | None:
        """Everything known about one event, by the id the window query gave it."""
        if not 0 <= event_id < self.order.size:
            return None
        index = int(self.order[event_id])
        columns = self.columns
        kind = EventKind(int(columns.kind[index]))
        track = self.tracks[int(self.track_of[event_id])]
        start = int(columns.start_ns[index])
        wall = self.profile.origin_wall_ns + start
        detail: dict[str, Any] = {
            "id": event_id,
            "name": columns.names[int(columns.name[index])],
            "kind": kind.name,
            "node": self.profile.nodes[int(columns.node[index])],
            "rank": int(columns.rank[index]),
            "track": track.label,
            "track_id": track.id,
            "start_ns": start,
            "duration_ns": int(columns.duration_ns[index]),
            "wall_time": datetime.fromtimestamp(wall / 1e9, tz=UTC).isoformat(
                timespec="microseconds"
            ),
            "thread_id": int(columns.thread_id[index]),
            "device": int(columns.device[index]),
            "depth": int(columns.depth[index]),
            "value": int(columns.value[index]),
            "precision": Precision(int(columns.precision[index])).name,
            "flow_id": int(columns.flow_id[index]),
        }
        partner = int(self.partner[event_id])
        if partner >= 0:
            partner_index = int(self.order[partner])
            latency = (
                int(columns.start_ns[partner_index]) - start
                if kind == EventKind.LAUNCH
                else start - int(columns.start_ns[partner_index])
            )
            detail["linked"] = {
                "id": partner,
                "name": columns.names[int(columns.name[partner_index])],
                "kind": EventKind(int(columns.kind[partner_index])).name,
                "track_id": int(self.track_of[partner]),
                "launch_latency_ns": latency,
            }
        return detail
