"""Which client errors prove a write never reached the API server (k8s.client)."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import (
    ConnectTimeoutError,
    MaxRetryError,
    NameResolutionError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)

from trainium_operator.k8s.client import never_reached_server

URL = "/api/v1/namespaces/team-a/pods"


def retried(reason: Exception) -> MaxRetryError:
    return MaxRetryError(None, URL, reason)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "error",
    [
        retried(NewConnectionError(None, "Connection refused")),  # type: ignore[arg-type]
        retried(NameResolutionError("api.example", None, OSError("no such host"))),  # type: ignore[arg-type]
        retried(ConnectTimeoutError("connect timed out")),
        NewConnectionError(None, "Connection refused"),  # type: ignore[arg-type]
    ],
    ids=["refused", "unresolved", "connect-timeout", "refused-unretried"],
)
def test_a_connection_never_made_means_the_request_never_reached_the_server(
    error: Exception,
) -> None:
    assert never_reached_server(error)


@pytest.mark.parametrize(
    "error",
    [
        # Sent, then the connection dropped or the answer never came: the write may have happened.
        ProtocolError("Connection aborted.", ConnectionResetError()),
        retried(ProtocolError("Connection aborted.", ConnectionResetError())),
        ReadTimeoutError(None, URL, "read timed out"),  # type: ignore[arg-type]
        ApiException(status=500, reason="Internal Server Error"),
        ApiException(status=504, reason="Gateway Timeout"),
        MaxRetryError(None, URL, None),  # type: ignore[arg-type]
    ],
    ids=["aborted", "aborted-retried", "read-timeout", "500", "504", "no-reason"],
)
def test_an_error_after_the_request_was_sent_may_have_written_and_is_not_unsent(
    error: Exception,
) -> None:
    assert not never_reached_server(error)
