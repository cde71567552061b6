"""The chart's tenancy policy on the real API server: a user who may only manage TrainingJobs in
one namespace cannot get a job whose pods run as another account, privileged, or on the host;
each refusal names the field and the missing permission, and an RBAC grant of that permission
lets the same spec through.

The policy objects are rendered by `helm template` exactly as the chart ships them (a release
in its own namespace that watches the tenant's namespace, with the profile UI and the upload
account on, so all three of the chart's accounts are reserved) and created with admin rights;
the tenant is impersonated (`Impersonate-User`) with only a Role on trainingjobs (and `get` on
the default claim, which every author whose jobs mount it needs): integration/tenancy_harness.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from integration.operator_harness import GROUP, PLURAL, VERSION, install_crds, job_manifest
from integration.tenancy_harness import (
    OTHER_TENANT,
    TENANT,
    UPLOAD_ACCOUNT,
    Tenancy,
    create,
    helm_template,
    installed_tenancy,
    label_pod_security,
    refusal,
)
from trainium_devcluster import testing
from trainium_devcluster.sim import wait_for
from trainium_operator.api import kueue

pytestmark = pytest.mark.integration
TENANT_ACCOUNT = "team-runner"


@pytest.fixture
def tenancy(dev_cluster: Any, tmp_path: Path) -> Iterator[Tenancy]:
    with installed_tenancy(dev_cluster, tmp_path) as state:
        yield state


def _trainer(security_context: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "trainer", "securityContext": security_context}]}}


# Each attempt, what the refusal must name (the field) and what would allow it (the grant).
def use(subresource: str) -> dict[str, Any]:
    """The RBAC rule granting verb "use" on trainingjobs/<subresource>."""
    return {"apiGroups": [GROUP], "resources": [f"trainingjobs/{subresource}"], "verbs": ["use"]}


# hostNetwork, hostPID and hostIPC: one permission, trainingjobs/hostnamespaces, for all three.
HOST_NAMESPACES = {
    f"host-{field.removeprefix('host').lower()}": (
        {"podTemplate": {"spec": {field: True}}},
        f"spec.podTemplate.spec.{field}",
        use("hostnamespaces"),
    )
    for field in ("hostNetwork", "hostPID", "hostIPC")
}
ATTEMPTS: dict[str, tuple[dict[str, Any], str, dict[str, Any]]] = {
    "privileged-trainer": (
        {"podTemplate": _trainer({"privileged": True})},
        "spec.podTemplate.spec.containers[trainer].securityContext.privileged",
        use("privileged"),
    ),
    "privileged-init-container": (
        {
            "podTemplate": {
                "spec": {
                    "initContainers": [
                        {
                            "name": "setup",
                            "image": "busybox",
                            "securityContext": {"privileged": True},
                        }
                    ]
                }
            }
        },
        "spec.podTemplate.spec.initContainers[setup].securityContext.privileged",
        use("privileged"),
    ),
    "host-path": (
        {"podTemplate": {"spec": {"volumes": [{"name": "host-root", "hostPath": {"path": "/"}}]}}},
        "spec.podTemplate.spec.volumes[host-root].hostPath",
        use("hostpath"),
    ),
    **HOST_NAMESPACES,
    "added-capabilities": (
        {
            "podTemplate": {
                "spec": {
                    "containers": [
                        {
                            "name": "sidecar",
                            "image": "busybox",
                            "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}},
                        }
                    ]
                }
            }
        },
        "spec.podTemplate.spec.containers[sidecar].securityContext.capabilities.add",
        use("capabilities"),
    ),
    "straggler-replacement": (
        {"health": {"onStraggler": "Replace"}},
        "spec.health.onStraggler: Replace",
        use("stragglerreplacement"),
    ),
    "preflight-cordon": (
        {"preflight": {"enabled": True, "onUnfit": "Cordon"}},
        "spec.preflight.onUnfit: Cordon",
        use("stragglerreplacement"),
    ),
    "another-service-account": (
        {"serviceAccountName": TENANT_ACCOUNT},
        "spec.serviceAccountName",
        {
            "apiGroups": [""],
            "resources": ["serviceaccounts"],
            "resourceNames": [TENANT_ACCOUNT],
            "verbs": ["use"],
        },
    ),
}
PERMISSION = {
    "privileged-trainer": 'needs verb "use" on trainingjobs/privileged',
    "privileged-init-container": 'needs verb "use" on trainingjobs/privileged',
    "host-path": 'needs verb "use" on trainingjobs/hostpath',
    "host-network": 'needs verb "use" on trainingjobs/hostnamespaces',
    "host-pid": 'needs verb "use" on trainingjobs/hostnamespaces',
    "host-ipc": 'needs verb "use" on trainingjobs/hostnamespaces',
    "added-capabilities": 'needs verb "use" on trainingjobs/capabilities',
    "straggler-replacement": 'needs verb "use" on trainingjobs/stragglerreplacement',
    "preflight-cordon": 'needs verb "use" on trainingjobs/stragglerreplacement',
    "another-service-account": (
        f'needs verb "use" on serviceaccounts (API group ""), resourceName {TENANT_ACCOUNT}'
    ),
}


@pytest.mark.parametrize("attempt", sorted(ATTEMPTS))
def test_each_escalation_is_refused_naming_the_field_and_permission_until_granted(
    tenancy: Tenancy, attempt: str
) -> None:
    spec, field, grant = ATTEMPTS[attempt]
    alice = tenancy.as_user(TENANT)
    manifest = job_manifest(f"esc-{attempt}", **spec)

    message = refusal(alice, tenancy.team, manifest)

    assert field in message
    assert PERMISSION[attempt] in message
    assert TENANT in message

    tenancy.grant(TENANT, tenancy.team, grant)
    # RBAC grants reach the authorizer within moments (its informers).
    wait_for(
        lambda: create(alice, tenancy.team, manifest) is None,
        timeout=30,
        description=f"{attempt} allowed once {TENANT} is granted {grant['resources']}",
    )
    # The grant is the author's: another tenant's identical job is still refused.
    assert field in refusal(
        tenancy.as_user(OTHER_TENANT), tenancy.team, {**manifest, "metadata": {"name": "bob"}}
    )


def test_the_charts_own_accounts_are_refused_even_to_an_author_who_may_use_every_account(
    tenancy: Tenancy,
) -> None:
    alice = tenancy.as_user(TENANT)
    tenancy.grant(
        TENANT,
        tenancy.team,
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["use", "impersonate"]},
    )
    for account in (tenancy.operator_account, tenancy.ui_account, UPLOAD_ACCOUNT):
        manifest = job_manifest("own-account", serviceAccountName=account)
        message = refusal(alice, tenancy.team, manifest)
        assert (
            f"spec.serviceAccountName: {account} is an account of the trainium-operator" in message
        )
    # The same grant does let the tenant's own account through.
    wait_for(
        lambda: (
            create(alice, tenancy.team, job_manifest("own", serviceAccountName=TENANT_ACCOUNT))
            is None
        ),
        timeout=30,
        description="a job running as the tenant's own account",
    )


def test_no_author_may_create_a_training_job_in_the_operators_namespace(tenancy: Tenancy) -> None:
    for api in (tenancy.as_user(TENANT), tenancy.admin):
        message = refusal(api, tenancy.operator_namespace, job_manifest("beside-the-operator"))
        assert f"TrainingJobs may not run in namespace {tenancy.operator_namespace}" in message


def test_a_plain_job_and_metadata_changes_of_a_granted_job_need_no_grant(
    tenancy: Tenancy,
) -> None:
    """The policy checks what a write adds: a job with nothing to grant passes, and a user
    without the grant (like the operator patching its finalizer) may still change the metadata
    of a job someone granted, but not its spec."""
    alice, bob = tenancy.as_user(TENANT), tenancy.as_user(OTHER_TENANT)
    create(alice, tenancy.team, job_manifest("plain"))
    tenancy.grant(TENANT, tenancy.team, use("hostnamespaces"))
    granted = job_manifest("granted", podTemplate={"spec": {"hostNetwork": True}})
    wait_for(
        lambda: create(alice, tenancy.team, granted) is None,
        timeout=30,
        description="the granted hostNetwork job created",
    )

    def patch_granted(api: Any, body: dict[str, Any]) -> None:
        api.patch_namespaced_custom_object(GROUP, VERSION, tenancy.team, PLURAL, "granted", body)

    patch_granted(bob, {"metadata": {"finalizers": ["example.com/test"], "labels": {"team": "a"}}})
    with pytest.raises(ApiException) as spec_change:
        patch_granted(bob, {"spec": {"runPolicy": {"suspend": True}}})
    assert spec_change.value.status == 403
    assert "spec.podTemplate.spec.hostNetwork" in json.loads(spec_change.value.body)["message"]
    patch_granted(tenancy.admin, {"metadata": {"finalizers": None}})


def test_straggler_replacement_is_refused_to_everyone_while_the_chart_has_it_off(
    dev_cluster: Any, tmp_path: Path
) -> None:
    """With health.stragglerReplacement off (the default) no grant lets a job cordon nodes: the
    refusal names the field, the chart value and what to write instead."""
    install_crds(dev_cluster.clients)
    release = f"r{uuid.uuid4().hex[:6]}"
    admission = client.AdmissionregistrationV1Api(dev_cluster.clients.api_client)
    with (
        testing.fresh_namespace(dev_cluster, prefix="t-op-") as operator_namespace,
        testing.fresh_namespace(dev_cluster, prefix="t-team-") as team,
    ):
        label_pod_security(dev_cluster, team, "baseline")
        documents = helm_template(
            dev_cluster, release, operator_namespace, {"watchNamespaces": [team]}, tmp_path
        )
        policy = next(d for d in documents if d["kind"] == "ValidatingAdmissionPolicy")
        binding = next(d for d in documents if d["kind"] == "ValidatingAdmissionPolicyBinding")
        admission.create_validating_admission_policy(policy)
        admission.create_validating_admission_policy_binding(binding)
        try:
            replace = job_manifest("replace", health={"onStraggler": "Replace"})

            def refusal() -> str:
                try:
                    dev_cluster.custom.create_namespaced_custom_object(
                        GROUP, VERSION, team, PLURAL, replace, dry_run="All"
                    )
                except ApiException as error:
                    return str(json.loads(error.body)["message"])
                return ""

            # The cluster admin is refused too: no RBAC grant turns it on, only the chart.
            message = wait_for(
                refusal, until=bool, timeout=30, description="Replace refused by the policy"
            )
            assert "spec.health.onStraggler: Replace is off in this cluster" in message
            assert "health.stragglerReplacement.enabled" in message
            assert "onStraggler: Report" in message
            report = job_manifest("report", health={"onStraggler": "Report"})
            dev_cluster.custom.create_namespaced_custom_object(
                GROUP, VERSION, team, PLURAL, report, dry_run="All"
            )
        finally:
            admission.delete_validating_admission_policy_binding(binding["metadata"]["name"])
            admission.delete_validating_admission_policy(policy["metadata"]["name"])


def test_a_workload_priority_class_is_refused_until_granted_whether_created_or_patched_on(
    tenancy: Tenancy,
) -> None:
    """Kueue's class is a TrainingJob label, so a label patch of a job created without one is
    checked as a create with it is; the grant is RBAC `use` on the class by name (no Kueue CRD
    is needed for the authorizer to answer)."""
    alice = tenancy.as_user(TENANT)
    field = f"metadata.labels[{kueue.PRIORITY_CLASS_LABEL}]"
    permission = (
        'needs verb "use" on workloadpriorityclasses (API group kueue.x-k8s.io), resourceName high'
    )

    def labelled(name: str, **labels: str) -> dict[str, Any]:
        manifest = job_manifest(name)
        manifest["metadata"]["labels"] = {kueue.QUEUE_NAME_LABEL: "trainium", **labels}
        return manifest

    high = labelled("high", **{kueue.PRIORITY_CLASS_LABEL: "high"})
    message = refusal(alice, tenancy.team, high)
    assert field in message
    assert permission in message
    assert TENANT in message

    create(alice, tenancy.team, labelled("plain"))
    with pytest.raises(ApiException) as patched:
        alice.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            tenancy.team,
            PLURAL,
            "plain",
            {"metadata": {"labels": {kueue.PRIORITY_CLASS_LABEL: "high"}}},
        )
    assert patched.value.status == 403
    assert permission in json.loads(patched.value.body)["message"]

    tenancy.grant(
        TENANT,
        tenancy.team,
        {
            "apiGroups": [kueue.KUEUE_GROUP],
            "resources": ["workloadpriorityclasses"],
            "resourceNames": ["high"],
            "verbs": ["use"],
        },
    )
    wait_for(
        lambda: create(alice, tenancy.team, high) is None,
        timeout=30,
        description=f"a job of WorkloadPriorityClass high once {TENANT} may use it",
    )
    assert field in refusal(
        tenancy.as_user(OTHER_TENANT),
        tenancy.team,
        {**high, "metadata": {**high["metadata"], "name": "bob"}},
    )
