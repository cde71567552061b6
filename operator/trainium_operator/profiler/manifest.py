"""`profile.json`, the top of a profile directory, and discovery of the rank files below it.

    <profile dir>/profile.json
    <profile dir>/<node>/rank-<RANK>.trnprof
    <profile dir>/<node>/neuron/...          (Neuron runtime output, when captured)

Rank 0 writes the manifest when profiling starts and rewrites it when it stops. The rank
files are the source of truth: readers discover them on disk, so a profile whose manifest is
missing or stale (rank 0 crashed) is still readable.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainium_operator.profiler.clock import ClockSyncPoint
from trainium_operator.profiler.format import (
    FORMAT_VERSION,
    INT64_MAX,
    RANK_FILE_SUFFIX,
    int_field,
    str_field,
)

MANIFEST_NAME = "profile.json"
MANIFEST_SCHEMA = 1
MAX_MANIFEST_BYTES = 16 << 20
"""profile.json is a few kilobytes (one entry per rank); a larger one is not read."""

_RANK_FILE = re.compile(r"^rank-(\d+)" + re.escape(RANK_FILE_SUFFIX) + "$")
# One component of a profile path (namespace, job, attempt, node): a Kubernetes name or a
# hostname. Never empty, ".", "..", absolute, or holding a separator or NUL, so a path built
# from such components stays below the directory it is joined to.
_SAFE_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,252}$")


def is_safe_segment(text: str) -> bool:
    """True for a name that may be one component of a local path (see _SAFE_SEGMENT)."""
    return bool(_SAFE_SEGMENT.match(text))


def rank_file_path_problem(relative: str) -> str | None:
    """Why `relative` is not `<node>/rank-<RANK>.trnprof` with a safe node name, or None."""
    parts = relative.split("/")
    if len(parts) != 2 or not is_safe_segment(parts[0]) or not _RANK_FILE.match(parts[1]):
        return f"{relative[:200]!r} is not <node>/rank-<RANK>{RANK_FILE_SUFFIX}"
    return None


class ManifestError(ValueError):
    """profile.json is missing or malformed; says which file."""


@dataclass(frozen=True)
class RankFileRef:
    """One rank file found on disk."""

    rank: int
    node: str
    path: Path


@dataclass(frozen=True)
class ManifestRank:
    rank: int
    node: str
    local_rank: int = 0
    file: str = ""  # relative to the profile directory


@dataclass(frozen=True)
class ProfileManifest:
    """What `profile.json` records about one profiling run of one job attempt."""

    job_name: str = ""
    namespace: str = ""
    uid: str = ""
    attempt: int = 0
    created: str = ""  # ISO 8601 UTC
    world_size: int = 0
    nodes: tuple[str, ...] = ()
    ranks: tuple[ManifestRank, ...] = ()
    step_window: tuple[int, int] | None = None
    format_version: tuple[int, int] = FORMAT_VERSION
    clock_sync: tuple[ClockSyncPoint, ...] = ()  # rank 0's; each rank file carries its own
    finished: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": MANIFEST_SCHEMA,
            "job_name": self.job_name,
            "namespace": self.namespace,
            "uid": self.uid,
            "attempt": self.attempt,
            "created": self.created,
            "world_size": self.world_size,
            "nodes": list(self.nodes),
            "ranks": [
                {"rank": r.rank, "node": r.node, "local_rank": r.local_rank, "file": r.file}
                for r in self.ranks
            ],
            "step_window": list(self.step_window) if self.step_window else None,
            "format_version": list(self.format_version),
            "clock_sync": [[p.monotonic_ns, p.wall_ns, p.uncertainty_ns] for p in self.clock_sync],
            "finished": self.finished,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_json(cls, data: Any) -> ProfileManifest:
        """The manifest in `data`; raises ValueError naming the field of the wrong shape."""
        if not isinstance(data, Mapping):
            raise ValueError("profile manifest is not a JSON object")
        window = _optional_list(data, "step_window")
        if window and len(window) != 2:
            raise ValueError(f"step_window must be [first, last], not {window!r:.80}")
        version = _optional_list(data, "format_version") or list(FORMAT_VERSION)
        extra = data.get("extra", {})
        if not isinstance(extra, Mapping):
            raise ValueError("extra must be a JSON object")
        return cls(
            job_name=_text(data, "job_name"),
            namespace=_text(data, "namespace"),
            uid=_text(data, "uid"),
            attempt=_number(data, "attempt"),
            created=_text(data, "created"),
            world_size=_number(data, "world_size"),
            nodes=tuple(str_field("nodes", n) for n in _optional_list(data, "nodes")),
            ranks=tuple(_rank(r) for r in _optional_list(data, "ranks")),
            step_window=(_as_number("step_window", window[0]), _as_number("step_window", window[1]))
            if window
            else None,
            format_version=(
                _as_number("format_version", version[0]),
                _as_number("format_version", version[1]),
            ),
            clock_sync=tuple(_sync_point(point) for point in _optional_list(data, "clock_sync")),
            finished=bool(data.get("finished", False)),
            extra=dict(extra),
        )


def _as_number(name: str, value: Any) -> int:
    return int_field(name, value, -INT64_MAX)


def _number(data: Mapping[str, Any], name: str) -> int:
    return _as_number(name, data.get(name, 0))


def _text(data: Mapping[str, Any], name: str) -> str:
    return str_field(name, data.get(name, ""))


def _optional_list(data: Mapping[str, Any], name: str) -> list[Any]:
    value = data.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{name} must be a list, not {type(value).__name__}")
    return value


def _sync_point(point: Any) -> ClockSyncPoint:
    if not isinstance(point, list) or len(point) != 3:
        raise ValueError(
            f"clock_sync points must be [monotonic, wall, uncertainty], not {point!r:.80}"
        )
    return ClockSyncPoint(*(_as_number("clock_sync", value) for value in point))


def _rank(entry: Any) -> ManifestRank:
    if not isinstance(entry, Mapping):
        raise ValueError("ranks[] must be JSON objects")
    file = _text(entry, "file")
    # The name is a path relative to the profile directory: it must stay inside it.
    problem = rank_file_path_problem(file) if file else None
    if problem:
        raise ValueError(f"ranks[].file: {problem}")
    return ManifestRank(
        rank=_as_number("ranks[].rank", entry.get("rank")),
        node=str_field("ranks[].node", entry.get("node")),
        local_rank=_number(entry, "local_rank"),
        file=file,
    )


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def write_manifest(profile_dir: str | os.PathLike[str], manifest: ProfileManifest) -> Path:
    """Atomically (write, then rename) write `<profile_dir>/profile.json`."""
    directory = Path(profile_dir)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / MANIFEST_NAME
    fd, tmp = tempfile.mkstemp(prefix=".profile.", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(manifest.to_json(), out, indent=2)
            out.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_manifest(profile_dir: str | os.PathLike[str]) -> ProfileManifest:
    """Read `<profile_dir>/profile.json`; raises ManifestError naming the file."""
    path = Path(profile_dir) / MANIFEST_NAME
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{path}: profile manifest larger than {MAX_MANIFEST_BYTES} bytes")
        data = json.loads(path.read_text(encoding="utf-8"))
    except ManifestError:
        raise
    except FileNotFoundError as exc:
        raise ManifestError(f"{path}: no profile manifest") from exc
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: unreadable profile manifest: {exc}") from exc
    except RecursionError as exc:
        raise ManifestError(f"{path}: unreadable profile manifest: nested too deeply") from exc
    return manifest_from_json(data, str(path))


def manifest_from_json(data: Any, source: str) -> ProfileManifest:
    """The manifest in parsed JSON `data`; raises ManifestError naming `source` and the field.
    Shared by the directory and the S3 readers, so both refuse the same malformed manifests."""
    if not isinstance(data, dict):
        raise ManifestError(f"{source}: profile manifest is not a JSON object")
    schema = data.get("schema", MANIFEST_SCHEMA)
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise ManifestError(f"{source}: manifest schema {schema!r:.40} is not a number")
    if schema > MANIFEST_SCHEMA:
        raise ManifestError(f"{source}: manifest schema {schema} is newer than this reader")
    try:
        return ProfileManifest.from_json(data)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ManifestError(f"{source}: malformed profile manifest: {exc}") from exc


def discover_rank_files(profile_dir: str | os.PathLike[str]) -> list[RankFileRef]:
    """Every `<node>/rank-<N>.trnprof` under the profile directory, ordered by rank."""
    root = Path(profile_dir)
    found: list[RankFileRef] = []
    if not root.is_dir():
        return found
    for node_dir in root.iterdir():
        if not node_dir.is_dir():
            continue
        for entry in node_dir.iterdir():
            match = _RANK_FILE.match(entry.name)
            if match and entry.is_file():
                found.append(RankFileRef(rank=int(match.group(1)), node=node_dir.name, path=entry))
    found.sort(key=lambda ref: (ref.rank, ref.node))
    return found


def manifest_from_rank_files(
    profile_dir: str | os.PathLike[str], base: ProfileManifest | None = None
) -> ProfileManifest:
    """`base` (or an empty manifest) with nodes and ranks replaced by what is on disk."""
    from dataclasses import replace

    from trainium_operator.profiler.format import ProfileFormatError, read_rank_header

    root = Path(profile_dir)
    ranks = []
    for ref in discover_rank_files(root):
        local_rank = 0
        # A damaged file is still listed: the reader reports the damage when it opens it.
        with contextlib.suppress(OSError, ProfileFormatError):
            local_rank = read_rank_header(ref.path).local_rank
        ranks.append(
            ManifestRank(
                rank=ref.rank,
                node=ref.node,
                local_rank=local_rank,
                file=ref.path.relative_to(root).as_posix(),
            )
        )
    nodes = tuple(sorted({r.node for r in ranks}))
    manifest = base or ProfileManifest(created=now_iso())
    return replace(manifest, nodes=nodes, ranks=tuple(ranks))
