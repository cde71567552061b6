"""Fixtures shared by the UI tests: a generated multi-node profile tree and a live server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.ui.app import create_app
from trainium_operator.ui.profiles import JobInfo
from ui_serving import serving

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


@pytest.fixture(scope="session")
def live_server(profile_root: Path) -> Iterator[str]:
    """The real aiohttp app on a loopback port, in a background thread."""
    with serving(create_app(profile_root, job_lister=fake_jobs, workers=1)) as url:
        yield url
