"""Profiles open from one request, and a profile the UI has listed is summarised in the
background, within bounds, so that its first open reads the cache; an open while it is being
summarised answers with its progress and never holds the server."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.analysis.loading import load_profile
from trainium_operator.analysis.report import annotation, dashboard
from trainium_operator.ui import profiles as ui_profiles
from trainium_operator.ui.app import STORE_KEY, create_app
from trainium_operator.ui.background import (
    RESUMMARISE_AFTER_S,
    BackgroundSummaries,
    Discovered,
    Progress,
    _Seen,
    due,
)
from trainium_operator.ui.guards import CSRF_HEADER
from trainium_operator.ui.profiles import JobInfo
from trainium_operator.ui.summary_cache import SummaryCache, checked_directory

SMALL = SyntheticSpec(nodes=2, ranks_per_node=2, steps=4, detailed_steps=(1, 2), kernels_per_step=8)
PROFILE = "team-a/job-a/0"
OTHER = "team-b/job-b/0"
POST = {CSRF_HEADER: "1"}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    write_synthetic_profile(tmp_path / "profiles" / PROFILE, SMALL)
    return tmp_path / "profiles"


@pytest.fixture
def cache(root: Path, tmp_path: Path) -> SummaryCache:
    return SummaryCache(checked_directory(tmp_path / "cache", root))


def run(app: web.Application, session: Any) -> None:
    async def go() -> None:
        async with TestClient(TestServer(app)) as client:
            await session(client, app)

    asyncio.run(go())


def counting_summaries(
    monkeypatch: pytest.MonkeyPatch, gate: threading.Event | None = None
) -> list[Path]:
    """Counts the rank files summarised; with `gate`, each waits for it to be set."""
    summarised: list[Path] = []
    real = ui_profiles.summarise_rank

    def counted(path: Path, points: Any) -> Any:
        if gate is not None:
            gate.wait(30)
        summarised.append(path)
        return real(path, points)

    monkeypatch.setattr(ui_profiles, "summarise_rank", counted)
    return summarised


async def summaries_state(client: TestClient[Any, Any], key: str, timeout_s: float = 30) -> str:
    """The profile's background summary state once it is no longer queued or running."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = (await (await client.get("/api/profiles")).json())["profiles"]
        state = next(row for row in rows if row["id"] == key)["summaries"]["state"]
        if state not in ("queued", "summarising") or time.monotonic() > deadline:
            return str(state)
        await asyncio.sleep(0.05)


def test_a_profile_is_due_when_new_changed_after_a_while_or_just_finished() -> None:
    seen = _Seen(fingerprint=(4, 100), finished=False, started=1000.0)

    assert due(None, Discovered("p", (4, 100)), 1000.0)
    assert not due(seen, Discovered("p", (4, 100)), 5000.0)  # unchanged
    assert not due(seen, Discovered("p"), 5000.0)  # the job list knows nothing new
    assert not due(seen, Discovered("p", (4, 200)), 1000.0 + RESUMMARISE_AFTER_S - 1)
    assert due(seen, Discovered("p", (4, 200)), 1000.0 + RESUMMARISE_AFTER_S)
    assert due(seen, Discovered("p", (4, 200), finished=True), 1001.0)


def test_the_background_queue_holds_at_most_its_bound_and_skips_opened_profiles() -> None:
    started: list[str] = []
    release = asyncio.Event()

    async def summarise(key: str, progress: Progress, stop: threading.Event) -> None:
        started.append(key)
        await release.wait()

    async def scenario() -> None:
        ahead = BackgroundSummaries(summarise, lambda key: key == "opened", max_queued=2)
        found = [Discovered(key, (1, 1)) for key in ("opened", "a", "b", "c", "d")]
        assert ahead.offer(found) == 2  # "opened" skipped; "c" and "d" wait for room
        while not started:
            await asyncio.sleep(0)
        assert started == ["a"]
        assert ahead.offer(found) == 1  # room for one again: "c" ("a" runs, "b" waits)
        assert list(ahead.queued) == ["b", "c"]
        assert ahead.status("a") == {"state": "summarising", **Progress().as_dict()}
        assert ahead.status("opened") is None
        release.set()
        while ahead.queued or ahead._current is not None:
            await asyncio.sleep(0.01)
        assert started == ["a", "b", "c"]
        assert ahead.status("c") == {"state": "ready"}
        await ahead.close()

    asyncio.run(scenario())


