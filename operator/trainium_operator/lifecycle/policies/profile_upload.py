"""When and how a finished attempt's profile goes to S3, decided purely from the job, its
status (as the state machine just computed it) and the job's upload pods.

When a profiled training attempt is over (a restart or a suspension replaced it, or the job
finished), its profile is uploaded by one pod (`builders.upload`). This policy adds to the
Decision:

- the attempt's upload pod, once;
- `status.profileUploads[]` (attempt, state, a classified reason with the operator's sentence
  for it, pod, destination, and `s3Uri` once the pod has succeeded: its manifest, written
  last, is in S3), the newest MAX_UPLOAD_RECORDS, older ones counted in
  `status.profileUploadsOlder`; for the finished job's last attempt also
  `status.profile.upload` and `status.profile.s3Uri`;
- the `ProfileUploaded` condition and one event per outcome: Normal `ProfileUploaded`, or
  Warning `ProfileUploadFailed` with the reason's sentence (missing bucket, access denied, no
  credentials, a refused symlink). The reason comes from the pod's exit code alone, never its
  log: the profile directory is the job author's. The job's phase is never touched: an upload
  failure never fails the training;
- the deletion of finished upload pods beyond the newest few, once their outcome is stored.

It runs after the policies that decide the job's course (machine.PIPELINE), on the status
they left; they know nothing about it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainium_operator.api.objects import POD_ENDED_PHASES, Obj, pod_ended
from trainium_operator.api.status import (
    MAX_PROFILE_UPLOAD_RECORDS,
    TERMINAL_PHASES,
    ConditionType,
    Phase,
    ProfileUpload,
    ProfileUploadCounts,
    ProfileUploadSummary,
    UploadReason,
    UploadState,
)
from trainium_operator.builders.job import JobRef
from trainium_operator.builders.upload import (
    CONTAINER_NAME,
    LABEL_PROFILE_ATTEMPT,
    UPLOAD_DEADLINE_SECONDS,
    UploadPodSettings,
    default_operator_image,
    destination_uri,
    upload_pod,
    upload_pod_name,
)
from trainium_operator.lifecycle.decision import Decision, EventRecord, PodDeletion
from trainium_operator.lifecycle.status_edit import StatusEdit
from trainium_operator.profiler import s3 as uploader

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass

DONE_STATES: frozenset[UploadState | None] = frozenset({"Succeeded", "Failed", "NoProfile"})
# status.profileUploads keeps the newest records; older ones are counted in
# status.profileUploadsOlder. A crash loop or suspend/resume cycles end an attempt each, and
# the status must stay far below etcd's object size limit.
MAX_UPLOAD_RECORDS = MAX_PROFILE_UPLOAD_RECORDS
# Finished upload pods kept for `kubectl logs` (the newest); older ones are deleted once their
# outcome is in the stored status.
KEEP_FINISHED_UPLOAD_PODS = 3
REASON_MESSAGES: dict[str, str] = {
    UploadReason.UPLOADED: "uploaded",
    UploadReason.NO_PROFILE: "no rank files in the attempt's profile directory",
    UploadReason.REFUSED: (
        "refused: a symlink or a file that is not regular in the profile directory "
        "(nothing was uploaded)"
    ),
    UploadReason.ACCESS_DENIED: (
        "access denied: the upload role needs s3:PutObject, s3:GetObject, s3:DeleteObject and "
        "s3:ListBucket on the prefix"
    ),
    UploadReason.BUCKET_MISSING: "the bucket does not exist",
    UploadReason.NO_CREDENTIALS: (
        "no AWS credentials (IRSA or EKS Pod Identity on the upload ServiceAccount)"
    ),
    UploadReason.UNREACHABLE: "the S3 endpoint was unreachable",
    UploadReason.UPLOAD_FAILED: "the upload failed (the upload pod's log has the detail)",
    UploadReason.TIMEOUT: f"the upload pod ran out of its {UPLOAD_DEADLINE_SECONDS} s deadline",
    UploadReason.POD_FAILED: "the upload pod failed before the uploader finished",
    UploadReason.POD_REFUSED: "the API server refused the upload pod",
    UploadReason.NOT_ON_CLAIM: "the profile directory is not on the claim",
}


@dataclass(frozen=True)
class UploadDefaults:
    """Chart-wide settings (flags of `trainium-operator run`, controller.settings): the default
    S3 URI of profiled jobs, the ServiceAccount of every upload pod (the chart's S3 upload
    account; None: the namespace's `default`, never the job's own account), and the operator's
    image and pull secrets, which upload pods run (None: the chart's default image of this
    version)."""

    s3_uri: str | None = None
    service_account: str | None = None
    image: str | None = None
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()

    def pod_settings(self) -> UploadPodSettings:
        return UploadPodSettings(
            image=self.image or default_operator_image(),
            image_pull_policy=self.image_pull_policy,
            image_pull_secrets=self.image_pull_secrets,
            service_account=self.service_account,
        )


def s3_uri_for(job: JobRef, defaults: UploadDefaults) -> str | None:
    if not job.spec.profile.enabled:
        return None
    return job.spec.profile.s3_uri or defaults.s3_uri


@dataclass(frozen=True)
class PodOutcome:
    """Where an upload pod is: Pending or Running with no reason, else Succeeded, Failed or
    NoProfile with an UploadReason."""

    state: UploadState
    reason: UploadReason | None = None  # once the pod is over


# The uploader's exit code -> (state, reason). Nothing else of the pod is read: its log and
# termination message are text whoever wrote into the profile directory may have shaped.
_BY_EXIT_CODE: dict[int, tuple[UploadState, UploadReason]] = {
    uploader.ExitCode.UPLOADED: ("Succeeded", UploadReason.UPLOADED),
    uploader.ExitCode.FAILED: ("Failed", UploadReason.UPLOAD_FAILED),
    uploader.ExitCode.USAGE: ("Failed", UploadReason.UPLOAD_FAILED),
    uploader.ExitCode.NO_PROFILE: ("NoProfile", UploadReason.NO_PROFILE),
    uploader.ExitCode.REFUSED: ("Failed", UploadReason.REFUSED),
    uploader.ExitCode.ACCESS_DENIED: ("Failed", UploadReason.ACCESS_DENIED),
    uploader.ExitCode.BUCKET_MISSING: ("Failed", UploadReason.BUCKET_MISSING),
    uploader.ExitCode.NO_CREDENTIALS: ("Failed", UploadReason.NO_CREDENTIALS),
    uploader.ExitCode.UNREACHABLE: ("Failed", UploadReason.UNREACHABLE),
}


def pod_outcome(pod: Obj) -> PodOutcome:
    """An upload pod's outcome, from its phase and its uploader's exit code (never its text)."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    if phase not in POD_ENDED_PHASES:
        return PodOutcome("Running" if phase == "Running" else "Pending")
    if phase == "Succeeded":  # the kubelet's word: every container exited 0
        return PodOutcome("Succeeded", UploadReason.UPLOADED)
    if status.get("reason") == "DeadlineExceeded":  # activeDeadlineSeconds
        return PodOutcome("Failed", UploadReason.TIMEOUT)
    exit_code: int | None = None
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated") or {}
        code = terminated.get("exitCode")
        if container.get("name") == CONTAINER_NAME and isinstance(code, int):
            exit_code = code
    unknown: tuple[UploadState, UploadReason] = ("Failed", UploadReason.POD_FAILED)
    state, reason = unknown if exit_code is None else _BY_EXIT_CODE.get(exit_code, unknown)
    if state == "Succeeded":  # a Failed pod whose uploader exited 0 (killed after it)
        state, reason = "Failed", UploadReason.POD_FAILED
    return PodOutcome(state, reason)


