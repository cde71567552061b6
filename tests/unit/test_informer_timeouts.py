"""A watch source that goes silent (a half-open connection) ends in an error and a new LIST;
it never freezes the reflector. Against a TCP server that accepts and never answers."""

from __future__ import annotations

import socket
import threading
import time
from functools import partial

import pytest
from kubernetes import client

from trainium_operator.k8s import informer
from trainium_operator.k8s.client import KEEPALIVE_SOCKET_OPTIONS


def test_a_silent_api_server_makes_the_reflector_list_again_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(informer, "LIST_READ_TIMEOUT_SECONDS", 0.3)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            accepted.append(connection)  # held open, never answered

    threading.Thread(target=accept, daemon=True).start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.getsockname()[1]}"
    configuration.retries = False
    core = client.CoreV1Api(client.ApiClient(configuration))
    reflector = informer.Reflector("pods", partial(core.list_namespaced_pod, "ns"), lambda _: None)
    reflector.start()
    try:
        deadline = time.monotonic() + 10
        while len(accepted) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        # The first LIST timed out, and after its 1 s backoff the reflector listed again.
        assert len(accepted) >= 2, "the reflector hung on a LIST that never answered"
    finally:
        reflector.stop()
        server.close()
        for connection in accepted:
            connection.close()


def test_api_connections_use_tcp_keepalive() -> None:
    assert (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1) in KEEPALIVE_SOCKET_OPTIONS
