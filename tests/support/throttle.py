"""Throttle a process tree from outside, as a slow node would be: SIGSTOP and SIGCONT on a duty
cycle (e.g. 10 ms running, 40 ms stopped), applied to the process and every descendant it has
at each cycle (children started later are caught at the next one). Linux only (/proc)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import TracebackType


def process_tree(pid: int) -> list[int]:
    """The process and its descendants, from /proc/<pid>/task/*/children."""
    found: list[int] = []
    pending = [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                pending += [int(child) for child in children.read_text().split()]
            except OSError:  # the task or process ended meanwhile
                continue
    return found


def _signal_all(pids: list[int], signum: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            continue


class Throttle:
    """`with Throttle(pid, running=0.01, stopped=0.04):` keeps the tree at ~20 % of the time;
    leaving the block (or `stop`) lets it run freely again."""

    def __init__(self, pid: int, *, running: float, stopped: float) -> None:
        self.pid = pid
        self.running = running
        self.stopped = stopped
        self.cycles = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._cycle, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        _signal_all(process_tree(self.pid), signal.SIGCONT)  # never leave the tree stopped

    def __enter__(self) -> Throttle:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _cycle(self) -> None:
        while not self._done.is_set():
            _signal_all(process_tree(self.pid), signal.SIGSTOP)
            if self._done.wait(self.stopped):
                return
            _signal_all(process_tree(self.pid), signal.SIGCONT)
            self.cycles += 1
            self._done.wait(self.running)
