"""Child creates and pod deletes leave the API server's answer raw (no client models: a gang's
hundreds of answers cost CPU on every start and restart) and still read it to its end, so one
connection serves the next request. Against a local HTTP server that counts connections."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from trainium_operator.k8s.client import Cluster

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "bert-train-0-0", "namespace": "team-a", "uid": "u1"},
    "spec": {"containers": [{"name": "trainer", "image": "example.com/train:1"}]},
    "status": {"phase": "Pending"},
}


class _Server(ThreadingHTTPServer):
    connections = 0
    created: set[str]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the API server
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def _answer(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        sent = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        name = sent["metadata"]["name"]
        if name in self.server.created:
            self._answer(409, {"kind": "Status", "code": 409, "reason": "AlreadyExists"})
            return
        self.server.created.add(name)
        self._answer(201, POD)

    def do_DELETE(self) -> None:
        self._answer(200, {**POD, "metadata": {**POD["metadata"], "deletionTimestamp": "x"}})

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.created = set()
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_creates_and_pod_deletes_skip_client_models_and_reuse_one_connection(
    server: _Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    configuration.retries = False
    api_client = client.ApiClient(configuration)

    def no_models(*_: Any, **__: Any) -> Any:
        raise AssertionError("an answer nobody reads was turned into client models")

    monkeypatch.setattr(api_client, "deserialize", no_models)
    cluster = Cluster(api_client)
    assert cluster.create(POD) is True
    assert cluster.create(POD) is False, "409: ours from an earlier pass"
    cluster.delete_pod("team-a", "bert-train-0-0", force=True)
    assert server.connections == 1, "an answer left unread keeps its connection from the pool"
    assert cluster.counter.counts == {"create pods": 2, "delete pods": 1}
