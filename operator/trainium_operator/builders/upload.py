"""The profile upload pod: after a profiled attempt ends, one short pod per attempt copies the
profile from the shared claim (mounted read-only) to S3 with boto3 (manifest last).

It runs the job's own training image, which carries the profiler package and boto3
(`python3 -m trainium_operator.profiler.s3 DIR s3://...`), as the job's ServiceAccount (the
IRSA / Pod Identity role with S3 access), on any node: it needs no Neuron device or EFA. The
training pods need no S3 access at all, and one uploader per attempt writes the manifest after
every node's rank files without any coordination between nodes.
"""

from __future__ import annotations

from typing import Any

from trainium_operator.builders.job import LABEL_JOB_NAME, LABEL_STAGE, JobRef

Obj = dict[str, Any]

UPLOAD_STAGE = "profile-upload"  # value of trainium.dev/stage on upload pods
LABEL_PROFILE_ATTEMPT = "trainium.dev/profile-attempt"
CONTAINER_NAME = "upload"
DATA_VOLUME = "shared-data"
UPLOAD_MODULE = "trainium_operator.profiler.s3"
# boto3's own retries cover throttling and dropped connections; a pod that still fails is
# reported, not retried blindly (a missing bucket or a denied role needs a person).
UPLOAD_DEADLINE_SECONDS = 3600


def upload_pod_name(job: JobRef, attempt: int) -> str:
    return f"{job.name}-profile-upload-{attempt}"


def destination_uri(s3_uri: str, job: JobRef, attempt: int) -> str:
    """`<s3Uri>/<namespace>/<job>/<attempt>` (the layout of shared/design.md)."""
    return f"{s3_uri.rstrip('/')}/{job.namespace}/{job.name}/{attempt}"


def is_upload_pod(pod: Obj) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_STAGE) == UPLOAD_STAGE


def upload_pod(
    job: JobRef, attempt: int, s3_uri: str, *, service_account: str | None = None
) -> Obj:
    spec = job.spec
    metadata = job.metadata(upload_pod_name(job, attempt))
    metadata["labels"] = {
        **metadata["labels"],
        LABEL_JOB_NAME: job.name,
        LABEL_STAGE: UPLOAD_STAGE,
        "app.kubernetes.io/component": UPLOAD_STAGE,
        LABEL_PROFILE_ATTEMPT: str(attempt),
    }
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": UPLOAD_DEADLINE_SECONDS,
        "containers": [
            {
                "name": CONTAINER_NAME,
                "image": spec.image,
                "imagePullPolicy": spec.image_pull_policy,
                "command": [
                    "python3",
                    "-m",
                    UPLOAD_MODULE,
                    job.profile_dir(attempt),
                    destination_uri(s3_uri, job, attempt),
                ],
                "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                # The last line of the log (the outcome in one sentence) becomes the
                # termination message the operator puts in the status and the event.
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "resources": {
                    "requests": {"cpu": "250m", "memory": "256Mi"},
                    "limits": {"memory": "1Gi"},
                },
                "volumeMounts": [
                    {"name": DATA_VOLUME, "mountPath": job.mount_path, "readOnly": True}
                ],
                "securityContext": {"allowPrivilegeEscalation": False},
            }
        ],
        "volumes": [
            {
                "name": DATA_VOLUME,
                "persistentVolumeClaim": {"claimName": spec.storage.claim_name, "readOnly": True},
            }
        ],
    }
    account = spec.service_account_name or service_account
    if account:
        pod_spec["serviceAccountName"] = account
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
