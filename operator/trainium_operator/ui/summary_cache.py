"""The UI's own store of rank summaries, so a profile opens without decoding it again.

Summaries are computed by the UI from the rank files (`analysis.summary`) and kept in a
directory that only the UI writes: never beside the profiles, whose volume tenants' training
pods write. An entry is named by the file's identity (resolved path, size, mtime, inode and a
hash of its first and last 4 KiB, which hold the header and the END block) together with the
clock sync points its times were aligned with and the summary version, so a rewritten, grown
or replaced rank file is summarised again and never served stale. Entries are written
atomically (a temporary file renamed), read back with `from_bytes`' checks (one that fails
them is deleted and recomputed) and pruned, least recently used first, past `max_bytes`.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import logging
import os
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainium_operator.analysis.summary import (
    SUMMARY_VERSION,
    RankSummary,
    SummaryError,
    from_bytes,
)
from trainium_operator.ui.limits import DEFAULT_SUMMARY_CACHE_BYTES

_EDGE_BYTES = 4096
_SUFFIX = ".summary"
_DASHBOARD_SUFFIX = ".dashboard"
log = logging.getLogger(__name__)


class UnsafeCacheDirError(ValueError):
    """The directory is not one only this UI writes."""


def file_identity(path: Path) -> str:
    """What names one version of a rank file: a change to any of it is another file."""
    resolved = path.resolve()
    with open(resolved, "rb") as handle:
        info = os.fstat(handle.fileno())
        digest = hashlib.blake2b(handle.read(_EDGE_BYTES), digest_size=16)
        if info.st_size > _EDGE_BYTES:
            handle.seek(max(_EDGE_BYTES, info.st_size - _EDGE_BYTES))
            digest.update(handle.read(_EDGE_BYTES))
    return f"{resolved}|{info.st_size}|{info.st_mtime_ns}|{info.st_ino}|{digest.hexdigest()}"


def summary_key(identity: str, points: Sequence[tuple[int, int]]) -> str:
    text = f"v{SUMMARY_VERSION}|{identity}|{sorted(points)}"
    return hashlib.sha256(text.encode()).hexdigest()


def default_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainium-operator" / "ui-summaries"


_DASHBOARD_FORMAT = 3  # 3: a header line, then the document as served, plain and gzipped


def dashboard_key(rank_identities: Sequence[str], manifest_identity: str) -> str:
    """A profile's composed dashboard: a function of its rank files and manifest alone."""
    version = f"v{SUMMARY_VERSION}.{_DASHBOARD_FORMAT}"
    text = "\n".join([version, manifest_identity, *sorted(rank_identities)])
    return hashlib.sha256(text.encode()).hexdigest()


def checked_directory(directory: Path, served_root: Path | None) -> Path:
    """The cache directory, created private (0700) if missing; refused when another user
    owns it, others may write it, or it lies inside the served profiles."""
    directory = directory.expanduser()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    resolved = directory.resolve()
    if served_root is not None:
        root = served_root.resolve()
        if resolved == root or root in resolved.parents:
            raise UnsafeCacheDirError(f"{resolved} is inside the served profiles ({root})")
    info = os.stat(resolved)
    if info.st_uid != os.getuid():
        raise UnsafeCacheDirError(f"{resolved} belongs to uid {info.st_uid}, not this UI's")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheDirError(f"{resolved} is writable by others (mode {info.st_mode:o})")
    return resolved


@dataclass(frozen=True)
class StoredDashboard:
    """A composed dashboard as the UI answers it: its JSON, plain and gzipped, encoded once
    when it was composed (a reopen sends these bytes without parsing them), its event count,
    and the histograms of its first annotations (name -> the `/api/annotation` answer)."""

    body: bytes
    gzipped: bytes
    events: int
    annotations: dict[str, Any]

    @classmethod
    def of(cls, document: dict[str, Any], annotations: dict[str, Any]) -> StoredDashboard:
        body = json.dumps(document).encode()
        gzipped = gzip.compress(body, compresslevel=6, mtime=0)
        return cls(body, gzipped, int(document["overview"]["events"]), annotations)

    def to_bytes(self) -> bytes:
        header = {
            "events": self.events,
            "annotations": self.annotations,
            "body": len(self.body),
            "gzipped": len(self.gzipped),
        }
        return json.dumps(header).encode() + b"\n" + self.body + self.gzipped


