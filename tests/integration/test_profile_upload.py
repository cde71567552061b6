"""A profiled job on the dev cluster ends with its profile in S3 (the local moto server) and
`status.profile.s3Uri` pointing at it; a failed upload is a Warning and a condition, never a
failed job.

KWOK runs no containers, so the test plays the pods, as the demo does: the training pods'
profile is written where their `/data` is (a local folder standing in for the claim), and the
upload pod's own command, read back from the API server, runs on this machine with its mount
path mapped to its mount's subPath of that folder, against the local S3 server. Its exit code
becomes the pod's outcome (the operator reads nothing else of it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from integration.operator_harness import (
    OperatorView,
    create_job,
    eventually,
    finish_pods,
    get_job,
    job_events,
    job_manifest,
    running_operator,
    wait_gang_running,
    wait_phase,
)
from integration.upload_pods import play_upload_pod, upload_pod, write_profile
from s3_server import S3Bucket
from trainium_operator.analysis.s3store import S3ProfileSource
from trainium_operator.controller.settings import ENV_PROFILE_S3_URI
from trainium_operator.profiler.s3 import ExitCode, parse_s3_uri

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]

MOUNT = "/data"


def profiled_job(name: str, s3_uri: str) -> dict[str, Any]:
    return job_manifest(
        name,
        compile={"enabled": False},
        profile={"enabled": True, "startStep": 1, "endStep": 4, "s3Uri": s3_uri},
    )


def train_and_record_profile(clients: Any, namespace: str, name: str, shared: Path) -> Path:
    """The training gang runs, writes its profile on the 'claim', and succeeds."""
    pods = wait_gang_running(clients, namespace, name, "train", 0)
    profile_dir = write_profile(
        pods, shared, MOUNT, nodes=2, ranks_per_node=2, steps=6, detailed_steps=(1, 4),
        kernels_per_step=8,
    )  # fmt: skip
    finish_pods(clients, namespace, pods)
    return profile_dir


def profile_condition(job: dict[str, Any]) -> dict[str, Any] | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition["type"] == "ProfileUploaded":
            return dict(condition)
    return None


def test_a_profiled_job_ends_with_its_profile_in_s3_and_the_status_pointing_at_it(
    clients: Any, namespace: str, tmp_path: Path, s3: S3Bucket, operator: OperatorView
) -> None:
    shared = tmp_path / "fsx"
    name = "bert-s3"
    base = s3.uri("profiles")
    create_job(clients, namespace, profiled_job(name, base))
    profile_dir = train_and_record_profile(clients, namespace, name, shared)
    job = wait_phase(clients, namespace, name, "Succeeded")
    pod = upload_pod(clients, namespace, name)
    assert pod.spec.volumes[0].persistent_volume_claim.read_only is True
    job = get_job(clients, namespace, name)
    assert job["status"]["profile"]["upload"]["state"] in ("Pending", "Running")
    assert "s3Uri" not in job["status"]["profile"], "not before the manifest is in"

    result = play_upload_pod(clients, namespace, pod, shared)
    assert result.returncode == 0, result.stderr
    expected = f"{base}/{namespace}/{name}/0"

    def uploaded() -> dict[str, Any] | None:
        job = get_job(clients, namespace, name)
        return job if job["status"]["profile"].get("s3Uri") else None

    job = eventually(uploaded, timeout=30, description="status.profile.s3Uri")
    assert job["status"]["profile"]["s3Uri"] == expected
    assert job["status"]["phase"] == "Succeeded"
    condition = profile_condition(job)
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", "Uploaded")
    # Events follow the status write they report.
    eventually(
        lambda: (
            ("Normal", "ProfileUploaded")
            in [(kind, reason) for kind, reason, _ in job_events(clients, namespace, name)]
        ),
        timeout=10,
        description="the ProfileUploaded event",
    )

    keys = s3.keys(f"profiles/{namespace}/{name}/0/")
    local_files = sorted(profile_dir.glob("*/rank-*.trnprof"))
    assert len([k for k in keys if k.endswith(".trnprof")]) == len(local_files) == 4
    assert f"profiles/{namespace}/{name}/0/profile.json" in keys
    source = S3ProfileSource(parse_s3_uri(base), cache_dir=tmp_path / "cache")
    (listed,) = source.listing()
    assert listed.complete
    assert listed.identifier == f"{namespace}/{name}/0"


def test_a_failed_upload_is_a_warning_and_a_condition_and_the_job_stays_succeeded(
    clients: Any, namespace: str, tmp_path: Path, s3: S3Bucket, operator: OperatorView
) -> None:
    shared = tmp_path / "fsx"
    name = "bert-nobucket"
    create_job(clients, namespace, profiled_job(name, "s3://no-such-bucket-here/profiles"))
    train_and_record_profile(clients, namespace, name, shared)
    wait_phase(clients, namespace, name, "Succeeded")
    pod = upload_pod(clients, namespace, name)
    result = play_upload_pod(clients, namespace, pod, shared)
    assert result.returncode == ExitCode.BUCKET_MISSING

    def failed() -> dict[str, Any] | None:
        job = get_job(clients, namespace, name)
        condition = profile_condition(job)
        return job if condition and condition["reason"] == "UploadFailed" else None

    job = eventually(failed, timeout=30, description="ProfileUploaded=False")
    assert job["status"]["phase"] == "Succeeded"
    assert "s3Uri" not in job["status"]["profile"]
    condition = profile_condition(job)
    assert condition is not None
    assert "the bucket does not exist" in condition["message"]
    # (status...reason is pruned where the shared dev cluster runs another CRD version)
    assert job["status"]["profile"]["upload"].get("reason", "BucketMissing") == "BucketMissing"
    # Events follow the status write that carries the condition.
    warnings = eventually(
        lambda: [
            message
            for kind, reason, message in job_events(clients, namespace, name)
            if (kind, reason) == ("Warning", "ProfileUploadFailed")
        ],
        timeout=30,
        description="the ProfileUploadFailed warning",
    )
    assert len(warnings) == 1
    assert "does not exist" in warnings[0]


def test_an_attempt_replaced_by_a_restart_is_uploaded_while_the_next_one_trains(
    clients: Any, namespace: str, tmp_path: Path, s3: S3Bucket, operator: OperatorView
) -> None:
    shared, name, base = tmp_path / "fsx", "bert-restart", s3.uri("runs")
    create_job(clients, namespace, profiled_job(name, base))
    pods = wait_gang_running(clients, namespace, name, "train", 0)
    write_profile(
        pods, shared, MOUNT, nodes=2, ranks_per_node=1, steps=4, detailed_steps=(1, 2),
        kernels_per_step=4,
    )  # fmt: skip
    finish_pods(clients, namespace, pods[:1], succeeded=False, exit_code=1)
    wait_gang_running(clients, namespace, name, "train", 1)
    pod = upload_pod(clients, namespace, name)
    assert pod.metadata.name == f"{name}-profile-upload-0"
    result = play_upload_pod(clients, namespace, pod, shared)
    assert result.returncode == 0, result.stderr

    def uploaded() -> dict[str, Any] | None:
        job = get_job(clients, namespace, name)
        records = job["status"].get("profileUploads") or []
        return job if records and records[0].get("s3Uri") else None

    job = eventually(uploaded, timeout=30, description="attempt 0 uploaded")
    assert job["status"]["phase"] == "Training", "attempt 1 trains meanwhile"
    assert job["status"]["profileUploads"][0]["s3Uri"] == f"{base}/{namespace}/{name}/0"
    assert f"runs/{namespace}/{name}/0/profile.json" in s3.keys("runs/")


def test_the_chart_wide_default_uploads_jobs_that_name_no_s3_uri(
    dev_cluster: Any, clients: Any, namespace: str, tmp_path: Path, s3: S3Bucket
) -> None:
    shared, name, default = tmp_path / "fsx", "bert-default", s3.uri("chart-default")
    manifest = job_manifest(
        name, compile={"enabled": False}, profile={"enabled": True, "startStep": 1, "endStep": 2}
    )
    env = {ENV_PROFILE_S3_URI: default}  # what the chart's profileUpload.s3Uri sets
    with running_operator(dev_cluster, namespace, tmp_path, env=env):
        create_job(clients, namespace, manifest)
        train_and_record_profile(clients, namespace, name, shared)
        wait_phase(clients, namespace, name, "Succeeded")
        pod = upload_pod(clients, namespace, name)
        assert pod.spec.containers[0].command[-1] == f"{default}/{namespace}/{name}/0"
        assert play_upload_pod(clients, namespace, pod, shared).returncode == 0

        def uploaded() -> dict[str, Any] | None:
            job = get_job(clients, namespace, name)
            return job if job["status"]["profile"].get("s3Uri") else None

        job = eventually(uploaded, timeout=30, description="status.profile.s3Uri")
        assert job["status"]["profile"]["s3Uri"] == f"{default}/{namespace}/{name}/0"
