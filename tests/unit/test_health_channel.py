"""The health channel's parts without a cluster: the contract, who may report, the token cache,
the pod's token and env, and the rank's reporter against a local endpoint."""

from __future__ import annotations

import base64
import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from trainium_operator.builders import pods
from trainium_operator.builders.job import Stage
from trainium_operator.contract import channel as contract
from trainium_operator.contract.channel import ProgressMessage, parse_message
from trainium_operator.controller.cache import ClusterCache
from trainium_operator.controller.channel_auth import TokenIdentity, authorize
from trainium_operator.controller.health_server import HealthChannel, ProgressStore, TokenCache
from trainium_operator.k8s.informer import WatchEvent
from trainium_operator.k8s.reviews import ReviewedUser
from trainium_operator.profiler.channel import ChannelConfig, Reporter
from unit.conftest import Posts
from unit.jobs import UID, job_document, job_ref

URL = "http://trainium-operator-health.trainium-system.svc:8090/v1/progress"


def message(**changes: Any) -> ProgressMessage:
    base = ProgressMessage(
        job="bert",
        namespace="team-a",
        uid=UID,
        attempt=0,
        rank=33,  # node 1 of 2, 32 processes each (trn1.32xlarge's default)
        node_rank=1,
        world_size=64,
        step=12,
        step_times_ms=(101.5, 99.0),
        samples=96,
    )
    return dataclasses.replace(base, **changes)


