"""Reading profiles from S3: listing by prefix and a local copy keyed by ETag.

A listing walks every key under the prefix (list_objects_v2, page by page) and groups them
into profiles: a directory with `profile.json` or `<node>/rank-<N>.trnprof` below it. Only a
profile whose manifest is there (the uploader writes it last) and whose rank files have the
sizes the manifest records is complete, and only a complete profile can be loaded; the others
are listed as incomplete (an upload still running or one that was interrupted).

Loading downloads each rank file once into a local cache (`$TRAINIUM_PROFILE_CACHE`, default
`~/.cache/trainium-operator/s3-profiles/<bucket>/<prefix>`), next to a `.etag` file: a later
load downloads only files whose ETag changed. The cached directory is then an ordinary profile
directory, so the dashboards, the report, the timeline and the Perfetto export are exactly the
ones a directory gets.

Keys are untrusted (anyone who may write under the prefix chooses them): a key is mapped to a
local path only when every component of it is a safe name and the result stays inside the
cache (see `key_problem` and `S3ProfileSource.cache_path`). A profile with an unsafe key is
listed with that problem and cannot be loaded; nothing of it is downloaded.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainium_operator.profiler.format import RANK_FILE_SUFFIX
from trainium_operator.profiler.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    ManifestError,
    ProfileManifest,
    is_safe_segment,
    manifest_from_json,
    rank_file_path_problem,
)
from trainium_operator.profiler.s3 import (
    S3Location,
    S3ProfileError,
    describe_error,
    list_objects,
    s3_client,
)

CACHE_ENV = "TRAINIUM_PROFILE_CACHE"
_RANK_FILE = re.compile(r"^rank-(\d+)" + re.escape(RANK_FILE_SUFFIX) + "$")


def default_cache_dir() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainium-operator" / "s3-profiles"


@dataclass(frozen=True)
class S3Object:
    key: str
    relative: str  # relative to the profile root
    size: int
    etag: str


@dataclass
class S3Profile:
    """One profile found under a prefix."""

    location: S3Location
    identifier: str  # the root relative to the listed prefix ("." for the prefix itself)
    rank_files: list[S3Object] = field(default_factory=list)
    manifest: S3Object | None = None
    manifest_data: ProfileManifest | None = None
    problem: str | None = None  # why it is not loadable, when it is not

    @property
    def complete(self) -> bool:
        return self.manifest is not None and self.problem is None

    @property
    def bytes(self) -> int:
        return sum(obj.size for obj in self.rank_files)


def key_problem(relative: str) -> str | None:
    """Why a key (relative to the listed prefix) may not become a local path, or None.

    Every component must be a safe name (no "..", ".", empty component, NUL, backslash or
    leading "/"), ending in `profile.json` or `<node>/rank-<RANK>.trnprof` below the root.
    """
    parts = relative.split("/")
    *root, last = parts
    if last != MANIFEST_NAME:
        root = root[:-1]
        problem = rank_file_path_problem("/".join(parts[-2:]))
        if problem:
            return f"key {relative[:300]!r}: {problem}"
    bad = [part for part in root if not is_safe_segment(part)]
    if bad:
        return f"key {relative[:300]!r}: unsafe path component {bad[0][:80]!r}"
    return None


def _split(relative: str) -> tuple[str, str] | None:
    """(profile root, path inside it) of a key relative to the listed prefix, or None."""
    parts = relative.split("/")
    if parts[-1] == MANIFEST_NAME:
        return "/".join(parts[:-1]), MANIFEST_NAME
    if len(parts) >= 2 and _RANK_FILE.match(parts[-1]):
        return "/".join(parts[:-2]), "/".join(parts[-2:])
    return None


def group_profiles(base: S3Location, objects: list[dict[str, Any]]) -> list[S3Profile]:
    """Pure: the listing's objects grouped into profiles, sorted by identifier."""
    found: dict[str, S3Profile] = {}
    prefix = base.dir_prefix
    for obj in objects:
        key = str(obj["Key"])
        if not key.startswith(prefix):
            continue
        split = _split(key[len(prefix) :])
        if split is None:
            continue
        root, inside = split
        profile = found.get(root)
        if profile is None:
            profile = found[root] = S3Profile(base.child(root), root or ".")
        problem = key_problem(key[len(prefix) :])
        if problem is not None:
            # Listed, so the hostile upload is visible, but never mapped to a local path.
            profile.problem = profile.problem or problem
            continue
        item = S3Object(key, inside, int(obj["Size"]), str(obj.get("ETag", "")).strip('"'))
        if inside == MANIFEST_NAME:
            profile.manifest = item
        else:
            profile.rank_files.append(item)
    for profile in found.values():
        profile.rank_files.sort(key=lambda o: o.relative)
        if profile.manifest is None and profile.problem is None:
            profile.problem = "no manifest: the upload is incomplete or still running"
    return [found[k] for k in sorted(found)]


def check_against_manifest(profile: S3Profile, manifest: ProfileManifest) -> str | None:
    """Why the listed rank files do not match what the manifest records, or None."""
    upload = manifest.extra.get("s3") or {}
    recorded = upload.get("files") or {} if isinstance(upload, dict) else None
    if not isinstance(recorded, dict) or not all(
        isinstance(size, int) and not isinstance(size, bool) for size in recorded.values()
    ):
        return f"{profile.location}/{MANIFEST_NAME}: extra.s3.files must map rank files to sizes"
    unsafe = [name for name in recorded if rank_file_path_problem(name)]
    if unsafe:
        return f"{profile.location}/{MANIFEST_NAME}: {rank_file_path_problem(unsafe[0])}"
    listed = {obj.relative: obj.size for obj in profile.rank_files}
    missing = sorted(set(recorded) - set(listed))
    if missing:
        return f"rank files named by the manifest are missing: {', '.join(missing[:5])}"
    wrong = sorted(name for name, size in recorded.items() if listed[name] != size)
    if wrong:
        return f"rank files differ in size from the manifest: {', '.join(wrong[:5])}"
    if not listed:
        return "no rank files"
    return None


