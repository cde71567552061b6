"""Fixtures shared by the unit tests of the health channel's reporter."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from trainium_operator.contract import channel as contract

# What a stub endpoint received: each POST's Authorization header and JSON body, in order.
Posts = list[tuple[str, dict[str, Any]]]


class _Endpoint(http.server.BaseHTTPRequestHandler):
    received: Posts

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.headers["Authorization"], json.loads(body)))
        reply = contract.reply_json(accepted=True)
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[tuple[str, Posts]]:
    """A local HTTP endpoint that accepts every progress POST: its URL and what it received."""
    received: Posts = []
    handler = type("Handler", (_Endpoint,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}{contract.PATH}", received
    server.shutdown()
