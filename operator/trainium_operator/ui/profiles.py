"""Finding profiles under a directory or an S3 prefix and holding the loaded ones for the UI.

Loading a profile reads its ranks' summaries (`analysis.summary`) from the UI's summary cache
(`ui.summary_cache`), summarising only the rank files it has not seen in this version (in the
server's process, one file at a time; in a pool of worker processes when `workers` > 1), and
composes the dashboard from them; the timeline
decodes a rank only when one of its tracks is shown (`ui.lazy_timeline`). A profile a listing
discovers is summarised ahead, in the background (`ui.background`), so that its first open
reads one stored dashboard; an open reports its progress while it summarises. Loaded profiles and
decoded ranks live in one memory LRU (`ui.memory`) whose budget is below the container's
limit; an evicted profile loads again from its summaries. This runs in a worker thread while
the server keeps answering. Paths from the browser are profile ids (`ui.profile_id`: paths
relative to the root) and are always resolved inside the root; a profile is held under its
resolved id, so every alias of one directory (a symlink, another spelling) shares one decode. At
most MAX_CONCURRENT_DECODES decodes run at once, counted until their thread really ends; a decode
whose profile was unloaded meanwhile stops at its next stage and is never stored. Under an S3
prefix only complete profiles (manifest present) can be loaded; loading downloads the rank
files into the ETag-keyed cache once. On-demand captures
(`<namespace>/<job>/<attempt>/on-demand/<id>`) are listed beside their attempt's profile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy.ma  # noqa: F401  np.unique imports it on first use: at start, not on an open's path

from trainium_operator.analysis.loading import ProfileLoadError, read_manifest_or_default
from trainium_operator.analysis.report import annotation_of, dashboard_of
from trainium_operator.analysis.s3store import S3Profile, S3ProfileSource
from trainium_operator.analysis.summary import (
    ComposedProfile,
    RankSummary,
    compose,
    from_bytes,
    node_sync_points,
    rank_timeline,
    summarise_rank,
    to_bytes,
)
from trainium_operator.analysis.timeline import TimelineIndex
from trainium_operator.contract.channel import ON_DEMAND_SUBDIR, valid_request_id
from trainium_operator.process_memory import release_freed_memory
from trainium_operator.profiler.manifest import MANIFEST_NAME, discover_rank_files
from trainium_operator.profiler.s3 import is_s3_uri, parse_s3_uri
from trainium_operator.ui import lazy_timeline
from trainium_operator.ui.background import BackgroundSummaries, Discovered, Progress
from trainium_operator.ui.limits import DEFAULT_SUMMARISE_AHEAD
from trainium_operator.ui.live import JobLive
from trainium_operator.ui.memory import DEFAULT_MEMORY_BUDGET, MemoryLRU
from trainium_operator.ui.profile_id import InvalidProfileIdError, ProfileId
from trainium_operator.ui.summary_cache import (
    StoredDashboard,
    SummaryCache,
    dashboard_key,
    file_identity,
    summary_key,
)

MAX_SEARCH_DEPTH = 8
MAX_ON_DEMAND_SCANNED = 1024  # entries of one on-demand/ directory looked at (a tenant's)
MAX_JOBS_EXAMINED = 64  # newest jobs whose profiles one round of `written` looks at
MAX_CONCURRENT_DECODES = 2  # profile loads at once (each summarises its ranks' files)
MAX_CONCURRENT_RANK_DECODES = 2  # ranks decoded for the timeline at once
# A rank decoded for the timeline holds its columns (~61 B/event) and their index (~80 B/event).
INDEXED_BYTES_PER_EVENT = 160
READY_ANNOTATIONS = 32  # annotation histograms composed with the dashboard (the picker's first)
# A profile opened from its stored dashboard has its summaries composed for the timeline this
# long after, once the page has drawn (the timeline then opens without composing first).
PRECOMPOSE_AFTER_S = 1.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobInfo:
    """A TrainingJob, as the injected lister reports it."""

    name: str
    namespace: str
    created: str
    status: str
    profile_path: str | None = None  # status.profile.path, when the job has written one
    profile_s3_uri: str | None = None  # status.profile.s3Uri, once its upload is complete
    on_demand_path: str | None = None  # status.onDemandProfile.path, once Captured
    profiling: bool = True  # spec.profile.enabled
    live: JobLive = field(default_factory=JobLive)  # progress and health from its status


JobLister = Callable[[], Awaitable[list[JobInfo]]]


class UnknownProfileError(KeyError):
    pass


class ProfileNotLoadableError(ValueError):
    """The profile exists but is incomplete (an S3 upload without its manifest)."""


class DecodeStoppedError(RuntimeError):
    """The profile was unloaded while it decoded: the decode's result is dropped."""


