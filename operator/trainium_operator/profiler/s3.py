"""Profiles in S3: the key layout, the boto3 client and the upload (manifest last).

    s3://<bucket>/<prefix>/<namespace>/<job>/<attempt>/profile.json
    s3://<bucket>/<prefix>/<namespace>/<job>/<attempt>/<node>/rank-<RANK>.trnprof

This module is part of the profiler package so that it runs without the operator's other
layers (the upload pod runs it from the operator's image); boto3 is imported only when a client is
made. Every client comes from one boto3 session per process: credentials from the default chain
(IRSA or EKS Pod Identity on EKS, never static keys in pods; refreshed by the session), the region
and `AWS_ENDPOINT_URL` from the standard configuration, plus a retry policy with backoff. The
session parses S3's service model once: a new session per client would parse it again (about
60 ms of CPU a client).

The upload writes every rank file (multipart above 8 MiB through boto3's transfer manager),
checks each object's size with a listing, and only then writes `profile.json`: the manifest is
the commit marker, so a reader that finds it finds every rank file complete. An interrupted
upload leaves no manifest (an earlier one of the same attempt is deleted first).
"""

from __future__ import annotations

import enum
import functools
import json
import os
import re
import stat
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainium_operator.profiler.format import (
    RANK_FILE_SUFFIX,
    ProfileFormatError,
    RankFileReader,
)
from trainium_operator.profiler.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    ManifestError,
    ManifestRank,
    ProfileManifest,
    is_safe_segment,
    manifest_from_json,
    now_iso,
)

S3_SCHEME = "s3://"
MIB = 1024 * 1024
# boto3's defaults, stated so the behaviour is explicit: multipart from 8 MiB in 8 MiB parts.
MULTIPART_THRESHOLD = 8 * MIB
MULTIPART_CHUNKSIZE = 8 * MIB
MAX_RETRY_ATTEMPTS = 8  # botocore "standard" mode: exponential backoff with jitter


class ExitCode(enum.IntEnum):
    """The upload pod's outcome, as its exit code: the operator classifies the pod by this
    number alone (lifecycle.policies.profile_upload), never by its log."""

    UPLOADED = 0
    FAILED = 1  # any other S3 or local error (the log says which)
    USAGE = 2
    NO_PROFILE = 3  # no rank files: an attempt that never trained
    REFUSED = 4  # a symlink, or a file that is not regular, where the profile's files are
    ACCESS_DENIED = 5
    BUCKET_MISSING = 6
    NO_CREDENTIALS = 7
    UNREACHABLE = 8


class S3ProfileError(RuntimeError):
    """An S3 operation on a profile failed; the message names the location and the cause."""

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class NoProfileError(S3ProfileError):
    """The directory holds no rank files: nothing to upload (an attempt that never trained)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.NO_PROFILE)


class RefusedFileError(S3ProfileError):
    """A symlink, or a file that is not regular, where a profile's file would be: the profile
    is not uploaded (nothing is read through it)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.REFUSED)


NO_PROFILE_EXIT_CODE = ExitCode.NO_PROFILE  # what the upload pod exits with then
_RANK_FILE = re.compile(r"^rank-(\d+)" + re.escape(RANK_FILE_SUFFIX) + "$")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
# O_NONBLOCK: a FIFO planted where a file should be never blocks the open.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
# spec.nodes (<= 512) x processes per node (<= 128): a profile has at most this many ranks.
MAX_RANK_FILES = 512 * 128
MAX_SCANNED_ENTRIES = 4 * MAX_RANK_FILES


