"""Host-side capture: the hot path (annotations, step markers) and the background threads.

Each thread records into its own bounded buffer of records: one flat list holding the seven
fields of each record in turn (no tuple per record, so recording adds nothing for the garbage
collector to track, and the flusher takes each field of every record with one slice). Only
the owning thread appends to it and only the flusher thread takes from its front, so the GIL
is the only synchronisation: `list += tuple` adds a whole record atomically, and the flusher
takes the first `len()` items it saw, then deletes exactly those. A full buffer drops the
new record and counts it.

Names are stored as the caller's string objects; interning into the file's string table
happens on the flusher thread, off the training thread. Timestamps are
`time.monotonic_ns()`; clock sync points map them to wall-clock time.

Outside the step window, `annotate(name)` reads one global and returns the name's shared
annotation, whose `with` runs no Python code and allocates nothing; `step()` returns after
one global read while profiling is off.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import itertools
import logging
import operator
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Final, ParamSpec, TypeVar

from trainium_operator.contract import channel as contract
from trainium_operator.contract import profiler_env
from trainium_operator.profiler import channel
from trainium_operator.profiler import sampler as sampler_mod
from trainium_operator.profiler.clock import take_sync_point
from trainium_operator.profiler.config import ProfilerConfig, ProfilerConfigError
from trainium_operator.profiler.events import HOST_DEVICE, EventKind
from trainium_operator.profiler.format import (
    EventBatch,
    ProfileFormatError,
    RankFileReader,
    RankFileWriter,
    RankHeader,
    Row,
    batch_of_rows,
    event_row,
    read_rank_header,
    row_track_order,
)
from trainium_operator.profiler.manifest import (
    ProfileManifest,
    manifest_from_rank_files,
    now_iso,
    write_manifest,
)
from trainium_operator.profiler.sources.base import ActivitySource, SourceBatch, SourceContext

log = logging.getLogger("trainium_operator.profiler")

P = ParamSpec("P")
R = TypeVar("R")

_monotonic_ns: Final = time.monotonic_ns
_get_ident: Final = threading.get_ident
_ANNOTATION: Final = int(EventKind.ANNOTATION)
_STEP: Final = int(EventKind.STEP)

STEP_EVENT_NAME: Final = "step"
OVERHEAD_COUNTER: Final = "profiler.background_cpu_ns"
"""COUNTER whose value is the CPU time the profiler's own thread has used so far."""
_COUNTER: Final = int(EventKind.COUNTER)
COUNTER_THREAD: Final = 0
"""thread_id of sampled counters (CPU, memory): they belong to the process, not a thread."""

RECORD_FIELDS: Final = 7
Record = tuple[int, str, int, int, int, int, int]
"""(kind, name, start_ns, end_ns, depth, value, thread_id): the fields of one record."""


class ThreadRing:
    """One thread's pending records, RECORD_FIELDS list items each. Written by its thread,
    drained by the flusher."""

    __slots__ = ("buf", "depth", "dropped", "ident", "limit", "thread", "thread_id")

    def __init__(self, capacity: int, thread: threading.Thread, thread_id: int) -> None:
        self.buf: list[Any] = []
        self.limit = capacity * RECORD_FIELDS  # items, for `capacity` records
        self.dropped = 0  # records lost to a full buffer (owner thread only)
        self.depth = 0  # open annotations on this thread
        self.thread = thread
        self.ident = thread.ident  # threading.get_ident() of the owner, a cheap identity test
        self.thread_id = thread_id  # the OS thread id, which other profilers also report

    def push(self, record: Record) -> None:
        buf = self.buf
        if len(buf) < self.limit:
            buf += record
        else:
            self.dropped += 1

    def drain(self) -> list[Any]:
        """Take every record written so far (flusher thread only), flat: RECORD_FIELDS items
        per record. The buffer keeps no reference to them."""
        buf = self.buf
        count = len(buf)  # whole records only: the owner adds a record in one operation
        taken = buf[:count]
        del buf[:count]
        return taken


