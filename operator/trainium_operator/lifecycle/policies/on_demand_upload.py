"""The S3 upload of a Captured on-demand profile (lifecycle.policies.on_demand_profile): with an
S3 URI configured (spec.profile.s3Uri, else the operator's --profile-s3-uri), its own upload
pod, once, while the job trains; `status.onDemandProfile.upload` follows it, with one event per
outcome. Only the latest request has a record: earlier requests' finished upload pods go."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainium_operator.api.objects import pod_ended
from trainium_operator.api.status import ProfileUploadSummary, UploadReason
from trainium_operator.builders.upload import (
    LABEL_PROFILE_REQUEST,
    on_demand_destination_uri,
    on_demand_upload_pod,
    on_demand_upload_pod_name,
)
from trainium_operator.lifecycle.decision import EventRecord, PodDeletion
from trainium_operator.lifecycle.policies.profile_upload import (
    DONE_STATES,
    MAX_REFUSAL_CHARS,
    PodOutcome,
    outcome_fields,
    pod_outcome,
)
from trainium_operator.lifecycle.status_edit import StatusEdit

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass


def on_demand_upload(p: Pass) -> None:
    """The upload pod of a Captured on-demand profile, once, and its outcome in
    `status.onDemandProfile.upload`."""
    job, decision = p.job, p.plan
    defaults = p.snapshot.settings.upload_defaults
    upload_pods = list(p.snapshot.upload_pods)
    record = p.status.on_demand_profile
    s3_uri = job.spec.profile.s3_uri or defaults.s3_uri
    # Only the latest request has a record: earlier requests' finished upload pods go, so
    # repeated requests never pile pods up.
    current = record.request_id.lower() if record is not None else ""
    decision.delete_pods += [
        PodDeletion(pod["metadata"]["name"], force=False)
        for pod in upload_pods
        if LABEL_PROFILE_REQUEST in (pod["metadata"].get("labels") or {})
        and pod["metadata"]["labels"][LABEL_PROFILE_REQUEST] != current
        and pod_ended(pod)
    ]
    if record is None or record.state != "Captured" or not s3_uri or decision.delete_job:
        return
    previous = record.upload or ProfileUploadSummary()
    if previous.state in DONE_STATES:
        return  # decided once; its pod may be gone since
    request, attempt = record.request_id, record.attempt or 0
    name = on_demand_upload_pod_name(job, request)
    pod = next((p for p in upload_pods if p["metadata"]["name"] == name), None)
    if pod is None:
        # The directory comes from the job and the request id, never from status.path.
        try:
            created = on_demand_upload_pod(job, attempt, request, s3_uri, defaults.pod_settings())
        except ValueError:
            outcome = PodOutcome("Failed", UploadReason.NOT_ON_CLAIM)
        else:
            decision.side_create.append(created)
            outcome = PodOutcome("Pending")
    else:
        outcome = pod_outcome(pod)
    upload = ProfileUploadSummary(
        pod=name,
        destination=on_demand_destination_uri(s3_uri, job, attempt, request),
        state=outcome.state,
        **outcome_fields(outcome),
    )
    p.status.on_demand_profile = record.model_copy(update={"upload": upload})
    if upload.state == previous.state:
        return
    if upload.state == "Succeeded":
        decision.events.append(
            EventRecord(
                "Normal",
                "ProfileUploaded",
                f"on-demand profile {request} uploaded to {upload.destination}",
            )
        )
    elif upload.state in DONE_STATES:
        decision.events.append(
            EventRecord(
                "Warning",
                "ProfileUploadFailed",
                f"on-demand profile {request} was not uploaded to {upload.destination} "
                f"(training is not affected): {upload.message or ''}",
            )
        )


def on_demand_upload_refused(edit: StatusEdit, pod: str, reason: str) -> None:
    """The on-demand upload recorded as Failed because the API server refused its pod, with
    its Warning (no retry; the job is untouched). Without a request on the status there is
    nothing to record it on."""
    record = edit.on_demand_profile
    if record is None:
        return
    upload = (record.upload or ProfileUploadSummary()).model_copy(
        update={
            "pod": pod,
            "state": "Failed",
            "reason": UploadReason.POD_REFUSED,
            "message": f"the upload pod {pod} was refused by the API server: {reason}"[
                :MAX_REFUSAL_CHARS
            ],
        }
    )
    edit.on_demand_profile = record.model_copy(update={"upload": upload})
    message = (
        f"on-demand profile {record.request_id} was not uploaded "
        f"(training is not affected): {upload.message}"
    )
    edit.decision.events.append(EventRecord("Warning", "ProfileUploadFailed", message))