def _is_profile_dir(path: Path) -> bool:
    if (path / MANIFEST_NAME).is_file():
        return True
    return bool(discover_rank_files(path))


def _on_demand_captures(profile_dir: Path) -> list[Path]:
    """The on-demand captures beside a profile (`on-demand/<request id>`), symlinks not
    followed, at most MAX_ON_DEMAND_SCANNED entries looked at."""
    captures = profile_dir / ON_DEMAND_SUBDIR
    if captures.is_symlink() or not captures.is_dir():
        return []
    found = []
    with os.scandir(captures) as entries:
        for entry in itertools.islice(entries, MAX_ON_DEMAND_SCANNED):
            path = Path(entry.path)
            if (
                valid_request_id(entry.name)
                and entry.is_dir(follow_symlinks=False)
                and _is_profile_dir(path)
            ):
                found.append(path)
    return found


def find_profiles(root: Path) -> list[Path]:
    """Profile directories under root (root itself included) and their on-demand captures,
    sorted by path."""
    found: list[Path] = []
    root = root.resolve()
    for directory, subdirectories, _ in os.walk(root):
        current = Path(directory)
        depth = len(current.relative_to(root).parts)
        if _is_profile_dir(current):
            found.append(current)
            found.extend(_on_demand_captures(current))
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
    """A loaded profile: its dashboard as answered (`StoredDashboard`: encoded once, with the
    histograms of its first annotations), and its composed summaries (the track list, the
    timeline's ranks, the other annotations), composed when first needed if the dashboard
    came ready-made from the summary cache."""

    stored: StoredDashboard
    composed: ComposedProfile | None
    recompose: Callable[[], ComposedProfile]
    composing: asyncio.Future[ComposedProfile] | None = None
    # Summaries an open computed, stored in the cache after its answer (`store_summaries`).
    unstored: list[tuple[str, RankSummary]] = field(default_factory=list)
    _document: dict[str, Any] | None = None

    @property
    def dashboard(self) -> dict[str, Any]:
        """The dashboard document, parsed when first needed (the track list's steps)."""
        if self._document is None:
            self._document = json.loads(self.stored.body)
        return self._document

    def nbytes(self) -> int:
        held = self.composed.nbytes() if self.composed is not None else 0
        return held + 9 * len(self.stored.body)  # its JSON, gzipped, parsed; the track list


def ready_annotations(composed: ComposedProfile, dashboard: dict[str, Any]) -> dict[str, Any]:
    """The histograms of the dashboard's first annotations (its picker shows the first)."""
    names = [row["name"] for row in dashboard["annotations"][:READY_ANNOTATIONS]]
    return {name: annotation_of(composed.inputs.samples, name) for name in names}


def summary_bytes(path: Path, points: Sequence[tuple[int, int]]) -> bytes:
    """A rank's summary as stored (runs in a decode worker process)."""
    return to_bytes(summarise_rank(path, points))


@dataclass
class LoadSlot:
    """One profile's load: its state, progress and, once loaded, its entry."""

    state: str = "unloaded"  # unloaded | loading | loaded | error
    error: str | None = None
    entry: LoadedEntry | None = None
    task: asyncio.Task[None] | None = None
    events: int = 0
    stop: threading.Event = field(default_factory=threading.Event)  # set by unload
    progress: Progress = field(default_factory=Progress)


def _placed(identifier: str) -> ProfileId | None:
    """The id in the operator's layout, whose location names its job (not its manifest)."""
    with contextlib.suppress(InvalidProfileIdError):
        parsed = ProfileId.parse(identifier)
        return parsed if parsed.in_layout else None
    return None


def _dir_row(root: Path, path: Path) -> dict[str, Any]:
    manifest, problem = read_manifest_or_default(path)
    files = discover_rank_files(path)
    identifier = profile_id(root, path)
    placed = _placed(identifier)
    return {
        "id": identifier,
        "path": str(path),
        "job_name": placed.job if placed else manifest.job_name,
        "namespace": placed.namespace if placed else manifest.namespace,
        "attempt": placed.attempt if placed else manifest.attempt,
        "capture": placed.capture if placed else None,
        "created": manifest.created,
        "nodes": len({ref.node for ref in files}),
        "ranks": len(files),
        "bytes": sum(ref.path.stat().st_size for ref in files),
        "finished": manifest.finished,
        "manifest_problem": problem,
        "loadable": True,
        "profile_status": "Complete" if manifest.finished else "Recording",
    }


