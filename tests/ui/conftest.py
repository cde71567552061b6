"""Fixtures shared by the UI tests: a generated multi-node profile tree and a live server."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from trainium_operator.analysis.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.ui.app import create_app
from trainium_operator.ui.profiles import JobInfo

PROFILE_ID = "ml/llama-pretrain/0"
UI_SPEC = SyntheticSpec(nodes=2, ranks_per_node=8, kernels_per_step=96)


@pytest.fixture(scope="session")
def profile_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("profiles")
    write_synthetic_profile(root / PROFILE_ID, UI_SPEC)
    return root


async def fake_jobs() -> list[JobInfo]:
    return [
        JobInfo("llama-pretrain", "ml", "2026-01-01T00:00:00Z", "Running", PROFILE_ID),
        JobInfo("bert-finetune", "ml", "2026-01-02T00:00:00Z", "Pending", None),
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def live_server(profile_root: Path) -> Iterator[str]:
    """The real aiohttp app on a loopback port, in a background thread."""
    port = _free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(create_app(profile_root, job_lister=fake_jobs, workers=1))
    started = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(30), "UI server did not start"
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)