class _Session:
    """One profiling run in this process: from start_profiling() to the final flush."""

    def __init__(self, config: ProfilerConfig, sources: list[ActivitySource] | None) -> None:
        assert config.output_dir is not None
        self.config = config
        self.pid = os.getpid()
        self.start_sync = take_sync_point()
        self.created = now_iso()
        self.local = threading.local()
        self.rings: list[ThreadRing] = []
        self.rings_lock = threading.Lock()
        self.step_number: int | None = None
        # The detailed window as plain ints for step(); no window means every step.
        self.window_first = config.steps.first if config.steps else -(2**63)
        self.window_last = config.steps.last if config.steps else 2**63
        self.step_start_ns = 0
        self.detail = False
        self.stopping = threading.Event()
        self.flushed = threading.Event()
        self.on_flushed: Callable[[], None] | None = None  # after the final flush, any thread
        self.failed: BaseException | None = None
        self.node_dir = config.output_dir / config.node
        self.context = SourceContext(
            config=config, node_dir=self.node_dir, pid=self.pid, start_sync=self.start_sync
        )
        self.sources = list(sources) if sources is not None else default_sources(self.context)
        self.source_dropped = 0
        self.flusher_cpu_ns = 0
        self.flusher = threading.Thread(
            target=self._flush_main, name="trainium-profiler-flush", daemon=True
        )
        self.sampler = sampler_mod.Sampler(
            record=self._record_sample,
            interval_s=config.sample_interval_s,
            idle_interval_s=max(config.sample_interval_s * 10, 1.0),
            node_wide=config.local_rank == 0,
            detail=lambda: self.detail,
        )

    # -- called on the training thread -----------------------------------------------------

    def ring(self) -> ThreadRing:
        try:
            ring: ThreadRing = self.local.ring
        except AttributeError:
            thread = threading.current_thread()
            ring = ThreadRing(self.config.ring_events, thread, threading.get_native_id())
            with self.rings_lock:
                self.rings.append(ring)
            self.local.ring = ring
        return ring

    def on_step(self, number: int) -> None:
        now = _monotonic_ns()
        previous = self.step_number
        if previous is not None:
            try:
                ring: ThreadRing = self.local.ring
            except AttributeError:
                ring = self.ring()
            buf = ring.buf  # ring.push(), inlined: a call costs a microsecond between steps
            if len(buf) < ring.limit:
                buf += (
                    _STEP,
                    STEP_EVENT_NAME,
                    self.step_start_ns,
                    now,
                    0,
                    previous,
                    ring.thread_id,
                )
            else:
                ring.dropped += 1
        self.step_number = number
        self.step_start_ns = now
        if now >= self.sampler.next_due_ns:
            self.sampler.on_step(now)
        detail = self.window_first <= number <= self.window_last
        if detail != self.detail:
            self.set_detail(detail)

    def set_detail(self, on: bool) -> None:
        if on == self.detail:
            return
        self.detail = on
        _publish_detail(self if on else _other_detail(self))
        self.sampler.reschedule()
        for source in self.sources:
            try:
                if on:
                    source.start_window()
                else:
                    source.stop_window()
            except Exception:
                log.exception(
                    "profiler source %s failed to %s", source.name, "start" if on else "stop"
                )

    def begin_stop(self) -> None:
        now = _monotonic_ns()
        if self.step_number is not None:
            ring = self.ring()
            ring.push(
                (
                    _STEP,
                    STEP_EVENT_NAME,
                    self.step_start_ns,
                    now,
                    0,
                    self.step_number,
                    ring.thread_id,
                )
            )
            self.step_number = None
        self.set_detail(False)
        self.stopping.set()

    def start(self) -> None:
        if self.config.steps is None:
            self.set_detail(True)
        if self.config.sample_interval_s > 0:
            self.sampler.start()
        self.flusher.start()

    # -- samples: taken at step markers or by the flusher -----------------------------------

    def _record_sample(
        self, kind: EventKind, name: str, start_ns: int, end_ns: int, value: int
    ) -> None:
        self.ring().push((int(kind), name, start_ns, end_ns, 0, value, COUNTER_THREAD))

    # -- flusher thread --------------------------------------------------------------------

    def _header(self) -> RankHeader:
        c = self.config
        return RankHeader(
            rank=c.rank,
            world_size=c.world_size,
            local_rank=c.local_rank,
            group_rank=c.group_rank,
            node=c.node,
            hostname=socket.gethostname(),
            pid=self.pid,
            job_name=c.job_name,
            namespace=c.namespace,
            job_uid=c.job_uid,
            attempt=c.attempt,
            step_window=(c.steps.first, c.steps.last) if c.steps else None,
            sources=("host", *sorted(s.name for s in self.sources)),
            clock_sync=(self.start_sync,),
        )

    def _manifest(self, finished: bool) -> ProfileManifest:
        c = self.config
        return ProfileManifest(
            job_name=c.job_name,
            namespace=c.namespace,
            uid=c.job_uid,
            attempt=c.attempt,
            created=self.created,
            world_size=c.world_size,
            step_window=(c.steps.first, c.steps.last) if c.steps else None,
            clock_sync=(self.start_sync,) if not finished else (self.start_sync, take_sync_point()),
            finished=finished,
        )

    def _flush_main(self) -> None:
        writer: RankFileWriter | None = None
        try:
            path = self.config.rank_file
            assert path is not None
            previous = set_aside_previous(path)
            header = self._header()
            if previous is not None:
                header = with_earlier_session(header, previous)
            writer = RankFileWriter(path, header)
            writer.name_track(COUNTER_THREAD, HOST_DEVICE, "process counters")
            if previous is not None:
                self.source_dropped += carry_over(previous, writer)
            if self.config.rank == 0:
                self._write_manifest(finished=False)
            self._flush_loop(writer)
        except BaseException as exc:
            self.failed = exc
            log.exception("profiler flusher failed; this rank's profile is incomplete")
        finally:
            self.sampler.stop()
            if writer is not None:
                try:
                    writer.close(dropped_events=self.dropped_events())
                except Exception:
                    log.exception("profiler could not close %s", writer.path)
            for source in self.sources:
                try:
                    source.close()
                except Exception:
                    log.exception("profiler source %s failed to close", source.name)
            if self.config.rank == 0 and self.failed is None:
                try:
                    self._write_manifest(finished=True)
                except Exception:
                    log.exception("profiler could not write the profile manifest")
            self.flushed.set()
            if self.on_flushed is not None:
                try:
                    self.on_flushed()
                except Exception:
                    log.exception("profiler: the end-of-flush callback failed")

    def _flush_loop(self, writer: RankFileWriter) -> None:
        c = self.config
        pending: list[EventBatch] = []
        pending_count = 0
        last_write = last_sync = time.monotonic()
        max_age = c.sync_interval_s
        sampler_wake_ns = self.sampler.on_wake(_monotonic_ns())
        while True:
            # The flush period, or sooner when the sampler needs a wake (node counters, or
            # process samples while no steps take them).
            until_sampler_s = (sampler_wake_ns - _monotonic_ns()) / 1e9
            stopping = self.stopping.wait(max(min(c.flush_interval_s, until_sampler_s), 0.0))
            if stopping:
                self.sampler.stop()  # its last samples land in this thread's ring, drained next
            else:
                sampler_wake_ns = self.sampler.on_wake(_monotonic_ns())
            drained = self._drain_rings(writer) + self._collect_sources(writer, final=stopping)
            if stopping:
                drained.append(self._overhead_batch())
            pending += drained
            pending_count += sum(map(len, drained))
            now = time.monotonic()
            if pending_count and (stopping or pending_count >= 4096 or now - last_write >= max_age):
                writer.write_batch(EventBatch.concatenate(pending))
                pending = []
                pending_count = 0
                last_write = now
            if stopping or now - last_sync >= c.sync_interval_s:
                writer.write_sync_points([take_sync_point()])
                last_sync = now
                pending.append(self._overhead_batch())
                pending_count += 1
            if stopping:
                return

    def _overhead_batch(self) -> EventBatch:
        # The profiler's own cost, recorded in the profile it produces.
        self.flusher_cpu_ns = time.thread_time_ns()
        value = self.flusher_cpu_ns
        at = _monotonic_ns()
        row = (_COUNTER, OVERHEAD_COUNTER, at, 0, COUNTER_THREAD, HOST_DEVICE, 0, value, 0, 0)
        return batch_of_rows([row])

    def _drain_rings(self, writer: RankFileWriter) -> list[EventBatch]:
        with self.rings_lock:
            rings = list(self.rings)
        batches: list[EventBatch] = []
        for ring in rings:
            records = ring.drain()
            if records:
                writer.name_track(ring.thread_id, HOST_DEVICE, ring.thread.name)
                batches.append(records_batch(records))
        return batches

    def _collect_sources(self, writer: RankFileWriter, final: bool) -> list[EventBatch]:
        rows: list[Row] = []
        for source in self.sources:
            try:
                batch: SourceBatch = source.collect(final)
            except Exception:
                log.exception("profiler source %s failed to convert its output", source.name)
                continue
            for (thread_id, device), name in batch.track_names.items():
                writer.name_track(thread_id, device, name)
            self.source_dropped += batch.dropped_events
            rows.extend(event_row(e) for e in batch.events)
        if not rows:
            return []
        rows.sort(key=row_track_order)
        return [batch_of_rows(rows)]

    def dropped_events(self) -> int:
        with self.rings_lock:
            return sum(r.dropped for r in self.rings) + self.source_dropped

    def _write_manifest(self, finished: bool) -> None:
        assert self.config.output_dir is not None
        manifest = manifest_from_rank_files(self.config.output_dir, self._manifest(finished))
        write_manifest(self.config.output_dir, manifest)