@dataclass(frozen=True)
class S3Location:
    """A bucket and a key prefix without leading or trailing slashes ("" = whole bucket)."""

    bucket: str
    prefix: str = ""

    def __str__(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def child(self, *parts: str) -> S3Location:
        extra = "/".join(p.strip("/") for p in parts if p.strip("/"))
        prefix = f"{self.prefix}/{extra}" if self.prefix and extra else (self.prefix or extra)
        return S3Location(self.bucket, prefix)

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    @property
    def dir_prefix(self) -> str:
        """The prefix as used in listings: with a trailing slash unless it is the bucket."""
        return f"{self.prefix}/" if self.prefix else ""


def is_s3_uri(text: str | Path) -> bool:
    return isinstance(text, str) and text.startswith(S3_SCHEME)


def parse_s3_uri(uri: str) -> S3Location:
    """`s3://bucket/some/prefix/` -> S3Location("bucket", "some/prefix")."""
    if not uri.startswith(S3_SCHEME):
        raise ValueError(f"{uri!r} is not an s3:// URI")
    bucket, _, prefix = uri[len(S3_SCHEME) :].partition("/")
    if not bucket or "*" in bucket:
        raise ValueError(f"{uri!r} names no bucket (s3://<bucket>/<prefix>)")
    cleaned = "/".join(part for part in prefix.split("/") if part)
    if any(part in (".", "..") for part in cleaned.split("/")):
        raise ValueError(f"{uri!r}: '.' and '..' are not allowed in the prefix")
    return S3Location(bucket, cleaned)


def s3_client(max_attempts: int = MAX_RETRY_ATTEMPTS) -> Any:
    """An S3 client from the process's session: default credential chain, standard config
    (AWS_ENDPOINT_URL, AWS_REGION, ...), retries with exponential backoff."""
    try:
        from botocore.config import Config

        # A session is not thread-safe; the clients it makes are.
        with _session_lock:
            return _session().client(
                "s3", config=Config(retries={"mode": "standard", "max_attempts": max_attempts})
            )
    except ImportError as exc:  # pragma: no cover - the images and dev installs carry boto3
        raise S3ProfileError(
            "boto3 is not installed (pip install 'trainium-operator[s3]')"
        ) from exc


_session_lock = threading.Lock()


@functools.cache
def _session() -> Any:
    import boto3

    return boto3.session.Session()


def transfer_config() -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        multipart_threshold=MULTIPART_THRESHOLD,
        multipart_chunksize=MULTIPART_CHUNKSIZE,
        use_threads=True,
    )


_DENIED_CODES = ("AccessDenied", "403", "Forbidden", "AllAccessDisabled", "InvalidAccessKeyId")
_NO_CREDENTIALS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError")
_UNREACHABLE = ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError")


def _error_code(error: BaseException) -> str:
    """The S3 error code of a botocore error, or ""."""
    response = getattr(error, "response", None)
    if isinstance(response, Mapping):
        code = str((response.get("Error") or {}).get("Code", ""))
        if code:
            return code
    # The transfer manager wraps the ClientError in S3UploadFailedError, keeping its text.
    wrapped = re.search(r"An error occurred \((\w+)\)", str(error))
    return wrapped.group(1) if wrapped else ""


def describe_error(error: BaseException, location: S3Location, action: str) -> str:
    """One clear sentence for the S3 errors people meet: missing bucket, denied, no creds."""
    code, name = _error_code(error), type(error).__name__
    if code == "NoSuchBucket":
        return f"{action} {location}: bucket {location.bucket!r} does not exist"
    if code in _DENIED_CODES:
        return (
            f"{action} {location}: access denied ({code}); the role of the pod or user needs "
            "s3:PutObject, s3:GetObject, s3:DeleteObject and s3:ListBucket on this prefix"
        )
    if name in _NO_CREDENTIALS:
        return (
            f"{action} {location}: no AWS credentials in the default chain (on EKS: IRSA or "
            "EKS Pod Identity on the pod's ServiceAccount)"
        )
    if name in _UNREACHABLE:
        return f"{action} {location}: S3 endpoint unreachable: {error}"
    return f"{action} {location}: {name}: {error}"


def exit_code_of(error: BaseException) -> ExitCode:
    """The class of an S3 error, as describe_error tells it."""
    code, name = _error_code(error), type(error).__name__
    if code == "NoSuchBucket":
        return ExitCode.BUCKET_MISSING
    if code in _DENIED_CODES:
        return ExitCode.ACCESS_DENIED
    if name in _NO_CREDENTIALS:
        return ExitCode.NO_CREDENTIALS
    if name in _UNREACHABLE:
        return ExitCode.UNREACHABLE
    return ExitCode.FAILED


def _client_errors() -> tuple[type[BaseException], ...]:
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    return (ClientError, BotoCoreError, S3UploadFailedError)


@dataclass(frozen=True)
class UploadedFile:
    key: str
    size: int


@dataclass(frozen=True)
class UploadResult:
    location: S3Location
    files: tuple[UploadedFile, ...]
    manifest_key: str

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def uri(self) -> str:
        return str(self.location)


