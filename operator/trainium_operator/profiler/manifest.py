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
from trainium_operator.profiler.format import FORMAT_VERSION, RANK_FILE_SUFFIX

MANIFEST_NAME = "profile.json"
MANIFEST_SCHEMA = 1

_RANK_FILE = re.compile(r"^rank-(\d+)" + re.escape(RANK_FILE_SUFFIX) + "$")


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
    def from_json(cls, data: Mapping[str, Any]) -> ProfileManifest:
        window = data.get("step_window")
        return cls(
            job_name=str(data.get("job_name", "")),
            namespace=str(data.get("namespace", "")),
            uid=str(data.get("uid", "")),
            attempt=int(data.get("attempt", 0)),
            created=str(data.get("created", "")),
            world_size=int(data.get("world_size", 0)),
            nodes=tuple(str(n) for n in data.get("nodes", ())),
            ranks=tuple(
                ManifestRank(
                    rank=int(r["rank"]),
                    node=str(r["node"]),
                    local_rank=int(r.get("local_rank", 0)),
                    file=str(r.get("file", "")),
                )
                for r in data.get("ranks", ())
            ),
            step_window=(int(window[0]), int(window[1])) if window else None,
            format_version=(
                int(data.get("format_version", FORMAT_VERSION)[0]),
                int(data.get("format_version", FORMAT_VERSION)[1]),
            ),
            clock_sync=tuple(ClockSyncPoint(*map(int, p)) for p in data.get("clock_sync", ())),
            finished=bool(data.get("finished", False)),
            extra=dict(data.get("extra", {})),
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
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ManifestError(f"{path}: no profile manifest") from exc
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: unreadable profile manifest: {exc}") from exc
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: profile manifest is not a JSON object")
    if int(data.get("schema", MANIFEST_SCHEMA)) > MANIFEST_SCHEMA:
        raise ManifestError(f"{path}: manifest schema {data['schema']} is newer than this reader")
    try:
        return ProfileManifest.from_json(data)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ManifestError(f"{path}: malformed profile manifest: {exc!r}") from exc


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
