"""Columnar, numpy-backed storage of a whole profile's events.

A profile of 2 nodes x 32 ranks holds about a million events; per-event Python objects would
cost ~200 bytes each and make every statistic a Python loop. Events are therefore appended
once, rank by rank, into typed buffers and then frozen into numpy arrays that every analysis
function slices and reduces in bulk.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from trainium_operator.profiler.events import Event, EventKind

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
U8 = npt.NDArray[np.uint8]
U64 = npt.NDArray[np.uint64]
F64 = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def kind_mask(kind: U8, kinds: Iterable[int]) -> BoolArray:
    """Boolean mask of the entries of `kind` that are one of `kinds`: a 256-entry table
    looked up per event (np.isin sorts both sides, several times slower on uint8 kinds)."""
    table = np.zeros(256, dtype=np.bool_)
    table[[int(k) for k in kinds]] = True
    mask: BoolArray = table[kind]
    return mask


TimelineMapping = Callable[[int, "npt.NDArray[np.int64]"], "npt.NDArray[np.int64]"]

DEVICE_BUSY_KINDS: tuple[EventKind, ...] = (
    EventKind.KERNEL,
    EventKind.MEMCPY,
    EventKind.COLLECTIVE,
)


@dataclass(frozen=True)
class EventColumns:
    """All events of a profile, one numpy array per field, in load order.

    `start_ns` is on the profile's common timeline (nanoseconds since the profile origin);
    `rank` is the global rank that recorded the event and `node` the index of its node in
    `node_names` of the owning profile. `name` indexes `names`.
    """

    kind: U8
    name: I32
    start_ns: I64
    duration_ns: I64
    thread_id: I64
    device: I32
    flow_id: U64
    value: I64
    precision: U8
    depth: I32
    rank: I32
    node: I32
    names: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    @property
    def end_ns(self) -> I64:
        return self.start_ns + self.duration_ns

    def of_kind(self, *kinds: EventKind) -> BoolArray:
        """Boolean mask of the events whose kind is one of `kinds`."""
        return kind_mask(self.kind, kinds)

    def name_id(self, name: str) -> int:
        """Index of `name` in the string table, or -1 when no event has it."""
        try:
            return self.names.index(name)
        except ValueError:
            return -1

    def nbytes(self) -> int:
        """Memory of the event columns (every field but the string table)."""
        return sum(int(getattr(self, f.name).nbytes) for f in fields(self) if f.name != "names")


class ColumnBuilder:
    """Accumulates events rank by rank, interning names, then freezes into `EventColumns`.

    Start times are shifted per rank by `offset_ns` (and optionally rescaled for clock drift)
    so every rank lands on the profile's common timeline.
    """

    def __init__(self) -> None:
        self._names: dict[str, int] = {}
        self._kind = array("B")
        self._name = array("i")
        self._start = array("q")
        self._duration = array("q")
        self._thread = array("q")
        self._device = array("i")
        self._flow = array("Q")
        self._value = array("q")
        self._precision = array("B")
        self._depth = array("i")
        self._rank_runs: list[tuple[int, int, int]] = []  # (rank, node, count)

    def intern(self, name: str) -> int:
        index = self._names.get(name)
        if index is None:
            index = len(self._names)
            self._names[name] = index
        return index

    def add_rank(self, rank: int, node: int, events: Iterable[Event]) -> int:
        """Appends one rank's events (raw monotonic timestamps); returns how many were added."""
        before = len(self._kind)
        names = self._names
        intern = self.intern
        kind_append = self._kind.append
        name_append = self._name.append
        start_append = self._start.append
        duration_append = self._duration.append
        thread_append = self._thread.append
        device_append = self._device.append
        flow_append = self._flow.append
        value_append = self._value.append
        precision_append = self._precision.append
        depth_append = self._depth.append
        for event in events:
            kind_append(event.kind)
            index = names.get(event.name)
            name_append(intern(event.name) if index is None else index)
            start_append(event.start_ns)
            duration_append(event.duration_ns)
            thread_append(event.thread_id)
            device_append(event.device)
            flow_append(event.flow_id)
            value_append(event.value)
            precision_append(event.precision)
            depth_append(event.depth)
        count = len(self._kind) - before
        self._rank_runs.append((rank, node, count))
        return count

    def build(self, to_timeline: TimelineMapping | None = None) -> EventColumns:
        """Freezes the buffers; `to_timeline(rank, starts)` maps a rank's raw start times onto
        the profile's common timeline (identity when None)."""
        ranks = np.empty(len(self._kind), dtype=np.int32)
        nodes = np.empty(len(self._kind), dtype=np.int32)
        start = np.frombuffer(self._start, dtype=np.int64).copy()
        position = 0
        for rank, node, count in self._rank_runs:
            ranks[position : position + count] = rank
            nodes[position : position + count] = node
            if to_timeline is not None:
                start[position : position + count] = to_timeline(
                    rank, start[position : position + count]
                )
            position += count
        return EventColumns(
            kind=np.frombuffer(self._kind, dtype=np.uint8).copy(),
            name=np.frombuffer(self._name, dtype=np.int32).copy(),
            start_ns=start,
            duration_ns=np.frombuffer(self._duration, dtype=np.int64).copy(),
            thread_id=np.frombuffer(self._thread, dtype=np.int64).copy(),
            device=np.frombuffer(self._device, dtype=np.int32).copy(),
            flow_id=np.frombuffer(self._flow, dtype=np.uint64).copy(),
            value=np.frombuffer(self._value, dtype=np.int64).copy(),
            precision=np.frombuffer(self._precision, dtype=np.uint8).copy(),
            depth=np.frombuffer(self._depth, dtype=np.int32).copy(),
            rank=ranks,
            node=nodes,
            names=tuple(self._names),
        )


def columns_from_events(
    events_by_rank: Iterable[tuple[int, int, Iterable[Event]]],
) -> EventColumns:
    """Columns for already-aligned events given as (rank, node index, events) triples."""
    builder = ColumnBuilder()
    for rank, node, events in events_by_rank:
        builder.add_rank(rank, node, events)
    return builder.build()
