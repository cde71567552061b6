"""The UI's request safety and Kubernetes authentication, with a fake review client.

The pure parts (Host, CSRF, bearer parsing, verdicts, the cache) are tested directly; the
middleware and handlers through the real aiohttp app in-process, with reviews answered by a
fake that records every question (so the cache is seen to save reviews).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner

from support.clock import FakeClock
from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.cli import main
from trainium_operator.k8s.reviews import (
    AccessReviewResult,
    ResourceQuestion,
    ReviewedUser,
    TokenReviewResult,
    access_review_result,
    subject_access_review_body,
    token_review_result,
)
from trainium_operator.ui import app as ui_app
from trainium_operator.ui.app import create_app
from trainium_operator.ui.auth import (
    ALL_NAMESPACES,
    KubernetesAccess,
    TtlCache,
    authentication_verdict,
    bearer_token,
    profile_namespace,
    profile_verdict,
)
from trainium_operator.ui.guards import (
    CSRF_HEADER,
    cross_origin_refusal,
    default_allowed_hosts,
    host_allowed,
    host_name,
)
from trainium_operator.ui.profiles import JobInfo

ALICE = ReviewedUser("alice", "uid-1", ("team-a-readers", "system:authenticated"))
TOKENS = {"alice-token": ALICE}
PROFILE_A = "team-a/job-a/0"
PROFILE_B = "team-b/job-b/0"
TINY = SyntheticSpec(nodes=1, ranks_per_node=1, steps=3, detailed_steps=(1, 2), kernels_per_step=2)
CSRF = {CSRF_HEADER: "1"}


@dataclass
class FakeReviews:
    """Authenticates TOKENS; allows `get trainingjobs` in `readable` namespaces only."""

    readable: frozenset[tuple[str, str]] = frozenset({("alice", "team-a")})
    tokens_reviewed: list[str] = field(default_factory=list)
    questions: list[tuple[str, ResourceQuestion]] = field(default_factory=list)

    def review_token(self, token: str, audiences: tuple[str, ...] = ()) -> TokenReviewResult:
        self.tokens_reviewed.append(token)
        user = TOKENS.get(token)
        if user is None:
            return TokenReviewResult(False, None, "invalid bearer token")
        return TokenReviewResult(True, user)

    def review_access(self, user: ReviewedUser, question: ResourceQuestion) -> AccessReviewResult:
        self.questions.append((user.name, question))
        allowed = (
            question.verb == "get"
            and (question.group, question.resource) == ("trainium.dev", "trainingjobs")
            and (user.name, question.namespace) in self.readable
        )
        return AccessReviewResult(allowed)


# ------------------------------------------------------------------ Host and CSRF (pure)


def test_host_names_are_compared_without_port_case_or_brackets() -> None:
    assert host_name("UI.Example.com:8443") == "ui.example.com"
    assert host_name("[::1]:8265") == "::1"
    assert host_name("127.0.0.1") == "127.0.0.1"
    assert host_allowed("localhost:8265", default_allowed_hosts("127.0.0.1"))
    assert host_allowed("[::1]:8265", default_allowed_hosts("127.0.0.1"))


def test_a_dns_rebinding_name_is_not_an_allowed_host() -> None:
    allowed = default_allowed_hosts("127.0.0.1")

    assert not host_allowed("evil.example:8265", allowed)
    assert not host_allowed("localhost.evil.example", allowed)
    assert not host_allowed(None, allowed)
    assert not host_allowed("", allowed)
    assert host_allowed("evil.example", ("*",))


def test_a_wildcard_bind_is_not_itself_an_allowed_host() -> None:
    assert default_allowed_hosts("0.0.0.0") == ("localhost", "127.0.0.1", "::1")
    assert default_allowed_hosts("10.0.0.5")[0] == "10.0.0.5"


def test_only_unsafe_methods_need_the_csrf_header() -> None:
    assert cross_origin_refusal("GET", {}) is None
    assert cross_origin_refusal("HEAD", {}) is None
    refusal = cross_origin_refusal("POST", {})
    assert refusal is not None
    assert CSRF_HEADER in refusal
    assert cross_origin_refusal("POST", {**CSRF, "Host": "h:1"}) is None


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
    ],
)
def test_a_post_from_another_origin_is_refused_even_with_the_header(
    headers: Mapping[str, str],
) -> None:
    assert cross_origin_refusal("POST", {**CSRF, "Host": "ui:8090", **headers}) is not None


def test_a_same_origin_post_passes() -> None:
    headers = {
        **CSRF,
        "Host": "ui:8090",
        "Origin": "http://ui:8090",
        "Sec-Fetch-Site": "same-origin",
    }
    assert cross_origin_refusal("POST", headers) is None


# ------------------------------------------------------------------ authentication (pure)


def test_bearer_tokens_are_parsed_from_the_authorization_header() -> None:
    assert bearer_token("Bearer abc.def") == "abc.def"
    assert bearer_token("bearer   abc ") == "abc"
    assert bearer_token("Basic dXNlcjpwYXNz") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


def test_authentication_verdicts() -> None:
    assert authentication_verdict(None, None).status == 401
    refused = authentication_verdict("t", TokenReviewResult(False, None, "token expired"))
    assert refused.status == 401
    assert "token expired" in refused.reason
    assert authentication_verdict("t", TokenReviewResult(True, ALICE)).allowed


def test_a_profile_belongs_to_the_namespace_its_location_names() -> None:
    assert profile_namespace("team-a/job/0") == "team-a"
    assert profile_namespace("./team-a//job/0/") == "team-a"
    assert profile_namespace("team-a/job/0/on-demand/req-1") == "team-a"  # not "0"
    assert profile_namespace("profiles/team-a/job/3") == ALL_NAMESPACES  # the first segment
    assert profile_namespace("team-a/job/0/stacks/x") == ALL_NAMESPACES
    assert profile_namespace("Team_A/job/0") == ALL_NAMESPACES  # not a namespace name
    assert profile_namespace("job/0") == ALL_NAMESPACES
    assert profile_namespace(".") == ALL_NAMESPACES
    assert profile_namespace("../team-a/job/0") == ALL_NAMESPACES


def test_a_profile_is_allowed_only_when_every_namespace_it_names_is_readable() -> None:
    readable = {"team-a": True, "team-b": False, ALL_NAMESPACES: False}

    assert profile_verdict(ALICE, readable, ["team-a"]).allowed
    denied = profile_verdict(ALICE, readable, ["team-a", "team-b"])
    assert denied.status == 403
    assert "team-b" in denied.reason
    assert "alice" in denied.reason
    assert profile_verdict(ALICE, readable, [ALL_NAMESPACES]).status == 403
    assert profile_verdict(ALICE, readable, ["unknown"]).status == 403


def test_review_bodies_and_results_follow_the_api() -> None:
    body = subject_access_review_body(
        ReviewedUser("bob", "u", ("g",), (("scopes", ("x",)),)),
        ResourceQuestion("get", "trainium.dev", "trainingjobs", "team-a"),
    )
    assert body["spec"] == {
        "user": "bob",
        "uid": "u",
        "groups": ["g"],
        "extra": {"scopes": ["x"]},
        "resourceAttributes": {
            "verb": "get",
            "group": "trainium.dev",
            "resource": "trainingjobs",
            "namespace": "team-a",
        },
    }
    assert not access_review_result({"allowed": True, "denied": True}).allowed
    assert not access_review_result({}).allowed
    assert token_review_result({"authenticated": True, "user": {}}).authenticated is False
    reviewed = token_review_result(
        {"authenticated": True, "user": {"username": "bob", "groups": ["g"], "extra": {"k": ["v"]}}}
    )
    assert reviewed.user == ReviewedUser("bob", "", ("g",), (("k", ("v",)),))


# ------------------------------------------------------------------ the cache


def test_cache_entries_expire_after_the_ttl() -> None:
    clock = FakeClock()
    cache: TtlCache[str, int] = TtlCache(ttl=10, max_entries=8, clock=clock)
    cache.put("a", 1)
    clock.now += 9.9
    assert cache.get("a") == 1
    clock.now += 0.1
    assert cache.get("a") is None


def test_cache_is_bounded_dropping_the_least_recently_used() -> None:
    cache: TtlCache[int, int] = TtlCache(ttl=60, max_entries=3, clock=FakeClock())
    for key in range(3):
        cache.put(key, key)
    cache.get(0)  # 1 is now the least recently used
    cache.put(3, 3)

    assert len(cache) == 3
    assert cache.get(1) is None
    assert [cache.get(k) for k in (0, 2, 3)] == [0, 2, 3]


def test_reviews_are_reused_within_the_ttl_and_repeated_after_it() -> None:
    reviews, clock = FakeReviews(), FakeClock()
    access = KubernetesAccess(reviews, ttl=10, clock=clock)

    async def page_loads() -> list[dict[str, bool]]:
        await access.authenticate("alice-token")
        first = await access.readable(ALICE, ["team-a", "team-b", "team-a"])
        second = await access.readable(ALICE, ["team-b", "team-a"])
        await access.authenticate("alice-token")
        clock.now += 11
        third = await access.readable(ALICE, ["team-a"])
        return [first, second, third]

    first, second, third = asyncio.run(page_loads())

    assert first == second == {"team-a": True, "team-b": False}
    assert third == {"team-a": True}
    assert [q.namespace for _, q in reviews.questions] == ["team-a", "team-b", "team-a"]
    assert reviews.tokens_reviewed == ["alice-token"]
    assert "alice-token" not in repr(access.tokens._entries)  # only its hash is kept


# ------------------------------------------------------------------ the app, in-process


@pytest.fixture(scope="module")
def two_namespaces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tenants")
    write_synthetic_profile(root / PROFILE_A, TINY)
    write_synthetic_profile(root / PROFILE_B, TINY)
    # A name in team-a that resolves to team-b's profile (anyone may write the shared volume).
    (root / "team-a" / "sneaky").mkdir()
    (root / "team-a" / "sneaky" / "0").symlink_to(root / PROFILE_B)
    return root


async def two_jobs() -> list[JobInfo]:
    return [
        JobInfo("job-a", "team-a", "2026-01-01T00:00:00Z", "Running", PROFILE_A),
        JobInfo("job-b", "team-b", "2026-01-02T00:00:00Z", "Running", PROFILE_B),
    ]


@dataclass
class Answer:
    status: int
    text: str
    headers: Mapping[str, str]

    def json(self) -> Any:
        return json.loads(self.text)


def call(app: web.Application, requests: list[tuple[str, str, dict[str, str]]]) -> list[Answer]:
    """Sends (method, path, headers) requests to the app in turn, on one in-process server."""

    async def run() -> list[Answer]:
        async with TestClient(TestServer(app)) as client:
            answers = []
            for method, path, headers in requests:
                response = await client.request(method, path, headers=headers)
                answers.append(Answer(response.status, await response.text(), response.headers))
            return answers

    return asyncio.run(run())


def kubernetes_app(root: Path, reviews: FakeReviews) -> web.Application:
    access = KubernetesAccess(reviews)
    return create_app(root, job_lister=two_jobs, workers=1, access=access)


ALICE_AUTH = {"Authorization": "Bearer alice-token"}


def test_an_anonymous_or_unknown_token_request_gets_401(two_namespaces: Path) -> None:
    app = kubernetes_app(two_namespaces, FakeReviews())
    anonymous, basic, unknown, health = call(
        app,
        [
            ("GET", "/api/profiles", {}),
            ("GET", "/", {"Authorization": "Basic dXNlcjpwYXNz"}),
            ("GET", "/api/profiles", {"Authorization": "Bearer nobody"}),
            ("GET", "/healthz", {}),
        ],
    )

    assert anonymous.status == 401
    assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")
    assert basic.status == 401
    assert unknown.status == 401
    assert "invalid bearer token" in unknown.text
    assert health.status == 200  # the probe needs no token


def without_summaries(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: value for key, value in row.items() if key != "summaries"} for row in rows]


def test_a_user_sees_only_jobs_and_profiles_of_namespaces_they_may_read(
    two_namespaces: Path,
) -> None:
    reviews = FakeReviews()
    first, second = call(
        kubernetes_app(two_namespaces, reviews),
        [("GET", "/api/profiles", ALICE_AUTH), ("GET", "/api/profiles?q=job", ALICE_AUTH)],
    )

    assert first.status == 200
    assert [row["id"] for row in first.json()["profiles"]] == [PROFILE_A]
    assert first.json()["total"] == 1
    assert [job["name"] for job in first.json()["jobs"]] == ["job-a"]
    # The same rows (the background summaries of team-a's profile may have moved on).
    assert without_summaries(second.json()["profiles"]) == without_summaries(
        first.json()["profiles"]
    )
    # One review per namespace for both page loads; the second was answered from the cache.
    assert sorted(q.namespace for _, q in reviews.questions) == ["team-a", "team-b"]
    assert reviews.tokens_reviewed == ["alice-token"]


def test_the_polled_job_list_shows_only_jobs_of_namespaces_the_user_may_read(
    two_namespaces: Path,
) -> None:
    anonymous, alice = call(
        kubernetes_app(two_namespaces, FakeReviews()),
        [("GET", "/api/jobs", {}), ("GET", "/api/jobs", ALICE_AUTH)],
    )

    assert anonymous.status == 401
    assert alice.status == 200
    assert [(job["name"], job["namespace"]) for job in alice.json()["jobs"]] == [
        ("job-a", "team-a")
    ]


def test_a_profile_of_another_namespace_is_403_on_every_route(two_namespaces: Path) -> None:
    post = {**ALICE_AUTH, **CSRF}
    # Each route that reads a profile, with the query it needs besides the id.
    reads = {"dashboard": "", "tracks": "", "window": "&start=0&end=1&width=1"}
    reads |= {"event": "&event=0", "annotation": "&name=forward"}
    answers = call(
        kubernetes_app(two_namespaces, FakeReviews()),
        [
            ("POST", f"/api/profiles/load?id={PROFILE_B}&wait=1", post),
            ("POST", f"/api/profiles/unload?id={PROFILE_B}", post),
            *(("GET", f"/api/{r}?id={PROFILE_B}{query}", ALICE_AUTH) for r, query in reads.items()),
            ("POST", "/api/profiles/load?id=team-a/sneaky/0&wait=1", post),
        ],
    )

    assert [a.status for a in answers] == [403] * len(answers)
    assert "team-b" in answers[0].text


def test_a_profile_of_a_readable_namespace_loads(two_namespaces: Path) -> None:
    post = {**ALICE_AUTH, **CSRF}
    loaded, dashboard = call(
        kubernetes_app(two_namespaces, FakeReviews()),
        [
            ("POST", f"/api/profiles/load?id={PROFILE_A}&wait=1", post),
            ("GET", f"/api/dashboard?id={PROFILE_A}", ALICE_AUTH),
        ],
    )

    assert loaded.json()["state"] == "loaded"
    assert dashboard.json()["overview"]["ranks"] == TINY.world_size


def test_state_changes_are_post_only_with_the_csrf_header(two_namespaces: Path) -> None:
    get_load, bare_post, forged = call(
        kubernetes_app(two_namespaces, FakeReviews()),
        [
            ("GET", f"/api/profiles/load?id={PROFILE_A}", ALICE_AUTH),
            ("POST", f"/api/profiles/load?id={PROFILE_A}", ALICE_AUTH),
            (
                "POST",
                f"/api/profiles/unload?id={PROFILE_A}",
                {**ALICE_AUTH, **CSRF, "Origin": "https://evil.example"},
            ),
        ],
    )

    assert get_load.status == 405
    assert bare_post.status == 403
    assert CSRF_HEADER in bare_post.text
    assert forged.status == 403
    assert "evil.example" in forged.text


def test_every_route_that_changes_state_is_post_only(two_namespaces: Path) -> None:
    app = create_app(two_namespaces, workers=1)
    state_changing = {"/api/profiles/load", "/api/profiles/open", "/api/profiles/unload"}
    methods: dict[str, set[str]] = {}
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        methods.setdefault(str(info.get("path") or info.get("prefix")), set()).add(route.method)

    assert {path for path, verbs in methods.items() if "POST" in verbs} == state_changing
    assert all(methods[path] == {"POST"} for path in state_changing)


def test_a_request_for_an_unknown_host_is_refused_in_both_modes(two_namespaces: Path) -> None:
    local = create_app(two_namespaces, workers=1)
    rebinding = {"Host": "evil.example:8265"}
    (local_refused, local_ok) = call(
        local,
        [("GET", "/api/profiles", rebinding), ("GET", "/api/profiles", {"Host": "localhost:1"})],
    )
    (cluster_refused,) = call(
        kubernetes_app(two_namespaces, FakeReviews()),
        [("GET", "/api/profiles", {**ALICE_AUTH, **rebinding})],
    )

    assert local_refused.status == 421
    assert "--allowed-host" in local_refused.text
    assert local_ok.status == 200
    assert cluster_refused.status == 421


def test_local_mode_needs_no_token(two_namespaces: Path) -> None:
    (listing,) = call(
        create_app(two_namespaces, job_lister=two_jobs, workers=1), [("GET", "/api/profiles", {})]
    )

    assert [row["id"] for row in listing.json()["profiles"]] == [PROFILE_A, PROFILE_B]
    assert [job["name"] for job in listing.json()["jobs"]] == ["job-a", "job-b"]


# ------------------------------------------------------------------ the command


def test_serve_binds_loopback_and_allows_only_loopback_names_by_default(
    two_namespaces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(web, "run_app", lambda app, **kw: seen.update(app=app, **kw))

    result = CliRunner().invoke(main, ["profile", "serve", str(two_namespaces)])

    assert result.exit_code == 0, result.output
    assert seen["host"] == "127.0.0.1"
    security = seen["app"][ui_app.SECURITY_KEY]
    assert security.access is None
    assert security.allowed_hosts == {"127.0.0.1", "localhost", "::1"}


def test_serve_takes_allowed_hosts_and_refuses_audiences_without_auth(
    two_namespaces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(web, "run_app", lambda app, **kw: seen.update(app=app, **kw))
    runner = CliRunner()

    hosts = runner.invoke(
        main,
        [
            "profile",
            "serve",
            str(two_namespaces),
            "--host",
            "0.0.0.0",
            "--allowed-host",
            "ui.example",
        ],
    )
    audience = runner.invoke(
        main, ["profile", "serve", str(two_namespaces), "--token-audience", "x"]
    )

    assert hosts.exit_code == 0, hosts.output
    assert seen["app"][ui_app.SECURITY_KEY].allowed_hosts == {"ui.example"}
    assert audience.exit_code == 2
    assert "--token-audience" in audience.output
