"""The profile UI bounded against its own users: every request number, id and list is one a
user chose, so none of them may size a structure, decode a profile twice or reach a 500.

Against the real aiohttp app in-process (its test client), with a tiny synthetic profile tree
written once per module and an injected job lister that counts its calls.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.analysis.s3store import group_profiles
from trainium_operator.k8s.reviews import (
    AccessReviewResult,
    ResourceQuestion,
    ReviewedUser,
    TokenReviewResult,
)
from trainium_operator.profiler.s3 import S3Location
from trainium_operator.ui import lazy_timeline
from trainium_operator.ui import profiles as ui_profiles
from trainium_operator.ui.app import STORE_KEY, create_app
from trainium_operator.ui.auth import ALL_NAMESPACES, KubernetesAccess, profile_namespace
from trainium_operator.ui.guards import CSRF_HEADER
from trainium_operator.ui.profiles import JobInfo, ProfileStore

TINY = SyntheticSpec(nodes=1, ranks_per_node=1, steps=3, detailed_steps=(1, 2), kernels_per_step=2)
ATTEMPT = "team-a/job-a/0"
CAPTURE = "team-a/job-a/0/on-demand/req-1"
POST = {CSRF_HEADER: "1"}

Session = Callable[[TestClient[Any, Any], web.Application], Awaitable[None]]


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bounded")
    write_synthetic_profile(root / ATTEMPT, TINY)
    write_synthetic_profile(root / CAPTURE, TINY)
    return root


def serve(app: web.Application, session: Session) -> None:
    """Runs `session` against the app on an in-process server."""

    async def run() -> None:
        async with TestClient(TestServer(app)) as client:
            await session(client, app)

    asyncio.run(run())


async def load(client: TestClient[Any, Any], identifier: str) -> Any:
    response = await client.post(f"/api/profiles/load?id={identifier}&wait=1", headers=POST)
    assert response.status == 200, await response.text()
    return await response.json()


# ------------------------------------------------------------------ the window query


def test_repeated_track_ids_are_answered_once(profile_root: Path) -> None:
    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        await load(client, ATTEMPT)
        tracks = await (await client.get(f"/api/tracks?id={ATTEMPT}")).json()
        end, first = tracks["end_ns"], tracks["nodes"][0]["ranks"][0]["tracks"][0]["id"]
        repeated = ",".join([str(first)] * 500)
        response = await client.get(
            f"/api/window?id={ATTEMPT}&start=0&end={end}&width=800&tracks={repeated}"
        )
        assert response.status == 200
        assert [track["id"] for track in (await response.json())["tracks"]] == [first]

    serve(create_app(profile_root, workers=1), session)


def test_track_lists_are_deduplicated_bounded_and_capped() -> None:
    from trainium_operator.ui.params import ParameterError, int_set

    query = {"tracks": "3,3,1,3,-1,99,1"}
    assert int_set(query, "tracks", low=0, high=10, max_items=4) == [3, 1]
    with pytest.raises(ParameterError, match="at most 2 distinct"):
        int_set({"tracks": "0,1,2,0"}, "tracks", low=0, high=10, max_items=2)
    with pytest.raises(ParameterError, match="longer than"):
        int_set({"tracks": "0," * 10_000}, "tracks", low=0, high=10, max_items=2)


def test_a_window_answer_stays_within_its_item_budget(profile_root: Path) -> None:
    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        await load(client, ATTEMPT)
        store = app[STORE_KEY]
        entry = store.slots[ATTEMPT].entry
        assert entry is not None
        composed = entry.composed
        every = list(range(len(composed.tracks)))
        span = {"start_ns": 0, "end_ns": composed.inputs.end_ns, "width_px": 8192}
        ranks = partial(store.rank_index, ATTEMPT, entry)
        full = await lazy_timeline.window(composed, ranks, **span, track_ids=every)
        sizes = [
            len(t["ids"]) + len(t["agg"]["px"]) if "ids" in t else len(t["t"])
            for t in full["tracks"]
        ]
        budget = max(sizes)  # room for the largest track, not for all of them
        bounded = await lazy_timeline.window(
            composed, ranks, **span, track_ids=every, max_items=budget
        )
        answered = [
            len(t["ids"]) + len(t["agg"]["px"]) if "ids" in t else len(t["t"])
            for t in bounded["tracks"]
        ]
        assert sum(answered) <= budget
        assert bounded["omitted"]  # the tracks that did not fit are named
        assert len(bounded["tracks"]) + len(bounded["omitted"]) == len(every)

    serve(create_app(profile_root, workers=1), session)


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("start=inf&end=1&width=10&tracks=0", 400),
        ("start=0&end=nan&width=10&tracks=0", 400),
        ("start=0&end=1e999&width=10&tracks=0", 400),
        ("start=-inf&end=1&width=10&tracks=0", 400),
        ("start=0&end=1&tracks=0&width=" + "9" * 100, 400),  # longer than any number needs
        ("start=-1e30&end=1e30&width=-5&tracks=0", 200),  # clamped into int64 and one pixel
        ("start=0&end=1e300&width=1e12&tracks=0", 200),
        ("start=0&end=1&width=10&tracks=0,x", 400),
        ("start=0&end=1&width=10&tracks=0,%C2%B2", 400),  # a Unicode digit is not a track id
    ],
)
def test_window_numbers_are_finite_and_clamped(profile_root: Path, query: str, status: int) -> None:
    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        await load(client, ATTEMPT)
        response = await client.get(f"/api/window?id={ATTEMPT}&{query}")
        assert response.status == status, await response.text()
        if status == 200:
            assert 1 <= (await response.json())["width"] <= 8192

    serve(create_app(profile_root, workers=1), session)


@pytest.mark.parametrize(
    ("event", "status"), [("inf", 400), ("nan", 400), ("-3", 404), ("1e300", 404)]
)
def test_event_numbers_are_finite_and_clamped(profile_root: Path, event: str, status: int) -> None:
    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        await load(client, ATTEMPT)
        response = await client.get(f"/api/event?id={ATTEMPT}&event={event}")
        assert response.status == status, await response.text()

    serve(create_app(profile_root, workers=1), session)


# ------------------------------------------------------------------ profile ids


def test_aliases_of_one_profile_decode_once(
    profile_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    decodes: list[Path] = []
    real = ui_profiles.summarise_rank

    def counted(path: Path, points: Any) -> Any:
        decodes.append(path.parent.parent)
        return real(path, points)

    monkeypatch.setattr(ui_profiles, "summarise_rank", counted)
    aliases = [ATTEMPT, f"{ATTEMPT}/", f"./{ATTEMPT}", "team-a//job-a/0", "team-a/./job-a/0"]

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        answers = [await load(client, alias) for alias in aliases]
        assert {answer["id"] for answer in answers} == {ATTEMPT}
        for alias in aliases:
            assert (await client.get(f"/api/dashboard?id={alias}")).status == 200
        assert list(app[STORE_KEY].slots) == [ATTEMPT]

    serve(create_app(profile_root, workers=1), session)
    assert decodes == [(profile_root / ATTEMPT).resolve()]


def test_a_symlink_to_a_profile_shares_its_decode(
    tmp_path: Path, profile_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "profiles"
    shutil.copytree(profile_root / ATTEMPT, root / ATTEMPT)
    (root / "team-a" / "alias").mkdir()
    (root / "team-a" / "alias" / "0").symlink_to(root / ATTEMPT, target_is_directory=True)
    decodes: list[Path] = []
    real = ui_profiles.summarise_rank
    monkeypatch.setattr(
        ui_profiles,
        "summarise_rank",
        lambda path, points: decodes.append(Path(path)) or real(path, points),
    )

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        assert (await load(client, "team-a/alias/0"))["id"] == ATTEMPT
        assert (await load(client, ATTEMPT))["state"] == "loaded"

    serve(create_app(root, workers=1), session)
    assert len(decodes) == 1


@pytest.mark.parametrize(
    "identifier",
    [
        "../outside",
        "team-a/../../etc",
        "team-a/job-a/0\x00",
        "team-a\\job-a\\0",
        "a/" * 40,
        "x" * 600,
    ],
)
def test_a_malformed_profile_id_is_a_400(profile_root: Path, identifier: str) -> None:
    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        for method, path in [("POST", "/api/profiles/load"), ("GET", "/api/dashboard")]:
            response = await client.request(method, path, params={"id": identifier}, headers=POST)
            assert response.status == 400, (path, await response.text())

    serve(create_app(profile_root, workers=1), session)


# ------------------------------------------------------------------ unload during a decode


def test_a_decode_unloaded_midway_stops_before_its_next_stage_and_stores_nothing(
    profile_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, release, decoded = threading.Event(), threading.Event(), threading.Event()
    composed: list[int] = []
    real_summary, real_compose = ui_profiles.summarise_rank, ui_profiles.compose

    def slow(path: Path, points: Any) -> Any:
        started.set()
        release.wait(5)
        try:
            return real_summary(path, points)
        finally:
            decoded.set()

    def counted_compose(*args: Any, **kwargs: Any) -> Any:
        composed.append(1)
        return real_compose(*args, **kwargs)

    monkeypatch.setattr(ui_profiles, "summarise_rank", slow)
    monkeypatch.setattr(ui_profiles, "compose", counted_compose)

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        first = await client.post(f"/api/profiles/load?id={ATTEMPT}", headers=POST)
        assert (await first.json())["state"] == "loading"
        await asyncio.to_thread(started.wait, 5)
        unloaded = await client.post(f"/api/profiles/unload?id={ATTEMPT}", headers=POST)
        assert (await unloaded.json())["unloaded"] is True
        release.set()
        await asyncio.to_thread(decoded.wait, 5)
        await asyncio.sleep(0.3)  # what the decode's thread would still do, it would do now
        assert composed == []  # the dashboard of a dropped decode is not built
        assert app[STORE_KEY].slots == {}
        assert (await client.get(f"/api/dashboard?id={ATTEMPT}")).status == 404

    serve(create_app(profile_root, workers=1), session)


def test_decodes_in_flight_are_bounded_however_often_a_user_unloads(
    profile_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    running, most = [0], [0]
    lock = threading.Lock()
    real = ui_profiles.summarise_rank

    def slow(path: Path, points: Any) -> Any:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        release.wait(5)
        try:
            return real(path, points)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(ui_profiles, "summarise_rank", slow)

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        for _ in range(10):
            await client.post(f"/api/profiles/load?id={ATTEMPT}", headers=POST)
            await asyncio.sleep(0.01)
            await client.post(f"/api/profiles/unload?id={ATTEMPT}", headers=POST)
        await asyncio.sleep(0.1)
        release.set()
        await client.post(f"/api/profiles/load?id={ATTEMPT}&wait=1", headers=POST)

    serve(create_app(profile_root, workers=1), session)
    assert most[0] <= 2  # MAX_CONCURRENT_DECODES, however many loads and unloads were sent


def test_a_waiting_load_of_a_profile_unloaded_meanwhile_is_a_409_not_a_500(
    profile_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, release = threading.Event(), threading.Event()
    real = ui_profiles.summarise_rank

    def slow(path: Path, points: Any) -> Any:
        started.set()
        release.wait(5)
        return real(path, points)

    monkeypatch.setattr(ui_profiles, "summarise_rank", slow)

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        waiting = asyncio.ensure_future(
            client.post(f"/api/profiles/load?id={ATTEMPT}&wait=1", headers=POST)
        )
        await asyncio.to_thread(started.wait, 5)
        await client.post(f"/api/profiles/unload?id={ATTEMPT}", headers=POST)
        release.set()
        response = await waiting
        assert response.status == 409, await response.text()

    serve(create_app(profile_root, workers=1), session)


# ------------------------------------------------------------------ the job list


def job_list_reads(
    profile_root: Path, answer: Callable[[], list[JobInfo]], session: Session, **app: Any
) -> int:
    """Runs `session` against an app whose job lister answers `answer()` (after a 10 ms API
    call); how many times the app read the list."""
    reads = [0]

    async def lister() -> list[JobInfo]:
        reads[0] += 1
        await asyncio.sleep(0.01)
        return answer()

    serve(create_app(profile_root, job_lister=lister, workers=1, **app), session)
    return reads[0]


def api_server_down() -> list[JobInfo]:
    raise RuntimeError("API server down")


def test_the_job_list_is_read_once_for_many_requests(profile_root: Path) -> None:
    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        answers = await asyncio.gather(*(client.get("/api/jobs") for _ in range(20)))
        answers += [await client.get("/api/profiles") for _ in range(5)]
        assert {answer.status for answer in answers} == {200}
        assert [job["name"] for job in (await answers[0].json())["jobs"]] == ["job-a"]

    job_a = JobInfo("job-a", "team-a", "2026-01-01T00:00:00Z", "Running")
    assert job_list_reads(profile_root, lambda: [job_a], session) == 1


def test_a_failing_job_list_is_not_read_again_per_request(profile_root: Path) -> None:
    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        for _ in range(5):
            body = await (await client.get("/api/jobs")).json()
            assert body["jobs"] is None
            assert "API server down" in body["jobs_error"]

    assert job_list_reads(profile_root, api_server_down, session) == 1


def test_the_job_list_is_read_again_after_its_ttl(profile_root: Path) -> None:
    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        await client.get("/api/jobs")
        await asyncio.sleep(0.06)
        await client.get("/api/jobs")

    assert job_list_reads(profile_root, list, session, job_list_ttl=0.05) == 2


# ------------------------------------------------------------------ on-demand captures


def test_on_demand_captures_are_listed_in_directory_mode_with_their_attempt(
    profile_root: Path,
) -> None:
    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        rows = (await (await client.get("/api/profiles")).json())["profiles"]
        by_id = {row["id"]: row for row in rows}
        assert set(by_id) == {ATTEMPT, CAPTURE}
        capture = by_id[CAPTURE]
        assert (capture["namespace"], capture["job_name"], capture["attempt"]) == (
            "team-a",
            "job-a",
            0,
        )
        assert capture["capture"] == "req-1"
        assert (await load(client, CAPTURE))["state"] == "loaded"

    serve(create_app(profile_root, workers=1), session)


def test_a_symlinked_or_misnamed_on_demand_entry_is_not_listed(
    tmp_path: Path, profile_root: Path
) -> None:
    root = tmp_path / "profiles"
    shutil.copytree(profile_root / ATTEMPT, root / ATTEMPT, ignore=shutil.ignore_patterns("req-*"))
    captures = root / ATTEMPT / "on-demand"
    shutil.copytree(profile_root / CAPTURE, captures / "bad_name!")
    (captures / "sneaky").symlink_to(profile_root / ATTEMPT, target_is_directory=True)

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        rows = (await (await client.get("/api/profiles")).json())["profiles"]
        assert [row["id"] for row in rows] == [ATTEMPT]

    serve(create_app(root, workers=1), session)


# ------------------------------------------------------------------ on-demand ids in a cluster


class ReadsOnly:
    """A review client: every token is `user`, who may read only `namespaces`."""

    def __init__(self, user: str, namespaces: set[str]) -> None:
        self.user, self.namespaces = ReviewedUser(user, f"uid-{user}", ()), namespaces

    def review_token(self, token: str, audiences: tuple[str, ...] = ()) -> TokenReviewResult:
        return TokenReviewResult(True, self.user)

    def review_access(self, user: ReviewedUser, question: ResourceQuestion) -> AccessReviewResult:
        return AccessReviewResult(question.verb == "get" and question.namespace in self.namespaces)


AUTH = {"Authorization": "Bearer t"}


@pytest.fixture(scope="module")
def two_teams(profile_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("teams")
    shutil.copytree(profile_root / "team-a", root / "team-a")
    shutil.copytree(profile_root / CAPTURE, root / "team-b/job-b/0/on-demand/req-2")
    write_synthetic_profile(root / "team-b/job-b/0", TINY)
    write_synthetic_profile(root / "elsewhere/run", TINY)  # outside the layout
    return root


def test_a_namespace_reader_opens_their_own_on_demand_capture_and_no_other(
    two_teams: Path,
) -> None:
    app = create_app(two_teams, workers=1, access=KubernetesAccess(ReadsOnly("alice", {"team-a"})))

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        rows = (await (await client.get("/api/profiles", headers=AUTH)).json())["profiles"]
        assert [row["id"] for row in rows] == [ATTEMPT, CAPTURE]
        own = await client.post(f"/api/profiles/load?id={CAPTURE}&wait=1", headers={**AUTH, **POST})
        assert own.status == 200, await own.text()
        other = await client.post(
            "/api/profiles/load?id=team-b/job-b/0/on-demand/req-2&wait=1",
            headers={**AUTH, **POST},
        )
        assert other.status == 403
        assert "team-b" in await other.text()

    serve(app, session)


def test_reading_a_namespace_named_0_shows_no_one_s_on_demand_captures(two_teams: Path) -> None:
    app = create_app(two_teams, workers=1, access=KubernetesAccess(ReadsOnly("zed", {"0"})))

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        rows = (await (await client.get("/api/profiles", headers=AUTH)).json())["profiles"]
        assert rows == []
        for identifier in (CAPTURE, "team-b/job-b/0/on-demand/req-2"):
            response = await client.get(f"/api/dashboard?id={identifier}", headers=AUTH)
            assert response.status == 403, identifier

    serve(app, session)


def test_the_cluster_ui_serves_no_profile_outside_the_layout(two_teams: Path) -> None:
    everyone = ReadsOnly("admin", {"", "team-a", "team-b", "elsewhere"})
    app = create_app(two_teams, workers=1, access=KubernetesAccess(everyone))

    async def session(client: TestClient[Any, Any], app: web.Application) -> None:
        rows = (await (await client.get("/api/profiles", headers=AUTH)).json())["profiles"]
        assert "elsewhere/run" not in [row["id"] for row in rows]
        response = await client.post(
            "/api/profiles/load?id=elsewhere/run&wait=1", headers={**AUTH, **POST}
        )
        assert response.status == 404

    serve(app, session)


def test_on_demand_captures_under_s3_belong_to_their_first_segment() -> None:
    base = S3Location("bucket", "profiles")
    objects = [
        {"Key": f"profiles/{CAPTURE}/profile.json", "Size": 10, "ETag": "e"},
        {"Key": f"profiles/{CAPTURE}/node-0/rank-0.trnprof", "Size": 10, "ETag": "e"},
        {"Key": f"profiles/{ATTEMPT}/node-0/rank-0.trnprof", "Size": 10, "ETag": "e"},
    ]

    class Listed:
        def __init__(self) -> None:
            self.base = base

        def listing(self) -> list[Any]:
            return group_profiles(base, objects)

    store = ProfileStore(Path("/nonexistent"), s3=Listed())  # type: ignore[arg-type]
    rows = {row["id"]: row for row in store.listing()}
    assert set(rows) == {ATTEMPT, CAPTURE}
    capture = rows[CAPTURE]
    assert (capture["namespace"], capture["job_name"], capture["attempt"], capture["capture"]) == (
        "team-a",
        "job-a",
        0,
        "req-1",
    )
    assert profile_namespace(CAPTURE) == "team-a"
    assert profile_namespace("profiles/team-a/job/3") == ALL_NAMESPACES  # not the layout
