"""Helpers for the profiler tests (imported by module name, like tests/unit/jobs.py)."""

from __future__ import annotations

import random
from pathlib import Path

from trainium_operator import profiler
from trainium_operator.profiler.clock import ClockSyncPoint
from trainium_operator.profiler.columnar import RecordColumns, decode_record_columns
from trainium_operator.profiler.config import ProfilerConfig
from trainium_operator.profiler.events import HOST_DEVICE, Event, EventKind, Precision
from trainium_operator.profiler.format import (
    RankFileReader,
    RankHeader,
    RankProfile,
    read_rank_file,
)

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


HEADER = RankHeader(
    rank=5,
    world_size=64,
    local_rank=5,
    group_rank=0,
    node="ip-10-1-2-3",
    hostname="trainer-0",
    pid=4242,
    job_name="llama",
    namespace="ml",
    job_uid="6f1c",
    attempt=1,
    step_window=(10, 20),
    sources=("host", "torch"),
    clock_sync=(ClockSyncPoint(1_000, 1_700_000_000_000_001_000, 40),),
    extra={"note": "ünïcode"},
)


def training_like_events(count: int, seed: int = 7) -> list[Event]:
    """A realistic mix: step markers, nested host ranges, launches/kernels with flows, samples."""
    rng = random.Random(seed)
    names = ["forward", "backward", "optimizer", "aten::addmm", "aten::relu", "nrt_execute"]
    events: list[Event] = []
    t = 5_000_000_000
    flow = 0
    while len(events) < count:
        t += rng.randint(1_000, 50_000)
        kind = rng.choice(
            [EventKind.ANNOTATION, EventKind.HOST_OP, EventKind.HOST_OP, EventKind.LAUNCH]
        )
        duration = rng.randint(500, 2_000_000)
        if kind == EventKind.LAUNCH:
            flow += 1
            events.append(Event(kind, "nrt_execute", t, duration, 77, HOST_DEVICE, flow))
            events.append(
                Event(
                    EventKind.KERNEL,
                    "nc_exec",
                    t + 30_000,
                    duration * 3,
                    0,
                    3,
                    flow,
                    precision=Precision.BF16,
                )
            )
        else:
            events.append(
                Event(
                    kind, rng.choice(names), t, duration, 77, HOST_DEVICE, depth=rng.randint(0, 3)
                )
            )
        if len(events) % 50 == 0:
            events.append(Event(EventKind.MEMORY, "memory.rss", t, 0, 0, HOST_DEVICE, value=2**33))
    return events[:count]


def decode_columnar(path: Path) -> tuple[RecordColumns, list[str]]:
    with RankFileReader(path) as reader:

        def decode(payload: bytes, offset: int, count: int) -> RecordColumns:
            return decode_record_columns(payload, offset, count, len(reader.strings), reader.tracks)

        batches = list(reader.decoded_blocks(decode))
        return RecordColumns.concatenate(batches), list(reader.strings)


def as_events(columns: RecordColumns, strings: list[str]) -> list[Event]:
    return [
        Event(
            EventKind(int(columns.kind[i])),
            strings[int(columns.name[i])],
            int(columns.start_ns[i]),
            int(columns.duration_ns[i]),
            int(columns.thread_id[i]),
            int(columns.device[i]),
            int(columns.flow_id[i]),
            int(columns.value[i]),
            Precision(int(columns.precision[i])),
            int(columns.depth[i]),
        )
        for i in range(len(columns))
    ]
