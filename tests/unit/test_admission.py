"""Admission refusals are told apart from RBAC denials by the API server's own message."""

from __future__ import annotations

import json

import pytest
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from trainium_operator.k8s.client import admission_rejection, is_forbidden, is_transient
from trainium_operator.lifecycle import machine
from unit.test_lifecycle import T0


def api_error(status: int, message: str) -> ApiException:
    error = ApiException(status=status, reason="Forbidden" if status == 403 else "Invalid")
    error.body = json.dumps({"kind": "Status", "message": message})
    return error


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (
            'pods "j-train-0-1" is forbidden: exceeded quota: q, requested: pods=1, used: '
            "pods=1, limited: pods=1",
            "QuotaExceeded",
        ),
        (
            'pods "j-train-0-0" is forbidden: no PriorityClass with name hi was found',
            "PriorityClassNotFound",
        ),
        (
            'pods "j-train-0-0" is forbidden: error looking up service account ns/trainer: '
            'serviceaccount "trainer" not found',
            "ServiceAccountNotFound",
        ),
        (
            'pods "j-train-0-0" is forbidden: violates PodSecurity "restricted:latest": '
            "allowPrivilegeEscalation != false",
            "PodSecurityRejected",
        ),
    ],
)
def test_admission_refusals_are_not_rbac(message: str, reason: str) -> None:
    rejection = admission_rejection(api_error(403, message))
    assert rejection is not None
    assert (rejection.reason, rejection.fatal) == (reason, False)
    assert rejection.message == message
    assert not is_forbidden(api_error(403, message))


def test_an_rbac_denial_stays_a_permission_problem() -> None:
    message = 'pods is forbidden: User "system:serviceaccount:x:op" cannot create resource "pods"'
    assert admission_rejection(api_error(403, message)) is None
    assert is_forbidden(api_error(403, message))


@pytest.mark.parametrize(
    ("message", "reason", "fatal"),
    [
        ('pods "j-train-0-0" is forbidden: pod rejected: RuntimeClass "neuron" not found',
         "RuntimeClassNotFound", False),
        ('pods "j-train-0-0" is forbidden: pod rejected: Pod Overhead set without corresponding '
         "RuntimeClass defined Overhead", "PodRejected", True),
        ('pods "j-train-0-0" is forbidden: the integer value of priority (0) must not be provided '
         "in pod spec; priority admission controller computed 0 from the given PriorityClass "
         "name", "PriorityRejected", True),
        ('pods "j-train-0-0" is forbidden: some admission plugin said no', "AdmissionRejected",
         False),
    ],
)  # fmt: skip
def test_built_in_admission_plugins_refusals_are_not_rbac_denials(
    message: str, reason: str, fatal: bool
) -> None:
    rejection = admission_rejection(api_error(403, message))
    assert rejection is not None
    assert (rejection.reason, rejection.fatal) == (reason, fatal)
    assert not is_forbidden(api_error(403, message))


def test_a_body_the_api_server_cannot_decode_is_an_invalid_pod_spec() -> None:
    message = (
        'Pod in version "v1" cannot be handled as a Pod: json: cannot unmarshal array into Go '
        "struct field PodSpec.spec.enableServiceLinks of type bool"
    )
    rejection = admission_rejection(api_error(400, message))
    assert rejection is not None
    assert (rejection.reason, rejection.fatal) == ("InvalidPodSpec", True)
    assert "enableServiceLinks" in rejection.message


def test_an_invalid_field_is_fatal() -> None:
    message = 'Pod "j-train-0-0" is invalid: metadata.labels: Invalid value: "a b"'
    rejection = admission_rejection(api_error(422, message))
    assert rejection is not None
    assert (rejection.reason, rejection.fatal) == ("InvalidPodSpec", True)


def test_a_refusal_the_cluster_can_lift_keeps_the_job_pending_with_the_cause() -> None:
    decision = machine.decide_finding(
        {"phase": "Pending"},
        1,
        T0,
        None,
        machine.ChildRefused("QuotaExceeded", "exceeded quota", False),
    )
    assert (decision.status["phase"], decision.status["reason"]) == ("Pending", "QuotaExceeded")
    (admitted,) = [c for c in decision.status["conditions"] if c["type"] == "Admitted"]
    assert (admitted["status"], admitted["reason"]) == ("False", "QuotaExceeded")
    assert [e.reason for e in decision.events] == ["QuotaExceeded"]


def test_an_invalid_pod_fails_the_job() -> None:
    decision = machine.decide_finding(
        {"phase": "Pending"},
        1,
        T0,
        None,
        machine.ChildRefused("InvalidPodSpec", "invalid label", True),
    )
    assert (decision.status["phase"], decision.status["reason"]) == ("Failed", "InvalidPodSpec")


def test_an_unreachable_or_restarting_api_server_is_transient_not_a_bug() -> None:
    refused = urllib3.exceptions.MaxRetryError(None, "/api", reason="connection refused")  # type: ignore[arg-type]
    assert is_transient(refused)
    assert is_transient(ApiException(status=503, reason="Service Unavailable"))
    assert is_transient(ApiException(status=429, reason="Too Many Requests"))
    assert not is_transient(ApiException(status=404, reason="Not Found"))
    assert not is_transient(ApiException(status=403, reason="Forbidden"))
    assert not is_transient(ValueError("a bug"))
