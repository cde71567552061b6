"""Helpers for the profiler tests (imported by module name, like tests/unit/jobs.py)."""

from __future__ import annotations

from pathlib import Path

from trainium_operator import profiler
from trainium_operator.profiler.config import ProfilerConfig
from trainium_operator.profiler.events import Event, EventKind
from trainium_operator.profiler.format import RankProfile, read_rank_file

NODE = "node-a"


def make_config(output_dir: Path, **overrides: object) -> ProfilerConfig:
    """A config for tests: no device sources, no sampler, fast flushing."""
    values: dict[str, object] = {
        "output_dir": output_dir,
        "node": NODE,
        "sources": frozenset(),
        "sample_interval_s": 0.0,
        "flush_interval_s": 0.05,
    }
    values.update(overrides)
    return ProfilerConfig(**values)  # type: ignore[arg-type]


def start(output_dir: Path, **overrides: object) -> Path:
    """Start profiling into output_dir; returns the rank file it will write."""
    config = make_config(output_dir, **overrides)
    assert profiler.start_profiling(config)
    assert config.rank_file is not None
    return config.rank_file


def stop_and_read(rank_file: Path) -> RankProfile:
    assert profiler.stop_profiling(wait=True, timeout=30), "the flusher did not finish"
    return read_rank_file(rank_file)


def of_kind(events: list[Event], kind: EventKind) -> list[Event]:
    return [e for e in events if e.kind == kind]


def ranges_by_name(events: list[Event]) -> dict[str, list[Event]]:
    found: dict[str, list[Event]] = {}
    for ev in of_kind(events, EventKind.ANNOTATION):
        found.setdefault(ev.name, []).append(ev)
    return found
