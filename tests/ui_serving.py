"""The real aiohttp UI app on a loopback port in a background thread, for tests."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from trainium_operator.ui.guards import CSRF_HEADER


@contextmanager
def serving(app: web.Application) -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    started = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(30)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def get_json(url: str) -> Any:
    """GET a JSON answer that must be 200."""
    with urllib.request.urlopen(url, timeout=60) as response:
        assert response.status == 200
        return json.loads(response.read())


def post_json(url: str) -> Any:
    """POST as the UI's own page does (with the CSRF header); the JSON answer."""
    request = urllib.request.Request(url, method="POST", headers={CSRF_HEADER: "1"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())