def reason_message(reason: str) -> str:
    """The operator's own sentence for an UploadReason (what status and events say)."""
    return REASON_MESSAGES.get(reason, "the upload pod failed")


def outcome_fields(outcome: PodOutcome) -> dict[str, Any]:
    """An upload record's reason and the operator's sentence for it, once the pod is over
    (absent before)."""
    if outcome.reason is None:
        return {}
    return {"reason": outcome.reason, "message": reason_message(outcome.reason)}


def ended_attempts(status: StatusEdit) -> list[int]:
    """Training attempts that are over, the newest MAX_UPLOAD_RECORDS of them: the attempts
    since the first training gang that a restart (or a suspension) replaced, and the last one
    once the job has finished. An older attempt is never uploaded."""
    current = status.attempt
    training = status.training
    first = training.first_attempt if training is not None else None
    ended = (
        list(range(max(first, current - MAX_UPLOAD_RECORDS), current)) if first is not None else []
    )
    profile = status.profile
    if status.phase in TERMINAL_PHASES and profile is not None and profile.path:
        ended.append(current)
    return ended[-MAX_UPLOAD_RECORDS:]


def _attempt_of(pod: Obj) -> int | None:
    value = (pod["metadata"].get("labels") or {}).get(LABEL_PROFILE_ATTEMPT, "")
    return int(value) if value.isdigit() else None


