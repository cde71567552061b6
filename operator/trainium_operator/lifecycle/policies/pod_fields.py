"""Dropped pod fields: a job admitted before the podTemplate allowlist refused some of its
fields runs without them; one Warning per job and operator process names them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainium_operator.lifecycle.decision import EventRecord
from trainium_operator.lifecycle.parse import dropped_pod_fields_message

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass


def dropped_pod_fields(p: Pass) -> None:
    dropped = p.job.dropped_pod_fields
    if dropped and not p.snapshot.dropped_fields_warned:
        message = dropped_pod_fields_message(dropped)
        p.plan.events.append(EventRecord("Warning", "PodFieldsDropped", message))