class S3ProfileSource:
    """Profiles under one S3 prefix, with a local ETag-keyed cache."""

    def __init__(
        self,
        base: S3Location,
        *,
        client: Any | None = None,
        cache_dir: Path | None = None,
        page_size: int | None = None,
    ) -> None:
        self.base = base
        self._client = client
        self.cache_dir = cache_dir or default_cache_dir()
        self.page_size = page_size

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = s3_client()
        return self._client

    def _errors(self) -> tuple[type[BaseException], ...]:
        from botocore.exceptions import BotoCoreError, ClientError

        return (ClientError, BotoCoreError)

    def local_dir(self, location: S3Location) -> Path:
        return self.cache_path(location, "")

    def cache_path(self, location: S3Location, relative: str) -> Path:
        """Where `relative` (a path inside the profile at `location`) is cached. Raises
        S3ProfileError unless every component is a safe name and the result stays inside the
        cache directory: keys come from the bucket, and a bucket is not trusted."""
        # The listed prefix is the operator's choice (parse_s3_uri refuses "." and ".." in it);
        # what lies below it comes from the bucket and must be safe names throughout.
        base = self.base.prefix
        if location.prefix == base:
            chosen, below = base.split("/") if base else ["_bucket_root"], ""
        elif base and location.prefix.startswith(self.base.dir_prefix):
            chosen, below = base.split("/"), location.prefix[len(self.base.dir_prefix) :]
        else:
            chosen, below = [], location.prefix
        untrusted = [
            *(below.split("/") if below else []),
            *(relative.split("/") if relative else []),
        ]
        parts = [location.bucket, *chosen, *untrusted]
        bad = [p for p in [location.bucket, *untrusted] if not is_safe_segment(p)] + [
            p for p in chosen if p in ("", ".", "..") or "\0" in p
        ]
        if bad:
            raise S3ProfileError(
                f"{location}/{relative[:300]}: unsafe path component {bad[0][:80]!r}, not cached"
            )
        root = self.cache_dir.resolve()
        target = root.joinpath(*parts).resolve()
        if not target.is_relative_to(root):
            raise S3ProfileError(f"{location}/{relative[:300]}: leaves the cache, not cached")
        return target

    def listing(self) -> list[S3Profile]:
        """Every profile under the prefix, each complete one with its manifest read."""
        try:
            objects = list(list_objects(self.client, self.base, self.page_size))
        except self._errors() as exc:
            raise S3ProfileError(describe_error(exc, self.base, "listing")) from exc
        profiles = group_profiles(self.base, objects)
        for profile in profiles:
            if profile.manifest is None or profile.problem is not None:
                continue
            try:
                profile.manifest_data = self._manifest(profile)
            except (S3ProfileError, ManifestError, OSError) as exc:
                profile.problem = str(exc)  # this profile's error; the others still list
                continue
            profile.problem = check_against_manifest(profile, profile.manifest_data)
        return profiles

    def find(self, identifier: str) -> S3Profile | None:
        for profile in self.listing():
            if profile.identifier == identifier:
                return profile
        return None

    def _download(self, obj: S3Object, target: Path) -> None:
        """`target` holds obj's bytes, downloaded only when its ETag is not the cached one."""
        tag = target.with_name(target.name + ".etag")
        cached = target.is_file() and tag.is_file() and tag.read_text() == obj.etag
        if cached and target.stat().st_size == obj.size:
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.part")
        location = S3Location(self.base.bucket, obj.key)
        try:
            # The transfer manager splits large files into concurrent ranged GETs.
            self.client.download_file(self.base.bucket, obj.key, str(partial))
        except self._errors() as exc:
            partial.unlink(missing_ok=True)
            raise S3ProfileError(describe_error(exc, location, "downloading")) from exc
        if partial.stat().st_size != obj.size:
            partial.unlink(missing_ok=True)
            raise S3ProfileError(f"downloading {location}: size changed during download")
        os.replace(partial, target)
        tag.write_text(obj.etag)

    def _manifest(self, profile: S3Profile) -> ProfileManifest:
        assert profile.manifest is not None
        source = f"{profile.location}/{MANIFEST_NAME}"
        if profile.manifest.size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{source}: larger than {MAX_MANIFEST_BYTES} bytes, not read")
        target = self.cache_path(profile.location, MANIFEST_NAME)
        self._download(profile.manifest, target)
        try:
            data = json.loads(target.read_text(encoding="utf-8"))
        except (ValueError, RecursionError) as exc:
            raise ManifestError(f"{source}: malformed: {exc!s:.200}") from exc
        return manifest_from_json(data, source)

    def fetch(self, profile: S3Profile) -> Path:
        """A local directory holding the complete profile (downloads what the cache lacks)."""
        if not profile.complete:
            raise S3ProfileError(f"{profile.location}: not loadable: {profile.problem}")
        for obj in profile.rank_files:
            self._download(obj, self.cache_path(profile.location, obj.relative))
        if profile.manifest is not None:
            self._download(profile.manifest, self.cache_path(profile.location, MANIFEST_NAME))
        return self.local_dir(profile.location)


def fetch_uri(location: S3Location, *, client: Any | None = None) -> Path:
    """The profile at exactly `location` (its root), downloaded into the cache."""
    source = S3ProfileSource(location, client=client)
    profile = source.find(".")
    if profile is None:
        raise S3ProfileError(f"{location}: no profile there (no profile.json or rank files)")
    return source.fetch(profile)