def pod_jwt(
    pod: str = "bert-train-0-1",
    uid: str = "pod-uid-1",
    audience: str = contract.AUDIENCE,
    nonce: str = "",
    namespace: str = "team-a",
) -> str:
    """A token shaped as the kubelet's projected, pod-bound one (its signature is the review's
    business: the fakes here review by content)."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    claims = {
        "aud": [audience],
        "exp": int(time.time()) + 3600,
        "kubernetes.io": {
            "namespace": namespace,
            "pod": {"name": pod, "uid": uid},
            "serviceaccount": {"name": "default", "uid": "sa-uid"},
        },
        "nonce": nonce,
    }
    return f"{part({'alg': 'RS256'})}.{part(claims)}.signature"


def training_pod(name: str = "bert-train-0-1", **label_changes: str) -> dict[str, Any]:
    labels = {
        "trainium.dev/job-name": "bert",
        "trainium.dev/stage": "train",
        "trainium.dev/attempt": "0",
        "trainium.dev/node-rank": "1",
        **label_changes,
    }
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": "pod-uid-1",
            "labels": labels,
            "ownerReferences": [{"uid": UID}],
        },
        "spec": {"nodeName": "trn-node-7"},
    }


def pod_identity(
    pod: str = "bert-train-0-1",
    uid: str = "pod-uid-1",
    *,
    username: str = "system:serviceaccount:team-a:default",
    extra: tuple[tuple[str, tuple[str, ...]], ...] | None = None,
    **changes: Any,
) -> TokenIdentity:
    """What a TokenReview says of a training pod's token (`changes`: of the review's result)."""
    if extra is None:
        extra = ((contract.CLAIM_POD_NAME, (pod,)), (contract.CLAIM_POD_UID, (uid,)))
    base = TokenIdentity(True, ReviewedUser(username, extra=extra), audiences=(contract.AUDIENCE,))
    return dataclasses.replace(base, **changes)


# -- the contract ---------------------------------------------------------------------------
def test_a_message_round_trips_through_its_json() -> None:
    sent = message(tokens=4096, sequence=7)
    assert parse_message(sent.to_json()) == sent


def test_a_message_with_a_step_age_a_stack_answer_and_final_round_trips() -> None:
    sent = message(step_age_ms=1234.5, stacks_dumped="a0-20261203T080000Z", final=True)
    assert parse_message(sent.to_json()) == sent


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"stepAgeMs": -1}, "stepAgeMs"),
        ({"stacksDumped": "../../etc"}, "stacksDumped"),
        ({"final": "yes"}, "final"),
    ],
)
def test_a_bad_step_age_stack_answer_or_final_flag_is_refused(
    extra: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        parse_message(json.dumps({**json.loads(message().to_json()), **extra}).encode())


def test_a_stack_request_id_is_a_path_component_only() -> None:
    assert contract.stacks_file("/d/stacks", "a0-1", 3) == "/d/stacks/a0-1/rank-3.txt"
    with pytest.raises(ValueError, match="not a stack request id"):
        contract.stacks_file("/d/stacks", "../x", 3)


def test_a_rank_that_has_not_started_a_step_reports_step_minus_one() -> None:
    assert parse_message(message(step=-1, step_times_ms=()).to_json()).step == -1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"[1]", "not a JSON object"),
        (b"{", "not JSON"),
        (json.dumps({**json.loads(message().to_json()), "rank": -1}).encode(), "rank"),
        (json.dumps({**json.loads(message().to_json()), "attempt": True}).encode(), "attempt"),
        (json.dumps({**json.loads(message().to_json()), "job": ""}).encode(), "job"),
        (
            json.dumps({**json.loads(message().to_json()), "stepTimesMs": [1.0] * 65}).encode(),
            "stepTimesMs",
        ),
        (
            json.dumps({**json.loads(message().to_json()), "stepTimesMs": [-3]}).encode(),
            "stepTimesMs",
        ),
        (b" " * (contract.MAX_BODY_BYTES + 1), "larger than"),
    ],
)
def test_a_malformed_message_is_refused_naming_the_field(body: bytes, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        parse_message(body)


# -- who may report ---------------------------------------------------------------------------
def test_a_training_pod_of_the_job_may_report_its_progress() -> None:
    verdict = authorize(message(), pod_identity(), training_pod(), job_document())
    assert verdict.accepted, verdict.reason


@pytest.mark.parametrize(
    ("identity", "pod", "reason"),
    [
        (TokenIdentity(False, error="expired"), training_pod(), "not valid: expired"),
        (pod_identity(audiences=("https://kubernetes.default.svc",)), training_pod(), "audience"),
        (pod_identity(username="alice"), training_pod(), "not a ServiceAccount token"),
        (pod_identity(extra=()), training_pod(), "not bound to a pod"),
        (
            pod_identity(username="system:serviceaccount:team-b:default"),
            training_pod(),
            "namespace team-b",
        ),
        (pod_identity(), None, "does not exist"),
        (pod_identity(uid="an-earlier-pod"), training_pod(), "not the pod the token was issued to"),
        (
            pod_identity(pod="other-train-0-1"),
            training_pod("other-train-0-1", **{"trainium.dev/job-name": "other"}),
            "not a training pod of job bert",
        ),
        (pod_identity(), training_pod(**{"trainium.dev/stage": "compile"}), "not a training pod"),
        (pod_identity(), training_pod(**{"trainium.dev/attempt": "1"}), "attempt 1"),
        (pod_identity(), training_pod(**{"trainium.dev/node-rank": "0"}), "node rank 0"),
    ],
)
def test_a_message_not_from_a_training_pod_of_that_job_is_refused(
    identity: TokenIdentity, pod: dict[str, Any] | None, reason: str
) -> None:
    verdict = authorize(message(), identity, pod, job_document())
    assert not verdict.accepted
    assert reason in verdict.reason


def test_a_pod_not_owned_by_the_job_uid_is_refused() -> None:
    pod = training_pod()
    pod["metadata"]["ownerReferences"] = [{"uid": "a-deleted-job-of-that-name"}]
    assert (
        "not owned by job uid" in authorize(message(), pod_identity(), pod, job_document()).reason
    )


def test_a_job_with_the_channel_off_or_gone_gets_no_progress() -> None:
    off = job_document(health={"enabled": False})
    assert (
        "health.enabled false" in authorize(message(), pod_identity(), training_pod(), off).reason
    )
    assert "is gone" in authorize(message(), pod_identity(), training_pod(), None).reason


# -- the endpoint's logic (the HTTP wiring runs in tests/integration/test_health_channel.py) -----
def _cache_with(*objects: tuple[str, dict[str, Any]]) -> ClusterCache:
    cache = ClusterCache()
    for kind, obj in objects:
        event = WatchEvent("ADDED", obj)
        (cache.on_job if kind == "job" else cache.on_pod)(event)
    return cache


def test_the_endpoint_reviews_each_token_once_per_ttl_and_stores_the_newest_message() -> None:
    reviews: list[str] = []
    now = [0.0]

    def review(token: str) -> TokenIdentity:
        reviews.append(token)
        return pod_identity()

    cache = _cache_with(("job", job_document()), ("pod", training_pod()))
    channel = HealthChannel(cache, TokenCache(review, clock=lambda: now[0]))
    token = pod_jwt()
    for step in (10, 11, 12):
        assert channel.receive(token, message(step=step).to_json())[0] == 200
    assert reviews == [token]
    now[0] = 61.0
    assert channel.receive(token, message(step=13).to_json())[0] == 200
    assert reviews == [token, token]
    (report,) = channel.store.ranks(("team-a", "bert")).values()
    assert (report.step, report.node) == (13, "trn-node-7")


def test_the_endpoint_refuses_without_a_token_a_bad_body_and_a_forged_job() -> None:
    cache = _cache_with(("job", job_document()), ("pod", training_pod()))
    other = job_document()
    other["metadata"] = {**other["metadata"], "name": "other", "uid": "other-uid"}
    cache.on_job(WatchEvent("ADDED", other))
    channel = HealthChannel(cache, TokenCache(lambda _t: pod_identity()))
    assert channel.receive("", message().to_json())[0] == 401
    assert channel.receive(pod_jwt(), b"not json")[0] == 400
    status, verdict = channel.receive(pod_jwt(), message(job="other", uid="other-uid").to_json())
    assert status == 403
    assert "not a training pod of job other" in verdict.reason
    assert channel.store.jobs() == []
    assert channel.counts == {"refused": 2, "malformed": 1}


def test_the_endpoint_asks_a_stalled_attempts_ranks_for_their_stacks_until_they_answered() -> None:
    job = job_document()
    request = "a0-20261203T080000Z"
    job["status"] = {
        "stall": {"attempt": 0, "stacks": {"requestId": request, "state": "Requested"}}
    }
    channel = HealthChannel(
        _cache_with(("job", job), ("pod", training_pod())), TokenCache(lambda _t: pod_identity())
    )
    status, reply = channel.answer(pod_jwt(), message().to_json())
    assert status == 200
    assert json.loads(reply)["requests"] == {contract.REQUEST_DUMP_STACKS: request}
    _, reply = channel.answer(pod_jwt(), message(stacks_dumped=request).to_json())
    assert json.loads(reply)["requests"] == {}
    assert channel.store.take_urgent() == [("team-a", "bert")]  # the answer wakes the job


def test_the_endpoint_answers_unavailable_when_the_token_cannot_be_reviewed() -> None:
    def review(_token: str) -> TokenIdentity:
        raise ConnectionError("API server away")

    cache = _cache_with(("job", job_document()), ("pod", training_pod()))
    channel = HealthChannel(cache, TokenCache(review))
    assert channel.receive(pod_jwt(), message().to_json())[0] == 503


def test_a_late_message_of_an_earlier_gang_does_not_replace_the_new_gangs_progress() -> None:
    store = ProgressStore()
    store.put(message(attempt=0, rank=0, step=50), "n0")
    store.put(message(attempt=1, rank=1, step=2), "n1")
    store.put(message(attempt=0, rank=1, step=51), "n0")
    ranks = store.ranks(("team-a", "bert"))
    assert {r: (v.attempt, v.step) for r, v in ranks.items()} == {1: (1, 2)}


# -- the pod -----------------------------------------------------------------------------------
def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def test_a_training_pod_gets_the_channel_env_and_a_pod_bound_audience_token() -> None:
    job = dataclasses.replace(job_ref(health={"reportIntervalSeconds": 2}), health_url=URL)
    pod = pods.pod(job, Stage.TRAIN, 0, 1)
    env = _env(pod)
    assert env[contract.URL] == URL
    assert env[contract.TOKEN_FILE] == contract.TOKEN_PATH
    assert env[contract.INTERVAL_S] == "2"
    assert env[contract.STACKS_DIR] == "/data/profiles/team-a/bert/0/stacks"
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == contract.TOKEN_VOLUME]
    assert volume["projected"]["sources"] == [
        {
            "serviceAccountToken": {
                "audience": contract.AUDIENCE,
                "expirationSeconds": 3600,
                "path": "token",
            }
        }
    ]
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {
        "name": contract.TOKEN_VOLUME,
        "mountPath": contract.TOKEN_DIR,
        "readOnly": True,
    } in mounts
    assert pod["spec"]["automountServiceAccountToken"] is False  # still no API credential


@pytest.mark.parametrize(
    ("health", "url", "stage"),
    [
        ({"enabled": False}, URL, Stage.TRAIN),
        ({}, None, Stage.TRAIN),
        ({}, URL, Stage.COMPILE),
    ],
)
def test_no_channel_for_a_job_that_disables_it_an_operator_without_one_or_compiling(
    health: dict[str, Any], url: str | None, stage: Stage
) -> None:
    job = dataclasses.replace(job_ref(health=health), health_url=url)
    pod = pods.pod(job, stage, 0, 0)
    assert not set(_env(pod)) & set(contract.OPERATOR_SET)
    assert contract.TOKEN_VOLUME not in {v["name"] for v in pod["spec"]["volumes"]}


# -- the rank's reporter ----------------------------------------------------------------------
def channel_environ(url: str, token_file: Path) -> dict[str, str]:
    return {
        **contract.channel_env(url, 0.05, str(token_file.parent / "stacks")),
        contract.TOKEN_FILE: str(token_file),
        "TRAINIUM_JOB_NAME": "bert",
        "TRAINIUM_JOB_NAMESPACE": "team-a",
        "TRAINIUM_JOB_UID": UID,
        "TRAINIUM_ATTEMPT": "0",
        "RANK": "3",
        "GROUP_RANK": "1",
        "WORLD_SIZE": "4",
    }


def reporter_config(tmp_path: Path, url: str = "http://unused/") -> ChannelConfig:
    """Rank 3's channel settings (channel_environ), its token file written under tmp_path."""
    token = tmp_path / "token"
    token.write_text("t")
    config = ChannelConfig.from_env(channel_environ(url, token))
    assert config is not None
    return config


