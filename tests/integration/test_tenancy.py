"""The chart's tenancy policy on the real API server: a user who may only manage TrainingJobs in
one namespace cannot get a job whose pods run as another account, privileged, or on the host;
each refusal names the field and the missing permission, and an RBAC grant of that permission
lets the same spec through.

The policy objects are rendered by `helm template` exactly as the chart ships them (a release
in its own namespace that watches the tenant's namespace, with the profile UI and the upload
account on, so all three of the chart's accounts are reserved) and created with admin rights;
the tenant is impersonated (`Impersonate-User`) with only a Role on trainingjobs.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from integration.operator_harness import GROUP, PLURAL, VERSION, install_crds, job_manifest
from trainium_devcluster import testing
from trainium_devcluster.sim import wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "trainium-operator"
TENANT = "tenant-alice"
OTHER_TENANT = "tenant-bob"
UPLOAD_ACCOUNT = "s3-profile-upload"
TENANT_ACCOUNT = "team-runner"


@dataclass(frozen=True)
class Tenancy:
    release: str
    operator_namespace: str
    team: str
    admin: Any  # CustomObjectsApi with the admin's rights
    rbac: Any  # RbacAuthorizationV1Api with the admin's rights
    kubeconfig: Path

    @property
    def operator_account(self) -> str:
        return f"{self.release}-trainium-operator"

    @property
    def ui_account(self) -> str:
        return f"{self.release}-trainium-operator-profile-ui"

    def as_user(self, user: str) -> Any:
        """CustomObjectsApi impersonating `user` (who is also system:authenticated)."""
        api_client = config.new_client_from_config(config_file=str(self.kubeconfig))
        api_client.set_default_header("Impersonate-User", user)
        return client.CustomObjectsApi(api_client)

    def grant(self, user: str, namespace: str, rule: dict[str, Any]) -> None:
        name = f"grant-{uuid.uuid4().hex[:6]}"
        self.rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": [rule]})
        self.rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
                ],
            },
        )


def _helm_template(
    dev_cluster: Any, release: str, namespace: str, values: dict[str, Any], tmp: Path
) -> list[dict[str, Any]]:
    values_path = tmp / "tenancy-values.yaml"
    values_path.write_text(yaml.safe_dump(values))
    result = subprocess.run(
        [
            "helm",
            "template",
            release,
            str(CHART),
            "-n",
            namespace,
            "-f",
            str(values_path),
            "--show-only",
            "templates/tenancy.yaml",
        ],
        capture_output=True,
        text=True,
        env=dev_cluster.tool_env(),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _refusal(api: Any, namespace: str, manifest: dict[str, Any]) -> str:
    """The API server's message refusing this create (a dry run: nothing is stored)."""
    with pytest.raises(ApiException) as refused:
        api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, manifest, dry_run="All"
        )
    assert refused.value.status == 403, refused.value.body
    message: str = json.loads(refused.value.body)["message"]
    return message


def _create(api: Any, namespace: str, manifest: dict[str, Any]) -> None:
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)


@pytest.fixture
def tenancy(dev_cluster: Any, tmp_path: Path) -> Iterator[Tenancy]:
    install_crds(dev_cluster.clients)
    release = f"r{uuid.uuid4().hex[:6]}"
    admission = client.AdmissionregistrationV1Api(dev_cluster.clients.api_client)
    rbac = client.RbacAuthorizationV1Api(dev_cluster.clients.api_client)
    with (
        testing.fresh_namespace(dev_cluster, prefix="t-op-") as operator_namespace,
        testing.fresh_namespace(dev_cluster, prefix="t-team-") as team,
    ):
        documents = _helm_template(
            dev_cluster,
            release,
            operator_namespace,
            {
                "watchNamespaces": [team],
                "workloadNamespace": team,
                "profileUI": {"enabled": True},
                "profileUpload": {"serviceAccount": {"name": UPLOAD_ACCOUNT}},
                # On, so that asking for it needs a grant (off, it is refused to everyone:
                # test_straggler_replacement_is_refused_to_everyone_while_the_chart_has_it_off).
                "health": {"stragglerReplacement": {"enabled": True}},
            },
            tmp_path,
        )
        kinds = sorted(doc["kind"] for doc in documents)
        assert kinds == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
        policy = next(d for d in documents if d["kind"] == "ValidatingAdmissionPolicy")
        binding = next(d for d in documents if d["kind"] == "ValidatingAdmissionPolicyBinding")
        admission.create_validating_admission_policy(policy)
        admission.create_validating_admission_policy_binding(binding)
        state = Tenancy(
            release=release,
            operator_namespace=operator_namespace,
            team=team,
            admin=dev_cluster.custom,
            rbac=rbac,
            kubeconfig=Path(dev_cluster.kubeconfig),
        )
        try:
            # The tenants may manage TrainingJobs in their namespace and, to show that the
            # policy (not RBAC) keeps them out, in the operator's namespace too.
            jobs_rule = {
                "apiGroups": [GROUP],
                "resources": [PLURAL],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
            }
            for user in (TENANT, OTHER_TENANT):
                state.grant(user, team, jobs_rule)
                state.grant(user, operator_namespace, jobs_rule)
            _wait_policy_enforced(state)
            yield state
        finally:
            admission.delete_validating_admission_policy_binding(binding["metadata"]["name"])
            admission.delete_validating_admission_policy(policy["metadata"]["name"])


