"""The health channel against its own ranks: a job author's pod, holding a genuine pod-bound
token, posts whatever it likes (hypothesis-generated messages: absurd worldSize, other nodes'
ranks, 20k distinct ranks, huge strings, wrong types), and anyone who can reach the endpoint
floods it with random bearer tokens. The operator stays alive, its memory bounded, its status
never claims more ranks than the job has, and no good rank loses its cached review."""

from __future__ import annotations

import base64
import json
import secrets
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from integration.health_ranks import pod_token, reporting_job, wait_account
from integration.operator_harness import (
    HealthOperator,
    create_job,
    get_job,
    job_manifest,
    wait_gang_running,
    wait_phase,
)
from trainium_operator.contract import channel as contract

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]

PPN = 4  # the job: 2 nodes x 4 processes, world 8
RSS_HEADROOM_MIB = 100


def post(url: str, body: bytes, token: str) -> int:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    return {
        name: float(value)
        for name, value in (line.rsplit(" ", 1) for line in lines if line and line[0] != "#")
    }


def forged_jwt(pod: Any) -> str:
    """An unsigned token claiming to be bound to `pod` for our audience."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    claims = {
        "aud": [contract.AUDIENCE],
        "exp": int(time.time()) + 600,
        "kubernetes.io": {
            "namespace": pod.metadata.namespace,
            "pod": {"name": pod.metadata.name, "uid": pod.metadata.uid},
        },
        "jti": secrets.token_hex(8),
    }
    return f"{part({'alg': 'RS256'})}.{part(claims)}.{secrets.token_urlsafe(32)}"


def header(pod: Any, job: dict[str, Any]) -> dict[str, Any]:
    return {
        "job": job["metadata"]["name"],
        "namespace": job["metadata"]["namespace"],
        "uid": job["metadata"]["uid"],
        "attempt": 0,
        "nodeRank": int(pod.metadata.labels["trainium.dev/node-rank"]),
        "worldSize": 2 * PPN,
        "sequence": 1,
    }


_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=64),
    st.just("x" * 100_000),
    st.lists(st.integers(), max_size=8),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=4),
)
_fields = st.sampled_from(
    [
        "worldSize",
        "rank",
        "nodeRank",
        "step",
        "attempt",
        "stepTimesMs",
        "samples",
        "stepAgeMs",
        "stacksDumped",
        "final",
        "job",
        "uid",
        "ranks",
        "lastCheckpointStep",
    ]
)


@st.composite
def hostile_bodies(draw: st.DrawFn, base: dict[str, Any]) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(["absurd world", "other node", "many ranks", "junk field", "raw"]))
    body = dict(base)
    if kind == "absurd world":
        body["worldSize"] = draw(st.sampled_from([2**62 - 1, 5 * 10**6, 2**31, 0, 9]))
        body["rank"] = draw(st.integers(0, 2**62 - 1))
        body["step"] = 1
    elif kind == "other node":
        own = range(base["nodeRank"] * PPN, (base["nodeRank"] + 1) * PPN)
        rank = draw(st.integers(0, 2**40).filter(lambda r: r not in own))
        body["ranks"] = [{"rank": rank, "step": 1}]
    elif kind == "many ranks":
        first = draw(st.integers(0, 20_000))
        body["ranks"] = [{"rank": first + r, "step": 1} for r in range(draw(st.integers(1, 300)))]
    elif kind == "junk field":
        body["rank"] = base["nodeRank"] * PPN
        body["step"] = 1
        body[draw(_fields)] = draw(_junk)
    else:
        return kind, draw(st.binary(max_size=2048))
    return kind, json.dumps(body).encode()


def test_a_rank_with_a_genuine_token_posting_hostile_messages_neither_kills_nor_bloats_the_operator(
    clients: Any, namespace: str, health_operator: HealthOperator, hostile_report: Any
) -> None:
    operator, port, metrics_port = health_operator
    create_job(
        clients,
        namespace,
        job_manifest(
            "victim",
            processesPerNode=PPN,
            compile={"enabled": False},
            health={"reportIntervalSeconds": 0.2},
        ),
    )
    gang = wait_gang_running(clients, namespace, "victim", "train", 0)
    wait_phase(clients, namespace, "victim", "Training")
    wait_account(clients, namespace)
    job = get_job(clients, namespace, "victim")
    url = f"http://127.0.0.1:{port}{contract.PATH}"
    pod = gang[1]
    token = pod_token(clients, pod)
    base = header(pod, job)
    idle = rss_mib(operator.process.pid)
    seen: dict[str, set[int]] = {}

    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(hostile_bodies(base))
    def fuzz(case: tuple[str, bytes]) -> None:
        kind, body = case
        status = post(url, body, token)
        seen.setdefault(kind, set()).add(status)
        # A junk field may still make a valid message (final: true), a few ranks may be
        # this node's own: those may land; what lands is bounded below.
        allowed = {400, 403, 413, 429} | ({200} if kind in ("junk field", "many ranks") else set())
        assert status in allowed, (kind, body[:200], status)

    fuzz()
    for kind, statuses in sorted(seen.items()):
        hostile_report.tried(
            "health channel POST (genuine pod token)", kind, f"answered {sorted(statuses)}"
        )

    # 20 000 distinct ranks in batches of 128: none stored (not this node's).
    refused = 0
    for first in range(10_000, 30_000, 128):
        ranks = [{"rank": r, "step": 1} for r in range(first, min(first + 128, 30_000))]
        refused += post(url, json.dumps({**base, "ranks": ranks}).encode(), token) in (403, 429)
    hostile_report.tried(
        "health channel POST (genuine pod token)",
        "20000 distinct ranks, 157 batches",
        f"{refused} refused (403/429)",
    )
    operator.assert_alive()
    grown = rss_mib(operator.process.pid) - idle
    # A legitimate batch of this node's ranks still lands, then the status says so.
    time.sleep(1.5)  # the pod's budget refills
    own = [
        {"rank": base["nodeRank"] * PPN + r, "step": 3, "stepTimesMs": [50.0]} for r in range(PPN)
    ]
    batch = json.dumps({**base, "ranks": own}).encode()
    assert post(url, batch, token) == 200
    # The same batch as fast as it goes: past two intervals' worth, 429.
    bursts = [post(url, batch, token) for _ in range(20)]
    hostile_report.tried(
        "health channel POST (genuine pod token)",
        "its own node's batch 20 times at once",
        f"{bursts.count(200)} x 200, {bursts.count(429)} x 429",
    )
    deadline = time.monotonic() + 30
    progress: dict[str, Any] = {}
    while time.monotonic() < deadline and not progress:
        progress = (get_job(clients, namespace, "victim").get("status") or {}).get("progress") or {}
        time.sleep(0.3)
    counts = metrics(metrics_port)

    assert 429 in bursts, bursts
    assert refused == len(range(10_000, 30_000, 128))
    assert grown < RSS_HEADROOM_MIB, grown
    assert counts["trainium_operator_health_stored_ranks"] <= 2 * PPN
    assert counts.get('trainium_operator_health_messages_total{outcome="rate_limited"}', 0) > 0
    assert progress, "the job's own ranks reported after the flood"
    assert progress["ranksReporting"] <= 2 * PPN
    assert progress["worldSize"] == 2 * PPN
    hostile_report.tried(
        "health channel (after the fuzzer)",
        "operator RSS and status.progress",
        f"alive, RSS +{grown:.0f} MiB, ranksReporting {progress['ranksReporting']} of {2 * PPN}",
    )


def test_a_flood_of_random_bearer_tokens_costs_no_review_and_evicts_no_good_rank(
    clients: Any,
    namespace: str,
    tmp_path: Path,
    health_operator: HealthOperator,
    hostile_report: Any,
) -> None:
    operator, port, metrics_port = health_operator
    pod, token_file = reporting_job(clients, namespace, "flooded", tmp_path)
    job = get_job(clients, namespace, "flooded")
    url = f"http://127.0.0.1:{port}{contract.PATH}"
    token = token_file.read_text()
    good = json.dumps({**header(pod, job), "worldSize": 1, "rank": 0, "step": 1}).encode()
    assert post(url, good, token) == 200
    before = metrics(metrics_port)
    statuses: set[int] = set()
    for _ in range(3000):
        statuses.add(post(url, good, secrets.token_urlsafe(64)))
    after = metrics(metrics_port)
    # Forged JWTs claiming the good pod pass the pre-filter: their reviews are limited per
    # claimed pod (429 past a burst), and refused ones never evict the good pod's review.
    forged_statuses = [post(url, good, forged_jwt(pod)) for _ in range(50)]
    forged = metrics(metrics_port)
    assert post(url, good, token) == 200
    final = metrics(metrics_port)
    operator.assert_alive()

    reviews = 'trainium_operator_health_token_reviews_total{decided_by="review"}'
    prefiltered = 'trainium_operator_health_token_reviews_total{decided_by="prefilter"}'
    assert statuses == {401}, statuses
    assert after[reviews] == before[reviews]  # no TokenReview for any of them
    assert after[prefiltered] - before[prefiltered] == 3000
    assert set(forged_statuses) <= {401, 429}, forged_statuses
    assert forged_statuses.count(429) >= 40
    assert forged[reviews] - after[reviews] <= 5  # the per-pod review burst
    assert final[reviews] == forged[reviews]  # the good token's review was still cached
    hostile_report.tried(
        "health channel POST (random bearer tokens)",
        "3000 distinct random tokens",
        f"all 401, {after[prefiltered] - before[prefiltered]:.0f} pre-filtered, "
        f"0 TokenReviews, the good rank's review kept",
    )
    hostile_report.tried(
        "health channel POST (forged JWTs of a live pod)",
        "50 distinct unsigned tokens claiming the pod",
        f"{forged_statuses.count(401)} x 401, {forged_statuses.count(429)} x 429, "
        f"{forged[reviews] - after[reviews]:.0f} TokenReviews",
    )
