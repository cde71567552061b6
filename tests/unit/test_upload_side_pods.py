"""Side pods run no tenant-chosen path and echo no tenant text (issue 29, item 4): the upload
pod mounts only the attempt's profile directory, read-only, at the operator's own path; its
arguments carry no path of the spec; its status says a classified reason, never the pod's log
or termination message; and the upload history in the status stays bounded."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from trainium_operator.api.status import validated_status
from trainium_operator.builders.upload import PROFILE_MOUNT_PATH, on_demand_upload_pod, upload_pod
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.policies.on_demand_profile import (
    STATUS_KEY,
    capture_path,
)
from trainium_operator.lifecycle.policies.on_demand_upload import on_demand_upload
from trainium_operator.lifecycle.policies.profile_upload import (
    MAX_UPLOAD_RECORDS,
    UploadDefaults,
    profile_upload,
)
from trainium_operator.lifecycle.snapshot import PassSettings
from trainium_operator.profiler import s3 as uploader
from unit.jobs import continue_with, job_ref

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
S3 = "s3://my-profiles/runs"
# A tenant's own layout: the claim at /fsx/team, profiles below it.
TENANT_STORAGE = {
    "storage": {"claimName": "fsx", "mountPath": "/fsx/team"},
    "profile": {"enabled": True, "s3Uri": S3, "outputDir": "/fsx/team/prof"},
}
# Whatever a tenant's code could print into the upload pod's log or termination message.
TOKEN = "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.secret-web-identity-token"


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def test_the_upload_pod_mounts_only_the_attempts_profile_directory_read_only_at_a_fixed_path() -> (
    None
):
    job = job_ref(**TENANT_STORAGE)
    (container,) = upload_pod(job, 2, S3, UploadDefaults().pod_settings())["spec"]["containers"]
    assert container["volumeMounts"] == [
        {
            "name": "shared-data",
            "mountPath": PROFILE_MOUNT_PATH,
            "subPath": "prof/team-a/bert/2",
            "readOnly": True,
        },
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    assert container["command"][-2:] == [PROFILE_MOUNT_PATH, "s3://my-profiles/runs/team-a/bert/2"]
    tenant_paths = ("/fsx/team", "/fsx/team/prof")
    carried = _strings(container["command"]) + _strings(container["env"])
    assert not [s for s in carried if any(s.startswith(p) for p in tenant_paths)], carried
    assert container["terminationMessagePolicy"] == "File", "the log never becomes a message"


def test_the_on_demand_upload_pod_mounts_only_the_requests_directory_at_the_fixed_path() -> None:
    job = job_ref(**TENANT_STORAGE)
    request = "p1-20261201T120000Z"
    pod = on_demand_upload_pod(job, 1, request, S3, UploadDefaults().pod_settings())
    (container,) = pod["spec"]["containers"]
    mount = container["volumeMounts"][0]
    assert (mount["mountPath"], mount["readOnly"]) == (PROFILE_MOUNT_PATH, True)
    assert mount["subPath"] == f"prof/team-a/bert/1/on-demand/{request}"
    assert container["command"][-2] == PROFILE_MOUNT_PATH
    assert not [s for s in _strings(container) if s.startswith("/fsx")]


def test_the_on_demand_upload_reads_the_operators_own_path_not_the_one_in_the_status() -> None:
    """status.onDemandProfile.path is only a report: a status edited to another path changes
    nothing the upload pod mounts."""
    job = job_ref(**TENANT_STORAGE)
    request = "p1-20261201T120000Z"
    record = {
        "requestId": request,
        "attempt": 1,
        "state": "Captured",
        "path": "/usr/lib/python3/site-packages",
    }
    decision = Decision(status={"phase": "Training", "attempt": 1, STATUS_KEY: record})
    continue_with(
        on_demand_upload,
        job,
        decision,
        NOW,
        upload_pods=(),
        settings=PassSettings(UploadDefaults(s3_uri=S3)),
    )
    (pod,) = decision.side_create
    mount = pod["spec"]["containers"][0]["volumeMounts"][0]
    expected = capture_path(job, 1, request).removeprefix("/fsx/team/")
    assert mount["subPath"] == expected == f"prof/team-a/bert/1/on-demand/{request}"


def _ended(pod: dict[str, Any], code: int, message: str = "", reason: str = "") -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    terminated: dict[str, Any] = {"exitCode": code, "reason": "Error", "message": message}
    pod["status"] = {
        "phase": "Failed" if code else "Succeeded",
        "containerStatuses": [{"name": "upload", "state": {"terminated": terminated}}],
    }
    if reason:
        pod["status"]["reason"] = reason
    return pod


def _finished(attempt: int = 0) -> dict[str, Any]:
    return {
        "phase": "Succeeded",
        "attempt": attempt,
        "profile": {"path": f"/data/profiles/team-a/bert/{attempt}"},
        "conditions": [],
    }


def _upload_once(pod_state: Any, status: dict[str, Any] | None = None) -> Decision:
    job = job_ref(profile={"enabled": True, "s3Uri": S3})
    first = Decision(status=copy.deepcopy(status or _finished()))
    continue_with(
        profile_upload,
        job,
        first,
        NOW,
        upload_pods=(),
        settings=PassSettings(UploadDefaults()),
    )
    (pod,) = first.side_create
    later = Decision(status=copy.deepcopy(first.status))
    continue_with(
        profile_upload,
        job,
        later,
        NOW,
        upload_pods=(pod_state(pod),),
        settings=PassSettings(UploadDefaults()),
    )
    validated_status(later.status)
    return later


@pytest.mark.parametrize(
    ("code", "pod_reason", "reason"),
    [
        (uploader.ExitCode.ACCESS_DENIED, "", "AccessDenied"),
        (uploader.ExitCode.BUCKET_MISSING, "", "BucketMissing"),
        (uploader.ExitCode.NO_CREDENTIALS, "", "NoCredentials"),
        (uploader.ExitCode.REFUSED, "", "Refused"),
        (1, "", "UploadFailed"),
        (137, "", "PodFailed"),
        (1, "DeadlineExceeded", "Timeout"),
    ],
)
def test_a_failed_upload_says_a_classified_reason_never_what_the_pod_printed(
    code: int, pod_reason: str, reason: str
) -> None:
    decision = _upload_once(lambda pod: _ended(pod, code, f"AWS token: {TOKEN}\n", pod_reason))
    (record,) = decision.status["profileUploads"]
    assert (record["state"], record["reason"]) == ("Failed", reason)
    everything = _strings(decision.status) + [e.message for e in decision.events]
    assert not [s for s in everything if TOKEN in s], "the pod's text is never echoed"


def test_an_upload_with_no_rank_files_is_no_profile_whatever_its_log_says() -> None:
    decision = _upload_once(lambda pod: _ended(pod, uploader.ExitCode.NO_PROFILE, TOKEN))
    (record,) = decision.status["profileUploads"]
    assert (record["state"], record["reason"]) == ("NoProfile", "NoProfile")
    assert TOKEN not in str(decision.status)


def test_a_succeeded_upload_ignores_the_pods_message() -> None:
    decision = _upload_once(lambda pod: _ended(pod, 0, TOKEN))
    (record,) = decision.status["profileUploads"]
    assert (record["state"], record["reason"]) == ("Succeeded", "Uploaded")
    assert TOKEN not in str(decision.status)


def test_profile_uploads_keep_the_newest_records_and_count_the_older_ones() -> None:
    """A crash-looping job ends an attempt per restart: its upload history stays bounded."""
    attempts = MAX_UPLOAD_RECORDS + 25
    status = _finished(attempt=attempts)
    status["phase"] = "Training"
    status["training"] = {"firstAttempt": 0}
    status["profileUploads"] = [
        {
            "attempt": a,
            "state": "Failed" if a % 5 == 0 else "Succeeded",
            "pod": f"p-{a}",
            "destination": f"{S3}/team-a/bert/{a}",
        }
        for a in range(attempts - 1)
    ]
    decision = Decision(status=status)
    continue_with(
        profile_upload,
        job_ref(profile={"enabled": True, "s3Uri": S3}),
        decision,
        NOW,
        upload_pods=(),
        settings=PassSettings(UploadDefaults()),
    )
    kept = decision.status["profileUploads"]
    assert len(kept) == MAX_UPLOAD_RECORDS
    assert [r["attempt"] for r in kept] == list(range(attempts - MAX_UPLOAD_RECORDS, attempts))
    older = decision.status["profileUploadsOlder"]
    dropped = range(attempts - MAX_UPLOAD_RECORDS)
    assert older == {
        "succeeded": sum(1 for a in dropped if a % 5),
        "failed": sum(1 for a in dropped if a % 5 == 0),
        "noProfile": 0,
    }
    assert [p["metadata"]["name"] for p in decision.side_create] == [
        f"bert-profile-upload-{attempts - 1}"
    ], "only the newest ended attempt still needed a pod: dropped ones are never re-uploaded"
    validated_status(decision.status)


def test_old_finished_upload_pods_are_deleted_only_once_their_outcome_is_stored() -> None:
    job = job_ref(profile={"enabled": True, "s3Uri": S3})
    settings = UploadDefaults().pod_settings()
    status = _finished(attempt=6)
    status["training"] = {"firstAttempt": 0}
    status["profileUploads"] = [
        {"attempt": a, "state": "Succeeded", "pod": f"bert-profile-upload-{a}",
         "destination": f"{S3}/team-a/bert/{a}", "reason": "Uploaded"}
        for a in range(5)
    ]  # fmt: skip
    pods = [_ended(upload_pod(job, a, S3, settings), 0) for a in range(6)]  # 5: not yet stored
    decision = Decision(status=copy.deepcopy(status))
    continue_with(
        profile_upload,
        job,
        decision,
        NOW,
        upload_pods=tuple(pods),
        settings=PassSettings(UploadDefaults()),
    )
    deleted = sorted(d.name for d in decision.delete_pods)
    assert deleted == ["bert-profile-upload-0", "bert-profile-upload-1"], deleted
    assert decision.status["profileUploads"][5]["state"] == "Succeeded", "stored in this pass"
