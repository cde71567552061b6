"""When and how a finished attempt's profile goes to S3, decided purely from the job, its
status (as the state machine just computed it) and the job's upload pods.

Once a profiled job has finished (Succeeded or Failed after training ran), its last attempt's
profile is uploaded by one pod (`builders.upload`). This policy adds to the Decision:

- the upload pod, once;
- `status.profile.upload` (state, pod, destination, the pod's message) and, when the pod has
  succeeded (its manifest, written last, is in S3), `status.profile.s3Uri`;
- the `ProfileUploaded` condition and one event per outcome: Normal `ProfileUploaded`, or
  Warning `ProfileUploadFailed` with the uploader's one-line reason (missing bucket, access
  denied, no credentials). The job's phase is never touched: an upload failure never fails
  the training.

It runs after `machine.decide`, on its output, so the state machine knows nothing about it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainium_operator.api.status import TERMINAL_PHASES, Phase
from trainium_operator.builders.job import JobRef
from trainium_operator.builders.upload import (
    LABEL_PROFILE_ATTEMPT,
    destination_uri,
    upload_pod,
    upload_pod_name,
)
from trainium_operator.lifecycle.machine import Decision, EventRecord

Obj = dict[str, Any]
CONDITION = "ProfileUploaded"
ENV_DEFAULT_S3_URI = "TRAINIUM_PROFILE_S3_URI"
ENV_UPLOAD_SERVICE_ACCOUNT = "TRAINIUM_PROFILE_UPLOAD_SERVICE_ACCOUNT"
DONE_STATES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class UploadDefaults:
    """Chart-wide settings: the operator's `--profile-s3-uri` / `TRAINIUM_PROFILE_S3_URI` and
    the ServiceAccount of upload pods when a job names none."""

    s3_uri: str | None = None
    service_account: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> UploadDefaults:
        """From the operator Deployment's env (the chart's profileUpload values)."""
        return cls(
            s3_uri=environ.get(ENV_DEFAULT_S3_URI, "").strip() or None,
            service_account=environ.get(ENV_UPLOAD_SERVICE_ACCOUNT, "").strip() or None,
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
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated:
            text = str(terminated.get("message") or "").strip()
            last = text.splitlines()[-1] if text else ""
            code = terminated.get("exitCode")
            reason = terminated.get("reason") or ""
            message = last or f"{reason or 'exited'} (exit code {code})"
    if phase == "Failed" and not message:
        message = status.get("message") or status.get("reason") or "the upload pod failed"
    if phase in ("Succeeded", "Failed"):
        return _PodOutcome(phase, message)
    return _PodOutcome("Running" if phase == "Running" else "Pending", "")


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


def plan_upload(
    job: JobRef,
    decision: Decision,
    upload_pods: list[Obj],
    defaults: UploadDefaults,
    now: datetime,
) -> None:
    """Adds the upload pod, its status and its events to `decision` (in place)."""
    s3_uri = s3_uri_for(job, defaults)
    status = decision.status
    profile = status.get("profile")
    if not s3_uri or not isinstance(profile, dict) or not profile.get("path"):
        return
    profile = status["profile"] = dict(profile)
    if status.get("phase") not in {p.value for p in TERMINAL_PHASES} or decision.delete_job:
        return
    attempt = int(status.get("attempt", 0))
    previous = profile.get("upload") or {}
    if previous.get("attempt") == attempt and previous.get("state") in DONE_STATES:
        return  # decided once; the pod may be gone since (cleanup, TTL)
    name = upload_pod_name(job, attempt)
    destination = destination_uri(s3_uri, job, attempt)
    pod = next(
        (
            p
            for p in upload_pods
            if p["metadata"]["name"] == name
            and (p["metadata"].get("labels") or {}).get(LABEL_PROFILE_ATTEMPT) == str(attempt)
        ),
        None,
    )
    if pod is None:
        decision.create.append(
            upload_pod(job, attempt, s3_uri, service_account=defaults.service_account)
        )
        outcome = _PodOutcome("Pending", "")
    else:
        outcome = _outcome(pod)
    upload: Obj = {"state": outcome.state, "pod": name, "attempt": attempt}
    upload["destination"] = destination
    if outcome.message:
        upload["message"] = outcome.message
    profile["upload"] = upload
    generation = job.generation
    phase = Phase(status["phase"])
    if outcome.state == "Succeeded":
        profile["s3Uri"] = destination
        message = f"profile of attempt {attempt} uploaded to {destination}"
        _set_condition(status, True, "Uploaded", message, generation=generation, now=now)
        decision.events.append(EventRecord("Normal", "ProfileUploaded", message))
    elif outcome.state == "Failed":
        profile.pop("s3Uri", None)
        message = (
            f"profile of attempt {attempt} was not uploaded to {destination} "
            f"(the {phase.value.lower()} job is not affected): {outcome.message}"
        )
        _set_condition(status, False, "UploadFailed", message, generation=generation, now=now)
        decision.events.append(EventRecord("Warning", "ProfileUploadFailed", message))
    else:
        message = f"uploading the profile of attempt {attempt} to {destination} (pod {name})"
        _set_condition(status, False, "Uploading", message, generation=generation, now=now)
