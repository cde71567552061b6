"""Helpers for tests and the demo: end a simulated container, lose a node, wait with clear failures.

Pod outcomes are requests to KWOK through pod annotations (see `stages`); node loss takes over the
node's Lease, which is exactly what the control plane sees when a kubelet dies: KWOK stops renewing
it and stops acting for the node and its pods, and the node lifecycle controller marks the node
`Ready=Unknown` after its grace period (16 s here), taints it
`node.kubernetes.io/unreachable:NoExecute` and sets `Ready=False` on its pods. Pods are evicted when
their toleration of that taint runs out (300 s by default, added by admission), then stay
Terminating, as pods on an unreachable node do, until the node comes back.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from trainium_devcluster import stages

T = TypeVar("T")

NODE_LEASE_NAMESPACE = "kube-node-lease"
NODE_LOST_HOLDER = "sim.trainium.dev/node-lost"
# Long enough that KWOK never considers the taken-over lease expired during a test.
NODE_LOST_LEASE_SECONDS = 24 * 3600
_GO_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")


class WaitTimeoutError(AssertionError):
    """A waited-for condition did not hold in time; the message shows the last observed state."""


def go_duration(after: str | float | timedelta) -> str:
    """A delay as the Go duration string KWOK parses (`5s`, `1500ms`)."""
    if isinstance(after, timedelta):
        after = after.total_seconds()
    if isinstance(after, int | float):
        if after < 0:
            raise ValueError(f"after must be >= 0 seconds, got {after}")
        return f"{round(after * 1000)}ms"
    if not _GO_DURATION.match(after):
        raise ValueError(f"after={after!r} is not a Go duration such as '5s', '1m30s' or '250ms'")
    return after


def outcome_annotations(
    *,
    succeeded: bool,
    exit_code: int | None = None,
    reason: str | None = None,
    message: str | None = None,
    after: str | float | timedelta | None = None,
) -> dict[str, str]:
    """The pod annotations that make KWOK end every container of a running pod this way."""
    code = exit_code if exit_code is not None else (0 if succeeded else 1)
    if succeeded and code != 0:
        raise ValueError(f"a succeeded pod exits 0, got exit_code={code}")
    if not succeeded and code == 0:
        raise ValueError("a failed pod needs a non-zero exit_code")
    if not 0 <= code <= 255:
        raise ValueError(f"exit_code must be in 0..255, got {code}")
    annotations = {
        stages.OUTCOME_ANNOTATION: stages.OUTCOME_SUCCEEDED if succeeded else stages.OUTCOME_FAILED,
        stages.EXIT_CODE_ANNOTATION: str(code),
        stages.REASON_ANNOTATION: reason or ("Completed" if succeeded else "Error"),
    }
    if message:
        annotations[stages.MESSAGE_ANNOTATION] = message
    if after is not None:
        annotations[stages.AFTER_ANNOTATION] = go_duration(after)
    return annotations


def simulate_pod_outcome(
    core_api: Any,
    namespace: str,
    pod: str,
    *,
    succeeded: bool,
    exit_code: int | None = None,
    reason: str | None = None,
    message: str | None = None,
    after: str | float | timedelta | None = None,
) -> None:
    """Ends the pod's containers (Succeeded or Failed) once it runs, optionally after a delay.

    Examples: `simulate_pod_outcome(core, ns, "w-0", succeeded=False, exit_code=137,
    reason="OOMKilled")`; `simulate_pod_outcome(core, ns, "w-1", succeeded=True, after="5s")`.
    """
    annotations = outcome_annotations(
        succeeded=succeeded, exit_code=exit_code, reason=reason, message=message, after=after
    )
    core_api.patch_namespaced_pod(pod, namespace, {"metadata": {"annotations": annotations}})


def pod_token(core_api: Any, pod: Any, audience: str, *, seconds: int = 600) -> str:
    """A token for the pod's ServiceAccount bound to the pod (a V1Pod), with `audience`: what
    the kubelet projects into a pod's token volume, for a local process that acts as the pod."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [audience],
            "expirationSeconds": seconds,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.metadata.name,
                "uid": pod.metadata.uid,
            },
        },
    }
    account = pod.spec.service_account_name or "default"
    answer = core_api.create_namespaced_service_account_token(
        account, pod.metadata.namespace, request
    )
    return str(answer.status.token)