def test_the_reporter_sends_step_and_step_times_with_the_current_token(
    endpoint: tuple[str, Posts], tmp_path: Path
) -> None:
    url, received = endpoint
    reporter = Reporter(reporter_config(tmp_path, url))
    token = tmp_path / "token"
    token.write_text("first\n")
    for number in range(5):
        reporter.on_step(number)
    reporter.report(samples=32, tokens=4096)
    assert reporter.send_once()
    token.write_text("rotated")  # the kubelet rotates the token: the next send reads it again
    reporter.on_step(5)
    assert reporter.send_once()
    (auth1, first), (auth2, second) = received
    assert (auth1, auth2) == ("Bearer first", "Bearer rotated")
    sent = parse_message(json.dumps(first).encode())
    assert (sent.job, sent.rank, sent.node_rank, sent.step, sent.samples, sent.tokens) == (
        "bert",
        3,
        1,
        4,
        32,
        4096,
    )
    assert len(sent.step_times_ms) == 4
    assert second["step"] == 5
    assert second["sequence"] == first["sequence"] + 1


def test_the_reporter_never_blocks_the_training_loop_when_the_operator_is_away(
    tmp_path: Path,
) -> None:
    # The operator never answers: every send hangs until the test lets it fail. The training
    # loop's steps still all return, and no send ever runs on the training thread.
    release, tried = threading.Event(), threading.Event()
    senders: list[int] = []

    def hanging_send(url: str, body: bytes, token: str) -> dict[str, Any]:
        senders.append(threading.get_ident())
        tried.set()
        release.wait(timeout=30)
        raise OSError("connection refused")

    config = reporter_config(tmp_path, "http://127.0.0.1:9/v1/progress")
    reporter = Reporter(config, send=hanging_send)
    reporter.start()
    for number in range(10):
        reporter.on_step(number)
    assert tried.wait(timeout=30), "the reporter thread never tried to send"
    for number in range(10, 20_000):
        reporter.on_step(number)  # returns while a send hangs: nothing queues behind it
    release.set()
    reporter.stop(final=False)
    assert reporter.sent == 0
    assert threading.get_ident() not in senders, "a send ran on the training thread"
    assert reporter.message().step == 19_999