def set_aside_previous(path: Path) -> Path | None:
    """Move an existing rank file (an earlier session, or a restarted worker's) out of the way."""
    if not path.exists():
        return None
    aside = path.with_name(f".{path.name}.previous")
    os.replace(path, aside)
    return aside


def with_earlier_session(header: RankHeader, previous: Path) -> RankHeader:
    """`header` noting the earlier session's pid and sources (kept in the same file)."""
    try:
        earlier = read_rank_header(previous)
    except (OSError, ProfileFormatError):
        return header
    pids = [p for p in earlier.extra.get("earlier_pids", "").split(",") if p]
    pids.append(str(earlier.pid))
    return dataclasses.replace(
        header,
        sources=tuple(dict.fromkeys((*header.sources, *earlier.sources))),
        extra={**header.extra, "earlier_pids": ",".join(pids)},
    )


def carry_over(previous: Path, writer: RankFileWriter) -> int:
    """Copy an earlier session's readable events into `writer`; returns its dropped count.

    One file per rank stays the rule: a second start_profiling() in a process, or a worker
    that torchrun restarted, continues the rank's file instead of replacing it. What a crashed
    writer left is kept up to its damage.
    """
    dropped = 0
    try:
        with RankFileReader(previous) as reader:
            try:
                for rows in reader.row_blocks():
                    for (thread_id, device), name in reader.track_names.items():
                        writer.name_track(thread_id, device, name)
                    writer.write_rows(rows)
            except ProfileFormatError as exc:
                log.warning("profiler kept the readable part of the earlier %s", exc)
            writer.write_sync_points(reader.clock_sync)
            dropped = reader.dropped_events
    except (OSError, ProfileFormatError) as exc:
        log.warning("profiler could not carry over the earlier rank file: %s", exc)
    previous.unlink(missing_ok=True)
    return dropped