def list_objects(client: Any, location: S3Location, page_size: int | None = None) -> Iterator[Any]:
    """Every object under the location's directory prefix, page by page."""
    paginator = client.get_paginator("list_objects_v2")
    pagination = {"PageSize": page_size} if page_size else {}
    for page in paginator.paginate(
        Bucket=location.bucket, Prefix=location.dir_prefix, PaginationConfig=pagination
    ):
        yield from page.get("Contents", ())


@dataclass(frozen=True)
class _RankEntry:
    rank: int
    node: str
    name: str

    @property
    def relative(self) -> str:
        return f"{self.node}/{self.name}"


def _open_dir(name: str, dir_fd: int) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise RefusedFileError(f"{name}: not a directory of the profile ({exc.strerror})") from exc


def _open_regular(name: str, dir_fd: int) -> tuple[int, os.stat_result]:
    """`name` in `dir_fd`, opened without following a symlink, if it is a regular file."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise RefusedFileError(
            f"{name}: refused ({exc.strerror}; symlinks are not followed)"
        ) from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise RefusedFileError(f"{name}: not a regular file")
    return fd, info


def _scan(root_fd: int) -> list[_RankEntry]:
    """Every `<node>/rank-<RANK>.trnprof` below `root_fd`, without following a symlink: a
    symlink where a node directory, a rank file or the manifest would be refuses the whole
    profile (it could name any file the upload pod can read, such as its web-identity token)."""
    found: list[_RankEntry] = []
    seen = 0
    with os.scandir(root_fd) as top:
        for entry in top:
            seen += 1
            if entry.is_symlink():
                raise RefusedFileError(f"{entry.name}: a symlink in the profile directory")
            if not entry.is_dir(follow_symlinks=False) or not is_safe_segment(entry.name):
                continue
            node_fd = _open_dir(entry.name, root_fd)
            try:
                with os.scandir(node_fd) as inner:
                    for item in inner:
                        seen += 1
                        if seen > MAX_SCANNED_ENTRIES:
                            raise RefusedFileError(
                                f"more than {MAX_SCANNED_ENTRIES} entries in the profile directory"
                            )
                        match = _RANK_FILE.match(item.name)
                        if match is None:
                            continue
                        if not item.is_file(follow_symlinks=False):
                            raise RefusedFileError(f"{entry.name}/{item.name}: not a regular file")
                        found.append(_RankEntry(int(match.group(1)), entry.name, item.name))
            finally:
                os.close(node_fd)
            if len(found) > MAX_RANK_FILES:
                raise RefusedFileError(f"more than {MAX_RANK_FILES} rank files")
    found.sort(key=lambda ref: (ref.rank, ref.node))
    return found


def _base_manifest(root_fd: int, root: Path) -> ProfileManifest | None:
    """profile.json of the directory if it is a regular file that parses; a symlink refuses."""
    if not _exists_at(MANIFEST_NAME, root_fd):
        return None  # rank 0 may have crashed before writing it: the rank files decide
    fd, info = _open_regular(MANIFEST_NAME, root_fd)
    with os.fdopen(fd, "rb") as file:
        if info.st_size > MAX_MANIFEST_BYTES:
            return None
        try:
            return manifest_from_json(json.loads(file.read()), str(root / MANIFEST_NAME))
        except (ManifestError, ValueError, RecursionError):
            return None


def _exists_at(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def upload_profile(
    directory: str | Path,
    destination: S3Location,
    *,
    client: Any | None = None,
    config: Any | None = None,
) -> UploadResult:
    """Uploads the profile in `directory` to `destination` (rank files, size check, manifest
    last). Raises S3ProfileError with a clear message (RefusedFileError for a symlink or a
    file that is not regular); never leaves a manifest behind unless every rank file is there
    with its full size. Every file is opened relative to the directory without following a
    symlink, so nothing outside it is read even while its writer keeps changing it."""
    root = Path(directory)
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except OSError as exc:
        raise NoProfileError(f"{root}: no profile directory ({exc.strerror})") from exc
    try:
        return _upload_from(root, root_fd, destination, client=client, config=config)
    finally:
        os.close(root_fd)


def _upload_from(
    root: Path,
    root_fd: int,
    destination: S3Location,
    *,
    client: Any | None,
    config: Any | None,
) -> UploadResult:
    refs = _scan(root_fd)
    if not refs:
        raise NoProfileError(f"{root}: no rank files (<node>/rank-<RANK>.trnprof) to upload")
    base = _base_manifest(root_fd, root)
    client = client or s3_client()
    config = config or transfer_config()
    errors = _client_errors()
    manifest_key = destination.key(MANIFEST_NAME)
    expected: dict[str, int] = {}
    ranks: list[ManifestRank] = []
    try:
        # A retried upload of the same attempt: take the old commit marker away first.
        client.delete_object(Bucket=destination.bucket, Key=manifest_key)
        for ref in refs:
            key = destination.key(ref.relative)
            node_fd = _open_dir(ref.node, root_fd)
            try:
                fd, info = _open_regular(ref.name, node_fd)
            finally:
                os.close(node_fd)
            with os.fdopen(fd, "rb") as file:
                expected[key] = info.st_size
                ranks.append(
                    ManifestRank(
                        ref.rank, ref.node, _local_rank(root / ref.relative, fd), ref.relative
                    )
                )
                file.seek(0)
                client.upload_fileobj(file, destination.bucket, key, Config=config)
        stored = {obj["Key"]: int(obj["Size"]) for obj in list_objects(client, destination)}
    except errors as exc:
        raise S3ProfileError(
            describe_error(exc, destination, "uploading to"), exit_code_of(exc)
        ) from exc
    wrong = {
        key: (size, stored.get(key)) for key, size in expected.items() if stored.get(key) != size
    }
    if wrong:
        detail = ", ".join(f"{k}: {s} B local, {g} in S3" for k, (s, g) in sorted(wrong.items()))
        raise S3ProfileError(
            f"uploading to {destination}: sizes do not match after upload: {detail}"
        )
    manifest = replace(
        base or ProfileManifest(created=now_iso()),
        nodes=tuple(sorted({r.node for r in ranks})),
        ranks=tuple(ranks),
    )
    sizes = {r.file: expected[destination.key(r.file)] for r in manifest.ranks}
    manifest = replace(
        manifest, extra={**manifest.extra, "s3": {"uploaded": now_iso(), "files": sizes}}
    )
    body = (json.dumps(manifest.to_json(), indent=2) + "\n").encode()
    try:
        client.put_object(
            Bucket=destination.bucket,
            Key=manifest_key,
            Body=body,
            ContentType="application/json",
        )
    except errors as exc:
        raise S3ProfileError(
            describe_error(exc, destination, "writing the manifest to"), exit_code_of(exc)
        ) from exc
    return UploadResult(
        destination,
        tuple(UploadedFile(key, size) for key, size in sorted(expected.items())),
        manifest_key,
    )


def _local_rank(path: Path, fd: int) -> int:
    """The rank file's local rank from its header (0 for a damaged one: a reader reports the
    damage when it opens the file), read through a duplicate of the already open `fd`."""
    try:
        with RankFileReader(path, os.fdopen(os.dup(fd), "rb")) as reader:
            return reader.header.local_rank
    except (OSError, ProfileFormatError):
        return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m trainium_operator.profiler.s3 DIR s3://bucket/prefix`: what the upload pod runs.

    The exit code is the outcome (ExitCode), the one thing the operator reads of the pod; the
    last line on stderr says it in one sentence for `kubectl logs`."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(
            "usage: python -m trainium_operator.profiler.s3 DIR s3://bucket/prefix", file=sys.stderr
        )
        return ExitCode.USAGE
    directory, uri = args
    try:
        destination = parse_s3_uri(uri)
    except ValueError as exc:
        print(f"profile upload failed: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        result = upload_profile(directory, destination)
    except NoProfileError as exc:
        print(f"profile upload skipped: {exc}", file=sys.stderr)
        return exc.exit_code
    except S3ProfileError as exc:
        print(f"profile upload failed: {exc}", file=sys.stderr)
        return exc.exit_code
    print(
        f"uploaded {len(result.files)} rank files ({result.bytes:,} bytes) and the manifest "
        f"to {result.uri}",
        file=sys.stderr,
    )
    return ExitCode.UPLOADED


if __name__ == "__main__":  # pragma: no cover - exercised through subprocess in the tests
    raise SystemExit(main())
