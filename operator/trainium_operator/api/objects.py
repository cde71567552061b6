"""The one alias for a Kubernetes object (or a part of one) as JSON: what the API server
returns, what the builders produce and what the status is stored as."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

# The phases a pod never leaves: its containers have ended and will not run again.
POD_ENDED_PHASES = frozenset({"Succeeded", "Failed"})


def pod_ended(pod: Obj) -> bool:
    """A pod, as the API server returns it, in one of POD_ENDED_PHASES."""
    return (pod.get("status") or {}).get("phase") in POD_ENDED_PHASES
