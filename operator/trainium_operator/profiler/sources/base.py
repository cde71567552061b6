"""The interface every activity source implements (host annotations are built in).

The capture session drives a source through one profiling run:

- `start_window()` / `stop_window()` on the thread that calls `step()` (or start/stop) when
  the detailed step window opens and closes. They must be quick: no parsing, no file I/O
  beyond what the underlying profiler itself needs to stop.
- `collect(final)` on the profiler's background flusher thread, repeatedly: returns the events
  converted since the previous call. Conversion work belongs here, off the training thread.
  `final` is True for the last call, after the run's last window closed.
- `close()` once on the flusher thread after the final `collect()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from trainium_operator.profiler.clock import ClockSyncPoint
from trainium_operator.profiler.config import ProfilerConfig
from trainium_operator.profiler.events import Event


@dataclass(frozen=True)
class SourceContext:
    """What a source may need to know about the run it belongs to."""

    config: ProfilerConfig
    node_dir: Path  # <profile dir>/<node>: where this rank's outputs live
    pid: int
    start_sync: ClockSyncPoint


@dataclass
class SourceBatch:
    """Events converted by a source, with display names for the tracks they use."""

    events: list[Event] = field(default_factory=list)
    track_names: dict[tuple[int, int], str] = field(default_factory=dict)
    dropped_events: int = 0


class ActivitySource(Protocol):
    name: str

    def start_window(self) -> None: ...

    def stop_window(self) -> None: ...

    def collect(self, final: bool) -> SourceBatch: ...

    def close(self) -> None: ...