def test_asked_for_its_stacks_a_rank_writes_every_threads_stack_once_and_says_so_at_once(
    tmp_path: Path,
) -> None:
    sent: list[dict[str, Any]] = []
    request = "a0-20261203T080000Z"

    def send(_url: str, body: bytes, _token: str) -> dict[str, Any]:
        sent.append(json.loads(body))
        return {"accepted": True, "requests": {contract.REQUEST_DUMP_STACKS: request}}

    reporter = Reporter(reporter_config(tmp_path), send=send)
    reporter.on_step(7)
    assert reporter.send_once()
    path = tmp_path / "stacks" / request / "rank-3.txt"
    text = path.read_text()
    assert "Thread MainThread" in text
    assert "test_asked_for_its_stacks" in text  # this very frame, as the training loop's would
    assert reporter.send_once()  # asked again (the operator has not heard the answer yet)
    assert reporter.stacks_written == [str(path)]  # written once per request
    assert "stacksDumped" not in sent[0]
    assert sent[1]["stacksDumped"] == request
    assert sent[0]["stepAgeMs"] >= 0


def test_a_rank_stopping_sends_a_final_message(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []

    def send(_url: str, body: bytes, _token: str) -> dict[str, Any]:
        sent.append(json.loads(body))
        return {"accepted": True}

    reporter = Reporter(reporter_config(tmp_path), send=send)
    reporter.start()
    reporter.stop()
    reporter.thread.join(5)
    assert sent[-1]["final"] is True


def test_no_reporter_without_the_operators_env_or_a_complete_identity(tmp_path: Path) -> None:
    assert ChannelConfig.from_env({}) is None
    environ = channel_environ("http://127.0.0.1:9/", tmp_path / "t")
    del environ["TRAINIUM_JOB_UID"]
    assert ChannelConfig.from_env(environ) is None


def test_a_restarted_operator_asks_its_ranks_to_retry_until_its_cache_is_filled() -> None:
    synced = [False]
    channel = HealthChannel(
        _cache_with(), TokenCache(lambda _t: pod_identity()), synced=lambda: synced[0]
    )
    assert channel.receive(pod_jwt(), message().to_json())[0] == 503
    synced[0] = True
    assert channel.receive(pod_jwt(), message().to_json())[0] == 403  # now it knows: no such pod


def test_the_spec_refuses_a_pod_template_volume_or_mount_that_takes_the_tokens_place() -> None:
    from trainium_operator.api import spec as spec_model

    assert spec_model.HEALTH_TOKEN_VOLUME == contract.TOKEN_VOLUME
    assert spec_model.HEALTH_TOKEN_DIR == contract.TOKEN_DIR
    from trainium_operator.lifecycle.parse import parse_job

    taken = {"spec": {"volumes": [{"name": contract.TOKEN_VOLUME, "emptyDir": {}}]}}
    problems = parse_job(job_document(podTemplate=taken))
    assert isinstance(problems, list)
    assert "'trainium-health-token' is the operator's" in problems[0]


def test_render_shows_the_channel_as_an_operator_serving_it_would_build_the_pods() -> None:
    from click.testing import CliRunner

    from trainium_operator.cli import main

    example = str(Path(__file__).resolve().parents[2] / "examples" / "bert-large-pretrain.yaml")
    served = CliRunner().invoke(
        main, ["render", "-f", example, "--stage", "train", "--health-url", URL]
    )
    plain = CliRunner().invoke(main, ["render", "-f", example, "--stage", "train"])
    assert served.exit_code == 0, served.output
    assert f"value: {URL}" in served.output
    assert f"audience: {contract.AUDIENCE}" in served.output
    assert contract.URL not in plain.output