def records_batch(flat: list[Any]) -> EventBatch:
    """Drained records (RECORD_FIELDS items each) as columns, in the order they were written
    (for ranges, the order they ended): one slice per field."""
    step = RECORD_FIELDS
    start = flat[2::step]
    count = len(start)
    zeros = [0] * count  # flow and precision: the writer never changes a column
    return EventBatch(
        kind=flat[0::step],
        name=flat[1::step],
        start_ns=start,
        duration_ns=list(map(operator.sub, flat[3::step], start)),
        thread_id=flat[6::step],
        device=[HOST_DEVICE] * count,
        flow_id=zeros,
        value=flat[5::step],
        precision=zeros,
        depth=flat[4::step],
    )


def default_sources(context: SourceContext) -> list[ActivitySource]:
    """The device sources the config asks for and this process can support."""
    found: list[ActivitySource] = []
    wanted = context.config.sources
    if "torch" in wanted:
        from trainium_operator.profiler.sources import torch_source

        src = torch_source.create(context)
        if src is not None:
            found.append(src)
    if "neuron" in wanted:
        from trainium_operator.profiler.sources import neuron

        nsrc = neuron.create(context)
        if nsrc is not None:
            found.append(nsrc)
    return found


# ---------------------------------------------------------------------------------------------
# Module state read by the hot path. `_session` is the running session (step markers go to it
# even outside the detailed window); `_detail` is the same session while the window is open.

