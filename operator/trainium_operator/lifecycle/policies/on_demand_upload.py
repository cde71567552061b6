"""The S3 upload of a Captured on-demand profile (lifecycle.policies.on_demand_profile): with an
S3 URI configured (spec.profile.s3Uri, else the operator's --profile-s3-uri), its own upload
pod, once, while the job trains; `status.onDemandProfile.upload` follows it, with one event per
outcome. Only the latest request has a record: earlier requests' finished upload pods go."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainium_operator.api.status import UploadReason
from trainium_operator.builders.upload import (
    LABEL_PROFILE_REQUEST,
    on_demand_destination_uri,
    on_demand_upload_pod,
    on_demand_upload_pod_name,
)
from trainium_operator.lifecycle.decision import EventRecord, PodDeletion
from trainium_operator.lifecycle.policies.on_demand_profile import STATUS_KEY
from trainium_operator.lifecycle.policies.profile_upload import (
    DONE_STATES,
    MAX_REFUSAL_CHARS,
    pod_outcome,
    reason_message,
)
from trainium_operator.lifecycle.status_edit import StatusEdit

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass

Obj = dict[str, Any]


def on_demand_upload(p: Pass) -> None:
    """The upload pod of a Captured on-demand profile, once, and its outcome in
    `status.onDemandProfile.upload`."""
    job, decision, status = p.job, p.plan, p.status.data
    defaults = p.snapshot.settings.upload_defaults
    upload_pods = list(p.snapshot.upload_pods)
    record: Obj | None = status.get(STATUS_KEY)
    s3_uri = job.spec.profile.s3_uri or defaults.s3_uri
    # Only the latest request has a record: earlier requests' finished upload pods go, so
    # repeated requests never pile pods up.
    current = str((record or {}).get("requestId", "")).lower()
    decision.delete_pods += [
        PodDeletion(pod["metadata"]["name"], force=False)
        for pod in upload_pods
        if LABEL_PROFILE_REQUEST in (pod["metadata"].get("labels") or {})
        and pod["metadata"]["labels"][LABEL_PROFILE_REQUEST] != current
        and (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
    ]
    if record is None or record.get("state") != "Captured" or not s3_uri or decision.delete_job:
        return
    previous: Obj = record.get("upload") or {}
    if previous.get("state") in DONE_STATES:
        return  # decided once; its pod may be gone since
    request, attempt = str(record["requestId"]), int(record.get("attempt", 0))
    name = on_demand_upload_pod_name(job, request)
    pod = next((p for p in upload_pods if p["metadata"]["name"] == name), None)
    upload: Obj = {
        "pod": name,
        "destination": on_demand_destination_uri(s3_uri, job, attempt, request),
    }
    reason: str
    if pod is None:
        # The directory comes from the job and the request id, never from status.path.
        try:
            created = on_demand_upload_pod(job, attempt, request, s3_uri, defaults.pod_settings())
        except ValueError:
            upload["state"], reason = "Failed", UploadReason.NOT_ON_CLAIM
        else:
            decision.side_create.append(created)
            upload["state"], reason = "Pending", ""
    else:
        upload["state"], reason = pod_outcome(pod)
    if reason:
        upload["reason"] = reason
        upload["message"] = reason_message(reason)
    record = status[STATUS_KEY] = {**record, "upload": upload}
    if upload["state"] == previous.get("state"):
        return
    if upload["state"] == "Succeeded":
        decision.events.append(
            EventRecord(
                "Normal",
                "ProfileUploaded",
                f"on-demand profile {request} uploaded to {upload['destination']}",
            )
        )
    elif upload["state"] in DONE_STATES:
        decision.events.append(
            EventRecord(
                "Warning",
                "ProfileUploadFailed",
                f"on-demand profile {request} was not uploaded to {upload['destination']} "
                f"(training is not affected): {upload.get('message', '')}",
            )
        )


def on_demand_upload_refused(edit: StatusEdit, pod: str, reason: str) -> None:
    """The on-demand upload recorded as Failed because the API server refused its pod, with
    its Warning (no retry; the job is untouched)."""
    record = dict(edit.data.get(STATUS_KEY) or {})
    upload = {**(record.get("upload") or {}), "pod": pod, "state": "Failed"}
    upload["reason"] = UploadReason.POD_REFUSED
    upload["message"] = f"the upload pod {pod} was refused by the API server: {reason}"[
        :MAX_REFUSAL_CHARS
    ]
    record["upload"] = upload
    edit.data[STATUS_KEY] = record
    message = (
        f"on-demand profile {record.get('requestId')} was not uploaded "
        f"(training is not affected): {upload['message']}"
    )
    edit.decision.events.append(EventRecord("Warning", "ProfileUploadFailed", message))