def _wait_policy_enforced(state: Tenancy) -> None:
    """The API server loads a new policy within a second or so; until then creates pass."""
    probe = job_manifest("probe", podTemplate={"spec": {"hostPID": True}})
    alice = state.as_user(TENANT)

    def refused() -> bool:
        try:
            alice.create_namespaced_custom_object(
                GROUP, VERSION, state.team, PLURAL, probe, dry_run="All"
            )
        except ApiException as error:
            return "spec.podTemplate.spec.hostPID" in str(error.body)
        return False

    wait_for(refused, timeout=30, description="the tenancy policy refusing a hostPID job")


def _trainer(security_context: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "trainer", "securityContext": security_context}]}}


# Each attempt, what the refusal must name (the field) and what would allow it (the grant).
ATTEMPTS: dict[str, tuple[dict[str, Any], str, dict[str, Any]]] = {
    "privileged-trainer": (
        {"podTemplate": _trainer({"privileged": True})},
        "spec.podTemplate.spec.containers[trainer].securityContext.privileged",
        {"apiGroups": [GROUP], "resources": ["trainingjobs/privileged"], "verbs": ["use"]},
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
        {"apiGroups": [GROUP], "resources": ["trainingjobs/privileged"], "verbs": ["use"]},
    ),
    "host-path": (
        {"podTemplate": {"spec": {"volumes": [{"name": "host-root", "hostPath": {"path": "/"}}]}}},
        "spec.podTemplate.spec.volumes[host-root].hostPath",
        {"apiGroups": [GROUP], "resources": ["trainingjobs/hostpath"], "verbs": ["use"]},
    ),
    "host-network": (
        {"podTemplate": {"spec": {"hostNetwork": True}}},
        "spec.podTemplate.spec.hostNetwork",
        {"apiGroups": [GROUP], "resources": ["trainingjobs/hostnamespaces"], "verbs": ["use"]},
    ),
    "host-pid": (
        {"podTemplate": {"spec": {"hostPID": True}}},
        "spec.podTemplate.spec.hostPID",
        {"apiGroups": [GROUP], "resources": ["trainingjobs/hostnamespaces"], "verbs": ["use"]},
    ),
    "host-ipc": (
        {"podTemplate": {"spec": {"hostIPC": True}}},
        "spec.podTemplate.spec.hostIPC",
        {"apiGroups": [GROUP], "resources": ["trainingjobs/hostnamespaces"], "verbs": ["use"]},
    ),
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
        {"apiGroups": [GROUP], "resources": ["trainingjobs/capabilities"], "verbs": ["use"]},
    ),
    "straggler-replacement": (
        {"health": {"onStraggler": "Replace"}},
        "spec.health.onStraggler: Replace",
        {
            "apiGroups": [GROUP],
            "resources": ["trainingjobs/stragglerreplacement"],
            "verbs": ["use"],
        },
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

    message = _refusal(alice, tenancy.team, manifest)

    assert field in message
    assert PERMISSION[attempt] in message
    assert TENANT in message

    tenancy.grant(TENANT, tenancy.team, grant)
    # RBAC grants reach the authorizer within moments (its informers).
    wait_for(
        lambda: _create(alice, tenancy.team, manifest) is None,
        timeout=30,
        description=f"{attempt} allowed once {TENANT} is granted {grant['resources']}",
    )
    # The grant is the author's: another tenant's identical job is still refused.
    assert field in _refusal(
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
        message = _refusal(alice, tenancy.team, manifest)
        assert (
            f"spec.serviceAccountName: {account} is an account of the trainium-operator" in message
        )
    # The same grant does let the tenant's own account through.
    wait_for(
        lambda: (
            _create(alice, tenancy.team, job_manifest("own", serviceAccountName=TENANT_ACCOUNT))
            is None
        ),
        timeout=30,
        description="a job running as the tenant's own account",
    )


def test_no_author_may_create_a_training_job_in_the_operators_namespace(tenancy: Tenancy) -> None:
    for api in (tenancy.as_user(TENANT), tenancy.admin):
        message = _refusal(api, tenancy.operator_namespace, job_manifest("beside-the-operator"))
        assert f"TrainingJobs may not run in namespace {tenancy.operator_namespace}" in message


def test_a_plain_job_and_metadata_changes_of_a_granted_job_need_no_grant(
    tenancy: Tenancy,
) -> None:
    """The policy checks what a write adds: a job with nothing to grant passes, and a user
    without the grant (like the operator patching its finalizer) may still change the metadata
    of a job someone granted, but not its spec."""
    alice, bob = tenancy.as_user(TENANT), tenancy.as_user(OTHER_TENANT)
    _create(alice, tenancy.team, job_manifest("plain"))
    tenancy.grant(
        TENANT,
        tenancy.team,
        {"apiGroups": [GROUP], "resources": ["trainingjobs/hostnamespaces"], "verbs": ["use"]},
    )
    granted = job_manifest("granted", podTemplate={"spec": {"hostNetwork": True}})
    wait_for(
        lambda: _create(alice, tenancy.team, granted) is None,
        timeout=30,
        description="the granted hostNetwork job created",
    )

    bob.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        tenancy.team,
        PLURAL,
        "granted",
        {"metadata": {"finalizers": ["example.com/test"], "labels": {"team": "a"}}},
    )
    with pytest.raises(ApiException) as spec_change:
        bob.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            tenancy.team,
            PLURAL,
            "granted",
            {"spec": {"runPolicy": {"suspend": True}}},
        )
    assert spec_change.value.status == 403
    assert "spec.podTemplate.spec.hostNetwork" in json.loads(spec_change.value.body)["message"]
    tenancy.admin.patch_namespaced_custom_object(
        GROUP, VERSION, tenancy.team, PLURAL, "granted", {"metadata": {"finalizers": None}}
    )


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
        documents = _helm_template(
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