_session: _Session | None = None
_detail: _Session | None = None
# An on-demand capture the operator asked for over the health channel (`captureSteps`): its own
# session, with its own directory and step window, beside `_session` (or without one).
_on_demand: _Session | None = None
_last_stopped: _Session | None = None
_lifecycle_lock = threading.Lock()
_PREVIOUS_FLUSH_WAIT_S = 60.0


def _other_detail(closing: _Session) -> _Session | None:
    """The session whose window is still open when `closing`'s closes (annotations go to it)."""
    for session in (_session, _on_demand):
        if session is not None and session is not closing and session.detail:
            return session
    return None


def on_demand_config(
    directory: str, first: int, steps: int, environ: dict[str, str] | None = None
) -> ProfilerConfig:
    """The settings of an on-demand capture: the pod's own profiler settings (identity,
    sources, intervals) with profiling on, `directory` and the window `first`..`first+steps-1`."""
    env = dict(os.environ if environ is None else environ)
    env.update(
        {
            profiler_env.ENABLE: "1",
            profiler_env.DIR: directory,
            profiler_env.STEPS: f"{first}:{first + steps - 1}",
        }
    )
    return ProfilerConfig.from_env(env)


def _on_demand_step(number: int) -> None:
    """Step `number` for the on-demand capture: opens a requested one, closes a finished one
    (its files are written in the background; the rank reports them once complete)."""
    global _on_demand  # noqa: PLW0603 - module globals are the hot path's one-read state
    session = _on_demand
    if session is not None:
        if number <= session.window_last:
            session.on_step(number)
            return
        session.begin_stop()
        _on_demand = None
    reporter = channel.current()
    request = reporter.take_capture() if reporter is not None else None
    if reporter is None or request is None:
        return
    directory = contract.on_demand_dir(reporter.config.stacks_dir, request.request_id)
    try:
        config = on_demand_config(directory, number, request.steps)
    except ProfilerConfigError as error:
        log.warning("profiler: on-demand capture %s not started: %s", request.request_id, error)
        reporter.capture_finished(request.request_id, complete=False)
        return
    # A running session owns the device profilers (one torch profiler per process): beside
    # it, the on-demand capture records host ranges, step markers and samples.
    session = _Session(config, [] if _session is not None else None)
    request_id = request.request_id
    session.on_flushed = lambda: reporter.capture_finished(
        request_id, complete=session.failed is None
    )
    _on_demand = session
    session.start()
    session.on_step(number)
    reporter.capture_started(request_id)
    _install_sigterm_flush()


def _stop_on_demand(wait_s: float) -> None:
    """Closes an open on-demand capture and waits (at most `wait_s`) for its files, so the
    rank's last message can report it."""
    global _on_demand
    session, _on_demand = _on_demand, None
    if session is not None:
        session.begin_stop()
        session.flushed.wait(wait_s)


_ON_DEMAND_STOP_WAIT_S = 2.0


def start_profiling(
    config: ProfilerConfig | None = None, *, sources: list[ActivitySource] | None = None
) -> bool:
    """Start capturing; returns False (and does nothing) when profiling is off.

    With no config, settings come from the environment (`TRAINIUM_PROFILE=1` etc.).
    `sources` replaces the device sources the config would choose. Calling it again while
    running is a no-op that returns True.
    """
    global _session  # noqa: PLW0603 - module globals are the hot path's one-read state
    channel.start_from_env()  # the health channel runs whether or not profiling does
    cfg = ProfilerConfig.from_env() if config is None else config
    if not cfg.enabled:
        return False
    with _lifecycle_lock:
        if _session is not None:
            return True
        previous = _last_stopped
        if previous is not None and previous.config.rank_file == cfg.rank_file:
            # The earlier session is still finishing this rank's file in the background.
            previous.flushed.wait(_PREVIOUS_FLUSH_WAIT_S)
        session = _Session(cfg, sources)
        _session = session
        session.start()
    _install_sigterm_flush()
    return True


