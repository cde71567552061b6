"""The profile upload pod: after a profiled attempt ends, one short pod per attempt copies the
profile from the shared claim to S3 with boto3 (manifest last).

The claim is tenant-writable, so the pod mounts only the profile's own directory of it
(`subPath`), read-only, at a path of the operator's choosing (PROFILE_MOUNT_PATH), never at
`spec.storage.mountPath`: a tenant's mount path over the image's Python would otherwise run
the tenant's code with the S3 role. Its arguments are that fixed path and the destination; its
status is classified from its exit code (lifecycle.policies.profile_upload), never read from
its log.

It runs the operator's own image and command (`python3 -m trainium_operator.profiler.s3 DIR
s3://...`; the image carries the profiler package and boto3), never the job's training image:
the upload role's S3 rights must not run code the job author chose. For the same reason it runs
as the chart's upload ServiceAccount (the IRSA / Pod Identity role with S3 access), never the
job's `spec.serviceAccountName`, and nothing of `spec.podTemplate` reaches it but the names of
its image pull secrets. It passes Pod Security `restricted` (non-root, no capability, no
privilege escalation, RuntimeDefault seccomp, read-only root filesystem), has no Kubernetes API
token, and runs on any node: it needs no Neuron device or EFA. The training pods need no S3
access at all, and one uploader per attempt writes the manifest after every node's rank files
without any coordination between nodes.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from importlib import metadata as package_metadata

from trainium_operator.api.objects import Obj
from trainium_operator.builders.job import LABEL_JOB_NAME, LABEL_STAGE, JobRef
from trainium_operator.contract import channel as channel_contract

UPLOAD_STAGE = "profile-upload"  # value of trainium.dev/stage on upload pods
LABEL_PROFILE_ATTEMPT = "trainium.dev/profile-attempt"
# On the upload pod of an on-demand profile (lifecycle/policies/on_demand_upload.py): its
# request id.
LABEL_PROFILE_REQUEST = "trainium.dev/profile-request"
ON_DEMAND_SUBDIR = channel_contract.ON_DEMAND_SUBDIR  # in S3 too
CONTAINER_NAME = "upload"
# Where the upload pod sees the profile directory (and nothing else of the claim).
PROFILE_MOUNT_PATH = "/profile"
DATA_VOLUME = "shared-data"
TMP_VOLUME = "tmp"
UPLOAD_MODULE = "trainium_operator.profiler.s3"
# boto3's own retries cover throttling and dropped connections; a pod that still fails is
# reported, not retried blindly (a missing bucket or a denied role needs a person).
UPLOAD_DEADLINE_SECONDS = 3600
# The operator image's unprivileged user (images/operator/Dockerfile: USER 65532:65532). Stated
# in the pod too, so runAsNonRoot is checked against a number, not the image's metadata.
OPERATOR_IMAGE_UID = 65532
# The chart's default image (image.repository "trainium-operator", tag = appVersion): what an
# operator run outside the chart uploads with.
DEFAULT_IMAGE_REPOSITORY = "trainium-operator"
# boto3 streams rank files in 8 MiB parts: a quarter CPU and a few hundred MiB are plenty; the
# CPU limit only slows a long upload down, it never fails it.
UPLOAD_RESOURCES: Obj = {
    "requests": {"cpu": "250m", "memory": "256Mi", "ephemeral-storage": "64Mi"},
    "limits": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "256Mi"},
}


def default_operator_image() -> str:
    return f"{DEFAULT_IMAGE_REPOSITORY}:{package_metadata.version('trainium-operator')}"


@dataclass(frozen=True)
class UploadPodSettings:
    """What the chart decides about upload pods (lifecycle.policies.profile_upload's
    UploadDefaults): the operator's own image and its pull secrets, and the ServiceAccount
    with the S3 role (None: the namespace's `default`)."""

    image: str
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    service_account: str | None = None


def upload_pod_name(job: JobRef, attempt: int) -> str:
    return f"{job.name}-profile-upload-{attempt}"


def destination_uri(s3_uri: str, job: JobRef, attempt: int) -> str:
    """`<s3Uri>/<namespace>/<job>/<attempt>` (the profile layout, docs/s3.md)."""
    return f"{s3_uri.rstrip('/')}/{job.namespace}/{job.name}/{attempt}"


def on_demand_upload_pod_name(job: JobRef, request_id: str) -> str:
    return f"{job.name}-profile-upload-{request_id.lower()}"


def on_demand_destination_uri(s3_uri: str, job: JobRef, attempt: int, request_id: str) -> str:
    """`<s3Uri>/<namespace>/<job>/<attempt>/on-demand/<request id>`: beside the attempt's
    profile, as on the claim."""
    return f"{destination_uri(s3_uri, job, attempt)}/{ON_DEMAND_SUBDIR}/{request_id}"


def is_upload_pod(pod: Obj) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_STAGE) == UPLOAD_STAGE


