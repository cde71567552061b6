"""What one operator process knows of each job beyond its stored status.

Lost when the process ends, so every reading of it has a safe meaning for "nothing known" (a
successor after a failover knows nothing). Kept per job name and uid: a job deleted and
created again under its name starts with nothing, and a deleted job's entry goes with it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from trainium_operator.builders.job import Stage
from trainium_operator.controller.cache import Key


@dataclass(slots=True)
class JobMemory:
    uid: str
    # The pod fields the allowlist dropped that this process has warned about.
    warned_dropped: tuple[str, ...] | None = None
    # The gang (stage, attempt) whose pod creates this process sent nowhere (the API server
    # unreachable) after storing its createdAttempt: no pod of it exists.
    unsent_gang: tuple[Stage, int] | None = None
    # Per stage, the newest attempt whose pods this process sent creates for or saw.
    gangs_known: dict[Stage, int] = field(default_factory=dict)

    def know_gang(self, stage: Stage, attempt: int) -> None:
        if self.gangs_known.get(stage, -1) < attempt:
            self.gangs_known[stage] = attempt


class JobMemories:
    """Every job's `JobMemory`; a job's passes never run concurrently, different jobs' do."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[Key, JobMemory] = {}

    def of(self, key: Key, uid: str) -> JobMemory:
        with self._lock:
            memory = self._jobs.get(key)
            if memory is None or memory.uid != uid:
                memory = self._jobs[key] = JobMemory(uid)
            return memory

    def forget(self, key: Key, uid: str | None = None) -> None:
        """Drops the job's memory (with `uid`: only that job's, not a successor's of its name)."""
        with self._lock:
            memory = self._jobs.get(key)
            if memory is not None and uid in (None, memory.uid):
                del self._jobs[key]

    def __len__(self) -> int:
        return len(self._jobs)
