"""Profiles in S3: the key layout, the boto3 client and the upload (manifest last).

    s3://<bucket>/<prefix>/<namespace>/<job>/<attempt>/profile.json
    s3://<bucket>/<prefix>/<namespace>/<job>/<attempt>/<node>/rank-<RANK>.trnprof

This module is part of the profiler package so that the training image (which runs the upload
pod) carries it without the operator's other layers; boto3 is imported only when a client is
made. Every client comes from boto3's default session: credentials from the default chain
(IRSA or EKS Pod Identity on EKS, never static keys in pods), the region and `AWS_ENDPOINT_URL`
from the standard configuration, plus a retry policy with backoff.

The upload writes every rank file (multipart above 8 MiB through boto3's transfer manager),
checks each object's size with a listing, and only then writes `profile.json`: the manifest is
the commit marker, so a reader that finds it finds every rank file complete. An interrupted
upload leaves no manifest (an earlier one of the same attempt is deleted first).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainium_operator.profiler.manifest import (
    MANIFEST_NAME,
    ManifestError,
    ProfileManifest,
    discover_rank_files,
    load_manifest,
    manifest_from_rank_files,
    now_iso,
)

S3_SCHEME = "s3://"
MIB = 1024 * 1024
# boto3's defaults, stated so the behaviour is explicit: multipart from 8 MiB in 8 MiB parts.
MULTIPART_THRESHOLD = 8 * MIB
MULTIPART_CHUNKSIZE = 8 * MIB
MAX_RETRY_ATTEMPTS = 8  # botocore "standard" mode: exponential backoff with jitter


class S3ProfileError(RuntimeError):
    """An S3 operation on a profile failed; the message names the location and the cause."""


class NoProfileError(S3ProfileError):
    """The directory holds no rank files: nothing to upload (an attempt that never trained)."""


NO_PROFILE_EXIT_CODE = 3  # what the upload pod exits with then (lifecycle.profile_upload)


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
    """An S3 client from the default session: default credential chain, standard config
    (AWS_ENDPOINT_URL, AWS_REGION, ...), retries with exponential backoff."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:  # pragma: no cover - the images and dev installs carry boto3
        raise S3ProfileError(
            "boto3 is not installed (pip install 'trainium-operator[s3]')"
        ) from exc
    config = Config(retries={"mode": "standard", "max_attempts": max_attempts})
    return boto3.session.Session().client("s3", config=config)


def transfer_config() -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        multipart_threshold=MULTIPART_THRESHOLD,
        multipart_chunksize=MULTIPART_CHUNKSIZE,
        use_threads=True,
    )


def describe_error(error: BaseException, location: S3Location, action: str) -> str:
    """One clear sentence for the S3 errors people meet: missing bucket, denied, no creds."""
    code = ""
    response = getattr(error, "response", None)
    if isinstance(response, Mapping):
        code = str((response.get("Error") or {}).get("Code", ""))
    if not code:
        # The transfer manager wraps the ClientError in S3UploadFailedError, keeping its text.
        wrapped = re.search(r"An error occurred \((\w+)\)", str(error))
        code = wrapped.group(1) if wrapped else ""
    name = type(error).__name__
    if code == "NoSuchBucket":
        return f"{action} {location}: bucket {location.bucket!r} does not exist"
    if code in ("AccessDenied", "403", "Forbidden", "AllAccessDisabled", "InvalidAccessKeyId"):
        return (
            f"{action} {location}: access denied ({code}); the role of the pod or user needs "
            "s3:PutObject, s3:GetObject, s3:DeleteObject and s3:ListBucket on this prefix"
        )
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        return (
            f"{action} {location}: no AWS credentials in the default chain (on EKS: IRSA or "
            "EKS Pod Identity on the pod's ServiceAccount)"
        )
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError"):
        return f"{action} {location}: S3 endpoint unreachable: {error}"
    return f"{action} {location}: {name}: {error}"


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


def _profile_manifest(directory: Path) -> ProfileManifest:
    try:
        base = load_manifest(directory)
    except ManifestError:
        base = None  # rank 0 may have crashed before writing it: the rank files decide
    return manifest_from_rank_files(directory, base)


def upload_profile(
    directory: str | Path,
    destination: S3Location,
    *,
    client: Any | None = None,
    config: Any | None = None,
) -> UploadResult:
    """Uploads the profile in `directory` to `destination` (rank files, size check, manifest
    last). Raises S3ProfileError with a clear message; never leaves a manifest behind unless
    every rank file is there with its full size."""
    root = Path(directory)
    refs = discover_rank_files(root)
    if not refs:
        raise NoProfileError(f"{root}: no rank files (<node>/rank-<RANK>.trnprof) to upload")
    client = client or s3_client()
    config = config or transfer_config()
    errors = _client_errors()
    manifest_key = destination.key(MANIFEST_NAME)
    expected: dict[str, int] = {}
    try:
        # A retried upload of the same attempt: take the old commit marker away first.
        client.delete_object(Bucket=destination.bucket, Key=manifest_key)
        for ref in refs:
            relative = ref.path.relative_to(root).as_posix()
            key = destination.key(relative)
            expected[key] = ref.path.stat().st_size
            client.upload_file(str(ref.path), destination.bucket, key, Config=config)
        stored = {obj["Key"]: int(obj["Size"]) for obj in list_objects(client, destination)}
    except errors as exc:
        raise S3ProfileError(describe_error(exc, destination, "uploading to")) from exc
    wrong = {
        key: (size, stored.get(key)) for key, size in expected.items() if stored.get(key) != size
    }
    if wrong:
        detail = ", ".join(f"{k}: {s} B local, {g} in S3" for k, (s, g) in sorted(wrong.items()))
        raise S3ProfileError(
            f"uploading to {destination}: sizes do not match after upload: {detail}"
        )
    manifest = _profile_manifest(root)
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
        raise S3ProfileError(describe_error(exc, destination, "writing the manifest to")) from exc
    return UploadResult(
        destination,
        tuple(UploadedFile(key, size) for key, size in sorted(expected.items())),
        manifest_key,
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m trainium_operator.profiler.s3 DIR s3://bucket/prefix`: what the upload pod runs.

    The last line on stderr is the one-sentence outcome; the pod's terminationMessagePolicy
    FallbackToLogsOnError makes it the termination message the operator reports."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(
            "usage: python -m trainium_operator.profiler.s3 DIR s3://bucket/prefix", file=sys.stderr
        )
        return 2
    directory, uri = args
    try:
        destination = parse_s3_uri(uri)
        result = upload_profile(directory, destination)
    except NoProfileError as exc:
        print(f"profile upload skipped: {exc}", file=sys.stderr)
        return NO_PROFILE_EXIT_CODE
    except (S3ProfileError, ValueError) as exc:
        print(f"profile upload failed: {exc}", file=sys.stderr)
        return 1
    print(
        f"uploaded {len(result.files)} rank files ({result.bytes:,} bytes) and the manifest "
        f"to {result.uri}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through subprocess in the tests
    raise SystemExit(main())
