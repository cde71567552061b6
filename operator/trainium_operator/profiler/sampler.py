"""Sampling of CPU utilisation and memory, for the whole profiling run.

Process CPU comes from `time.process_time_ns()` (user + system time of all threads), resident
memory from `/proc/self/statm`. One rank per node (local rank 0) also samples the node:
`/proc/stat` CPU and `/proc/meminfo` used memory, so 32 ranks do not read the same counters.
Utilisation values are per-mille of one core summed over cores (1000 = one busy core); each
utilisation sample spans the interval it measured (from the previous reading to this one), so
the first interval of a series counts like every other and the analysis needs no neighbour to
know what a sample covers. Memory samples are instants.

The sampler has no thread of its own. While steps run, the step marker takes the process
sample once one is due (a clock comparison per step; the sample itself is a clock read and a
pread, about a microsecond): waking a thread for it, and handing that thread the GIL, would
cost the training process more than the sample. The flusher, which wakes anyway, reads the
node counters and takes over the process samples whenever none was taken for an interval (no
steps, or a long one): it notices within one flush period and then wakes at the sample
interval until steps take over again.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from trainium_operator.profiler.events import EventKind

CPU_PROCESS = "cpu.process"
CPU_NODE = "cpu.node"
MEMORY_RSS = "memory.rss"
MEMORY_NODE_USED = "memory.node_used"
NODE_SAMPLE_INTERVAL_S = 1.0

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

RecordSample = Callable[[EventKind, str, int, int, int], None]
"""record(kind, name, start_ns, end_ns, value): a sample over [start_ns, end_ns]."""


def read_node_cpu_ticks(stat: Path = Path("/proc/stat")) -> tuple[int, int] | None:
    """(busy ticks, total ticks) summed over all cores since boot."""
    try:
        with stat.open() as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already inside user/nice
    return total - idle, total


def read_node_used_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        info = {}
        for line in meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0]) * 1024
        return info["MemTotal"] - info["MemAvailable"]
    except (OSError, KeyError, ValueError, IndexError):
        return None


class _StatmReader:
    """Resident memory from a /proc/self/statm descriptor kept open: one pread per sample."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._fd = None

    def rss_bytes(self) -> int | None:
        if self._fd is None:
            return None
        try:
            return int(os.pread(self._fd, 128, 0).split()[1]) * _PAGE_SIZE
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_NEVER: Final = 2**63
_NODE_EARLY_NS: Final = 10_000_000
"""A wake this close before the node counters are due reads them (no second wake for them)."""


class Sampler:
    """Takes process samples every `interval_s` inside the detailed window (`idle_interval_s`
    outside it) and, when `node_wide`, node samples every `node_interval_s`; see the module
    notes for who calls it when. Thread-safe: one lock, never waited for on a step."""

    def __init__(
        self,
        *,
        record: RecordSample,
        interval_s: float,
        idle_interval_s: float,
        node_wide: bool,
        detail: Callable[[], bool],
        node_interval_s: float = NODE_SAMPLE_INTERVAL_S,
    ) -> None:
        self._record = record
        self._interval_ns = int(interval_s * 1e9)
        self._idle_interval_ns = int(idle_interval_s * 1e9)
        self._node_wide = node_wide
        self._node_interval_ns = int(node_interval_s * 1e9)
        self._detail = detail
        self._lock = threading.Lock()
        self._statm: _StatmReader | None = None  # while started
        self._prev_cpu = 0
        self._prev_at = 0
        self._node_at = 0
        self._prev_node: tuple[int, int] | None = None
        self.next_due_ns = _NEVER
        """When the next process sample is due (monotonic ns); read on every step, unlocked."""

    def start(self) -> None:
        with self._lock:
            self._statm = _StatmReader()
            now = time.monotonic_ns()
            self._prev_cpu = time.process_time_ns()
            self._prev_at = self._node_at = now
            self._prev_node = read_node_cpu_ticks() if self._node_wide else None
            self._sample_memory(now, node=self._node_wide)
            self.reschedule()

    def reschedule(self) -> None:
        """Recompute when the next sample is due (the window opened or closed)."""
        if self._statm is not None:
            interval = self._interval_ns if self._detail() else self._idle_interval_ns
            self.next_due_ns = self._prev_at + interval

    def on_step(self, now_ns: int) -> None:
        """At a step marker (training thread): the process sample, if one is due. Skipped
        when the flusher is sampling right now: the step never waits."""
        if now_ns >= self.next_due_ns and self._lock.acquire(blocking=False):
            try:
                if self._statm is not None and now_ns >= self.next_due_ns:
                    self._sample_process(now_ns)
            finally:
                self._lock.release()

    def on_wake(self, now_ns: int) -> int:
        """At a flusher wake: the process sample if none was taken for an interval, the node
        counters if due. Returns when the sampler next needs a wake (monotonic ns)."""
        with self._lock:
            if self._statm is None:
                return _NEVER
            wake = _NEVER
            if now_ns >= self.next_due_ns:
                self._sample_process(now_ns)
                wake = self.next_due_ns  # until steps take over again
            if self._node_wide:
                node_due = self._node_at + self._node_interval_ns
                if now_ns + _NODE_EARLY_NS >= node_due:
                    self._sample_node(now_ns)
                    node_due = now_ns + self._node_interval_ns
                wake = min(wake, node_due)
            return wake

    def stop(self) -> None:
        """The final samples (process, and node counters when node-wide); then no more."""
        with self._lock:
            if self._statm is None:
                return
            now = time.monotonic_ns()
            self._sample_process(now, node=self._node_wide)
            self._statm.close()
            self._statm = None
            self.next_due_ns = _NEVER

    def _sample_process(self, now_ns: int, node: bool = False) -> None:
        cpu = time.process_time_ns()
        elapsed = now_ns - self._prev_at
        if elapsed > 0:
            busy = (cpu - self._prev_cpu) * 1000 // elapsed
            self._record(EventKind.CPU_UTIL, CPU_PROCESS, self._prev_at, now_ns, busy)
        if node:
            self._sample_node_cpu(now_ns)
        self._sample_memory(now_ns, node=node)
        self._prev_cpu, self._prev_at = cpu, now_ns
        self.reschedule()

    def _sample_node(self, now_ns: int) -> None:
        self._sample_node_cpu(now_ns)
        used = read_node_used_memory()
        if used is not None:
            self._record(EventKind.MEMORY, MEMORY_NODE_USED, now_ns, now_ns, used)

    def _sample_node_cpu(self, now_ns: int) -> None:
        node = read_node_cpu_ticks()
        prev = self._prev_node
        if node is not None and prev is not None and node[1] > prev[1]:
            cores = os.cpu_count() or 1
            value = (node[0] - prev[0]) * 1000 * cores // (node[1] - prev[1])
            self._record(EventKind.CPU_UTIL, CPU_NODE, self._node_at, now_ns, value)
        self._prev_node = node
        self._node_at = now_ns

    def _sample_memory(self, at_ns: int, node: bool) -> None:
        assert self._statm is not None
        rss = self._statm.rss_bytes()
        if rss is not None:
            self._record(EventKind.MEMORY, MEMORY_RSS, at_ns, at_ns, rss)
        if node:
            used = read_node_used_memory()
            if used is not None:
                self._record(EventKind.MEMORY, MEMORY_NODE_USED, at_ns, at_ns, used)