def stop_profiling(*, wait: bool = False, timeout: float | None = None) -> bool:
    """Stop capturing. Returns at once: the final flush runs on the background thread (an
    on-demand capture still open is closed first, waiting at most 2 s for its file, so the
    health channel's last message can report it).

    wait=True blocks until the rank file is complete (or `timeout` passes) and returns whether
    it completed. Returns True without waiting.
    """
    global _session, _last_stopped  # noqa: PLW0603 - module globals are the hot path's one-read state
    _stop_on_demand(_ON_DEMAND_STOP_WAIT_S)
    channel.stop()
    with _lifecycle_lock:
        session = _session
        if session is None:
            return True
        session.begin_stop()
        _session = None
        _publish_detail(None)
        _last_stopped = session
    _remove_sigterm_flush()
    if wait:
        return session.flushed.wait(timeout)
    return True


def background_cpu_ns() -> int | None:
    """CPU time the running session's own thread (the flusher, which also reads the node
    counters) has used, or None. Samples taken at step markers run on the training thread.

    The same figure is written into the profile as the `profiler.background_cpu_ns` counter
    at every sync point and at stop, so each profile reports what it cost.
    """
    session = _session
    if session is None:
        return None
    thread = session.flusher
    if thread.ident is None or not thread.is_alive():
        return 0
    try:
        return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))
    except (OSError, AttributeError):  # it exited meanwhile, or not Linux
        return 0


def is_enabled() -> bool:
    """True while profiling runs (step markers are recorded), in or out of the step window."""
    return _session is not None


def is_capturing_detail() -> bool:
    """True while annotations are recorded (inside the step window)."""
    return _detail is not None


def current_config() -> ProfilerConfig | None:
    session = _session
    return session.config if session is not None else None


def step(number: int) -> None:
    """Mark the start of training step `number` (and the end of the previous one).

    Steps are recorded for the whole run; the step window only limits detailed capture.
    Call it from the training loop's thread.
    """
    session = _session
    if session is not None:
        session.on_step(number)
    if _on_demand is not None or channel.capture_pending():
        _on_demand_step(number)
    channel.on_step(number)


class Annotation:
    """A named host range: `with annotate("forward"):` or `@annotate("forward")`.

    An instance used as a context manager records one range per `with`; used as a decorator
    it records one range per call and can be shared by threads.
    """

    __slots__ = ("_depth", "_ring", "_start", "name")

    def __init__(self, name: str) -> None:
        # _start and _depth are set only when recording: fewer stores on the disabled path.
        self.name = name
        self._ring: ThreadRing | None = None

    def __enter__(self) -> Annotation:
        session = _detail
        if session is None:
            self._ring = None
            return self
        try:
            ring: ThreadRing = session.local.ring
        except AttributeError:
            ring = session.ring()
        depth = ring.depth
        ring.depth = depth + 1
        self._ring = ring
        self._depth = depth
        self._start = _monotonic_ns()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        ring = self._ring
        if ring is None:
            return
        end = _monotonic_ns()
        self._ring = None
        depth = self._depth
        ring.depth = depth
        buf = ring.buf
        if len(buf) < ring.limit:
            buf += (_ANNOTATION, self.name, self._start, end, depth, 0, ring.thread_id)
        else:
            ring.dropped += 1

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        name = self.name

        @functools.wraps(fn)
        def annotated(*args: P.args, **kwargs: P.kwargs) -> R:
            session = _detail
            if session is None:
                return fn(*args, **kwargs)
            try:
                ring: ThreadRing = session.local.ring
            except AttributeError:
                ring = session.ring()
            depth = ring.depth
            ring.depth = depth + 1
            start = _monotonic_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                end = _monotonic_ns()
                ring.depth = depth
                ring.push((_ANNOTATION, name, start, end, depth, 0, ring.thread_id))

        return annotated


