"""Finding profiles under a directory and holding the loaded ones for the web UI.

Loading decodes every rank file (seconds for a million events), so it runs in a worker
thread while the server keeps answering; a profile is loaded once and kept until the user
unloads it. Paths from the browser are profile ids (paths relative to the root) and are
always resolved inside the root.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainium_operator.analysis.loading import LoadedProfile, load_profile, read_manifest_or_default
from trainium_operator.analysis.report import dashboard
from trainium_operator.analysis.timeline import TimelineIndex
from trainium_operator.profiler.manifest import MANIFEST_NAME, discover_rank_files

MAX_SEARCH_DEPTH = 8


@dataclass(frozen=True)
class JobInfo:
    """A TrainingJob with profiling on, as the injected lister reports it."""

    name: str
    namespace: str
    created: str
    status: str
    profile_path: str | None = None  # status.profile.path, when the job has written one


JobLister = Callable[[], Awaitable[list[JobInfo]]]


class UnknownProfileError(KeyError):
    pass


def _is_profile_dir(path: Path) -> bool:
    if (path / MANIFEST_NAME).is_file():
        return True
    return bool(discover_rank_files(path))


def find_profiles(root: Path) -> list[Path]:
    """Profile directories under root (root itself included), sorted by path."""
    found: list[Path] = []
    root = root.resolve()
    for directory, subdirectories, _ in os.walk(root):
        current = Path(directory)
        depth = len(current.relative_to(root).parts)
        if _is_profile_dir(current):
            found.append(current)
            subdirectories[:] = []  # node directories belong to this profile
            continue
        if depth >= MAX_SEARCH_DEPTH:
            subdirectories[:] = []
        subdirectories.sort()
    return sorted(found)


def profile_id(root: Path, path: Path) -> str:
    relative = path.resolve().relative_to(root.resolve()).as_posix()
    return relative or "."


@dataclass
class LoadedEntry:
    profile: LoadedProfile
    index: TimelineIndex
    dashboard: dict[str, Any]


@dataclass
class _Slot:
    state: str = "unloaded"  # unloaded | loading | loaded | error
    error: str | None = None
    entry: LoadedEntry | None = None
    task: asyncio.Task[None] | None = None
    events: int = 0


def build_entry(path: Path, workers: int | None) -> LoadedEntry:
    profile = load_profile(path, workers=workers)
    return LoadedEntry(profile, TimelineIndex(profile), dashboard(profile))


@dataclass
class ProfileStore:
    root: Path
    workers: int | None = None
    slots: dict[str, _Slot] = field(default_factory=dict)

    def resolve(self, identifier: str) -> Path:
        candidate = (self.root / identifier).resolve()
        root = self.root.resolve()
        if candidate != root and root not in candidate.parents:
            raise UnknownProfileError(identifier)
        if not candidate.is_dir() or not _is_profile_dir(candidate):
            raise UnknownProfileError(identifier)
        return candidate

    def listing(self) -> list[dict[str, Any]]:
        rows = []
        for path in find_profiles(self.root):
            identifier = profile_id(self.root, path)
            manifest, problem = read_manifest_or_default(path)
            files = discover_rank_files(path)
            slot = self.slots.get(identifier, _Slot())
            rows.append(
                {
                    "id": identifier,
                    "path": str(path),
                    "job_name": manifest.job_name,
                    "namespace": manifest.namespace,
                    "attempt": manifest.attempt,
                    "created": manifest.created,
                    "nodes": len({ref.node for ref in files}),
                    "ranks": len(files),
                    "bytes": sum(ref.path.stat().st_size for ref in files),
                    "finished": manifest.finished,
                    "manifest_problem": problem,
                    "state": slot.state,
                    "error": slot.error,
                    "events": slot.events,
                }
            )
        return rows

    async def load(self, identifier: str) -> _Slot:
        path = self.resolve(identifier)
        slot = self.slots.setdefault(identifier, _Slot())
        if slot.state in ("loading", "loaded"):
            return slot
        slot.state, slot.error = "loading", None

        async def run() -> None:
            try:
                entry = await asyncio.to_thread(build_entry, path, self.workers)
            except Exception as exc:  # shown to the user; the server keeps running
                slot.state, slot.error, slot.entry = "error", f"{type(exc).__name__}: {exc}", None
            else:
                slot.state, slot.entry, slot.events = "loaded", entry, len(entry.profile.columns)

        slot.task = asyncio.create_task(run())
        return slot

    async def wait_loaded(self, identifier: str) -> LoadedEntry:
        slot = self.slots.get(identifier)
        if slot is None:
            raise UnknownProfileError(identifier)
        if slot.task is not None:
            await asyncio.shield(slot.task)
        if slot.entry is None:
            raise UnknownProfileError(identifier)
        return slot.entry

    def unload(self, identifier: str) -> bool:
        slot = self.slots.pop(identifier, None)
        if slot is None:
            return False
        if slot.task is not None and not slot.task.done():
            slot.task.cancel()
        return True

    def loaded(self, identifier: str) -> LoadedEntry:
        slot = self.slots.get(identifier)
        if slot is None or slot.entry is None:
            raise UnknownProfileError(identifier)
        return slot.entry
