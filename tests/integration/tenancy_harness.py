"""The chart's tenancy policy on the real API server, shared by test_tenancy.py and the hostile
tier (hostile/test_admission.py): the policy objects rendered by `helm template` exactly as the
chart ships them, created with admin rights, and tenants who may only manage TrainingJobs
(impersonated with `Impersonate-User`)."""

from __future__ import annotations

import contextlib
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

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "trainium-operator"
TENANT = "tenant-alice"
OTHER_TENANT = "tenant-bob"
UPLOAD_ACCOUNT = "s3-profile-upload"
# The claim every job mounts unless spec.storage.claimName says otherwise: the tenants may get
# it, as any author whose jobs run must (the policy checks it).
DEFAULT_CLAIM = "fsx-claim"
JOBS_RULE = {
    "apiGroups": [GROUP],
    "resources": [PLURAL],
    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
}
CLAIM_RULE = {
    "apiGroups": [""],
    "resources": ["persistentvolumeclaims"],
    "resourceNames": [DEFAULT_CLAIM],
    "verbs": ["get"],
}


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


POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"


def label_pod_security(dev_cluster: Any, namespace: str, level: str | None) -> None:
    """Sets (or, with None, removes) the namespace's enforced Pod Security level."""
    dev_cluster.clients.core.patch_namespace(
        namespace, {"metadata": {"labels": {POD_SECURITY_ENFORCE: level}}}
    )


def helm_template(
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


def refusal(api: Any, namespace: str, manifest: dict[str, Any]) -> str:
    """The API server's message refusing this create (a dry run: nothing is stored)."""
    with pytest.raises(ApiException) as refused:
        api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, manifest, dry_run="All"
        )
    assert refused.value.status == 403, refused.value.body
    message: str = json.loads(refused.value.body)["message"]
    return message


def create(api: Any, namespace: str, manifest: dict[str, Any]) -> None:
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)


@contextlib.contextmanager
def installed_tenancy(dev_cluster: Any, tmp: Path) -> Iterator[Tenancy]:
    """The chart's policy for a release in its own namespace watching one team namespace (with
    the profile UI and the upload account on, so all three chart accounts are reserved, and
    straggler replacement on, so asking for it needs a grant), and two tenants with rights on
    TrainingJobs there (and, to show the policy, not RBAC, keeps them out, in the operator's
    namespace too) and on the default claim."""
    install_crds(dev_cluster.clients)
    release = f"r{uuid.uuid4().hex[:6]}"
    admission = client.AdmissionregistrationV1Api(dev_cluster.clients.api_client)
    rbac = client.RbacAuthorizationV1Api(dev_cluster.clients.api_client)
    with (
        testing.fresh_namespace(dev_cluster, prefix="t-op-") as operator_namespace,
        testing.fresh_namespace(dev_cluster, prefix="t-team-") as team,
    ):
        for namespace in (operator_namespace, team):
            # The policy takes new jobs only where a Pod Security level is enforced.
            label_pod_security(dev_cluster, namespace, "baseline")
        documents = helm_template(
            dev_cluster,
            release,
            operator_namespace,
            {
                "watchNamespaces": [team],
                "workloadNamespace": team,
                "profileUI": {"enabled": True},
                "profileUpload": {"serviceAccount": {"name": UPLOAD_ACCOUNT}},
                "health": {"stragglerReplacement": {"enabled": True}},
            },
            tmp,
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
            for user in (TENANT, OTHER_TENANT):
                state.grant(user, team, JOBS_RULE)
                state.grant(user, team, CLAIM_RULE)
                state.grant(user, operator_namespace, JOBS_RULE)
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
    # And the tenants' grants reach the authorizer: a plain job (its claim checked) passes.
    plain = job_manifest("probe")
    wait_for(
        lambda: (
            alice.create_namespaced_custom_object(
                GROUP, VERSION, state.team, PLURAL, plain, dry_run="All"
            )
            is not None
        ),
        timeout=30,
        description="a plain job of a tenant who may get the default claim",
    )