def _find_pod(upload_pods: list[Obj], name: str, attempt: int) -> Obj | None:
    for pod in upload_pods:
        if pod["metadata"]["name"] == name and _attempt_of(pod) == attempt:
            return pod
    return None


def _record(p: Pass, attempt: int, s3_uri: str) -> ProfileUpload:
    """The attempt's upload record, creating its pod when there is none yet."""
    job, defaults = p.job, p.snapshot.settings.upload_defaults
    name = upload_pod_name(job, attempt)
    pod = _find_pod(list(p.snapshot.upload_pods), name, attempt)
    if pod is not None:
        outcome = pod_outcome(pod)
    else:
        try:
            p.plan.side_create.append(upload_pod(job, attempt, s3_uri, defaults.pod_settings()))
            outcome = PodOutcome("Pending")
        except ValueError:  # spec validation refuses such a profile.outputDir first
            outcome = PodOutcome("Failed", UploadReason.NOT_ON_CLAIM)
    destination = destination_uri(s3_uri, job, attempt)
    record = ProfileUpload(
        attempt=attempt,
        state=outcome.state,
        pod=name,
        destination=destination,
        **outcome_fields(outcome),
    )
    if outcome.state == "Succeeded":
        record = record.model_copy(update={"s3_uri": destination})
    return record


def _report(
    record: ProfileUpload, previous: ProfileUpload | None, phase: Phase | None, decision: Decision
) -> tuple[bool, str, str] | None:
    """The condition (value, reason, message) for this record, plus its event once."""
    attempt, destination, state = record.attempt, record.destination, record.state
    changed = (previous.state if previous is not None else None) != state
    if state == "Succeeded":
        message = f"profile of attempt {attempt} uploaded to {destination}"
        if changed:
            decision.events.append(EventRecord("Normal", "ProfileUploaded", message))
        return True, "Uploaded", message
    if state == "NoProfile":
        message = f"attempt {attempt} wrote no profile to upload: {record.message or ''}"
        if changed:
            decision.events.append(EventRecord("Normal", "NoProfile", message))
        return False, "NoProfile", message
    if state == "Failed":
        message = _failed_message(record, phase)
        if changed:
            decision.events.append(EventRecord("Warning", "ProfileUploadFailed", message))
        return False, "UploadFailed", message
    message = f"uploading the profile of attempt {attempt} to {destination} (pod {record.pod})"
    return False, "Uploading", message


def _fold_older(status: StatusEdit, records: dict[int, ProfileUpload]) -> list[ProfileUpload]:
    """The newest MAX_UPLOAD_RECORDS records; the older ones counted, by state, in
    status.profileUploadsOlder."""
    ordered = [records[a] for a in sorted(records)]
    kept, older = ordered[-MAX_UPLOAD_RECORDS:], ordered[:-MAX_UPLOAD_RECORDS]
    if older:
        counts = status.profile_uploads_older or ProfileUploadCounts()
        states = [record.state for record in older]
        succeeded = states.count("Succeeded")
        no_profile = states.count("NoProfile")
        status.profile_uploads_older = ProfileUploadCounts(
            succeeded=counts.succeeded + succeeded,
            failed=counts.failed + len(states) - succeeded - no_profile,
            no_profile=counts.no_profile + no_profile,
        )
    return kept