class _SharedAnnotation(Annotation):
    """What `annotate(name)` returns outside the step window: one object per name, shared by
    every caller, so an annotation there allocates nothing. Its class says what `with` does:
    `_IdleAnnotation` while no window is open, `_WindowAnnotation` while one is (a caller may
    keep the object and use it later, as it may any Annotation)."""

    __slots__ = ("_enter_self",)

    def __init__(self, name: str) -> None:
        super().__init__(name)
        # A C callable returning this object: `with` calls it without running Python code.
        self._enter_self: Callable[[], _SharedAnnotation] = itertools.repeat(self).__next__


class _IdleAnnotation(_SharedAnnotation):
    """`with` on it runs only C code: __enter__ returns the object, __exit__ returns "", which
    is false, so exceptions propagate. Both are looked up when the `with` begins."""

    __slots__ = ()
    __enter__ = property(operator.attrgetter("_enter_self"))
    __exit__ = "".format  # type: ignore[assignment]


class _WindowAnnotation(_SharedAnnotation):
    """A shared annotation used while the window is open: each `with` keeps its start on a
    per-thread list (the object's own slots are shared by all its users)."""

    __slots__ = ()

    def __enter__(self) -> _WindowAnnotation:
        opened = _shared_open()
        session = _detail
        if session is None:
            opened.append((self, None, 0, 0))
            return self
        try:
            ring: ThreadRing = session.local.ring
        except AttributeError:
            ring = session.ring()
        depth = ring.depth
        ring.depth = depth + 1
        opened.append((self, ring, _monotonic_ns(), depth))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        end = _monotonic_ns()
        opened = _shared_open()
        for i in range(len(opened) - 1, -1, -1):
            if opened[i][0] is self:
                _, ring, start, depth = opened.pop(i)
                break
        else:
            return
        if ring is not None:
            ring.depth = depth
            ring.push((_ANNOTATION, self.name, start, end, depth, 0, ring.thread_id))


_SharedOpen = list[tuple[_WindowAnnotation, "ThreadRing | None", int, int]]
_shared_local = threading.local()
_shared_annotations: dict[str, _SharedAnnotation] = {}
_shared_lock = threading.Lock()
MAX_SHARED_ANNOTATIONS: Final = 4096
"""Names with a shared annotation; beyond them (names built per call, say) annotate()
returns a new Annotation each time, so the table cannot grow without bound."""
_new_object: Final = object.__new__


def _shared_open() -> _SharedOpen:
    try:
        opened: _SharedOpen = _shared_local.opened
    except AttributeError:
        opened = _shared_local.opened = []
    return opened


def _shared_annotation(name: str) -> Annotation:
    with _shared_lock:
        shared = _shared_annotations.get(name)
        if shared is None:
            if len(_shared_annotations) >= MAX_SHARED_ANNOTATIONS:
                return Annotation(name)
            shared = _IdleAnnotation(name)
            if _detail is not None:
                shared.__class__ = _WindowAnnotation  # type: ignore[assignment]
            _shared_annotations[name] = shared
        return shared


def _set_shared_window() -> None:
    """Give every shared annotation the behaviour of the window as it is now (open or not:
    read under the lock, so the last of two racing switches leaves the right one)."""
    with _shared_lock:
        cls = _IdleAnnotation if _detail is None else _WindowAnnotation
        for shared in _shared_annotations.values():
            shared.__class__ = cls


def _publish_detail(session: _Session | None) -> None:
    """Make `session` the one annotations record into (None: no window is open)."""
    global _detail  # noqa: PLW0603 - module globals are the hot path's one-read state
    was_open = _detail is not None
    _detail = session
    if was_open != (session is not None):
        _set_shared_window()


def annotate(name: str) -> Annotation:
    """A named host range: `with annotate("forward"):` or `@annotate("forward")`.

    Outside the step window this costs a flag check and a dictionary lookup: it returns the
    name's shared Annotation, whose `with` does nothing. Inside it returns a new Annotation.
    """
    if _detail is None:
        shared = _shared_annotations.get(name)
        return shared if shared is not None else _shared_annotation(name)
    fresh: Annotation = _new_object(Annotation)
    fresh.name = name
    return fresh