def _stored_dashboard(data: bytes) -> StoredDashboard | None:
    """The stored dashboard, or None when the bytes are not one (written by this UI, so a
    check of their framing is enough: the document itself is not parsed again)."""
    line, _, rest = data.partition(b"\n")
    try:
        header = json.loads(line)
    except ValueError:
        return None
    if not isinstance(header, dict) or not isinstance(header.get("annotations"), dict):
        return None
    sizes = (header.get("body"), header.get("gzipped"), header.get("events"))
    if not all(isinstance(size, int) and size >= 0 for size in sizes):
        return None
    body, gzipped = rest[: header["body"]], rest[header["body"] :]
    framed = len(body) == header["body"] and len(gzipped) == header["gzipped"]
    if not framed or body[:1] != b"{" or body[-1:] != b"}" or gzipped[:2] != b"\x1f\x8b":
        return None
    return StoredDashboard(body, gzipped, header["events"], header["annotations"])


class SummaryCache:
    """Summaries by key (`summary_key`) in `directory`; None: nothing is kept on disk."""

    def __init__(self, directory: Path | None, max_bytes: int = DEFAULT_SUMMARY_CACHE_BYTES):
        self.directory = directory
        self.max_bytes = max_bytes
        self._written = 0  # bytes written since the last prune

    def _path(self, key: str) -> Path:
        assert self.directory is not None
        return self.directory / f"{key}{_SUFFIX}"

    def get(self, key: str) -> RankSummary | None:
        if self.directory is None:
            return None
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            summary = from_bytes(data)
        except SummaryError as exc:
            log.warning("dropping unreadable summary %s: %s", path.name, exc)
            path.unlink(missing_ok=True)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: pruned last
        return summary

    def get_dashboard(self, key: str) -> StoredDashboard | None:
        """A profile's dashboard as composed before from the same files (`dashboard_key`)."""
        if self.directory is None:
            return None
        path = self.directory / f"{key}{_DASHBOARD_SUFFIX}"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        found = _stored_dashboard(data)
        if found is None:
            log.warning("dropping unreadable dashboard %s", path.name)
            path.unlink(missing_ok=True)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        return found

    def put_dashboard(self, key: str, stored: StoredDashboard) -> None:
        self._write(f"{key}{_DASHBOARD_SUFFIX}", stored.to_bytes())

    def put(self, key: str, data: bytes) -> None:
        self._write(f"{key}{_SUFFIX}", data)

    def _write(self, name: str, data: bytes) -> None:
        if self.directory is None or len(data) > self.max_bytes:
            return
        handle, temporary = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(temporary, self.directory / name)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        self._written += len(data)
        if self._written > self.max_bytes // 8:
            self.prune()

    def prune(self) -> int:
        """Deletes the least recently used entries past `max_bytes`; how many went."""
        self._written = 0
        if self.directory is None:
            return 0
        entries = []
        stored = [
            *self.directory.glob(f"*{_SUFFIX}"),
            *self.directory.glob(f"*{_DASHBOARD_SUFFIX}"),
        ]
        for path in stored:
            with contextlib.suppress(FileNotFoundError):
                info = path.stat()
                entries.append((info.st_mtime_ns, info.st_size, path))
        entries.sort(reverse=True)  # newest first
        kept, removed = 0, 0
        for _, size, path in entries:
            kept += size
            if kept > self.max_bytes:
                path.unlink(missing_ok=True)
                removed += 1
        return removed
