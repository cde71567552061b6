"""The health channel under peering (controller/health_role.py): the acting replica's pod label,
a standby's answer, and what a replica that has just begun acting writes (progress, stalls)."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from support.local_server import free_port
from trainium_operator.contract import channel as contract
from trainium_operator.controller import health_role
from trainium_operator.controller.health_role import (
    ACTIVE,
    LABEL,
    STANDBY,
    HealthRole,
    RoleStep,
    role_step,
)
from trainium_operator.controller.health_server import HealthChannel, ServerThread, TokenCache
from trainium_operator.controller.settings import OwnPod
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.observed import Observed
from trainium_operator.lifecycle.policies.progress import progress
from trainium_operator.lifecycle.ranks import RankSample
from trainium_operator.lifecycle.snapshot import PassSettings
from trainium_operator.profiler.channel import MIN_RETRY_S, Reporter, http_send, next_wait
from unit.jobs import decide, job_document, job_ref, run_policy
from unit.test_health_channel import (
    _cache_with,
    message,
    pod_identity,
    pod_jwt,
    reporter_config,
    training_pod,
)
from unit.test_stalls import T0, frozen, job, observed, stalled_condition, training

NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
POD = OwnPod("trainium-system", "trn-trainium-operator-7d9-abcde")


# -- the role: who accepts, what the pod's label says ---------------------------------------------
@pytest.mark.parametrize(
    ("acting", "accepting", "label", "step"),
    [
        (True, True, ACTIVE, RoleStep(True, False, None)),  # steady: nothing written
        (False, False, STANDBY, RoleStep(False, False, None)),
        (True, False, STANDBY, RoleStep(True, True, ACTIVE)),  # took over
        (False, True, ACTIVE, RoleStep(False, True, STANDBY)),  # outranked, or stopping
        (False, False, None, RoleStep(False, False, STANDBY)),  # a new pod: says standby
        (False, False, ACTIVE, RoleStep(False, False, STANDBY)),  # restarted: a stale label
    ],
)
def test_the_role_writes_the_label_only_when_it_differs(
    acting: bool, accepting: bool, label: str | None, step: RoleStep
) -> None:
    assert role_step(acting, accepting, label, labelled=True) == step


def test_without_its_pod_a_replica_still_takes_its_role_but_labels_nothing() -> None:
    assert role_step(True, False, None, labelled=False) == RoleStep(True, True, None)


class FakePods:
    """The two own-pod calls of k8s.client.Cluster, counted."""

    def __init__(self, label: str | None = None, fail: int = 0) -> None:
        self.labels = {} if label is None else {LABEL: label}
        self.reads = 0
        self.writes: list[str] = []
        self.fail = fail

    def own_pod_label(self, namespace: str, name: str, key: str) -> str | None:
        assert (namespace, name) == (POD.namespace, POD.name)
        self.reads += 1
        return self.labels.get(key)

    def label_own_pod(self, namespace: str, name: str, key: str, value: str) -> None:
        assert (namespace, name) == (POD.namespace, POD.name)
        if self.fail:
            self.fail -= 1
            raise ConnectionError("the API server is away")
        self.writes.append(value)
        self.labels[key] = value


def endpoint(accepting: bool = True) -> HealthChannel:
    cache = _cache_with(("job", job_document()), ("pod", training_pod()))
    return HealthChannel(cache, TokenCache(lambda _t: pod_identity()), accepting=accepting)


def role_of(pods: FakePods, acting: list[bool], channel: HealthChannel) -> HealthRole:
    return HealthRole(channel, lambda: acting[0], pods, POD)  # type: ignore[arg-type]


def test_a_replica_labels_its_pod_once_per_change_of_role_and_restarts_its_store() -> None:
    pods, acting, channel = FakePods(), [False], endpoint(accepting=False)
    role = role_of(pods, acting, channel)
    for _ in range(5):
        role.check()
    assert (pods.reads, pods.writes, channel.accepting) == (1, [STANDBY], False)

    channel.store.put(message(), "n")  # heard while standing by: never kept
    acting[0] = True
    for _ in range(5):
        role.check()
    assert (pods.writes, channel.accepting) == ([STANDBY, ACTIVE], True)
    assert channel.store.jobs() == []
    since = channel.store.since

    acting[0] = False
    role.check()
    assert (pods.writes, channel.accepting) == ([STANDBY, ACTIVE, STANDBY], False)
    assert channel.store.since >= since
    assert pods.reads == 1, "read once; every later write is known"


def test_stopping_the_acting_replica_labels_it_standby_and_drains_before_closing() -> None:
    pods, channel = FakePods(ACTIVE), endpoint(accepting=True)
    role = role_of(pods, [True], channel)
    role.check()
    assert pods.writes == []
    assert role.drain_seconds() == 0.0
    step = role.check(stopping=True)
    assert step == RoleStep(False, True, STANDBY)
    assert (pods.labels[LABEL], channel.accepting) == (STANDBY, False)
    assert 0 < role.drain_seconds() <= health_role.DRAIN_SECONDS


def test_a_failed_label_write_is_retried_at_the_next_check() -> None:
    pods, channel = FakePods(STANDBY, fail=1), endpoint(accepting=False)
    role = role_of(pods, [True], channel)
    assert role.check_logged() is None
    assert channel.accepting, "the role is taken even while the label cannot be written"
    assert role.check_logged() == RoleStep(True, False, ACTIVE)
    assert pods.writes == [ACTIVE]


# -- a standby's answer ------------------------------------------------------------------------
def test_a_standby_answers_503_with_retry_after_and_keeps_nothing() -> None:
    channel = endpoint(accepting=False)
    port = free_port()
    server = ServerThread(channel, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}{contract.PATH}"
    try:
        request = urllib.request.Request(
            url,
            data=message().to_json(),
            method="POST",
            headers={"Authorization": f"Bearer {pod_jwt()}"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 503
        assert refused.value.headers["Retry-After"] == str(contract.RETRY_AFTER_S)
        assert json.loads(refused.value.read())["accepted"] is False
        # The rank's client reads it as "retry that soon".
        reply = http_send(url, message().to_json(), pod_jwt())
        assert (reply["status"], reply["retryAfterS"]) == (503, contract.RETRY_AFTER_S)
    finally:
        server.stop()
    assert channel.store.jobs() == []
    assert channel.counted() == {"standby": 2}


@pytest.mark.parametrize(
    ("previous", "sent", "retry_after", "wait"),
    [
        (5.0, True, None, 5.0),  # sent: the interval
        (5.0, False, 1.0, 1.0),  # a standby asked: that soon
        (20.0, False, 1.0, 1.0),  # ... even after backing off
        (5.0, False, 30.0, 5.0),  # never more than an interval
        (5.0, False, 0.0, MIN_RETRY_S),  # never a spin
        (5.0, False, None, 10.0),  # the operator away: doubled
        (20.0, False, None, 20.0),  # up to the most
    ],
)
def test_a_rank_retries_a_standbys_refusal_within_an_interval_instead_of_backing_off(
    previous: float, sent: bool, retry_after: float | None, wait: float
) -> None:
    got = next_wait(
        previous, sent=sent, retry_after_s=retry_after, interval_s=5.0, max_backoff_s=20.0
    )
    assert got == wait


# -- a replica that has just begun acting ------------------------------------------------------
def rank(number: int, step: int, *, ms: float = 500.0) -> RankSample:
    return RankSample(
        rank=number, attempt=0, world_size=4, step=step, step_times_ms=(ms,) * 16, received=NOW
    )


WRITTEN = {
    "attempt": 0,
    "step": 100,
    "maxStep": 101,
    "ranksReporting": 4,
    "worldSize": 4,
    "lastProgressTime": "2026-12-02T11:59:50Z",
    "updateTime": "2026-12-02T11:59:50Z",
}


def progress_after(ranks: list[RankSample], since: datetime) -> Any:
    """status.progress after one pass of a replica that began keeping messages at `since`."""
    job = job_ref(health={"reportIntervalSeconds": 1})
    status = {"phase": "Training", "attempt": 0, "progress": dict(WRITTEN)}
    seen = Observed((), {}, True, {}, NOW)
    plan = run_policy(
        progress,
        job,
        status,
        seen,
        ranks=tuple(ranks),
        ranks_since=since,
        settings=PassSettings(progress_interval=1.0),
    )
    return plan.status["progress"]


def test_after_a_failover_progress_waits_for_as_many_ranks_as_it_counted_then_moves_on() -> None:
    just_now = NOW - timedelta(seconds=1)
    # One fast rank heard: its step is not the gang's; nothing is blanked or rewritten.
    kept = progress_after([rank(3, 106)], just_now)
    assert (kept["step"], kept["ranksReporting"], kept["updateTime"]) == (
        100,
        4,
        WRITTEN["updateTime"],
    )
    # Every rank heard again: each restored its own figures.
    full = progress_after([rank(0, 104), rank(1, 105), rank(2, 104), rank(3, 106)], just_now)
    assert (full["step"], full["maxStep"], full["ranksReporting"]) == (104, 106, 4)
    assert full["stepTimeP50Ms"] == 500.0


def test_a_rank_still_unheard_after_the_warm_up_no_longer_holds_the_figures() -> None:
    long_ago = NOW - timedelta(seconds=10)  # past 2 report intervals and the margin
    moved = progress_after([rank(0, 104), rank(1, 105)], long_ago)
    assert (moved["step"], moved["ranksReporting"]) == (104, 2)


def test_after_a_failover_progress_never_goes_back_even_once_every_rank_is_heard() -> None:
    # A late message of a slow rank (step 99 < 100 written): what was said stays.
    kept = progress_after([rank(0, 99), rank(1, 105), rank(2, 104), rank(3, 106)], NOW)
    assert kept["step"] == 100


def test_a_stall_is_not_raised_before_every_rank_was_heard_since_a_failover() -> None:
    j = job(reportIntervalSeconds=1)
    status = training(j)
    now = T0 + timedelta(seconds=400)
    ranks = frozen(now, T0)  # both ranks' steps began 400 s ago: a stall, once both are heard

    def stall_pass(heard: list[RankSample], acting_for: float) -> Decision:
        since = now - timedelta(seconds=acting_for)
        return decide(j, status, observed(j, now), ranks=tuple(heard), ranks_since=since)

    only_one = stall_pass(ranks[1:], 1.0)
    assert stalled_condition(only_one.status) is None
    assert only_one.requeue_after == pytest.approx(3.0)  # 2 intervals + 2 s margin - 1 s
    both = stall_pass(ranks, 1.0)
    assert (stalled_condition(both.status) or {}).get("status") == "True"
    late = stall_pass(ranks[:1], 7.0)
    assert (stalled_condition(late.status) or {}).get("status") == "True", "a bounded wait"


def test_failed_sends_are_retried_at_the_report_interval_so_a_new_replica_hears_within_one(
    tmp_path: Path,
) -> None:
    # The default report interval, 5 s: past the 1 s floor.
    reporter = Reporter(dataclasses.replace(reporter_config(tmp_path), interval_s=5.0))
    interval = reporter.config.interval_s
    assert reporter.max_backoff_s == interval
    wait = interval
    for _ in range(5):  # the operator away for a while: no replica acts, the Service has none
        wait = next_wait(
            wait,
            sent=False,
            retry_after_s=None,
            interval_s=interval,
            max_backoff_s=reporter.max_backoff_s,
        )
        assert wait == interval  # never backed off past it