class AnnotationHandle:
    """An open range from `annotation_begin`; close it with `annotation_end`, on any thread."""

    __slots__ = ("_depth", "_ring", "_start", "name")

    def __init__(self, name: str, ring: ThreadRing | None, start: int, depth: int) -> None:
        self.name = name
        self._ring = ring
        self._start = start
        self._depth = depth


_NULL_HANDLE: Final = AnnotationHandle("", None, 0, 0)


def annotation_begin(name: str) -> AnnotationHandle:
    """Open a named range that may end in another function (or thread)."""
    session = _detail
    if session is None:
        return _NULL_HANDLE
    try:
        ring: ThreadRing = session.local.ring
    except AttributeError:
        ring = session.ring()
    depth = ring.depth
    ring.depth = depth + 1
    return AnnotationHandle(name, ring, _monotonic_ns(), depth)


def annotation_end(handle: AnnotationHandle) -> None:
    """Close a range opened by `annotation_begin`. Ending a handle twice records it once."""
    ring = handle._ring
    if ring is None:
        return
    end = _monotonic_ns()
    handle._ring = None
    open_ranges = ring.depth - 1
    ring.depth = open_ranges if open_ranges > 0 else 0
    record = (_ANNOTATION, handle.name, handle._start, end, handle._depth, 0, ring.thread_id)
    if ring.ident == _get_ident():
        buf = ring.buf
        if len(buf) < ring.limit:
            buf += record
        else:
            ring.dropped += 1
        return
    # Another thread owns `ring`; writing it from here would race its owner, so the record
    # goes to this thread's ring, carrying the beginning thread's id.
    session = _detail or _session
    if session is not None:
        session.ring().push(record)


def wait_for_flush(timeout: float | None = None) -> bool:
    """Block until the last stopped session has written its file (for tests and scripts)."""
    session = _last_stopped
    return True if session is None else session.flushed.wait(timeout)


def _stop_at_exit() -> None:
    # The flusher is a daemon thread (so a script that never stops profiling can still exit);
    # at interpreter exit give it a bounded time to finish the file.
    session = _session
    stop_profiling()
    target = session or _last_stopped
    if target is not None:
        target.flushed.wait(30.0)


_SIGTERM_FLUSH_TIMEOUT_S = 5.0


def _flush_then_terminate(signum: int, frame: FrameType | None) -> None:
    # Kubernetes and torchrun stop workers with SIGTERM, whose default action skips atexit.
    # Let the flusher write what the rings hold and close the file, then die as before.
    # No locks here: the signal may have interrupted this thread inside start/stop.
    for session in (_on_demand, _session):
        if session is not None:
            session.stopping.set()
            session.flushed.wait(_SIGTERM_FLUSH_TIMEOUT_S)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_sigterm_flush() -> None:
    """Flush on SIGTERM, unless the program handles SIGTERM itself (or we are not able to)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _flush_then_terminate)


def _remove_sigterm_flush() -> None:
    on_main_thread = threading.current_thread() is threading.main_thread()
    if on_main_thread and signal.getsignal(signal.SIGTERM) is _flush_then_terminate:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _forget_session_in_child() -> None:
    # A forked child (e.g. a DataLoader worker) inherits the parent's state but not its
    # threads: it must not write into the parent's rings or file.
    global _session, _detail, _last_stopped, _on_demand, _shared_lock  # noqa: PLW0603 - module globals are the hot path's one-read state
    _session = None
    _detail = None
    _last_stopped = None
    _on_demand = None
    _shared_lock = threading.Lock()  # another thread may have held it at the fork
    _set_shared_window()


atexit.register(_stop_at_exit)
os.register_at_fork(after_in_child=_forget_session_in_child)

__all__ = [
    "Annotation",
    "AnnotationHandle",
    "annotate",
    "annotation_begin",
    "annotation_end",
    "background_cpu_ns",
    "current_config",
    "is_capturing_detail",
    "is_enabled",
    "start_profiling",
    "step",
    "stop_profiling",
    "wait_for_flush",
]