def test_a_listed_profile_is_summarised_ahead_so_its_first_open_reads_the_cache(
    root: Path, cache: SummaryCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    summarised = counting_summaries(monkeypatch)
    monkeypatch.setattr(ui_profiles, "PRECOMPOSE_AFTER_S", 600.0)

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        assert await summaries_state(client, PROFILE) == "ready"
        assert len(summarised) == 4  # every rank, in the background
        response = await client.post(f"/api/profiles/open?id={PROFILE}", headers=POST)
        assert response.status == 200
        assert len(summarised) == 4  # the open read the stored dashboard
        entry = app[STORE_KEY].loaded(PROFILE)
        assert entry.composed is None  # nothing of the summaries held for the dashboard
        expected = dashboard(load_profile(root / PROFILE, workers=1))
        got = await response.json()
        for section in ("kernels", "steps", "utilisation"):
            assert got[section] == json.loads(json.dumps(expected[section])), section

    run(create_app(root, workers=1, summary_cache=cache), session)


def test_a_profile_named_by_the_job_list_is_summarised_ahead(
    root: Path, cache: SummaryCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    summarised = counting_summaries(monkeypatch)

    async def jobs() -> list[JobInfo]:
        return [JobInfo("job-a", "team-a", "2026-01-01T00:00:00Z", "Running", PROFILE)]

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        assert (await client.get("/api/jobs")).status == 200
        store = app[STORE_KEY]
        deadline = time.monotonic() + 30
        while store.ahead.status(PROFILE) != {"state": "ready"}:
            assert time.monotonic() < deadline, store.ahead.status(PROFILE)
            await asyncio.sleep(0.05)
        assert len(summarised) == 4

    run(create_app(root, job_lister=jobs, workers=1, summary_cache=cache), session)


def test_an_open_while_its_profile_is_summarised_shows_progress_and_the_server_answers(
    root: Path, cache: SummaryCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    summarised = counting_summaries(monkeypatch, gate)
    monkeypatch.setattr("trainium_operator.ui.app.OPEN_WAIT_S", 0.2)

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        assert (await client.get("/api/profiles")).status == 200  # discovered: summarising
        began = time.monotonic()
        waiting = await client.post(f"/api/profiles/open?id={PROFILE}", headers=POST)
        assert waiting.status == 202
        body = await waiting.json()
        assert body["state"] == "loading"
        assert body["progress"]["total"] in (0, 4)  # the files are being listed or summarised
        assert (await client.get("/healthz")).status == 200
        assert time.monotonic() - began < 5  # answered while nothing was summarised
        gate.set()
        while True:
            answer = await client.post(f"/api/profiles/open?id={PROFILE}", headers=POST)
            if answer.status == 200:
                break
            assert answer.status == 202
        assert (await answer.json())["overview"]["ranks"] == 4
        assert len(summarised) == 4  # once, by the background: the open waited for it

    run(create_app(root, workers=1, summary_cache=cache), session)


def test_a_cold_open_answers_its_progress_then_its_dashboard(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    counting_summaries(monkeypatch, gate)
    monkeypatch.setattr("trainium_operator.ui.app.OPEN_WAIT_S", 0.2)

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        first = await client.post(f"/api/profiles/open?id={PROFILE}", headers=POST)
        assert first.status == 202
        progress = (await first.json())["progress"]
        assert progress["done"] <= progress["total"]
        assert app[STORE_KEY].ahead.status(PROFILE) is None  # an open, not background work
        gate.set()
        second = await client.post(f"/api/profiles/open?id={PROFILE}", headers=POST)
        while second.status == 202:
            second = await client.post(f"/api/profiles/open?id={PROFILE}", headers=POST)
        assert second.status == 200
        assert (await second.json())["overview"]["events"] > 0

    run(create_app(root, workers=1, summarise_ahead=0), session)


def test_a_cold_open_stores_its_summaries_after_it_answered(
    root: Path, cache: SummaryCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    summarised = counting_summaries(monkeypatch)

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        opened = await client.post(f"/api/profiles/open?id={PROFILE}", headers=POST)
        while opened.status == 202:
            opened = await client.post(f"/api/profiles/open?id={PROFILE}", headers=POST)
        assert opened.status == 200

    run(create_app(root, workers=1, summary_cache=cache, summarise_ahead=0), session)
    assert cache.directory is not None
    assert len(list(cache.directory.glob("*.summary"))) == 4  # stored by the time it stopped
    assert len(summarised) == 4

    async def timeline(client: TestClient[Any, Any], app: web.Application) -> None:
        assert (await client.post(f"/api/profiles/open?id={PROFILE}", headers=POST)).status == 200
        assert (await client.get(f"/api/tracks?id={PROFILE}")).status == 200

    run(create_app(root, workers=1, summary_cache=cache, summarise_ahead=0), timeline)
    assert len(summarised) == 4  # a restarted UI composed the timeline from the stored ones


def test_an_open_of_an_unknown_profile_is_a_404(root: Path) -> None:
    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        response = await client.post("/api/profiles/open?id=team-a/nothing/0", headers=POST)
        assert response.status == 404

    run(create_app(root, workers=1), session)


def test_with_summarise_ahead_0_a_listing_summarises_nothing(
    root: Path, cache: SummaryCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    summarised = counting_summaries(monkeypatch)

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        rows = (await (await client.get("/api/profiles")).json())["profiles"]
        await asyncio.sleep(0.2)
        assert rows[0]["summaries"] is None
        assert summarised == []

    run(create_app(root, workers=1, summary_cache=cache, summarise_ahead=0), session)


def test_a_reopened_profile_s_annotation_histograms_need_no_summaries(
    root: Path, cache: SummaryCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = load_profile(root / PROFILE, workers=1)
    names = [row["name"] for row in dashboard(whole)["annotations"]]

    async def first_open(client: TestClient[Any, Any], app: web.Application) -> None:
        assert (await client.post(f"/api/profiles/open?id={PROFILE}", headers=POST)).status == 200

    async def reopen(client: TestClient[Any, Any], app: web.Application) -> None:
        assert (await client.post(f"/api/profiles/open?id={PROFILE}", headers=POST)).status == 200
        for name in names:
            got = await (await client.get(f"/api/annotation?id={PROFILE}&name={name}")).json()
            assert got == json.loads(json.dumps(annotation(whole, name)))
        assert app[STORE_KEY].loaded(PROFILE).composed is None  # answered from the cache

    run(create_app(root, workers=1, summary_cache=cache, summarise_ahead=0), first_open)
    summarised = counting_summaries(monkeypatch)
    monkeypatch.setattr(ui_profiles, "PRECOMPOSE_AFTER_S", 600.0)
    run(create_app(root, workers=1, summary_cache=cache, summarise_ahead=0), reopen)
    assert summarised == []


def test_a_profile_opened_from_its_stored_dashboard_is_composed_for_the_timeline_soon_after(
    root: Path, cache: SummaryCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ui_profiles, "PRECOMPOSE_AFTER_S", 0.05)

    async def open_profile(client: TestClient[Any, Any], app: web.Application) -> None:
        assert (await client.post(f"/api/profiles/open?id={PROFILE}", headers=POST)).status == 200

    async def reopen(client: TestClient[Any, Any], app: web.Application) -> None:
        await open_profile(client, app)
        entry = app[STORE_KEY].loaded(PROFILE)
        deadline = time.monotonic() + 30
        while entry.composed is None:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        assert len(entry.composed.summaries) == 4

    run(create_app(root, workers=1, summary_cache=cache, summarise_ahead=0), open_profile)
    run(create_app(root, workers=1, summary_cache=cache, summarise_ahead=0), reopen)


def test_the_dashboard_is_sent_gzipped_only_to_a_client_that_accepts_it(root: Path) -> None:
    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        opened = await client.post(
            f"/api/profiles/open?id={PROFILE}", headers={**POST, "Accept-Encoding": "gzip"}
        )
        assert opened.headers["Content-Encoding"] == "gzip"
        plain = await client.get(
            f"/api/dashboard?id={PROFILE}", headers={"Accept-Encoding": "identity"}
        )
        assert "Content-Encoding" not in plain.headers
        assert await opened.json() == await plain.json()

    run(create_app(root, workers=1, summarise_ahead=0), session)


def test_a_stored_dashboard_that_fails_its_framing_is_dropped_and_composed_again(
    root: Path, cache: SummaryCache, tmp_path: Path
) -> None:
    async def open_profile(client: TestClient[Any, Any], app: web.Application) -> None:
        response = await client.post(f"/api/profiles/open?id={PROFILE}", headers=POST)
        assert response.status == 200
        assert (await response.json())["overview"]["ranks"] == 4

    run(create_app(root, workers=1, summary_cache=cache, summarise_ahead=0), open_profile)
    (stored,) = (tmp_path / "cache").glob("*.dashboard")
    intact = stored.read_bytes()
    stored.write_bytes(intact[:-10])  # a torn write the rename should have prevented
    run(create_app(root, workers=1, summary_cache=cache, summarise_ahead=0), open_profile)
    again = cache.get_dashboard(stored.stem)  # composed again from the summaries, and stored
    assert again is not None
    assert again.events == json.loads(intact.partition(b"\n")[0])["events"]
