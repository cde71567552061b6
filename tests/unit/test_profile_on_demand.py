"""Profiling on demand: the annotation's parsing and the policy
(lifecycle/policies/on_demand_profile.py), the endpoint's request, and the rank's capture
switch (profiler/capture.py, channel.py)."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from trainium_operator.api.status import validated_status
from trainium_operator.builders.job import JobRef
from trainium_operator.contract import channel as contract
from trainium_operator.lifecycle import machine
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.policies.on_demand_profile import (
    ANNOTATION,
    STATUS_KEY,
    capture_requests_for,
    on_demand_profile,
    parse_profile_steps,
)
from trainium_operator.lifecycle.policies.on_demand_upload import on_demand_upload
from trainium_operator.lifecycle.policies.profile_upload import UploadDefaults
from trainium_operator.lifecycle.ranks import RankSample
from trainium_operator.lifecycle.snapshot import PassSettings
from trainium_operator.profiler import capture, channel
from trainium_operator.profiler.channel import ChannelConfig, Reporter
from trainium_operator.profiler.events import EventKind
from trainium_operator.profiler.format import RankFileReader
from unit.jobs import UID, continue_with, job_ref

T0 = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
URL = "http://trainium-operator-health.trainium-system.svc:8090/v1/progress"


def job(**health: Any) -> JobRef:
    # One process per node: on-demand profiling sizes the gang from the spec (2 ranks here).
    return dataclasses.replace(job_ref(processesPerNode=1, health=health), health_url=URL)


def training(attempt: int = 0, **more: Any) -> dict[str, Any]:
    return {"phase": "Training", "attempt": attempt, **more}


def rank(number: int, attempt: int = 0, **more: Any) -> RankSample:
    return RankSample(
        rank=number,
        attempt=attempt,
        world_size=2,
        step=10,
        step_times_ms=(100.0,),
        received=T0,
        **more,
    )


def run(
    status: dict[str, Any],
    annotations: dict[str, str],
    ranks: list[RankSample],
    now: datetime = T0,
    the_job: JobRef | None = None,
) -> Decision:
    decision = Decision(status=json.loads(json.dumps(status)))
    continue_with(
        on_demand_profile,
        the_job or job(),
        decision,
        now,
        annotations=annotations,
        ranks=None if ranks is None else tuple(ranks),
    )
    validated_status(decision.status)
    return decision


# -- the annotation -----------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "steps"), [("+1", 1), ("+20", 20), (" +1000 ", 1000)])
def test_plus_n_within_the_bound_is_a_number_of_steps(value: str, steps: int) -> None:
    assert parse_profile_steps(value) == steps


@pytest.mark.parametrize("value", ["20", "+0", "+1001", "-5", "+", "+2x", "", "+99999999"])
def test_anything_else_is_refused_naming_the_annotation_and_the_fix(value: str) -> None:
    with pytest.raises(ValueError, match=r"trainium\.dev/profile-steps.*set it to \+N"):
        parse_profile_steps(value)


# -- the policy ---------------------------------------------------------------------------------
def test_an_annotated_training_job_records_the_request_then_the_annotation_is_removed() -> None:
    decision = run(training(), {ANNOTATION: "+20"}, [rank(0), rank(1)])
    record = decision.status[STATUS_KEY]
    assert record == {
        "requestId": "p0-20261203T080000Z",
        "attempt": 0,
        "steps": 20,
        "requestedTime": "2026-12-03T08:00:00Z",
        "path": "/data/profiles/team-a/bert/0/on-demand/p0-20261203T080000Z",
        "state": "Requested",
        "annotation": "+20",
        "ranksExpected": 2,
        "ranksCaptured": 0,
    }
    assert decision.remove_annotations == [(ANNOTATION, "+20")]
    assert [(e.type, e.reason) for e in decision.events] == [("Normal", "ProfileRequested")]
    assert "next 20 steps" in decision.events[0].message


def test_a_request_already_recorded_is_not_served_twice_only_its_annotation_removed() -> None:
    first = run(training(), {ANNOTATION: "+20"}, [])
    # The removal did not happen (an operator restart between the two writes): same value.
    again = run(first.status, {ANNOTATION: "+20"}, [], now=T0 + timedelta(seconds=5))
    assert again.status[STATUS_KEY]["requestId"] == first.status[STATUS_KEY]["requestId"]
    assert again.remove_annotations == [(ANNOTATION, "+20")]
    assert again.events == []
    removed = run(again.status, {}, [])
    assert "annotation" not in removed.status[STATUS_KEY]
    assert removed.remove_annotations == []


@pytest.mark.parametrize(
    ("status", "annotation", "the_job", "says"),
    [
        (training(), "20", None, r"is not \+N"),
        (training(), "+5000", None, "asks for 5000 steps"),
        ({"phase": "Pending", "attempt": 0}, "+20", None, "not Training"),
        (training(), "+20", "off", "spec.health.enabled is false"),
    ],
)
def test_a_bad_value_or_a_job_not_training_gets_one_warning_and_the_annotation_removed(
    status: dict[str, Any], annotation: str, the_job: str | None, says: str
) -> None:
    subject = job(enabled=False) if the_job == "off" else job()
    decision = run(status, {ANNOTATION: annotation}, [], the_job=subject)
    assert STATUS_KEY not in decision.status
    assert decision.remove_annotations == [(ANNOTATION, annotation)]
    ((kind, reason, message),) = [(e.type, e.reason, e.message) for e in decision.events]
    assert (kind, reason) == ("Warning", "ProfileRequestRefused")
    assert ANNOTATION in message
    assert re.search(says, message), message


def test_a_second_request_while_one_captures_is_refused() -> None:
    first = run(training(), {ANNOTATION: "+20"}, [])
    consumed = run(first.status, {}, [])
    second = run(consumed.status, {ANNOTATION: "+5"}, [])
    assert second.status[STATUS_KEY]["requestId"] == first.status[STATUS_KEY]["requestId"]
    assert "still requested" in second.events[0].message


def test_the_request_goes_capturing_then_captured_once_every_rank_completed_its_files() -> None:
    requested = run(training(), {ANNOTATION: "+3"}, []).status
    request = requested[STATUS_KEY]["requestId"]
    capturing = run(requested, {}, [rank(0, profile_capturing=request), rank(1)])
    assert capturing.status[STATUS_KEY]["state"] == "Capturing"
    assert capturing.events == []
    half = run(capturing.status, {}, [rank(0, profile_captured=request), rank(1)])
    assert half.status[STATUS_KEY]["state"] == "Capturing"
    assert half.status[STATUS_KEY]["ranksCaptured"] == 1
    done = run(
        half.status,
        {},
        [rank(0, profile_captured=request), rank(1, profile_captured=request)],
        now=T0 + timedelta(seconds=9),
    )
    record = done.status[STATUS_KEY]
    assert (record["state"], record["ranksCaptured"], record["ranksExpected"]) == ("Captured", 2, 2)
    assert record["completeTime"] == "2026-12-03T08:00:09Z"
    ((kind, reason, message),) = [(e.type, e.reason, e.message) for e in done.events]
    assert (kind, reason) == ("Normal", "ProfileCaptured")
    assert record["path"] in message
    # Captured: the replies ask nothing more, and a new annotation is a new request.
    assert capture_requests_for({"status": done.status}, 0, "") == {}
    later = run(done.status, {ANNOTATION: "+3"}, [], now=T0 + timedelta(minutes=1))
    assert later.status[STATUS_KEY]["requestId"] == "p0-20261203T080100Z"


def test_a_restart_before_every_rank_captured_leaves_the_request_incomplete() -> None:
    requested = run(training(), {ANNOTATION: "+3"}, []).status
    request = requested[STATUS_KEY]["requestId"]
    restarted = run({**requested, "attempt": 1}, {}, [rank(0, profile_captured=request), rank(1)])
    record = restarted.status[STATUS_KEY]
    assert (record["state"], record["missingRanks"]) == ("Incomplete", [1])
    assert [(e.type, e.reason) for e in restarted.events] == [("Warning", "ProfileIncomplete")]


def captured_status() -> dict[str, Any]:
    requested = run(training(), {ANNOTATION: "+3"}, []).status
    request = requested[STATUS_KEY]["requestId"]
    ranks = [rank(0, profile_captured=request), rank(1, profile_captured=request)]
    return run(requested, {}, ranks).status


def upload_pass(
    decision: Decision, pods: tuple[dict[str, Any], ...], defaults: UploadDefaults
) -> None:
    """The on-demand upload policy on `decision`, with these upload pods and chart defaults."""
    settings = PassSettings(defaults)
    continue_with(on_demand_upload, job(), decision, T0, upload_pods=pods, settings=settings)


def test_a_captured_profile_gets_its_own_upload_pod_when_s3_is_configured() -> None:
    defaults = UploadDefaults(s3_uri="s3://bucket/profiles", image="op:1")
    decision = Decision(status=captured_status())
    upload_pass(decision, (), defaults)
    (pod,) = decision.side_create
    record = decision.status[STATUS_KEY]
    assert pod["metadata"]["name"] == "bert-profile-upload-p0-20261203t080000z"
    (container,) = pod["spec"]["containers"]
    assert container["command"][-2:] == [
        "/profile",
        "s3://bucket/profiles/team-a/bert/0/on-demand/p0-20261203T080000Z",
    ]
    assert container["volumeMounts"][0]["subPath"] == record["path"].removeprefix("/data/")
    assert record["upload"]["state"] == "Pending"
    validated_status(decision.status)
    # The pod succeeded: recorded once, with its event; never created again.
    pod["status"] = {"phase": "Succeeded"}
    done = Decision(status=decision.status)
    upload_pass(done, (pod,), defaults)
    assert done.status[STATUS_KEY]["upload"]["state"] == "Succeeded"
    assert [(e.type, e.reason) for e in done.events] == [("Normal", "ProfileUploaded")]
    later = Decision(status=done.status)
    upload_pass(later, (), defaults)
    assert (later.side_create, later.events) == ([], [])


def test_without_an_s3_uri_or_before_captured_nothing_is_uploaded() -> None:
    for status, defaults in [
        (captured_status(), UploadDefaults()),
        (run(training(), {ANNOTATION: "+3"}, []).status, UploadDefaults(s3_uri="s3://b/p")),
    ]:
        decision = Decision(status=status)
        upload_pass(decision, (), defaults)
        assert decision.side_create == []


def test_a_refused_upload_pod_is_a_failed_upload_not_a_failed_job() -> None:
    refused = machine.decide_finding(
        captured_status(), 1, T0, None, machine.UploadPodRefused("pod-x", "quota exceeded")
    )
    status, message = refused.status, refused.events[0].message
    assert status[STATUS_KEY]["upload"]["state"] == "Failed"
    assert "quota exceeded" in message
    assert status["phase"] == "Training"
    validated_status(status)


def test_the_endpoint_asks_the_attempts_ranks_until_each_says_it_captured() -> None:
    status = run(training(), {ANNOTATION: "+7"}, []).status
    request = status[STATUS_KEY]["requestId"]
    body = {"status": status}
    asked = {contract.REQUEST_CAPTURE_STEPS: {"id": request, "steps": 7}}
    assert capture_requests_for(body, 0, "") == asked
    assert capture_requests_for(body, 0, request) == {}
    assert capture_requests_for(body, 1, "") == {}  # another attempt's ranks
    assert capture_requests_for(None, 0, "") == {}


def test_the_endpoint_reads_a_request_past_unknown_fields_and_skips_an_unreadable_one() -> None:
    status = run(training(), {ANNOTATION: "+7"}, []).status
    record = status[STATUS_KEY]
    newer = {"status": {**status, STATUS_KEY: {**record, "aFieldOfANewerOperator": 1}}}
    asked = {contract.REQUEST_CAPTURE_STEPS: {"id": record["requestId"], "steps": 7}}
    assert capture_requests_for(newer, 0, "") == asked
    unreadable = {"status": {**status, STATUS_KEY: {**record, "steps": "seven"}}}
    assert capture_requests_for(unreadable, 0, "") == {}
    assert capture_requests_for({"status": {STATUS_KEY: "not an object"}}, 0, "") == {}


def test_a_message_carries_the_ranks_capture_answers() -> None:
    message = contract.ProgressMessage(
        job="bert",
        namespace="team-a",
        uid=UID,
        attempt=0,
        rank=0,
        node_rank=0,
        world_size=1,
        step=3,
        step_times_ms=(),
        profile_capturing="p0-x",
        profile_captured="p0-y",
    )
    assert contract.parse_message(message.to_json()) == message
    with pytest.raises(ValueError, match="profileCaptured"):
        contract.parse_message(
            json.dumps({**json.loads(message.to_json()), "profileCaptured": "../x"}).encode()
        )


# -- the rank -----------------------------------------------------------------------------------
def test_asked_to_capture_a_rank_profiles_exactly_the_next_n_steps_into_the_requests_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stacks = tmp_path / "profiles" / "team-a" / "bert" / "0" / "stacks"
    environ = {
        **contract.channel_env("http://unused/", 0.05, str(stacks)),
        contract.TOKEN_FILE: str(tmp_path / "token"),
        "TRAINIUM_JOB_NAME": "bert",
        "TRAINIUM_JOB_NAMESPACE": "team-a",
        "TRAINIUM_JOB_UID": UID,
        "TRAINIUM_ATTEMPT": "0",
        "TRAINIUM_NODE_NAME": "node-a",
        "TRAINIUM_PROFILE_SOURCES": "none",
        "RANK": "0",
        "GROUP_RANK": "0",
        "WORLD_SIZE": "1",
    }
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TRAINIUM_PROFILE", raising=False)
    (tmp_path / "token").write_text("t")
    request = "p0-20261203T080000Z"
    sent: list[dict[str, Any]] = []

    def send(_url: str, body: bytes, _token: str) -> dict[str, Any]:
        sent.append(json.loads(body))
        ask = {contract.REQUEST_CAPTURE_STEPS: {"id": request, "steps": 3}}
        return {"accepted": True, "requests": ask}

    config = ChannelConfig.from_env(environ)
    assert config is not None
    reporter = Reporter(config, send=send)
    monkeypatch.setattr(channel, "_reporter", reporter)
    assert not capture.start_profiling()  # profiling is off: only the channel would run
    capture.step(0)
    capture.step(1)
    assert reporter.send_once()  # the reply asks for the next 3 steps
    assert reporter.send_once()  # asked again before it answered: still one capture
    for number in range(2, 8):
        capture.step(number)
        with capture.annotate("forward"):
            pass
        if number == 2:
            assert capture.is_capturing_detail()
            assert reporter.profile_capturing == request
    assert not capture.is_capturing_detail()  # closed at step 5
    deadline = time.monotonic() + 10
    while reporter.profile_captured != request and time.monotonic() < deadline:
        time.sleep(0.02)
    assert reporter.profile_captured == request
    assert reporter.send_once()
    assert sent[-1]["profileCaptured"] == request
    directory = tmp_path / "profiles" / "team-a" / "bert" / "0" / "on-demand" / request
    assert (directory / "profile.json").exists()
    with RankFileReader(directory / "node-a" / "rank-0.trnprof") as reader:
        rows = [row for block in reader.row_blocks() for row in block]
    assert sorted(r[7] for r in rows if r[0] == EventKind.STEP) == [2, 3, 4]
    assert [r[1] for r in rows if r[0] == EventKind.ANNOTATION] == ["forward"] * 3
    capture.stop_profiling()
