"""Background sampling of CPU utilisation and memory, for the whole profiling run.

Process CPU comes from `time.process_time_ns()` (user + system time of all threads), resident
memory from `/proc/self/statm`. One rank per node (local rank 0) also samples the node:
`/proc/stat` CPU and `/proc/meminfo` used memory, so 32 ranks do not read the same counters.
Utilisation values are per-mille of one core summed over cores (1000 = one busy core).
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

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

RecordSample = Callable[[EventKind, str, int, int], None]


def read_rss_bytes(statm: Path = Path("/proc/self/statm")) -> int | None:
    try:
        fields = statm.read_text().split()
        return int(fields[1]) * _PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return None


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


class Sampler:
    """Samples on its own daemon thread; faster while the detailed window is open."""

    def __init__(
        self,
        record: RecordSample,
        interval_s: float,
        idle_interval_s: float,
        node_wide: bool,
        detail: Callable[[], bool],
    ) -> None:
        self._record = record
        self._interval_s = interval_s
        self._idle_interval_s = idle_interval_s
        self._node_wide = node_wide
        self._detail = detail
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="trainium-profiler-sample", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop and wait for the thread, so its final sample is in its ring."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        prev_cpu = time.process_time_ns()
        prev_at = time.monotonic_ns()
        prev_node = read_node_cpu_ticks() if self._node_wide else None
        self.sample_memory(prev_at)
        while True:
            stopped = self._wait_for_next_sample(prev_at)
            now = time.monotonic_ns()
            cpu = time.process_time_ns()
            elapsed = now - prev_at
            if elapsed > 0:
                permille = (cpu - prev_cpu) * 1000 // elapsed
                self._record(EventKind.CPU_UTIL, CPU_PROCESS, now, permille)
            if self._node_wide:
                node = read_node_cpu_ticks()
                if node is not None and prev_node is not None and node[1] > prev_node[1]:
                    busy = node[0] - prev_node[0]
                    total = node[1] - prev_node[1]
                    cores = os.cpu_count() or 1
                    self._record(EventKind.CPU_UTIL, CPU_NODE, now, busy * 1000 * cores // total)
                prev_node = node
            self.sample_memory(now)
            prev_cpu, prev_at = cpu, now
            if stopped:
                return

    def _wait_for_next_sample(self, last_ns: int) -> bool:
        """Sleep until the next sample is due; True when stopped meanwhile.

        The detailed window can open while we sleep the long idle interval, so the wait is
        sliced at the fast interval and the due time re-evaluated."""
        while True:
            interval = self._interval_s if self._detail() else self._idle_interval_s
            remaining = last_ns / 1e9 + interval - time.monotonic_ns() / 1e9
            if remaining <= 0:
                return False
            if self._stop.wait(min(remaining, self._interval_s)):
                return True

    def sample_memory(self, at_ns: int) -> None:
        rss = read_rss_bytes()
        if rss is not None:
            self._record(EventKind.MEMORY, MEMORY_RSS, at_ns, rss)
        if self._node_wide:
            used = read_node_used_memory()
            if used is not None:
                self._record(EventKind.MEMORY, MEMORY_NODE_USED, at_ns, used)