def restricted_pod_security_context() -> Obj:
    """Pod Security `restricted` at the pod level."""
    return {
        "runAsNonRoot": True,
        "runAsUser": OPERATOR_IMAGE_UID,
        "runAsGroup": OPERATOR_IMAGE_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def restricted_container_security_context() -> Obj:
    """Pod Security `restricted` at the container level, plus a read-only root filesystem
    (the uploader writes nothing but boto3's temporary files, to the /tmp emptyDir)."""
    return {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def image_pull_secrets(job: JobRef, settings: UploadPodSettings) -> list[Obj]:
    """The chart's pull secrets (for the operator image) and the job's own, by name, once each:
    a registry mirror the job's namespace needs for every image is in the job's list."""
    names = [*settings.image_pull_secrets]
    names += [str(s.get("name")) for s in job.spec.pod_template.spec.image_pull_secrets]
    return [{"name": name} for name in dict.fromkeys(n for n in names if n)]


def claim_subpath(job: JobRef, directory: str) -> str:
    """`directory` (a path in the training pods) relative to the claim's root, for a
    `subPath`. Raises ValueError when it is not strictly below spec.storage.mountPath or has a
    "." or ".." component (spec validation refuses such a profile.outputDir first)."""
    parts = directory.split("/")
    if not directory.startswith("/") or any(p in (".", "..") for p in parts):
        raise ValueError(f"{directory!r} is not a normalized absolute path")
    relative = posixpath.relpath(posixpath.normpath(directory), job.mount_path)
    if relative == "." or relative.startswith(".."):
        raise ValueError(f"{directory!r} is not below the claim's mount path {job.mount_path}")
    return relative


def upload_pod(job: JobRef, attempt: int, s3_uri: str, settings: UploadPodSettings) -> Obj:
    """The upload pod of an ended attempt's profile."""
    return _upload_pod(
        job,
        upload_pod_name(job, attempt),
        claim_subpath(job, job.profile_dir(attempt)),
        destination_uri(s3_uri, job, attempt),
        {LABEL_PROFILE_ATTEMPT: str(attempt)},
        settings,
    )


def on_demand_upload_pod(
    job: JobRef, attempt: int, request_id: str, s3_uri: str, settings: UploadPodSettings
) -> Obj:
    """The upload pod of a captured on-demand profile (`<profile dir>/on-demand/<id>`,
    derived here from the job, never from the status)."""
    # Raises ValueError for an id that is not one path component.
    directory = channel_contract.on_demand_dir(
        channel_contract.stacks_dir(job.profile_dir(attempt)), request_id
    )
    return _upload_pod(
        job,
        on_demand_upload_pod_name(job, request_id),
        claim_subpath(job, directory),
        on_demand_destination_uri(s3_uri, job, attempt, request_id),
        {LABEL_PROFILE_REQUEST: request_id.lower()},
        settings,
    )


def _upload_pod(  # noqa: PLR0917 - private: its two callers above
    job: JobRef,
    name: str,
    subpath: str,
    destination: str,
    labels: dict[str, str],
    settings: UploadPodSettings,
) -> Obj:
    spec = job.spec
    metadata = job.metadata(name)
    metadata["labels"] = {
        **spec.pod_metadata.labels,
        **metadata["labels"],
        LABEL_JOB_NAME: job.name,
        LABEL_STAGE: UPLOAD_STAGE,
        "app.kubernetes.io/component": UPLOAD_STAGE,
        **labels,
    }
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": UPLOAD_DEADLINE_SECONDS,
        # The S3 role's credentials come from the IRSA / Pod Identity webhook's own projected,
        # audience-bound token; the uploader never calls the Kubernetes API.
        "automountServiceAccountToken": False,
        "securityContext": restricted_pod_security_context(),
        "containers": [
            {
                "name": CONTAINER_NAME,
                "image": settings.image,
                "imagePullPolicy": settings.image_pull_policy,
                "command": [
                    "python3",
                    "-m",
                    UPLOAD_MODULE,
                    PROFILE_MOUNT_PATH,
                    destination,
                ],
                "env": [
                    {"name": "PYTHONUNBUFFERED", "value": "1"},
                    # No .pyc files on the read-only root; temporary files in the emptyDir.
                    {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
                    {"name": "TMPDIR", "value": "/tmp"},
                    {"name": "HOME", "value": "/tmp"},
                ],
                # The outcome is the exit code; the log (kubectl logs) has the detail and never
                # becomes a termination message or status text.
                "terminationMessagePolicy": "File",
                "resources": UPLOAD_RESOURCES,
                "volumeMounts": [
                    {
                        "name": DATA_VOLUME,
                        "mountPath": PROFILE_MOUNT_PATH,
                        "subPath": subpath,
                        "readOnly": True,
                    },
                    {"name": TMP_VOLUME, "mountPath": "/tmp"},
                ],
                "securityContext": restricted_container_security_context(),
            }
        ],
        "volumes": [
            {
                "name": DATA_VOLUME,
                "persistentVolumeClaim": {"claimName": spec.storage.claim_name, "readOnly": True},
            },
            {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}},
        ],
    }
    if spec.tolerations:
        pod_spec["tolerations"] = list(spec.tolerations)
    secrets = image_pull_secrets(job, settings)
    if secrets:
        pod_spec["imagePullSecrets"] = secrets
    if settings.service_account:
        pod_spec["serviceAccountName"] = settings.service_account
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