def _finished_pods_to_delete(upload_pods: list[Obj], stored: dict[int, ProfileUpload]) -> list[str]:
    """Upload pods of attempts whose outcome the stored status already holds (or that are
    older than every record and over), but the newest KEEP_FINISHED_UPLOAD_PODS: their
    outcome is written before they go, and a crash loop never piles pods up."""
    oldest = min(stored, default=0)
    finished: list[tuple[int, str]] = []
    for pod in upload_pods:
        attempt = _attempt_of(pod)
        if attempt is None:
            continue
        done = attempt in stored and stored[attempt].state in DONE_STATES
        over = pod_ended(pod)
        if done or (attempt < oldest and over and attempt not in stored):
            finished.append((attempt, pod["metadata"]["name"]))
    finished.sort(reverse=True)
    return [name for _, name in finished[KEEP_FINISHED_UPLOAD_PODS:]]


def profile_upload(p: Pass) -> None:
    """Upload pods, their status and their events for the ended attempts' profiles.

    `status.profileUploads` keeps one record per ended attempt, the newest
    MAX_UPLOAD_RECORDS (the policies before this one never touch it); `status.profile.upload` /
    `.s3Uri` mirror the last attempt's once the job has finished; the `ProfileUploaded`
    condition describes the newest upload. Finished upload pods beyond the newest few are
    deleted once their outcome is stored."""
    job, decision, status = p.job, p.plan, p.status
    s3_uri = s3_uri_for(job, p.snapshot.settings.upload_defaults)
    if not s3_uri or decision.delete_job:
        return
    records = {r.attempt: r for r in status.profile_uploads}
    stored = dict(records)
    latest: tuple[bool, str, str] | None = None
    for attempt in ended_attempts(status):
        previous = records.get(attempt)
        if previous is not None and previous.state in DONE_STATES:
            record = previous  # decided once; its pod may be gone since (cleanup, TTL)
        else:
            record = _record(p, attempt, s3_uri)
        latest = _report(record, previous, status.phase, decision) or latest
        records[attempt] = record
    decision.delete_pods += [
        PodDeletion(name, force=False)
        for name in _finished_pods_to_delete(list(p.snapshot.upload_pods), stored)
    ]
    if latest is None:
        return
    status.profile_uploads = _fold_older(status, records)
    status.condition(ConditionType.PROFILE_UPLOADED, *latest)
    profile = status.profile
    current = records.get(status.attempt)
    if profile is not None and current is not None:
        profile = profile.model_copy(update={"upload": _upload_view(current)})
        if current.s3_uri:
            profile = profile.model_copy(update={"s3_uri": current.s3_uri})
        else:
            profile = profile.without("s3_uri")
        status.profile = profile


# The API server's refusal is quoted up to this many characters (a quota, a policy's message).
MAX_REFUSAL_CHARS = 300


def upload_refused(edit: StatusEdit, attempt: int, pod: str, reason: str) -> None:
    """The upload of `attempt` recorded as Failed because the API server refused its pod (a
    quota, Pod Security, a missing ServiceAccount, a policy webhook), with its Warning. The
    upload is over (no retry until the job changes); the job's phase is untouched."""
    records = {r.attempt: r for r in edit.profile_uploads}
    record = records.get(attempt) or ProfileUpload(attempt=attempt, pod=pod)
    record = records[attempt] = record.model_copy(
        update={
            "state": "Failed",
            "reason": UploadReason.POD_REFUSED,
            "message": f"the upload pod {pod} was refused by the API server: {reason}"[
                :MAX_REFUSAL_CHARS
            ],
        }
    )
    edit.profile_uploads = _fold_older(edit, records)
    profile = edit.profile
    if profile is not None and edit.attempt == attempt:
        edit.profile = profile.model_copy(update={"upload": _upload_view(record)})
    message = _failed_message(record, edit.phase)
    edit.condition(ConditionType.PROFILE_UPLOADED, False, "UploadFailed", message)
    edit.decision.events.append(EventRecord("Warning", "ProfileUploadFailed", message))


def _upload_view(record: ProfileUpload) -> ProfileUploadSummary:
    """An upload record as `status.profile.upload` shows it (the s3Uri is the profile's own)."""
    return ProfileUploadSummary.model_validate(
        record.model_dump(exclude_unset=True, exclude={"s3_uri"})
    )


def _failed_message(record: ProfileUpload, phase: Phase | None) -> str:
    job_state = f"the {phase.lower()} job" if phase else "training"
    return (
        f"profile of attempt {record.attempt} was not uploaded to "
        f"{record.destination or 'S3'} ({job_state} is not affected): "
        f"{record.message or ''}"
    )
