"""The timeline of a profile opened from its summaries: ranks decoded only when shown.

The track tree comes from the summaries. A window query names tracks; each belongs to one
rank, and only those ranks are decoded (`analysis.summary.rank_timeline`, kept in the UI's
memory LRU) and asked for their part of the window. Track ids are the profile's (a rank's
tracks are contiguous); an event id is `rank position * EVENT_ID_STRIDE + its id within the
rank`, so the browser never needs to know which rank it came from.
"""

from __future__ import annotations

import bisect
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from trainium_operator.analysis.summary import ComposedProfile
from trainium_operator.analysis.timeline import MAX_FLOWS, MAX_WINDOW_ITEMS, TimelineIndex

EVENT_ID_STRIDE = 1 << 32  # events of one rank; ids stay below 2**53 (exact in JavaScript)
RankIndex = Callable[[int], Awaitable[TimelineIndex]]


def rank_of_track(composed: ComposedProfile, track_id: int) -> int:
    """The position (in `composed.summaries`) of the rank that owns a track."""
    return bisect.bisect_right(composed.track_offset, track_id) - 1


def tree(composed: ComposedProfile) -> list[dict[str, Any]]:
    """node -> rank -> tracks, in display order (as `TimelineIndex.tree`)."""
    nodes: list[dict[str, Any]] = []
    names = composed.inputs.nodes
    for summary, node, offset in zip(
        composed.summaries, composed.node_of, composed.track_offset, strict=True
    ):
        if not summary.tracks:
            continue
        if not nodes or nodes[-1]["index"] != node:
            nodes.append({"index": node, "name": names[node], "ranks": []})
        tracks = [
            {key: track[key] for key in ("kind", "label", "device", "rows", "events", "unit")}
            | {"id": offset + i}
            for i, track in enumerate(summary.tracks)
        ]
        nodes[-1]["ranks"].append(
            {"rank": summary.rank, "local_rank": summary.local_rank, "tracks": tracks}
        )
    return nodes


def _items(track: dict[str, Any]) -> int:
    return len(track["ids"]) + len(track["agg"]["px"]) if "ids" in track else len(track["t"])


def _global_track(
    composed: ComposedProfile, track: dict[str, Any], position: int
) -> dict[str, Any]:
    """A rank's window track with the profile's track, event and name ids."""
    out = dict(track)
    out["id"] = track["id"] + composed.track_offset[position]
    if "ids" in track:
        names = composed.name_lookup[position]
        out["ids"] = [position * EVENT_ID_STRIDE + i for i in track["ids"]]
        out["name"] = names[np.asarray(track["name"], dtype=np.int64)].tolist()
        out["agg"] = track["agg"] | {
            "name": names[np.asarray(track["agg"]["name"], dtype=np.int64)].tolist()
        }
    return out


async def window(
    composed: ComposedProfile,
    rank_index: RankIndex,
    *,
    start_ns: int,
    end_ns: int,
    width_px: int,
    track_ids: list[int],
    max_items: int = MAX_WINDOW_ITEMS,
) -> dict[str, Any]:
    """`TimelineIndex.window` over the whole profile, decoding only the ranks it names."""
    by_rank: dict[int, list[int]] = {}
    for track_id in dict.fromkeys(track_ids):
        if 0 <= track_id < len(composed.tracks):
            position = rank_of_track(composed, track_id)
            by_rank.setdefault(position, []).append(track_id - composed.track_offset[position])
    answer: dict[str, Any] = {"tracks": [], "omitted": [], "flows": []}
    budget = max_items
    for position, local_ids in by_rank.items():
        index = await rank_index(position)
        offset = composed.track_offset[position]
        part = index.window(start_ns, end_ns, width_px, local_ids, max_items=budget)
        answer.update(start=part["start"], end=part["end"], width=part["width"])
        for track in part["tracks"]:
            budget -= _items(track)
            answer["tracks"].append(_global_track(composed, track, position))
        answer["omitted"].extend(track + offset for track in part["omitted"])
        base = position * EVENT_ID_STRIDE
        answer["flows"].extend(
            [
                base + launch,
                launch_track + offset,
                launch_ts,
                base + kernel,
                kernel_track + offset,
                ts,
            ]
            for launch, launch_track, launch_ts, kernel, kernel_track, ts in part["flows"]
        )
    if "start" not in answer:  # no track named: the window's own bounds, nothing in it
        end_ns = max(end_ns, start_ns + 1)
        answer.update(start=start_ns, end=end_ns, width=width_px)
    answer["flows"] = answer["flows"][:MAX_FLOWS]
    return {key: answer[key] for key in ("start", "end", "width", "tracks", "omitted", "flows")}


def split_event_id(composed: ComposedProfile, event_id: int) -> tuple[int, int] | None:
    position, local = divmod(event_id, EVENT_ID_STRIDE)
    if event_id < 0 or position >= len(composed.summaries):
        return None
    return position, local


def event(
    composed: ComposedProfile, index: TimelineIndex, position: int, local: int
) -> dict[str, Any] | None:
    """`TimelineIndex.event` of a rank, with the profile's event and track ids."""
    detail = index.event(local)
    if detail is None:
        return None
    offset, base = composed.track_offset[position], position * EVENT_ID_STRIDE
    detail["id"] = base + detail["id"]
    detail["track_id"] += offset
    if "linked" in detail:
        detail["linked"]["id"] += base
        detail["linked"]["track_id"] += offset
    return detail
