"""The profile upload policy and pod (pure): when the pod is made, what the status, the
condition and the events say for each outcome, and that the job's phase never changes."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from trainium_operator.builders.upload import (
    UPLOAD_STAGE,
    UploadPodSettings,
    is_upload_pod,
    upload_pod,
)
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.policies.profile_upload import UploadDefaults, profile_upload
from trainium_operator.lifecycle.snapshot import PassSettings
from unit.jobs import continue_with, job_ref

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
S3 = "s3://my-profiles/runs"
PROFILED = {"profile": {"enabled": True, "s3Uri": S3}}


def finished_status(phase: str = "Succeeded", attempt: int = 2) -> dict[str, Any]:
    return {
        "phase": phase,
        "attempt": attempt,
        "profile": {"path": f"/data/profiles/team-a/bert/{attempt}", "claimName": "fsx-claim"},
        "conditions": [],
    }


def run(
    status: dict[str, Any], pods: list[dict[str, Any]], **spec: Any
) -> tuple[Decision, dict[str, Any]]:
    job = job_ref(**(spec or PROFILED))
    decision = Decision(status=copy.deepcopy(status))
    continue_with(
        profile_upload,
        job,
        decision,
        NOW,
        upload_pods=tuple(pods),
        settings=PassSettings(UploadDefaults()),
    )
    return decision, decision.status


def ended(pod: dict[str, Any], phase: str, message: str = "", code: int = 0) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
    if message:
        terminated["message"] = message
    pod["status"] = {
        "phase": phase,
        "containerStatuses": [{"name": "upload", "state": {"terminated": terminated}}],
    }
    return pod


def condition(status: dict[str, Any]) -> dict[str, Any]:
    (found,) = [c for c in status["conditions"] if c["type"] == "ProfileUploaded"]
    return found


OPERATOR = UploadPodSettings(
    image="123.dkr.ecr.us-west-2.amazonaws.com/trainium-operator:0.1.0",
    image_pull_policy="Always",
    image_pull_secrets=("chart-registry",),
    service_account="trn-profile-upload",
)
# A job author's attempt to steer the upload pod: their image, account, podTemplate.
AUTHORED = {
    "serviceAccountName": "trainer-irsa",
    "image": "example.com/train:1",
    "tolerations": [{"key": "team", "operator": "Equal", "value": "nlp", "effect": "NoSchedule"}],
    "podMetadata": {"labels": {"cost-center": "nlp"}},
    "podTemplate": {
        "spec": {
            "imagePullSecrets": [{"name": "team-registry"}, {"name": "chart-registry"}],
            "securityContext": {"runAsUser": 0},
            "hostNetwork": True,
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
            "containers": [{"name": "trainer", "securityContext": {"privileged": True}}],
        }
    },
    **PROFILED,
}


def test_the_upload_pod_reads_the_claim_read_only_and_writes_the_attempts_prefix() -> None:
    job = job_ref(**AUTHORED)
    pod = upload_pod(job, 2, S3, OPERATOR)
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert pod["metadata"]["name"] == "bert-profile-upload-2"
    assert is_upload_pod(pod)
    assert pod["metadata"]["labels"]["trainium.dev/stage"] == UPLOAD_STAGE
    assert "trainium.dev/attempt" not in pod["metadata"]["labels"], "not part of any gang"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == job.uid
    assert container["command"] == [
        "python3",
        "-m",
        "trainium_operator.profiler.s3",
        "/profile",
        "s3://my-profiles/runs/team-a/bert/2",
    ]
    assert container["terminationMessagePolicy"] == "File"
    assert container["volumeMounts"][0] == {
        "name": "shared-data",
        "mountPath": "/profile",
        "subPath": "profiles/team-a/bert/2",
        "readOnly": True,
    }
    assert spec["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "fsx-claim",
        "readOnly": True,
    }
    assert "nodeSelector" not in spec, "any node will do"
    assert "schedulerName" not in spec
    assert not any("AWS_" in e["name"] for e in container["env"]), "no keys in pods"


def test_the_upload_pod_runs_the_operators_image_and_account_never_the_authors() -> None:
    pod = upload_pod(job_ref(**AUTHORED), 2, S3, OPERATOR)
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert (container["image"], container["imagePullPolicy"]) == (OPERATOR.image, "Always")
    assert spec["serviceAccountName"] == "trn-profile-upload"
    assert spec["automountServiceAccountToken"] is False
    # Of the podTemplate only the pull secrets' names arrive (once each, the chart's first).
    assert spec["imagePullSecrets"] == [{"name": "chart-registry"}, {"name": "team-registry"}]
    assert [v["name"] for v in spec["volumes"]] == ["shared-data", "tmp"]
    assert "hostNetwork" not in spec
    assert spec["tolerations"] == AUTHORED["tolerations"]
    assert pod["metadata"]["labels"]["cost-center"] == "nlp"


def test_without_a_chart_account_the_upload_pod_runs_as_the_namespace_default() -> None:
    settings = UploadPodSettings(image=OPERATOR.image)
    spec = upload_pod(job_ref(**AUTHORED), 0, S3, settings)["spec"]
    assert "serviceAccountName" not in spec, "the namespace's default, not trainer-irsa"
    assert spec["imagePullSecrets"] == [{"name": "team-registry"}, {"name": "chart-registry"}]


def test_the_upload_pod_meets_pod_security_restricted_with_limits() -> None:
    spec = upload_pod(job_ref(**PROFILED), 0, S3, OPERATOR)["spec"]
    (container,) = spec["containers"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 65532, "the operator image's USER"
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/profile", "/tmp"}
    assert set(container["resources"]["limits"]) >= {"cpu", "memory"}
    assert set(container["resources"]["requests"]) >= {"cpu", "memory"}


def test_upload_pods_default_to_the_operator_image_of_this_version() -> None:
    # Outside the chart: the chart's default image of this version, never the job's. (The
    # chart's settings reach UploadDefaults through `run`'s flags: test_operator_settings.)
    assert UploadDefaults().pod_settings().image == "trainium-operator:0.1.0"
    decision, _ = run(finished_status(), [])
    (pod,) = decision.side_create
    assert pod["spec"]["containers"][0]["image"] == "trainium-operator:0.1.0"


def test_a_finished_profiled_job_gets_one_upload_pod() -> None:
    decision, status = run(finished_status(), [])
    (pod,) = decision.side_create
    assert pod["metadata"]["name"] == "bert-profile-upload-2"
    assert status["profile"]["upload"]["state"] == "Pending"
    assert "s3Uri" not in status["profile"]
    assert condition(status)["status"] == "False"
    assert condition(status)["reason"] == "Uploading"
    assert status["phase"] == "Succeeded"
    assert decision.events == []

    again, _ = run(status, [pod])
    assert again.side_create == [], "the pod exists: no second one"


@pytest.mark.parametrize("phase", ["Training", "Restarting", "Pending"])
def test_nothing_is_uploaded_while_the_job_runs(phase: str) -> None:
    decision, status = run(finished_status(phase), [])
    assert decision.side_create == []
    assert "upload" not in status["profile"]


def test_no_upload_without_an_s3_uri_or_without_profiling() -> None:
    assert run(finished_status(), [], profile={"enabled": True})[0].side_create == []
    assert run(finished_status(), [], profile={"enabled": False, "s3Uri": S3})[0].side_create == []
    job = job_ref(profile={"enabled": True})
    decision = Decision(status=finished_status())
    continue_with(
        profile_upload,
        job,
        decision,
        NOW,
        upload_pods=(),
        settings=PassSettings(UploadDefaults(s3_uri="s3://chart-default/p")),
    )
    (pod,) = decision.side_create
    assert pod["spec"]["containers"][0]["command"][-1] == "s3://chart-default/p/team-a/bert/2"


def test_a_successful_upload_points_the_status_at_s3_once() -> None:
    first, status = run(finished_status(), [])
    done = ended(first.side_create[0], "Succeeded", "uploaded 2 rank files ...")
    decision, status = run(status, [done])
    assert status["profile"]["s3Uri"] == "s3://my-profiles/runs/team-a/bert/2"
    assert status["profile"]["path"] == "/data/profiles/team-a/bert/2"
    assert status["profile"]["upload"]["state"] == "Succeeded"
    assert condition(status)["status"] == "True"
    assert [(e.type, e.reason) for e in decision.events] == [("Normal", "ProfileUploaded")]

    later, status_after = run(status, [])  # the pod was cleaned up since
    assert later.side_create == []
    assert later.events == []
    assert status_after == status


def test_a_failed_upload_is_a_warning_and_a_condition_never_a_failed_job() -> None:
    first, status = run(finished_status(), [])
    failed = ended(first.side_create[0], "Failed", "some log line\n", code=6)  # BucketMissing
    decision, status = run(status, [failed])
    assert status["phase"] == "Succeeded"
    assert "s3Uri" not in status["profile"]
    assert status["profile"]["upload"]["state"] == "Failed"
    assert status["profile"]["upload"]["reason"] == "BucketMissing"
    assert status["profile"]["upload"]["message"] == "the bucket does not exist"
    cond = condition(status)
    assert (cond["status"], cond["reason"]) == ("False", "UploadFailed")
    assert "does not exist" in cond["message"]
    ((kind, why, message),) = [(e.type, e.reason, e.message) for e in decision.events]
    assert (kind, why) == ("Warning", "ProfileUploadFailed")
    assert "s3://my-profiles/runs/team-a/bert/2" in message
    assert "the bucket does not exist" in message
    assert "some log line" not in str(status), "the pod's own text is never read"
    assert run(status, [failed])[0].events == [], "reported once"


def test_a_failed_job_uploads_what_its_last_attempt_recorded() -> None:
    decision, status = run(finished_status("Failed", attempt=3), [])
    (pod,) = decision.side_create
    assert pod["metadata"]["name"] == "bert-profile-upload-3"
    assert status["phase"] == "Failed"


def training_status(attempt: int, first: int = 0) -> dict[str, Any]:
    status = finished_status("Training", attempt)
    status["training"] = {"firstAttempt": first}
    return status


def test_an_attempt_replaced_by_a_restart_is_uploaded_while_the_next_one_trains() -> None:
    decision, status = run(training_status(attempt=2), [])
    assert [p["metadata"]["name"] for p in decision.side_create] == [
        "bert-profile-upload-0",
        "bert-profile-upload-1",
    ]
    assert [r["attempt"] for r in status["profileUploads"]] == [0, 1]
    assert "upload" not in status["profile"], "the running attempt's own profile is not done"
    assert status["phase"] == "Training"

    pods = [ended(decision.side_create[0], "Succeeded"), ended(decision.side_create[1], "Running")]
    pods[1]["status"] = {"phase": "Running"}
    later, status = run(status, pods)
    first, second = status["profileUploads"]
    assert first["s3Uri"] == "s3://my-profiles/runs/team-a/bert/0"
    assert second["state"] == "Running"
    assert [(e.type, e.reason) for e in later.events] == [("Normal", "ProfileUploaded")]
    assert later.side_create == []


def test_an_attempt_that_wrote_no_profile_is_noted_not_a_failure() -> None:
    decision, status = run(training_status(attempt=1), [])
    skipped = ended(
        decision.side_create[0],
        "Failed",
        "profile upload skipped: /data/...: no rank files",
        code=3,
    )
    later, status = run(status, [skipped])
    (record,) = status["profileUploads"]
    assert record["state"] == "NoProfile"
    assert "s3Uri" not in record
    assert [(e.type, e.reason) for e in later.events] == [("Normal", "NoProfile")]
    assert condition(status)["reason"] == "NoProfile"


def test_the_last_attempt_is_uploaded_after_the_earlier_ones_and_mirrored_in_profile() -> None:
    status = finished_status("Succeeded", attempt=1)
    status["training"] = {"firstAttempt": 0}
    status["profileUploads"] = [
        {"attempt": 0, "state": "Succeeded", "pod": "bert-profile-upload-0",
         "destination": "s3://my-profiles/runs/team-a/bert/0",
         "s3Uri": "s3://my-profiles/runs/team-a/bert/0"},
    ]  # fmt: skip
    decision, status = run(status, [])
    assert [p["metadata"]["name"] for p in decision.side_create] == ["bert-profile-upload-1"]
    assert status["profile"]["upload"]["attempt"] == 1
    done = ended(decision.side_create[0], "Succeeded")
    _, status = run(status, [done])
    assert status["profile"]["s3Uri"] == "s3://my-profiles/runs/team-a/bert/1"
    assert [r["s3Uri"] for r in status["profileUploads"]] == [
        "s3://my-profiles/runs/team-a/bert/0",
        "s3://my-profiles/runs/team-a/bert/1",
    ]


def test_a_stale_s3_uri_leaves_the_profile_while_its_attempt_uploads_absent_not_null() -> None:
    status = finished_status()
    status["profile"]["s3Uri"] = "s3://my-profiles/runs/team-a/bert/1"  # an earlier attempt's
    _, status = run(status, [])
    assert status["profile"]["upload"]["state"] == "Pending"
    assert "s3Uri" not in status["profile"]


def test_an_upload_record_an_older_operator_wrote_without_pod_or_destination_stays_as_it_is() -> (
    None
):
    status = finished_status()
    status["profileUploads"] = [{"attempt": 2, "state": "Succeeded"}]
    decision, status = run(status, [])
    assert status["profileUploads"] == [{"attempt": 2, "state": "Succeeded"}]
    assert (decision.side_create, decision.events) == ([], [])
    assert condition(status)["status"] == "True"
