"""The real kube-apiserver's Pod Security admission admits what the operator creates: a job's
training pods in a namespace that enforces `baseline`, and its profile upload pod in one that
enforces `restricted`; a training pod is refused by `restricted`, for the reason the builder
states (runAsNonRoot: the Neuron images run as root).

The training job runs in a baseline namespace (its pods exist only if admission let them in);
its upload pod, read back from the API server, is created again (server-side dry run, which
runs admission) in a restricted namespace. A privileged pod refused by the same baseline
namespace shows enforcement is on, so a passing test means something.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from integration.operator_harness import (
    OperatorView,
    create_job,
    eventually,
    finish_pods,
    job_manifest,
    wait_gang_running,
    wait_phase,
)
from trainium_devcluster import testing

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]

ENFORCE = "pod-security.kubernetes.io/enforce"


PRIVILEGED_POD = {
    "metadata": {"name": "privileged"},
    "spec": {
        "containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": True}}]
    },
}


def enforce(clients: Any, namespace: str, level: str) -> None:
    """Labels `namespace` to enforce `level` and returns once admission refuses a privileged pod
    there: Pod Security reads namespace labels from an informer, so a label takes effect a moment
    after the patch (CI once created a pod in that moment)."""
    labels = {ENFORCE: level, f"{ENFORCE}-version": "latest"}
    clients.core.patch_namespace(namespace, {"metadata": {"labels": labels}})
    eventually(
        lambda: refusal(clients, namespace, PRIVILEGED_POD),
        timeout=30,
        description=f"Pod Security to enforce {level} in {namespace}",
    )


def refusal(clients: Any, namespace: str, pod: dict[str, Any]) -> str | None:
    """None if admission admits `pod` in `namespace` (dry run), else the API server's reason."""
    from kubernetes.client.rest import ApiException

    try:
        clients.core.create_namespaced_pod(namespace, pod, dry_run="All")
    except ApiException as error:
        if error.status == 403:
            return str(error.body)
        raise
    return None


def recreatable(pod: Any, api: Any) -> dict[str, Any]:
    """A pod read from the API server as a body to create again under a new name."""
    body: dict[str, Any] = api.sanitize_for_serialization(pod)
    metadata = body["metadata"]
    body["metadata"] = {"name": f"{metadata['name']}-copy", "labels": metadata.get("labels")}
    body.pop("status", None)
    body["spec"].pop("nodeName", None)
    return body


@pytest.fixture
def restricted_namespace(dev_cluster: Any) -> Iterator[str]:
    with testing.fresh_namespace(dev_cluster) as name:
        enforce(dev_cluster.clients, name, "restricted")
        yield name


def test_training_pods_pass_baseline_and_the_upload_pod_passes_restricted(
    dev_cluster: Any, namespace: str, restricted_namespace: str, operator: OperatorView
) -> None:
    clients = dev_cluster.clients
    api = clients.core.api_client
    enforce(clients, namespace, "baseline")  # returns once a privileged pod is refused

    name = "bert-psa"
    profile = {"enabled": True, "startStep": 1, "endStep": 4, "s3Uri": "s3://bucket/profiles"}
    create_job(clients, namespace, job_manifest(name, compile={"enabled": False}, profile=profile))
    pods = wait_gang_running(clients, namespace, name, "train", 0)
    assert len(pods) == 2, "both training pods were admitted under baseline"
    training = recreatable(pods[0], api)
    reason = refusal(clients, restricted_namespace, training)
    assert reason is not None, "restricted refuses a training pod"
    assert "runAsNonRoot" in reason, reason

    finish_pods(clients, namespace, pods)
    wait_phase(clients, namespace, name, "Succeeded")

    def upload_pod() -> Any:
        found = clients.core.list_namespaced_pod(
            namespace,
            label_selector=f"trainium.dev/job-name={name},trainium.dev/stage=profile-upload",
        ).items
        return found[0] if found else None

    upload = eventually(upload_pod, timeout=60, description=f"{name}'s upload pod")
    assert refusal(clients, restricted_namespace, recreatable(upload, api)) is None