def _unreadable_row(identifier: str, path: str, error: str) -> dict[str, Any]:
    """The row of a profile that could not even be listed: its error, and not loadable."""
    return {
        "id": identifier,
        "path": path,
        "job_name": "",
        "namespace": "",
        "attempt": 0,
        "created": "",
        "nodes": 0,
        "ranks": 0,
        "bytes": 0,
        "finished": False,
        "capture": None,
        "manifest_problem": error,
        "error": error,
        "loadable": False,
        "profile_status": "Unreadable",
    }


def _row_or_error(identifier: str, path: str, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    # One bad profile is that profile's error; the list still answers for every other one.
    try:
        return make()
    except Exception as exc:
        log.warning("listing profile %s failed: %s", path, exc)
        return _unreadable_row(identifier, path, f"{type(exc).__name__}: {exc}")


def _s3_row(profile: S3Profile) -> dict[str, Any]:
    manifest = profile.manifest_data
    # The layout <namespace>/<job>/<attempt>[/on-demand/<id>] names the job; the manifest
    # (the training pod's) only where the key is outside that layout.
    placed = _placed(profile.identifier)
    return {
        "id": profile.identifier,
        "path": str(profile.location),
        "job_name": placed.job if placed else (manifest.job_name if manifest else ""),
        "namespace": placed.namespace if placed else (manifest.namespace if manifest else ""),
        "attempt": placed.attempt if placed else (manifest.attempt if manifest else 0),
        "capture": placed.capture if placed else None,
        "created": manifest.created if manifest else "",
        "nodes": len({obj.relative.split("/")[0] for obj in profile.rank_files}),
        "ranks": len(profile.rank_files),
        "bytes": profile.bytes,
        "finished": bool(manifest and manifest.finished),
        "manifest_problem": profile.problem,
        "loadable": profile.complete,
        "profile_status": "Complete" if profile.complete else "Incomplete",
    }


def matches(row: dict[str, Any], query: str, status: str) -> bool:
    """The list's search (job name, namespace/job or id, case-insensitive) and status filter."""
    needle = query.strip().lower()
    if needle:
        haystack = f"{row['namespace']}/{row['job_name']} {row['id']}".lower()
        if needle not in haystack:
            return False
    return not status or row.get("status") == status


@dataclass
class ProfileStore:
    """Profiles under `root`: a directory, or an S3 prefix when `s3` is set."""

    root: Path
    workers: int | None = None
    slots: dict[str, LoadSlot] = field(default_factory=dict)
    s3: S3ProfileSource | None = None
    max_decodes: int = MAX_CONCURRENT_DECODES
    cache: SummaryCache = field(default_factory=lambda: SummaryCache(None))
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    summarise_ahead: int = DEFAULT_SUMMARISE_AHEAD
    memory: MemoryLRU = field(init=False, repr=False)
    ahead: BackgroundSummaries = field(init=False, repr=False)
    _decodes: asyncio.Semaphore = field(init=False, repr=False)
    _rank_decode_places: asyncio.Semaphore = field(init=False, repr=False)
    _rank_decodes: dict[Hashable, asyncio.Future[TimelineIndex]] = field(
        init=False, repr=False, default_factory=dict
    )
    _executor: concurrent.futures.ProcessPoolExecutor | None = field(init=False, default=None)
    _pool_lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)
    _opens_summarising: int = field(init=False, default=0)  # opens summarising rank files now
    _s3_listed: dict[str, S3Profile] = field(init=False, repr=False, default_factory=dict)
    _storing: set[asyncio.Future[None]] = field(init=False, repr=False, default_factory=set)

    def __post_init__(self) -> None:
        self._decodes = asyncio.Semaphore(self.max_decodes)
        self._rank_decode_places = asyncio.Semaphore(MAX_CONCURRENT_RANK_DECODES)
        self.memory = MemoryLRU(self.memory_budget, self._evicted)
        self.ahead = BackgroundSummaries(self._summarise_ahead, self._opening, self.summarise_ahead)

    @classmethod
    def for_source(
        cls,
        source: str | Path,
        workers: int | None = None,
        s3: S3ProfileSource | None = None,
        *,
        cache: SummaryCache | None = None,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        summarise_ahead: int = DEFAULT_SUMMARISE_AHEAD,
    ) -> ProfileStore:
        root = Path(source)
        if is_s3_uri(str(source)) and isinstance(source, str):
            s3 = s3 or S3ProfileSource(parse_s3_uri(source))
            root = Path(str(s3.base))
        return cls(
            root,
            workers=workers,
            s3=s3,
            cache=cache or SummaryCache(None),
            memory_budget=memory_budget,
            summarise_ahead=summarise_ahead,
        )

    @property
    def root_label(self) -> str:
        return str(self.s3.base) if self.s3 is not None else str(self.root)

    def resolve(self, identifier: str) -> Path:
        if self.s3 is not None:
            raise UnknownProfileError(identifier)  # S3 profiles have no local path until loaded
        candidate = (self.root / identifier).resolve()
        root = self.root.resolve()
        if candidate != root and root not in candidate.parents:
            raise UnknownProfileError(identifier)
        if not candidate.is_dir() or not _is_profile_dir(candidate):
            raise UnknownProfileError(identifier)
        return candidate

    def id_for(self, path: str | None, s3_uri: str | None) -> str | None:
        """The id of a job's profile (status.profile) in this store, if it serves it."""
        if self.s3 is not None:
            if not s3_uri or not is_s3_uri(s3_uri):
                return None
            location = parse_s3_uri(s3_uri)
            base = self.s3.base
            if location.bucket != base.bucket:
                return None
            if location.prefix == base.prefix:
                return "."
            if not location.prefix.startswith(base.dir_prefix):
                return None
            return location.prefix[len(base.dir_prefix) :]
        if not path:
            return None
        try:
            return profile_id(self.root, self.resolve(path))
        except (UnknownProfileError, ValueError):
            return None  # not written yet, or outside what this UI serves

    def _with_slot(self, row: dict[str, Any]) -> dict[str, Any]:
        slot = self.slots.get(row["id"], LoadSlot())
        error = slot.error or row.get("error")
        return {
            **row,
            "state": slot.state,
            "error": error,
            "events": slot.events,
            "progress": slot.progress.as_dict() if slot.state == "loading" else None,
            "summaries": self.ahead.status(row["id"]),
        }

    def _opening(self, key: str) -> bool:
        slot = self.slots.get(key)
        return slot is not None and slot.state in ("loading", "loaded")

    def discovered(self, rows: Sequence[dict[str, Any]], job_ids: Sequence[str] = ()) -> None:
        """Profiles a listing showed: the loadable ones not summarised yet are queued to be
        summarised in the background, newest first (see `ui.background`)."""
        if self.summarise_ahead <= 0 or self.cache.directory is None:
            return  # nowhere to keep what it would compute
        listed = [row for row in rows if row.get("loadable") and not row.get("error")]
        listed.sort(key=lambda row: row.get("created") or "", reverse=True)
        found = [
            Discovered(row["id"], (row["ranks"], row["bytes"]), bool(row["finished"]))
            for row in listed
        ]
        found += [Discovered(key) for key in job_ids]
        self.ahead.offer(found)

    def written(self, jobs: Sequence[JobInfo], limit: int) -> list[Discovered]:
        """The profiles that the first MAX_JOBS_EXAMINED jobs' statuses name, that hold rank
        files (a window written) and that the summarise-ahead queue wants (not summarised
        since they changed), in the jobs' order (newest first), at most `limit`: what
        `ui.written` offers. A directory's profile carries the same fingerprint as its listing
        row, so the two never disagree about a change; an S3 profile is named only once its
        upload is complete. Runs in a thread: it looks at the named directories' files."""
        found: list[Discovered] = []
        for job in jobs[:MAX_JOBS_EXAMINED]:
            named = [self.id_for(job.profile_path, job.profile_s3_uri)]
            if self.s3 is None and job.on_demand_path:
                named.append(self.id_for(job.on_demand_path, None))
            for key in named:
                if len(found) >= limit:
                    return found
                if key is None or any(item.key == key for item in found):
                    continue
                item = self._written_item(key)
                if item is not None and self.ahead.wants(item):
                    found.append(item)
        return found

    def _written_item(self, key: str) -> Discovered | None:
        if self.s3 is not None:
            return Discovered(key)
        try:
            path = self.resolve(key)
        except UnknownProfileError:
            return None  # removed since
        row = _row_or_error(key, str(path), partial(_dir_row, self.root, path))
        if not row["loadable"] or not row["ranks"] or row.get("error"):
            return None  # no window written yet
        return Discovered(key, (row["ranks"], row["bytes"]), bool(row["finished"]))

    def _build_ahead(
        self, target: Path | S3Profile, stop: threading.Event, progress: Progress
    ) -> None:
        """The build of a background summary, whose result only the cache keeps: its memory
        is freed, and returned to the system, before the next one."""
        self._build(target, stop, progress, ahead=True)
        release_freed_memory()

    async def _summarise_ahead(self, key: str, progress: Progress, stop: threading.Event) -> None:
        """One profile summarised and its dashboard composed into the cache, then let go."""
        # Under S3 the profile as the listing that discovered it saw it: no listing again.
        listed = self._s3_listed.get(key)
        target = listed if listed is not None else await asyncio.to_thread(self._locate, key)
        work = asyncio.ensure_future(asyncio.to_thread(self._build_ahead, target, stop, progress))
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            stop.set()
            await asyncio.wait([work])
            raise

    def listing(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        if self.s3 is not None:
            listed = self.s3.listing()
            self._s3_listed = {profile.identifier: profile for profile in listed}
            for profile in listed:
                rows.append(
                    _row_or_error(
                        profile.identifier, str(profile.location), partial(_s3_row, profile)
                    )
                )
        else:
            root = self.root.resolve()
            for path in find_profiles(self.root):
                rows.append(
                    _row_or_error(
                        profile_id(root, path), str(path), partial(_dir_row, self.root, path)
                    )
                )
        return [self._with_slot(row) for row in rows]

    def key(self, identifier: ProfileId) -> str:
        """The id the store holds this profile under: in a directory the id of the directory
        it resolves to (so aliases share one slot), under S3 the canonical id. Raises
        UnknownProfileError for an id naming no profile here."""
        if self.s3 is not None or identifier.text in self.slots:
            return identifier.text  # a held profile stays reachable (to unload) if deleted
        return profile_id(self.root, self.resolve(identifier.text))

    def _locate(self, identifier: str) -> Path | S3Profile:
        if self.s3 is None:
            return self.resolve(identifier)
        profile = self.s3.find(identifier)
        if profile is None:
            raise UnknownProfileError(identifier)
        if not profile.complete:
            raise ProfileNotLoadableError(f"{profile.location}: {profile.problem}")
        return profile

    def _summaries(
        self,
        paths: Sequence[Path],
        points: Sequence[Sequence[tuple[int, int]]],
        check: Callable[[], None],
        identities: Sequence[str] | None = None,
        *,
        progress: Progress | None = None,
        ahead: bool = False,
        unstored: list[tuple[str, RankSummary]] | None = None,
    ) -> list[RankSummary]:
        """Each rank file's summary: from the cache, or summarised now and stored (with
        `unstored`, those summarised in this process are appended there instead, to be stored
        once the open has answered: encoding and writing them is not on its path)."""
        known = identities or [file_identity(p) for p in paths]
        keys = [summary_key(ident, pts) for ident, pts in zip(known, points, strict=True)]
        found: dict[int, RankSummary] = {}
        shown = progress or Progress()
        shown.phase, shown.done, shown.total = "summarising", 0, len(paths)
        for i, key in enumerate(keys):
            cached = self.cache.get(key)
            if cached is not None:
                found[i] = cached
                shown.done += 1
        missing = [i for i in range(len(paths)) if i not in found]
        with self._summarising(counted=bool(missing) and not ahead):
            for i, summary, data in self._summarise(missing, paths, points, check, ahead=ahead):
                if self.cache.directory is None:
                    pass  # nothing is kept: nothing to encode
                elif data is None and unstored is not None:
                    unstored.append((keys[i], summary))
                else:
                    self.cache.put(keys[i], to_bytes(summary) if data is None else data)
                found[i] = summary
                shown.done += 1
        return [found[i] for i in range(len(paths))]

    @contextlib.contextmanager
    def _summarising(self, *, counted: bool) -> Any:
        """Counts the opens summarising rank files, which background work gives way to."""
        if not counted:
            yield
            return
        with self._pool_lock:
            self._opens_summarising += 1
        try:
            yield
        finally:
            with self._pool_lock:
                self._opens_summarising -= 1

    def _give_way(self, check: Callable[[], None]) -> None:
        """Background work waits while a user's open summarises (its workers are theirs)."""
        while self._opens_summarising:
            check()
            time.sleep(0.05)

    def _summarise(
        self,
        missing: list[int],
        paths: Sequence[Path],
        points: Sequence[Sequence[tuple[int, int]]],
        check: Callable[[], None],
        *,
        ahead: bool = False,
    ) -> Iterator[tuple[int, RankSummary, bytes | None]]:
        """Each missing rank's summary and, from a worker, its stored bytes: in this process
        one file at a time (the default: no worker start on an open's path, one rank's columns
        in memory at once), or in a pool of `workers` processes."""
        workers = 1 if self.workers is None else self.workers
        if workers <= 1 or len(missing) <= 1:
            for i in missing:
                check()
                if ahead:
                    self._give_way(check)
                yield i, summarise_rank(paths[i], points[i]), None
            return
        pool = self._pool(workers)
        waiting = iter(missing)
        futures: dict[concurrent.futures.Future[bytes], int] = {}

        def submit() -> None:
            i = next(waiting, None)
            if i is not None:
                futures[pool.submit(summary_bytes, paths[i], points[i])] = i

        # In the background only `workers` files are submitted at once, so an open's files
        # are queued behind a few of them at most, never behind a whole profile.
        for _ in range(workers if ahead else len(missing)):
            submit()
        try:
            while futures:
                done, _ = concurrent.futures.wait(
                    futures, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for future in done:
                    i = futures.pop(future)
                    check()
                    if ahead:
                        self._give_way(check)
                    submit()
                    data = future.result()
                    yield i, from_bytes(data), data
        finally:
            for future in futures:
                future.cancel()  # an unload or a refused file: the rest is not started

    def _pool(self, workers: int) -> concurrent.futures.ProcessPoolExecutor:
        with self._pool_lock:
            if self._executor is None:
                # forkserver: this is a threaded server; fork would copy its locks mid-use.
                context = multiprocessing.get_context("forkserver")
                self._executor = concurrent.futures.ProcessPoolExecutor(workers, mp_context=context)
            return self._executor

    async def aclose(self) -> None:
        """Stops the background summaries, lets the summaries of finished opens be stored,
        then stops the decode workers (the app's cleanup)."""
        await self.ahead.close()
        if self._storing:
            await asyncio.wait(set(self._storing))
        self.close()

    def close(self) -> None:
        """Stops the decode workers."""
        with self._pool_lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None

    def _build(
        self,
        target: Path | S3Profile,
        stop: threading.Event,
        progress: Progress | None = None,
        *,
        ahead: bool = False,
    ) -> LoadedEntry:
        """A profile's entry: its stored dashboard if these very files were composed before,
        else its ranks summarised (`ahead`: in the background) and composed, and stored."""

        def check() -> None:
            if stop.is_set():
                raise DecodeStoppedError("unloaded while loading")

        shown = progress or Progress()
        began = time.perf_counter()
        check()
        if isinstance(target, S3Profile):
            assert self.s3 is not None
            shown.phase = "downloading"
            location: Path = self.s3.fetch(target)
            check()
        else:
            location = target
        manifest, problem = read_manifest_or_default(location)
        paths = [ref.path for ref in discover_rank_files(location)]
        if not paths:
            raise ProfileLoadError(f"{location}: no rank files (<node>/rank-<RANK>.trnprof) found")
        identities = [file_identity(p) for p in paths]
        manifest_file = location / MANIFEST_NAME
        document = dashboard_key(
            identities, file_identity(manifest_file) if manifest_file.is_file() else "none"
        )

        unstored: list[tuple[str, RankSummary]] = []

        def recompose(
            check: Callable[[], None] = lambda: None,
            progress: Progress | None = None,
            later: list[tuple[str, RankSummary]] | None = None,
        ) -> ComposedProfile:
            summaries = self._summaries(
                paths,
                [()] * len(paths),
                check,
                identities,
                progress=progress,
                ahead=ahead,
                unstored=later,
            )
            # A rank without sync points of its own is placed with its node peers' (same clock).
            pooled = node_sync_points(summaries)
            borrowing = [
                i for i, s in enumerate(summaries) if not s.own_sync and pooled.get(s.node)
            ]
            if borrowing:
                again = self._summaries(
                    [paths[i] for i in borrowing],
                    [pooled[summaries[i].node] for i in borrowing],
                    check,
                    ahead=ahead,
                    unstored=later,
                )
                for i, summary in zip(borrowing, again, strict=True):
                    summaries[i] = summary
            check()
            if progress is not None:
                progress.phase = "composing"
            return compose(summaries, location, manifest, problem, time.perf_counter() - began)

        stored = self.cache.get_dashboard(document)
        composed = None
        if stored is None:  # else composed before from these very files: nothing to read
            composed = recompose(check, shown, None if ahead else unstored)
            dashboard = dashboard_of(composed.inputs)
            if isinstance(target, S3Profile):
                dashboard["overview"]["path"] = str(target.location)  # not the local cache
            stored = StoredDashboard.of(dashboard, ready_annotations(composed, dashboard))
            self.cache.put_dashboard(document, stored)
        shown.phase = "done"
        # Composed again when the timeline first needs it (nothing to stop: it is no load).
        return LoadedEntry(stored, composed, partial(recompose, lambda: None), unstored=unstored)

    def _stored(self, task: asyncio.Future[None]) -> None:
        self._storing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("storing summaries failed: %s", task.exception())

    def store_summaries(self, entry: LoadedEntry) -> None:
        """Stores the summaries its open computed (in a thread, after the open answered)."""
        while entry.unstored:
            key, summary = entry.unstored.pop()
            self.cache.put(key, to_bytes(summary))

    def _precompose(self, key: str, entry: LoadedEntry) -> None:
        """Composes a loaded profile's summaries for its timeline, unless it was let go."""
        slot = self.slots.get(key)
        if slot is None or slot.entry is not entry or entry.composing is not None:
            return
        task = asyncio.ensure_future(self.composed(key, entry))
        task.add_done_callback(_log_failure)

    async def composed(self, key: str, entry: LoadedEntry) -> ComposedProfile:
        """The entry's composed summaries, composed once (from the summary cache) if the
        dashboard came ready-made."""
        if entry.composed is not None:
            return entry.composed
        if entry.composing is None:
            entry.composing = asyncio.ensure_future(asyncio.to_thread(entry.recompose))
        composed = await asyncio.shield(entry.composing)
        entry.composed = composed
        slot = self.slots.get(key)
        if slot is not None and slot.entry is entry:
            self.memory.put(("profile", key), slot, entry.nbytes())
        return composed

    async def _decode(
        self, target: Path | S3Profile, stop: threading.Event, progress: Progress
    ) -> LoadedEntry:
        """The decode in a worker thread, holding one of the decode places until the thread
        has ended: cancelling the waiting task does not free memory the thread still holds."""
        async with self._decodes:
            if stop.is_set():  # unloaded while it waited for a place
                raise DecodeStoppedError("unloaded while loading")
            decode = asyncio.ensure_future(asyncio.to_thread(self._build, target, stop, progress))
            try:
                return await asyncio.shield(decode)
            except asyncio.CancelledError:
                stop.set()
                await asyncio.wait([decode])
                if not decode.cancelled():
                    decode.exception()  # retrieved: its DecodeStoppedError is expected
                raise

    async def load(self, key: str) -> LoadSlot:
        """Starts loading the profile held as `key` (see `key`), unless it is held already."""
        target = await asyncio.to_thread(self._locate, key)
        slot = self.slots.setdefault(key, LoadSlot())
        if slot.state in ("loading", "loaded"):
            return slot
        slot.state, slot.error, slot.progress = "loading", None, Progress()
        self.ahead.withdraw(key)

        async def run() -> None:
            try:
                # Being summarised in the background: its progress is this open's, and the
                # open then reads what it stored instead of summarising the files again.
                shared = self.ahead.progress.get(key)
                if shared is not None:
                    slot.progress = shared
                    await self.ahead.settled(key)
                    slot.progress = Progress()
                entry = await self._decode(target, slot.stop, slot.progress)
            except DecodeStoppedError:
                return  # unloaded: the slot is gone, nothing is stored
            except Exception as exc:  # shown to the user; the server keeps running
                slot.state, slot.error, slot.entry = "error", f"{type(exc).__name__}: {exc}", None
            else:
                if slot.stop.is_set():
                    return  # unloaded while the last stage ran: dropped, not stored
                slot.state, slot.entry = "loaded", entry
                slot.events = entry.stored.events
                self.memory.put(("profile", key), slot, entry.nbytes())
                if entry.unstored:
                    storing = asyncio.ensure_future(asyncio.to_thread(self.store_summaries, entry))
                    self._storing.add(storing)
                    storing.add_done_callback(self._stored)
                if entry.composed is None:
                    asyncio.get_running_loop().call_later(
                        PRECOMPOSE_AFTER_S, self._precompose, key, entry
                    )

        slot.task = asyncio.create_task(run())
        return slot

    async def settled(self, slot: LoadSlot, timeout: float | None = None) -> None:
        """Waits for the slot's load to end (or be stopped by an unload, or `timeout` seconds
        to pass), never raising."""
        if slot.task is not None:
            await asyncio.wait([slot.task], timeout=timeout)

    async def wait_loaded(self, key: str) -> LoadedEntry:
        slot = self.slots.get(key)
        if slot is None:
            raise UnknownProfileError(key)
        await self.settled(slot)
        if slot.entry is None or self.slots.get(key) is not slot:
            raise UnknownProfileError(key)
        return slot.entry

    def unload(self, key: str) -> bool:
        slot = self.slots.pop(key, None)
        if slot is None:
            return False
        self.memory.pop(("profile", key))
        self.memory.drop_where(lambda held: _rank_of(held, key))
        slot.stop.set()  # the decode stops at its next stage and stores nothing
        slot.entry = None
        if slot.task is not None and not slot.task.done():
            slot.task.cancel()
        return True

    def loaded(self, identifier: str) -> LoadedEntry:
        slot = self.slots.get(identifier)
        if slot is None or slot.entry is None:
            raise UnknownProfileError(identifier)
        return slot.entry

    def _evicted(self, key: Hashable, value: Any) -> None:
        """The memory LRU let go of an entry: an evicted profile is unloaded."""
        if isinstance(key, tuple) and key[0] == "profile":
            slot = self.slots.get(key[1])
            if slot is value:
                self.unload(key[1])
                log.info("profile %s unloaded to stay within the memory budget", key[1])

    async def rank_index(self, key: str, entry: LoadedEntry, position: int) -> TimelineIndex:
        """The timeline index of one rank of a loaded profile: held in the memory LRU, decoded
        (one decode per rank however many requests want it) when it is not."""
        held = ("rank", key, id(entry), position)
        kept = self.memory.get(held)
        if isinstance(kept, TimelineIndex):
            return kept
        composed = await self.composed(key, entry)
        summary = composed.summaries[position]
        size = max(summary.event_count, 1) * INDEXED_BYTES_PER_EVENT
        self.memory.check(size, f"rank {summary.rank} ({summary.event_count:,} events)")
        task = self._rank_decodes.get(held)
        if task is None:
            task = asyncio.ensure_future(self._decode_rank(composed, position))
            self._rank_decodes[held] = task
            task.add_done_callback(lambda _: self._rank_decodes.pop(held, None))
        index = await asyncio.shield(task)
        if self.slots.get(key) is not None and self.slots[key].entry is entry:
            self.memory.put(held, index, size)  # not kept for a profile unloaded meanwhile
        return index

    async def _decode_rank(self, composed: ComposedProfile, position: int) -> TimelineIndex:
        async with self._rank_decode_places:
            summary = composed.summaries[position]
            return await asyncio.to_thread(
                rank_timeline,
                summary,
                composed.node_of[position],
                composed.inputs.nodes,
                composed.origin_wall_ns,
            )

    async def window(
        self, key: str, entry: LoadedEntry, span: tuple[int, int], width: int, tracks: list[int]
    ) -> dict[str, Any]:
        return await lazy_timeline.window(
            await self.composed(key, entry),
            partial(self.rank_index, key, entry),
            start_ns=span[0],
            end_ns=span[1],
            width_px=width,
            track_ids=tracks,
        )

    async def event(self, key: str, entry: LoadedEntry, event_id: int) -> dict[str, Any] | None:
        composed = await self.composed(key, entry)
        where = lazy_timeline.split_event_id(composed, event_id)
        if where is None:
            return None
        position, local = where
        index = await self.rank_index(key, entry, position)
        return lazy_timeline.event(composed, index, position, local)


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.info("composing ahead of the timeline failed: %s", task.exception())


def _rank_of(held: Hashable, key: str) -> bool:
    return isinstance(held, tuple) and held[0] == "rank" and held[1] == key
