"""A real S3 API on localhost for the tests: moto in server mode (HTTP, multipart, ranged GETs,
list_objects_v2 pagination), started once per session on a free port.

`s3` (function scope) puts AWS_ENDPOINT_URL and dummy credentials into the environment of
that test only (monkeypatch) and gives it a fresh bucket, so the code under test makes its
clients exactly as it does in production: boto3's default session and standard configuration.
`s3_denying_endpoint` is a second moto server, in its own process, with request
authentication on (INITIAL_NO_AUTH_ACTION_COUNT=0): every request from unknown credentials is
refused with 403, as S3 refuses a role without the permission.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from support.local_server import free_port, wait_answering
from trainium_operator.profiler.s3 import s3_client

REGION = "us-east-1"
_bucket_numbers = itertools.count()


def aws_env(endpoint: str) -> dict[str, str]:
    """The standard AWS settings pointing boto3 at `endpoint` with dummy credentials."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        # Non-AWS endpoints: no default CRC checksums on every request (moto's advice).
        "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
        "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


# Variables of the developer's own AWS setup that must not leak into a test.
_CLEARED = (
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_ENDPOINT_URL_S3",
)


@dataclass(frozen=True)
class S3Server:
    endpoint: str


@dataclass(frozen=True)
class S3Bucket:
    endpoint: str
    bucket: str
    env: dict[str, str]

    def client(self) -> Any:
        return s3_client()

    def uri(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}".rstrip("/")

    def keys(self, prefix: str = "") -> dict[str, int]:
        paginator = self.client().get_paginator("list_objects_v2")
        return {
            obj["Key"]: int(obj["Size"])
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix)
            for obj in page.get("Contents", ())
        }


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3Server(f"http://{host}:{port}")
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Bucket:
    env = aws_env(s3_server.endpoint)
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    bucket = f"profiles-{os.getpid()}-{next(_bucket_numbers)}"
    made = S3Bucket(s3_server.endpoint, bucket, env)
    made.client().create_bucket(Bucket=bucket)
    return made


@pytest.fixture(scope="session")
def s3_denying_endpoint() -> Iterator[str]:
    """A moto server that authenticates requests: dummy credentials get 403 AccessDenied."""
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_answering(f"{endpoint}/moto-api/", process, 30)
        yield endpoint
    finally:
        process.terminate()
        process.wait(10)
