"""Side pods (the profile upload) against a job author who controls the claim and the spec
(issue 29, item 4), on the dev cluster: the claim over a system directory is refused by the
API server naming the field; the upload pod the operator creates mounts only the attempt's
profile directory, read-only, at the operator's path, and carries no path of the spec; a
symlink planted in the profile is refused by the real uploader and the status says Refused,
never what the pod printed.

KWOK runs no containers: as tests/integration/test_profile_upload.py does, the upload pod's
own command (read back from the API server) runs here, with its mount's subPath of a local
folder standing in for the claim at the pod's mount path, against the local S3 server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from integration.operator_harness import (
    create_job,
    eventually,
    finish_pods,
    get_job,
    job_manifest,
    wait_gang_running,
    wait_phase,
)
from integration.upload_pods import play_upload_pod, upload_pod, write_profile
from s3_server import S3Bucket
from trainium_operator.api.status import UploadReason
from trainium_operator.builders.upload import PROFILE_MOUNT_PATH
from trainium_operator.lifecycle.policies.profile_upload import REASON_MESSAGES
from trainium_operator.profiler.s3 import ExitCode

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]

SYSTEM_MOUNT_PATHS = ("/usr/lib/python3/site-packages", "/etc", "/")
TOKEN = "eyJhbGciOiJSUzI1NiJ9.the-upload-roles-web-identity-token"


def test_a_claim_mounted_over_a_system_directory_is_refused_naming_the_field(
    dev_cluster: Any, namespace: str, hostile_report: Any
) -> None:
    for mount_path in SYSTEM_MOUNT_PATHS:
        manifest = job_manifest("over-system", storage={"mountPath": mount_path})
        with pytest.raises(Exception) as refused:  # noqa: PT011 - ApiException; checked below
            create_job(dev_cluster.clients, namespace, manifest)
        body = str(getattr(refused.value, "body", ""))
        status = getattr(refused.value, "status", None)
        hostile_report.tried(
            "spec.storage.mountPath", mount_path, f"HTTP {status}, names the field: "
            f"{'spec.storage.mountPath' in body}",
        )  # fmt: skip
        assert status == 422, refused.value
        assert "spec.storage.mountPath" in body, body


@pytest.mark.usefixtures("operator")
def test_the_upload_pod_mounts_only_its_profile_read_only_and_refuses_a_planted_symlink(
    dev_cluster: Any, namespace: str, tmp_path: Path, s3: S3Bucket, hostile_report: Any
) -> None:
    clients = dev_cluster.clients
    claim = tmp_path / "claim"
    name = "side-pod"
    mount = "/fsx/team"
    manifest = job_manifest(
        name,
        compile={"enabled": False},
        storage={"claimName": "fsx-claim", "mountPath": mount},
        profile={"enabled": True, "startStep": 1, "endStep": 2, "s3Uri": s3.uri("p")},
    )
    create_job(clients, namespace, manifest)
    pods = wait_gang_running(clients, namespace, name, "train", 0)
    profile_dir = write_profile(
        pods, claim, mount, nodes=1, ranks_per_node=2, steps=4, detailed_steps=(1, 2),
        kernels_per_step=4,
    )  # fmt: skip
    # The tenant's code plants a rank file that names the upload pod's projected token.
    secret = tmp_path / "token"
    secret.write_text(TOKEN)
    planted = sorted(profile_dir.glob("*/rank-*.trnprof"))[0]
    planted.unlink()
    planted.symlink_to(secret)
    finish_pods(clients, namespace, pods)
    wait_phase(clients, namespace, name, "Succeeded")

    pod = upload_pod(clients, namespace, name)
    (container,) = pod.spec.containers
    mounts = [(m.mount_path, m.sub_path, m.read_only) for m in container.volume_mounts]
    claim_volume = next(v for v in pod.spec.volumes if v.persistent_volume_claim)
    hostile_report.tried(
        "upload pod volumeMounts", f"spec.storage.mountPath={mount}", f"mounts {mounts}"
    )
    assert mounts[0] == (PROFILE_MOUNT_PATH, f"profiles/{namespace}/{name}/0", True)
    assert [m[0] for m in mounts[1:]] == ["/tmp"]
    assert claim_volume.persistent_volume_claim.read_only is True
    carried = [*container.command, *(e.value or "" for e in container.env or [])]
    assert not [a for a in carried if mount in a], carried

    # The pod's own command, with the claim's subPath at its mount path; whatever the pod
    # says it printed is never read.
    result = play_upload_pod(clients, namespace, pod, claim, env=s3.env, message=TOKEN)

    def decided() -> dict[str, Any] | None:
        job = get_job(clients, namespace, name)
        conditions = job["status"].get("conditions") or []
        failed = [
            c for c in conditions if c["type"] == "ProfileUploaded" and c["status"] == "False"
        ]
        return job if failed and failed[0]["reason"] == "UploadFailed" else None

    job = eventually(decided, timeout=60, description="the upload's outcome")
    (record,) = job["status"]["profileUploads"]
    (condition,) = [c for c in job["status"]["conditions"] if c["type"] == "ProfileUploaded"]
    hostile_report.tried(
        "profile rank file", "symlink to the upload pod's token", f"{record['state']}/"
        f"{record.get('reason')}, uploaded keys {sorted(s3.keys())}",
    )  # fmt: skip
    assert result.returncode == ExitCode.REFUSED, result.stderr
    assert record["state"] == "Failed"
    # The operator's sentence for Refused (the condition is in every CRD version the shared dev
    # cluster may have installed; status.profileUploads[].reason only in this one's).
    assert REASON_MESSAGES[UploadReason.REFUSED] in condition["message"]
    assert record.get("reason", "Refused") == "Refused"
    assert s3.keys() == {}, "nothing read through the symlink reaches S3"
    assert TOKEN not in str(job["status"]), "the pod's text is never echoed into the status"
    assert job["status"]["phase"] == "Succeeded", "an upload never fails the job"