KWOK_GROUP, KWOK_VERSION = "kwok.x-k8s.io", "v1alpha1"


def simulate_pod_logs(
    custom_api: Any,
    namespace: str,
    pod: str,
    lines: list[str],
    log_file: Path,
    *,
    containers: list[str],
) -> None:
    """Serve `lines` as the log of the pod's containers (what `kubectl logs` returns), as a
    kubelet serves a container's output: written to `log_file` in the CRI log format the
    kubelet keeps, which KWOK reads when the log is asked for."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text("".join(f"{stamp} stdout F {line}\n" for line in lines))
    body = {
        "apiVersion": f"{KWOK_GROUP}/{KWOK_VERSION}",
        "kind": "Logs",
        "metadata": {"name": pod, "namespace": namespace},
        "spec": {"logs": [{"containers": containers, "logsFile": str(log_file), "follow": False}]},
    }
    custom_api.create_namespaced_custom_object(KWOK_GROUP, KWOK_VERSION, namespace, "logs", body)


def _micro_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def simulate_node_loss(core_api: Any, node: str) -> None:
    """Stops the node's heartbeat, as when its kubelet dies; `restore_node` brings it back."""
    from kubernetes import client

    coordination = client.CoordinationV1Api(core_api.api_client)
    now = datetime.now(UTC)
    lease_patch = {
        "spec": {
            "holderIdentity": NODE_LOST_HOLDER,
            "leaseDurationSeconds": NODE_LOST_LEASE_SECONDS,
            "renewTime": _micro_time(now),
        }
    }
    coordination.patch_namespaced_lease(node, NODE_LEASE_NAMESPACE, lease_patch)
    core_api.patch_node(
        node, {"metadata": {"annotations": {stages.NODE_LOST_ANNOTATION: _micro_time(now)}}}
    )


def restore_node(core_api: Any, node: str) -> None:
    """Hands the node's Lease back to KWOK, which heartbeats again and reports the node Ready."""
    from kubernetes import client

    coordination = client.CoordinationV1Api(core_api.api_client)
    expired = datetime.now(UTC) - timedelta(days=2)
    coordination.patch_namespaced_lease(
        node,
        NODE_LEASE_NAMESPACE,
        {"spec": {"leaseDurationSeconds": 1, "renewTime": _micro_time(expired)}},
    )
    core_api.patch_node(node, {"metadata": {"annotations": {stages.NODE_LOST_ANNOTATION: None}}})


def _describe(value: object, limit: int = 2000) -> str:
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def wait_for(
    fetch: Callable[[], T],
    *,
    until: Callable[[T], bool] | None = None,
    timeout: float,
    description: str,
    interval: float = 0.25,
) -> T:
    """Polls `fetch` until `until(value)` (or, without `until`, a truthy value); returns that value.

    Exceptions from `fetch` (say, 404 before an object exists) count as "not yet". On timeout it
    raises WaitTimeoutError naming what was awaited and the last value or error seen.
    """
    deadline = time.monotonic() + timeout
    last: object = "<nothing fetched>"
    while True:
        try:
            value = fetch()
            if until(value) if until is not None else bool(value):
                return value
            last = value
        except Exception as error:
            last = error
        if time.monotonic() >= deadline:
            raise WaitTimeoutError(
                f"timed out after {timeout:.0f}s waiting for {description}; "
                f"last observed: {_describe(last)}"
            )
        time.sleep(interval)


def node_is_ready(node: dict[str, Any]) -> bool:
    """The node's Ready condition is True (a node object as the API server serialises it)."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False
