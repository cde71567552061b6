"""When and how a finished attempt's profile goes to S3, decided purely from the job, its
status (as the state machine just computed it) and the job's upload pods.

When a profiled training attempt is over (a restart or a suspension replaced it, or the job
finished), its profile is uploaded by one pod (`builders.upload`). This policy adds to the
Decision:

- the attempt's upload pod, once;
- `status.profileUploads[]` (attempt, state, pod, destination, the pod's message, and `s3Uri`
  once the pod has succeeded: its manifest, written last, is in S3); for the finished job's
  last attempt also `status.profile.upload` and `status.profile.s3Uri`;
- the `ProfileUploaded` condition and one event per outcome: Normal `ProfileUploaded`, or
  Warning `ProfileUploadFailed` with the uploader's one-line reason (missing bucket, access
  denied, no credentials). The job's phase is never touched: an upload failure never fails
  the training.

It runs after `machine.decide`, on its output, so the state machine knows nothing about it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainium_operator.api.status import TERMINAL_PHASES
from trainium_operator.builders.job import JobRef
from trainium_operator.builders.upload import (
    LABEL_PROFILE_ATTEMPT,
    UploadPodSettings,
    default_operator_image,
    destination_uri,
    upload_pod,
    upload_pod_name,
)
from trainium_operator.lifecycle.decision import Decision, EventRecord
from trainium_operator.profiler import s3 as uploader

Obj = dict[str, Any]
CONDITION = "ProfileUploaded"
ENV_DEFAULT_S3_URI = "TRAINIUM_PROFILE_S3_URI"
ENV_UPLOAD_SERVICE_ACCOUNT = "TRAINIUM_PROFILE_UPLOAD_SERVICE_ACCOUNT"
# The operator's own image, as the chart's Deployment runs it (upload pods run it too).
ENV_OPERATOR_IMAGE = "TRAINIUM_OPERATOR_IMAGE"
ENV_OPERATOR_IMAGE_PULL_POLICY = "TRAINIUM_OPERATOR_IMAGE_PULL_POLICY"
# Comma-separated names of the chart's imagePullSecrets (they must exist in the job's namespace).
ENV_OPERATOR_IMAGE_PULL_SECRETS = "TRAINIUM_OPERATOR_IMAGE_PULL_SECRETS"
DONE_STATES = frozenset({"Succeeded", "Failed", "NoProfile"})
# The uploader's exit code when it found no rank files (an attempt that never trained).
NO_PROFILE_EXIT_CODE = uploader.NO_PROFILE_EXIT_CODE


@dataclass(frozen=True)
class UploadDefaults:
    """Chart-wide settings: the operator's `--profile-s3-uri` / `TRAINIUM_PROFILE_S3_URI`, the
    ServiceAccount of every upload pod (the chart's S3 upload account; None: the namespace's
    `default`, never the job's own account), and the operator's image and pull secrets, which
    upload pods run (None: the chart's default image of this version)."""

    s3_uri: str | None = None
    service_account: str | None = None
    image: str | None = None
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> UploadDefaults:
        """From the operator Deployment's env (the chart's image and profileUpload values)."""
        secrets = environ.get(ENV_OPERATOR_IMAGE_PULL_SECRETS, "")
        return cls(
            s3_uri=environ.get(ENV_DEFAULT_S3_URI, "").strip() or None,
            service_account=environ.get(ENV_UPLOAD_SERVICE_ACCOUNT, "").strip() or None,
            image=environ.get(ENV_OPERATOR_IMAGE, "").strip() or None,
            image_pull_policy=environ.get(ENV_OPERATOR_IMAGE_PULL_POLICY, "").strip()
            or "IfNotPresent",
            image_pull_secrets=tuple(n.strip() for n in secrets.split(",") if n.strip()),
        )

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
class _PodOutcome:
    state: str  # Pending | Running | Succeeded | Failed
    message: str


def _outcome(pod: Obj) -> _PodOutcome:
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    message = ""
    exit_code: int | None = None
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated:
            text = str(terminated.get("message") or "").strip()
            last = text.splitlines()[-1] if text else ""
            code = terminated.get("exitCode")
            exit_code = int(code) if code is not None else None
            reason = terminated.get("reason") or ""
            message = last or f"{reason or 'exited'} (exit code {code})"
    if phase == "Failed" and not message:
        message = status.get("message") or status.get("reason") or "the upload pod failed"
    if phase == "Failed" and exit_code == NO_PROFILE_EXIT_CODE:
        return _PodOutcome("NoProfile", message)
    if phase in ("Succeeded", "Failed"):
        return _PodOutcome(phase, message)
    return _PodOutcome("Running" if phase == "Running" else "Pending", "")


def pod_outcome(pod: Obj) -> tuple[str, str]:
    """(state, message) of an upload pod: Pending, Running, Succeeded, Failed or NoProfile."""
    outcome = _outcome(pod)
    return outcome.state, outcome.message


def _ts(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _set_condition(
    status: Obj, value: bool, reason: str, message: str, *, generation: int, now: datetime
) -> None:
    conditions: list[Obj] = status.setdefault("conditions", [])
    wanted = "True" if value else "False"
    for cond in conditions:
        if cond["type"] == CONDITION:
            if cond["status"] != wanted:
                cond["lastTransitionTime"] = _ts(now)
            cond.update(
                status=wanted, reason=reason, message=message, observedGeneration=generation
            )
            return
    conditions.append(
        {
            "type": CONDITION,
            "status": wanted,
            "reason": reason,
            "message": message,
            "lastTransitionTime": _ts(now),
            "observedGeneration": generation,
        }
    )


def ended_attempts(status: Obj) -> list[int]:
    """Training attempts that are over: every attempt since the first training gang that a
    restart (or a suspension) replaced, and the last one once the job has finished."""
    current = int(status.get("attempt", 0))
    first = (status.get("training") or {}).get("firstAttempt")
    ended = list(range(int(first), current)) if first is not None else []
    profile = status.get("profile")
    finished = status.get("phase") in {p.value for p in TERMINAL_PHASES}
    if finished and isinstance(profile, dict) and profile.get("path"):
        ended.append(current)
    return ended


def _find_pod(upload_pods: list[Obj], name: str, attempt: int) -> Obj | None:
    for pod in upload_pods:
        labels = pod["metadata"].get("labels") or {}
        if pod["metadata"]["name"] == name and labels.get(LABEL_PROFILE_ATTEMPT) == str(attempt):
            return pod
    return None


def _record(
    job: JobRef,
    attempt: int,
    s3_uri: str,
    *,
    upload_pods: list[Obj],
    decision: Decision,
    defaults: UploadDefaults,
) -> Obj:
    """The attempt's upload record, creating its pod when there is none yet."""
    name = upload_pod_name(job, attempt)
    pod = _find_pod(upload_pods, name, attempt)
    if pod is None:
        decision.side_create.append(upload_pod(job, attempt, s3_uri, defaults.pod_settings()))
        outcome = _PodOutcome("Pending", "")
    else:
        outcome = _outcome(pod)
    record: Obj = {
        "attempt": attempt,
        "state": outcome.state,
        "pod": name,
        "destination": destination_uri(s3_uri, job, attempt),
    }
    if outcome.message:
        record["message"] = outcome.message
    if outcome.state == "Succeeded":
        record["s3Uri"] = record["destination"]
    return record


def _report(
    record: Obj, previous: Obj | None, phase: str | None, decision: Decision
) -> tuple[bool, str, str] | None:
    """The condition (value, reason, message) for this record, plus its event once."""
    attempt, destination, state = record["attempt"], record["destination"], record["state"]
    changed = (previous or {}).get("state") != state
    if state == "Succeeded":
        message = f"profile of attempt {attempt} uploaded to {destination}"
        if changed:
            decision.events.append(EventRecord("Normal", "ProfileUploaded", message))
        return True, "Uploaded", message
    if state == "NoProfile":
        message = f"attempt {attempt} wrote no profile to upload: {record.get('message', '')}"
        if changed:
            decision.events.append(EventRecord("Normal", "NoProfile", message))
        return False, "NoProfile", message
    if state == "Failed":
        message = _failed_message(record, phase)
        if changed:
            decision.events.append(EventRecord("Warning", "ProfileUploadFailed", message))
        return False, "UploadFailed", message
    message = f"uploading the profile of attempt {attempt} to {destination} (pod {record['pod']})"
    return False, "Uploading", message


def plan_upload(
    job: JobRef,
    decision: Decision,
    upload_pods: list[Obj],
    defaults: UploadDefaults,
    now: datetime,
) -> None:
    """Adds upload pods, their status and their events to `decision` (in place).

    `status.profileUploads` keeps one record per ended attempt (the state machine never
    touches it); `status.profile.upload` / `.s3Uri` mirror the last attempt's once the job
    has finished; the `ProfileUploaded` condition describes the newest upload."""
    s3_uri = s3_uri_for(job, defaults)
    status = decision.status
    if not s3_uri or decision.delete_job:
        return
    records = {int(r["attempt"]): r for r in status.get("profileUploads") or []}
    latest: tuple[bool, str, str] | None = None
    for attempt in ended_attempts(status):
        previous = records.get(attempt)
        if previous is not None and previous.get("state") in DONE_STATES:
            record = previous  # decided once; its pod may be gone since (cleanup, TTL)
        else:
            record = _record(
                job, attempt, s3_uri, upload_pods=upload_pods, decision=decision, defaults=defaults
            )
        latest = _report(record, previous, status.get("phase"), decision) or latest
        records[attempt] = record
    if latest is None:
        return
    status["profileUploads"] = [records[a] for a in sorted(records)]
    _set_condition(status, *latest, generation=job.generation, now=now)
    profile = status.get("profile")
    current = records.get(int(status.get("attempt", 0)))
    if isinstance(profile, dict) and current is not None:
        profile = status["profile"] = dict(profile)
        profile["upload"] = _upload_view(current)
        if current.get("s3Uri"):
            profile["s3Uri"] = current["s3Uri"]
        else:
            profile.pop("s3Uri", None)


def upload_refused(
    status: Obj, attempt: int, pod: str, reason: str, *, generation: int, now: datetime
) -> tuple[Obj, str]:
    """`status` with the upload of `attempt` recorded as Failed because the API server refused
    its pod (a quota, Pod Security, a missing ServiceAccount, a policy webhook), and the event
    message. The upload is over (no retry until the job changes); the job's phase is untouched."""
    updated = copy.deepcopy(status)
    records = {int(r["attempt"]): r for r in updated.get("profileUploads") or []}
    record = records.setdefault(attempt, {"attempt": attempt, "pod": pod})
    record["state"] = "Failed"
    record["message"] = f"the upload pod {pod} was refused by the API server: {reason}"
    updated["profileUploads"] = [records[a] for a in sorted(records)]
    profile = updated.get("profile")
    if isinstance(profile, dict) and int(updated.get("attempt", 0)) == attempt:
        profile["upload"] = _upload_view(record)
    message = _failed_message(record, updated.get("phase"))
    _set_condition(updated, False, "UploadFailed", message, generation=generation, now=now)
    return updated, message


def _upload_view(record: Obj) -> Obj:
    """An upload record as `status.profile.upload` shows it (the s3Uri is the profile's own)."""
    return {k: v for k, v in record.items() if k != "s3Uri"}


def _failed_message(record: Obj, phase: str | None) -> str:
    job_state = f"the {phase.lower()} job" if phase else "training"
    return (
        f"profile of attempt {record['attempt']} was not uploaded to "
        f"{record.get('destination', 'S3')} ({job_state} is not affected): "
        f"{record.get('message', '')}"
    )
