"""What the reflectors keep of an object (k8s.informer's cache transforms)."""

from __future__ import annotations

from typing import Any

from trainium_operator.k8s.informer import (
    ownership_and_status,
    ownership_only,
    without_managed_fields,
)


def served_service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "bert",
            "namespace": "team-a",
            "uid": "u-1",
            "resourceVersion": "42",
            "creationTimestamp": "2026-12-01T12:00:00Z",
            "labels": {"trainium.dev/job-name": "bert"},
            "ownerReferences": [{"kind": "TrainingJob", "name": "bert", "uid": "job-uid"}],
            "managedFields": [{"manager": "trainium-operator", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"clusterIP": "None", "selector": {"trainium.dev/job-name": "bert"}},
        "status": {"loadBalancer": {}},
    }


def test_ownership_only_keeps_identity_labels_and_owners_and_nothing_else() -> None:
    served = served_service()
    dropped = ("creationTimestamp", "managedFields")
    identity = {k: v for k, v in served["metadata"].items() if k not in dropped}
    assert set(identity) == {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "labels",
        "ownerReferences",
    }
    assert ownership_only(served) == {"apiVersion": "v1", "kind": "Service", "metadata": identity}


def test_ownership_only_keeps_a_deletion_under_way() -> None:
    service = served_service()
    service["metadata"]["deletionTimestamp"] = "2026-12-01T12:01:00Z"
    assert ownership_only(service)["metadata"]["deletionTimestamp"] == "2026-12-01T12:01:00Z"


def test_the_default_transform_drops_only_managed_fields() -> None:
    service = served_service()
    kept = without_managed_fields(served_service())
    del service["metadata"]["managedFields"]
    assert kept == service


def test_ownership_and_status_keeps_the_state_as_well_and_drops_the_spec() -> None:
    kept = ownership_and_status(served_service())
    assert kept["status"] == {"loadBalancer": {}}
    assert "spec" not in kept
    assert kept["metadata"] == ownership_only(served_service())["metadata"]
