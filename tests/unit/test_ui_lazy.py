"""The UI opens profiles from summaries it keeps itself and decodes only the ranks it shows,
within a memory budget; a hostile rank file is still refused with its reason."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.analysis.loading import load_profile
from trainium_operator.analysis.timeline import TimelineIndex
from trainium_operator.ui import profiles as ui_profiles
from trainium_operator.ui.app import STORE_KEY, create_app
from trainium_operator.ui.guards import CSRF_HEADER
from trainium_operator.ui.memory import MemoryLRU
from trainium_operator.ui.summary_cache import SummaryCache, UnsafeCacheDirError, checked_directory
from unit.test_ui_ahead import counting_summaries

SMALL = SyntheticSpec(nodes=2, ranks_per_node=2, steps=4, detailed_steps=(1, 2), kernels_per_step=8)
PROFILE = "team-a/job-a/0"
POST = {CSRF_HEADER: "1"}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    write_synthetic_profile(tmp_path / "profiles" / PROFILE, SMALL)
    return tmp_path / "profiles"


def run(app: web.Application, session: Any) -> None:
    async def go() -> None:
        async with TestClient(TestServer(app)) as client:
            await session(client, app)

    asyncio.run(go())


async def load(client: TestClient[Any, Any], expect: int = 200) -> Any:
    response = await client.post(f"/api/profiles/load?id={PROFILE}&wait=1", headers=POST)
    assert response.status == expect, await response.text()
    return await response.json() if expect == 200 else await response.text()


def test_a_restarted_ui_opens_a_profile_from_its_cache_and_resummarises_a_changed_rank(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summarised = counting_summaries(monkeypatch)
    cache = SummaryCache(checked_directory(tmp_path / "cache", root))

    async def open_dashboard(client: TestClient[Any, Any], app: web.Application) -> None:
        await load(client)
        assert (await client.get(f"/api/dashboard?id={PROFILE}")).status == 200

    run(create_app(root, workers=1, summary_cache=cache), open_dashboard)
    assert len(summarised) == 4  # every rank once
    run(create_app(root, workers=1, summary_cache=cache), open_dashboard)
    assert len(summarised) == 4  # a new server: the dashboard composed before, from the cache
    for composed in (tmp_path / "cache").glob("*.dashboard"):
        composed.unlink()
    run(create_app(root, workers=1, summary_cache=cache), open_dashboard)
    assert len(summarised) == 4  # composed again: every summary from the cache
    rank_file = sorted((root / PROFILE).glob("*/*.trnprof"))[0]
    data = rank_file.read_bytes()
    rank_file.write_bytes(data)  # same bytes, new mtime: another version of the file
    os.utime(rank_file, ns=(1, 1))
    run(create_app(root, workers=1, summary_cache=cache), open_dashboard)
    assert summarised[4:] == [rank_file.resolve()]


def test_the_cache_directory_must_be_the_ui_s_own(root: Path, tmp_path: Path) -> None:
    with pytest.raises(UnsafeCacheDirError, match="inside the served profiles"):
        checked_directory(root / "team-a" / "cache", root)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(UnsafeCacheDirError, match="writable by others"):
        checked_directory(shared, root)


def test_a_stored_summary_that_fails_its_checks_is_recomputed(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = SummaryCache(checked_directory(tmp_path / "cache", root))

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        await load(client)

    run(create_app(root, workers=1, summary_cache=cache), session)
    for stored in (tmp_path / "cache").glob("*.summary"):
        stored.write_bytes(stored.read_bytes()[:100])
    for composed in (tmp_path / "cache").glob("*.dashboard"):
        composed.unlink()  # so the profile is composed from its summaries again
    summarised = counting_summaries(monkeypatch)
    run(create_app(root, workers=1, summary_cache=cache), session)
    assert len(summarised) == 4


def test_the_timeline_decodes_only_the_ranks_it_shows_and_answers_as_the_whole_profile(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = load_profile(root / PROFILE, workers=1)
    index = TimelineIndex(whole)
    decoded: list[int] = []
    real = ui_profiles.rank_timeline
    monkeypatch.setattr(
        ui_profiles,
        "rank_timeline",
        lambda summary, *args: decoded.append(summary.rank) or real(summary, *args),
    )
    rank2 = [t.id for t in index.tracks if t.rank == 2 and t.kind != "counter"]

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        await load(client)
        query = f"start=0&end={whole.end_ns}&width=900&tracks={','.join(map(str, rank2))}"
        got = await (await client.get(f"/api/window?id={PROFILE}&{query}")).json()
        expected = index.window(0, whole.end_ns, 900, rank2)
        assert decoded == [2]
        names = (await (await client.get(f"/api/tracks?id={PROFILE}")).json())["names"]
        for mine, theirs in zip(got["tracks"], expected["tracks"], strict=True):
            assert mine["id"] == theirs["id"]
            assert mine["start"] == theirs["start"]
            assert mine["dur"] == theirs["dur"]
            assert [names[n] for n in mine["name"]] == [
                whole.columns.names[n] for n in theirs["name"]
            ]
        first = got["tracks"][0]["ids"][0]
        detail = await (await client.get(f"/api/event?id={PROFILE}&event={first}")).json()
        assert (detail["rank"], detail["id"], detail["track_id"]) == (2, first, rank2[0])

    run(create_app(root, workers=1), session)


def test_memory_lru_evicts_the_least_recently_used_within_its_budget() -> None:
    evicted: list[str] = []
    lru = MemoryLRU(100, lambda key, value: evicted.append(str(key)))
    lru.put("a", 1, 40)
    lru.put("b", 2, 40)
    assert lru.get("a") == 1  # a is now the most recently used
    lru.put("c", 3, 40)
    assert evicted == ["b"]
    assert lru.total == 80


def test_a_rank_larger_than_the_memory_budget_is_refused_before_it_is_decoded(root: Path) -> None:
    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        await load(client)
        response = await client.get(f"/api/window?id={PROFILE}&start=0&end=1&width=10&tracks=0")
        assert response.status == 507
        assert "memory budget" in await response.text()

    run(create_app(root, workers=1, memory_budget=4096), session)


def test_a_profile_evicted_from_memory_is_unloaded_and_loads_again(root: Path) -> None:
    other = "team-b/job-b/0"
    shutil.copytree(root / PROFILE, root / other)

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        await load(client)
        second = await client.post(f"/api/profiles/load?id={other}&wait=1", headers=POST)
        assert second.status == 200
        assert list(app[STORE_KEY].slots) == [other]  # the budget holds one profile
        assert (await load(client))["state"] == "loaded"

    run(create_app(root, workers=1, memory_budget=100_000), session)


def test_a_truncated_rank_file_is_refused_with_its_reason(root: Path) -> None:
    rank_file = sorted((root / PROFILE).glob("*/*.trnprof"))[0]
    rank_file.write_bytes(rank_file.read_bytes()[:20])

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        text = await load(client, expect=422)
        assert "ends inside its header" in text

    run(create_app(root, workers=1), session)
