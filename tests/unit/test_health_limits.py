"""The health channel bounded against its own ranks: messages bound to the job's shape, the
pods' and jobs' budgets, the token pre-filter and review cache, the endpoint's connections."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from support.local_server import free_port
from trainium_operator.contract import channel as contract
from trainium_operator.contract.channel import batch_json, parse_messages
from trainium_operator.controller import channel_limits, health_server
from trainium_operator.controller.channel_auth import TokenIdentity, authorize
from trainium_operator.controller.channel_limits import TokenBucket, token_claims
from trainium_operator.controller.health_server import (
    HealthChannel,
    ProgressStore,
    ReviewLimitedError,
    ServerThread,
    TokenCache,
)
from trainium_operator.lifecycle.policies import on_demand_profile as profile_on_demand
from trainium_operator.lifecycle.policies import stalls
from trainium_operator.lifecycle.ranks import RankSample
from unit.jobs import job_document, job_ref
from unit.test_health_channel import (
    _cache_with,
    message,
    pod_identity,
    pod_jwt,
    training_pod,
)

KEY = ("team-a", "bert")


def channel(job: dict[str, Any] | None = None) -> HealthChannel:
    cache = _cache_with(("job", job or job_document()), ("pod", training_pod()))
    return HealthChannel(cache, TokenCache(lambda _t: pod_identity()))


def node_batch(ranks: range, **changes: Any) -> bytes:
    return batch_json([message(rank=r, **changes) for r in ranks])


# -- messages bound to the job's shape -------------------------------------------------------
@pytest.mark.parametrize("world_size", [2**61, 65, 63, 1])
def test_a_message_whose_world_size_is_not_the_specs_is_refused_and_stores_nothing(
    world_size: int,
) -> None:
    endpoint = channel()
    status, verdict = endpoint.receive(pod_jwt(), message(world_size=world_size).to_json())
    assert status == 403, verdict
    assert "not the job's 64 (2 nodes x 32 processes)" in verdict.reason
    assert endpoint.store.jobs() == []


@pytest.mark.parametrize("rank", [0, 31, 64, 2**40])
def test_a_pod_may_report_only_its_own_nodes_ranks(rank: int) -> None:
    endpoint = channel()  # the pod is node rank 1: ranks 32..63
    status, verdict = endpoint.receive(pod_jwt(), message(rank=rank).to_json())
    assert status == 403, verdict
    assert "is not a rank of node 1 (32..63)" in verdict.reason
    assert endpoint.store.jobs() == []


def test_a_pods_batch_of_its_ranks_is_stored_rank_by_rank_with_its_node() -> None:
    endpoint = channel()
    status, _ = endpoint.receive(pod_jwt(), node_batch(range(32, 64), step=7))
    assert status == 200
    stored = endpoint.store.ranks(KEY)
    assert sorted(stored) == list(range(32, 64))
    assert {(r.node, r.step) for r in stored.values()} == {("trn-node-7", 7)}


def test_a_batch_naming_another_nodes_rank_is_refused_whole() -> None:
    endpoint = channel()
    status, verdict = endpoint.receive(pod_jwt(), node_batch(range(31, 40)))
    assert status == 403
    assert "rank 31 is not a rank of node 1" in verdict.reason
    assert endpoint.store.jobs() == []


def test_a_batch_round_trips_and_caps_its_ranks_step_times_and_duplicates() -> None:
    messages = [message(rank=r, step_times_ms=tuple(float(t) for t in range(40))) for r in (32, 33)]
    parsed = parse_messages(batch_json(messages))
    assert [m.rank for m in parsed] == [32, 33]
    assert parsed[0].step_times_ms == tuple(float(t) for t in range(24, 40))  # the newest 16
    assert dataclasses.replace(parsed[1], step_times_ms=()) == dataclasses.replace(
        messages[1], step_times_ms=()
    )
    too_many = json.dumps(
        {**message().header_json(), "ranks": [{"rank": r, "step": 1} for r in range(129)]}
    ).encode()
    with pytest.raises(ValueError, match=r"ranks: a list of 1\.\.128"):
        parse_messages(too_many)
    with pytest.raises(ValueError, match="rank 5 is named twice"):
        parse_messages(batch_json([message(rank=5), message(rank=5)]))


def test_the_store_keeps_no_more_ranks_of_a_job_than_it_is_allowed() -> None:
    store = ProgressStore()
    stored = store.put_many([message(rank=r) for r in range(100)], "n", max_ranks=10)
    assert stored == 10
    assert len(store.ranks(KEY)) == 10
    assert store.put(message(rank=3, step=99), "n", max_ranks=10) == 1  # a kept rank moves


def _sample(rank: int, world_size: int, **changes: Any) -> RankSample:
    base = RankSample(
        rank=rank,
        attempt=0,
        world_size=world_size,
        step=5,
        step_times_ms=(100.0,),
        received=datetime(2026, 1, 1, tzinfo=UTC),
    )
    return dataclasses.replace(base, **changes)


def test_the_stall_watch_sizes_the_gang_from_the_spec_not_from_a_ranks_world_size() -> None:
    job = job_ref()
    ranks = [_sample(0, 2**62), _sample(1, 3, final=True), _sample(2**40, 2**62)]
    gang = stalls.watch(job.spec.health, ranks, 0, job.spec.world_size)
    assert gang is not None
    assert gang.world == set(range(64)) - {1}
    assert [r.rank for r in gang.ranks] == [0]


def test_on_demand_profiling_sizes_the_gang_from_the_spec_not_from_a_ranks_world_size() -> None:
    ranks = [_sample(0, 2**62, profile_captured="r1"), _sample(7, 2**62, final=True)]
    gang = profile_on_demand._gang(ranks, 0, "r1", 64)
    assert gang.world == set(range(64))
    assert gang.expected == set(range(64)) - {7}
    assert gang.captured == {0}


# -- budgets ---------------------------------------------------------------------------------
def test_a_bucket_admits_its_burst_then_its_rate() -> None:
    bucket = TokenBucket(rate=6.4, burst=64, tokens=64, updated=0.0)  # 32 ranks every 5 s
    assert bucket.take(64, 0.0)
    assert not bucket.take(1, 0.0)
    assert not bucket.take(32, 4.9)
    assert bucket.take(32, 5.0)


def test_a_pod_over_its_ranks_per_interval_is_answered_429_and_counted() -> None:
    now = [0.0]
    endpoint = channel()
    endpoint.clock = lambda: now[0]
    batch = node_batch(range(32, 64))
    # The burst: BURST_INTERVALS intervals' worth of the pod's ranks, then 429.
    burst = int(channel_limits.BURST_INTERVALS)
    answers = [endpoint.receive(pod_jwt(), batch)[0] for _ in range(burst + 1)]
    assert answers == [200] * burst + [429]
    one = message().to_json()
    assert endpoint.receive(pod_jwt(), one)[0] == 429  # one-rank messages share the budget
    now[0] = 5.0  # one interval later: one interval's worth again
    assert endpoint.receive(pod_jwt(), batch)[0] == 200
    assert endpoint.receive(pod_jwt(), one)[0] == 429
    assert endpoint.counted()["rate_limited"] == 3


def test_the_budget_never_uses_an_interval_below_the_floor() -> None:
    doc = job_document()
    doc["spec"]["health"] = {"reportIntervalSeconds": 0.001}  # past the CRD: the floor holds
    endpoint = channel(doc)
    now = [0.0]
    endpoint.clock = lambda: now[0]
    batch = node_batch(range(32, 64))
    sent = 0
    while now[0] < 1.0:
        sent += endpoint.receive(pod_jwt(), batch)[0] == 200
        now[0] += 0.01
    assert sent <= channel_limits.BURST_INTERVALS + 1.0 / contract.MIN_INTERVAL_S + 1, sent


# -- tokens ----------------------------------------------------------------------------------
def test_an_identity_without_our_audience_or_with_none_is_refused() -> None:
    for audiences in ((), ("https://kubernetes.default.svc",)):
        identity = pod_identity(audiences=audiences)
        verdict = authorize(message(), identity, training_pod(), job_document())
        assert not verdict.accepted
        assert "not for the audience" in verdict.reason


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("random-garbage", "not a JWT"),
        ("a.b.c", "not a JWT"),
        (pod_jwt(audience="https://kubernetes.default.svc"), "not for the audience"),
        (pod_jwt(pod=""), "not bound to a pod"),
        ("x" * (contract.MAX_TOKEN_BYTES + 1), "too long"),
    ],
)
def test_the_pre_filter_refuses_a_token_that_cannot_be_a_pod_bound_one_of_ours(
    token: str, reason: str
) -> None:
    claims = token_claims(token, time.time())
    assert isinstance(claims, str)
    assert reason in claims


def test_a_token_for_a_pod_not_in_the_cache_is_refused_without_a_review() -> None:
    reviewed: list[str] = []

    def review(token: str) -> TokenIdentity:
        reviewed.append(token)
        return pod_identity()

    endpoint = HealthChannel(
        _cache_with(("job", job_document()), ("pod", training_pod())), TokenCache(review)
    )
    for token in ("garbage", pod_jwt(uid="another-uid"), pod_jwt(pod="bert-train-0-9")):
        status, verdict = endpoint.receive(token, message().to_json())
        assert status == 401, verdict
    assert reviewed == []
    assert endpoint.tokens.prefiltered == 3


def test_concurrent_messages_with_one_token_share_one_review() -> None:
    reviewed: list[str] = []

    def review(token: str) -> TokenIdentity:
        reviewed.append(token)
        time.sleep(0.1)
        return pod_identity()

    tokens = TokenCache(review)
    token = pod_jwt()
    results: list[TokenIdentity] = []
    threads = [
        threading.Thread(target=lambda: results.append(tokens.identity(token))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert reviewed == [token]
    assert len(results) == 8
    assert all(r.authenticated for r in results)


def test_reviews_are_rate_limited_per_claimed_pod() -> None:
    reviewed: list[str] = []
    tokens = TokenCache(lambda t: reviewed.append(t) or TokenIdentity(False, error="bad"))
    limited = 0
    for index in range(20):
        try:
            tokens.identity(pod_jwt(nonce=str(index)))
        except ReviewLimitedError:
            limited += 1
    assert len(reviewed) == health_server.REVIEW_BURST_PER_POD
    assert limited == 20 - health_server.REVIEW_BURST_PER_POD


def test_a_flood_of_bad_tokens_never_evicts_a_good_review(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health_server, "MAX_CACHED_TOKENS", 100)
    monkeypatch.setattr(health_server, "MAX_REFUSED_TOKENS", 50)
    good = pod_jwt()
    reviewed: list[str] = []

    def review(token: str) -> TokenIdentity:
        reviewed.append(token)
        return pod_identity() if token == good else TokenIdentity(False, error="bad")

    tokens = TokenCache(review)
    assert tokens.identity(good).authenticated
    for index in range(300):  # each claims a pod of its own: no per-pod limit applies
        bad = pod_jwt(uid=f"uid-{index}", nonce=str(index))
        assert not tokens.identity(bad).authenticated
    assert tokens.cached(good)
    assert tokens.identity(good).authenticated
    assert reviewed.count(good) == 1
    assert tokens.sizes() == (1, 50)


def test_a_pod_keeps_a_bounded_number_of_accepted_tokens() -> None:
    tokens = TokenCache(lambda _t: pod_identity())
    minted = [pod_jwt(nonce=str(i)) for i in range(health_server.REVIEW_BURST_PER_POD.__int__())]
    for token in minted:
        tokens.identity(token)
    assert tokens.sizes()[0] == min(len(minted), health_server.MAX_TOKENS_PER_POD)


# -- the endpoint's connections --------------------------------------------------------------
@contextlib.contextmanager
def serving(endpoint: HealthChannel) -> Iterator[int]:
    """The endpoint served on a free localhost port (yielded) until the block ends."""
    port = free_port()
    server = ServerThread(endpoint, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        server.stop()


def test_idle_connections_are_cut_at_their_deadline_and_capped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(health_server, "MAX_CONNECTIONS", 3)
    monkeypatch.setattr(health_server, "CONNECTION_SECONDS", 0.4)
    endpoint = channel()
    with serving(endpoint) as port:
        slow = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(3)]
        for sock in slow:
            sock.sendall(b"POST /v1/progress HTTP/1.1\r\nHost: x\r\n")  # headers never end
        time.sleep(0.1)
        extra = socket.create_connection(("127.0.0.1", port), timeout=2)
        assert extra.recv(1) == b""  # refused: closed at once
        time.sleep(0.5)
        for sock in slow:
            sock.settimeout(1)
            assert sock.recv(1024) in (b"",) or sock.recv(1024) == b""  # cut at the deadline
        assert endpoint.counted()["connection_refused"] == 1
        for sock in [*slow, extra]:
            sock.close()


def test_a_sender_gone_mid_message_is_counted_cut_off_and_logs_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    endpoint = channel()
    with serving(endpoint) as port, caplog.at_level(logging.ERROR):
        sock = socket.create_connection(("127.0.0.1", port), timeout=2)
        sock.sendall(
            b'POST /v1/progress HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"rank"'
        )
        time.sleep(0.1)
        sock.close()  # the rest of the promised body never comes
        deadline = time.monotonic() + 5
        while "cut_off" not in endpoint.counted() and time.monotonic() < deadline:
            time.sleep(0.02)
    assert endpoint.counted().get("cut_off") == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
