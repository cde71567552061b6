"""A profile that a job's status shows written is summarised ahead without anyone listing it,
so that a link to it opens from the cache; within the summarise-ahead queue's bound, and an
open still refuses a damaged rank file with its reason."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.profiler.manifest import MANIFEST_NAME
from trainium_operator.ui.app import STORE_KEY, create_app
from trainium_operator.ui.guards import CSRF_HEADER
from trainium_operator.ui.jobs import job_info
from trainium_operator.ui.profiles import JobInfo, ProfileStore
from trainium_operator.ui.summary_cache import SummaryCache, checked_directory
from trainium_operator.ui.written import offer_written
from unit.test_ui_ahead import counting_summaries

SMALL = SyntheticSpec(nodes=1, ranks_per_node=2, steps=3, detailed_steps=(1, 1), kernels_per_step=4)
POST = {CSRF_HEADER: "1"}
FAST = 0.05  # seconds between two looks at the job list


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "profiles"


@pytest.fixture
def cache(root: Path, tmp_path: Path) -> SummaryCache:
    root.mkdir(exist_ok=True)
    return SummaryCache(checked_directory(tmp_path / "cache", root))


def written(root: Path, key: str) -> str:
    write_synthetic_profile(root / key, SMALL)
    return key


def job(name: str, profile: str | None, created: str = "2026-01-01T00:00:00Z") -> JobInfo:
    return JobInfo(name, "team-a", created, "Running", profile_path=profile)


def run(app: web.Application, session: Any) -> None:
    async def go() -> None:
        async with TestClient(TestServer(app)) as client:
            await session(client, app)

    asyncio.run(go())


async def settled_state(app: web.Application, key: str, timeout_s: float = 30) -> str | None:
    """The profile's summarise-ahead state once it is no longer queued or running."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = app[STORE_KEY].ahead.status(key) or {"state": None}
        settled = status["state"] not in (None, "queued", "summarising")
        if settled or time.monotonic() > deadline:
            return status["state"]
        await asyncio.sleep(0.02)


def test_a_profile_a_job_shows_written_is_summarised_ahead_and_its_link_opens_from_the_cache(
    root: Path, cache: SummaryCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = written(root, "team-a/job-a/0")
    summarised = counting_summaries(monkeypatch)

    async def jobs() -> list[JobInfo]:
        return [job("job-a", key)]

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        # No page listed anything: the job list alone named the profile.
        assert await settled_state(app, key) == "ready"
        assert len(summarised) == 2
        opened = await client.post(f"/api/profiles/open?id={key}", headers=POST)
        assert opened.status == 200  # the first open answers the dashboard at once
        assert (await opened.json())["overview"]["ranks"] == 2
        assert len(summarised) == 2  # read from the cache, nothing summarised again

    app = create_app(
        root, job_lister=jobs, summary_cache=cache, job_list_ttl=0, summarise_written_every=FAST
    )
    run(app, session)


def test_a_job_whose_profile_holds_no_rank_file_yet_is_not_queued_until_one_is_written(
    root: Path, cache: SummaryCache
) -> None:
    key = "team-a/job-a/0"
    (root / key).mkdir(parents=True)
    (root / key / MANIFEST_NAME).write_text('{"job_name": "job-a"}')

    async def jobs() -> list[JobInfo]:
        return [job("job-a", key)]

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        await asyncio.sleep(10 * FAST)
        assert app[STORE_KEY].ahead.status(key) is None  # the window is not written yet
        write_synthetic_profile(root / key, SMALL)
        assert await settled_state(app, key) == "ready"

    app = create_app(
        root, job_lister=jobs, summary_cache=cache, job_list_ttl=0, summarise_written_every=FAST
    )
    run(app, session)


def test_a_captured_on_demand_profile_is_named_and_one_still_capturing_is_not() -> None:
    def item(state: str) -> dict[str, Any]:
        return {
            "metadata": {"name": "job-a", "namespace": "team-a"},
            "status": {"onDemandProfile": {"path": "/data/p/on-demand/r1", "state": state}},
        }

    assert job_info(item("Captured")).on_demand_path == "/data/p/on-demand/r1"
    assert job_info(item("Capturing")).on_demand_path is None


def test_one_look_queues_no_more_profiles_than_the_queue_has_room_for(
    root: Path, cache: SummaryCache
) -> None:
    keys = [written(root, f"team-a/job-{i}/0") for i in range(4)]

    async def jobs() -> list[JobInfo]:
        return [job(f"job-{i}", key) for i, key in enumerate(keys)]

    async def scenario() -> None:
        store = ProfileStore(root, cache=cache, summarise_ahead=2)
        try:
            assert await offer_written(store, jobs) == 2
            queued = len(store.ahead.queued) + (store.ahead._current is not None)
            assert queued <= 2
            assert {store.ahead.status(key) is not None for key in keys} == {True, False}
        finally:
            await store.aclose()

    asyncio.run(scenario())


def test_with_summarise_written_every_0_no_job_s_profile_is_summarised_unlisted(
    root: Path, cache: SummaryCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = written(root, "team-a/job-a/0")
    summarised = counting_summaries(monkeypatch)

    async def jobs() -> list[JobInfo]:
        return [job("job-a", key)]

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        await asyncio.sleep(10 * FAST)
        assert app[STORE_KEY].ahead.status(key) is None
        assert summarised == []

    app = create_app(
        root, job_lister=jobs, summary_cache=cache, job_list_ttl=0, summarise_written_every=0
    )
    run(app, session)


def test_a_truncated_rank_file_of_a_written_profile_is_refused_with_its_reason_on_open(
    root: Path, cache: SummaryCache
) -> None:
    key = written(root, "team-a/job-a/0")
    rank_file = sorted((root / key).glob("*/*.trnprof"))[0]
    rank_file.write_bytes(rank_file.read_bytes()[:20])

    async def jobs() -> list[JobInfo]:
        return [job("job-a", key)]

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        assert await settled_state(app, key) == "error"  # summarising ahead refused it too
        opened = await client.post(f"/api/profiles/open?id={key}", headers=POST)
        while opened.status == 202:
            opened = await client.post(f"/api/profiles/open?id={key}", headers=POST)
        assert opened.status == 422
        assert "ends inside its header" in await opened.text()

    app = create_app(
        root, job_lister=jobs, summary_cache=cache, job_list_ttl=0, summarise_written_every=FAST
    )
    run(app, session)
