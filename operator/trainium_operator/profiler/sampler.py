"""Background sampling of CPU utilisation and memory, for the whole profiling run.

Process CPU comes from `time.process_time_ns()` (user + system time of all threads), resident
memory from `/proc/self/statm`. One rank per node (local rank 0) also samples the node:
`/proc/stat` CPU and `/proc/meminfo` used memory, so 32 ranks do not read the same counters.
Utilisation values are per-mille of one core summed over cores (1000 = one busy core); each
utilisation sample spans the interval it measured (from the previous reading to this one), so
the first interval of a series counts like every other and the analysis needs no neighbour to
know what a sample covers. Memory samples are instants.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

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


class Sampler:
    """Samples on its own daemon thread; faster while the detailed window is open.

    Each process sample costs a clock read and one pread; node-wide counters (local rank 0
    only) are read at most once a second, because /proc/stat and /proc/meminfo cost a few
    hundred microseconds of CPU to generate.
    """

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
        self._interval_s = interval_s
        self._idle_interval_s = idle_interval_s
        self._node_wide = node_wide
        self._node_interval_ns = int(node_interval_s * 1e9)
        self._detail = detail
        self._stop = threading.Event()
        self.cpu_ns = 0  # CPU time this sampler thread has used, for the overhead counter
        self.thread = threading.Thread(
            target=self._run, name="trainium-profiler-sample", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Stop and wait for the thread, so its final sample is in its ring."""
        self._stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=5.0)

    def _run(self) -> None:
        statm = _StatmReader()
        try:
            self._loop(statm)
        finally:
            statm.close()

    def _loop(self, statm: _StatmReader) -> None:
        record = self._record
        prev_cpu = time.process_time_ns()
        prev_at = time.monotonic_ns()
        node_at = prev_at  # when prev_node was read
        prev_node = read_node_cpu_ticks() if self._node_wide else None
        self._sample_memory(statm, prev_at, node=self._node_wide)
        while True:
            stopped = self._wait_for_next_sample(prev_at, node_at)
            now = time.monotonic_ns()
            cpu = time.process_time_ns()
            elapsed = now - prev_at
            if elapsed > 0:
                busy = (cpu - prev_cpu) * 1000 // elapsed
                record(EventKind.CPU_UTIL, CPU_PROCESS, prev_at, now, busy)
            node_due = self._node_wide and (stopped or now - node_at >= self._node_interval_ns)
            if node_due:
                node = read_node_cpu_ticks()
                if node is not None and prev_node is not None and node[1] > prev_node[1]:
                    busy_ticks = node[0] - prev_node[0]
                    total = node[1] - prev_node[1]
                    cores = os.cpu_count() or 1
                    value = busy_ticks * 1000 * cores // total
                    record(EventKind.CPU_UTIL, CPU_NODE, node_at, now, value)
                prev_node = node
                node_at = now
            self._sample_memory(statm, now, node=node_due)
            prev_cpu, prev_at = cpu, now
            self.cpu_ns = time.thread_time_ns()
            if stopped:
                return

    def _wait_for_next_sample(self, last_ns: int, node_ns: int) -> bool:
        """Sleep until the next sample is due; True when stopped meanwhile.

        The detailed window can open while we sleep the long idle interval, so the wait is
        sliced at the fast interval and the due time re-evaluated. Node counters keep their
        own interval even while process sampling idles, so the host is sampled through a
        short run, not only at its end."""
        while True:
            interval = self._interval_s if self._detail() else self._idle_interval_s
            due = last_ns / 1e9 + interval
            if self._node_wide:
                due = min(due, (node_ns + self._node_interval_ns) / 1e9)
            remaining = due - time.monotonic_ns() / 1e9
            if remaining <= 0:
                return False
            if self._stop.wait(min(remaining, self._interval_s)):
                return True

    def _sample_memory(self, statm: _StatmReader, at_ns: int, node: bool) -> None:
        rss = statm.rss_bytes()
        if rss is not None:
            self._record(EventKind.MEMORY, MEMORY_RSS, at_ns, at_ns, rss)
        if node:
            used = read_node_used_memory()
            if used is not None:
                self._record(EventKind.MEMORY, MEMORY_NODE_USED, at_ns, at_ns, used)
