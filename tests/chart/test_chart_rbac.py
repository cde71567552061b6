"""The operator's RBAC as rendered: exactly the contracted permissions, least privilege."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from chart.chart_harness import (
    FULLNAME,
    RELEASE_NAMESPACE,
    SCENARIOS,
    Manifest,
    one,
    render,
)

Permissions = dict[tuple[str, str], set[str]]
# Which verbs each account gets is derived from the code in test_chart_rbac_from_code.py (both
# ways: nothing unused, nothing missing); these tests check the shape around it.


def permissions(rules: Iterable[dict[str, Any]]) -> Permissions:
    granted: Permissions = {}
    for rule in rules:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def rbac_objects(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if m["kind"] in {"Role", "ClusterRole"}]


def test_bindings_grant_the_roles_to_the_operator_service_account_only(tmp_path: Path) -> None:
    manifests = render({"watchNamespaces": ["team-a"]}, tmp_path)
    account = {"kind": "ServiceAccount", "name": FULLNAME, "namespace": RELEASE_NAMESPACE}
    cluster_binding = one(manifests, "ClusterRoleBinding", FULLNAME)
    assert cluster_binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": FULLNAME,
    }
    assert cluster_binding["subjects"] == [account]
    binding = one(manifests, "RoleBinding", FULLNAME)
    assert binding["metadata"]["namespace"] == "team-a"
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"] == [account]
    assert one(manifests, "ServiceAccount", FULLNAME)["metadata"]["namespace"] == RELEASE_NAMESPACE


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_no_role_in_the_chart_has_wildcards_or_reads_secrets(scenario: str, tmp_path: Path) -> None:
    for role in rbac_objects(render(SCENARIOS[scenario], tmp_path)):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], (role["metadata"]["name"], rule)
            assert not {"secrets", "configmaps", "serviceaccounts/token"} & set(rule["resources"])
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_operator_never_creates_queues_claims_or_nodes(scenario: str, tmp_path: Path) -> None:
    manifests = render(SCENARIOS[scenario], tmp_path)
    operator_roles = [m for m in rbac_objects(manifests) if m["metadata"]["name"] == FULLNAME]
    assert operator_roles
    for role in operator_roles:
        granted = permissions(role["rules"])
        for forbidden in [("", "persistentvolumeclaims"), ("", "persistentvolumes")]:
            assert forbidden not in granted
        # Nodes are watched, and patched only to cordon a straggler's (onStraggler: Replace).
        assert granted.get(("", "nodes"), set()) <= {"get", "list", "watch", "patch"}
        # Queues are read to report a missing or closed one, never written.
        assert granted.get(("scheduling.volcano.sh", "queues"), set()) <= {"get", "list", "watch"}
        # Kueue makes its Workloads and the admins their LocalQueues: the operator only reads.
        for resource in ("workloads", "localqueues"):
            assert granted.get(("kueue.x-k8s.io", resource), set()) <= {"list", "watch"}


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="cluster-wide"),
        pytest.param({"watchNamespaces": ["team-a", "team-b"]}, id="namespaced"),
    ],
)
def test_profile_ui_roles_split_jobs_per_namespace_from_the_cluster_scoped_reviews(
    values: dict[str, Any], tmp_path: Path
) -> None:
    manifests = render({**values, "profileUI": {"enabled": True}}, tmp_path)
    name = f"{FULLNAME}-profile-ui"
    roles = [m for m in rbac_objects(manifests) if m["metadata"]["name"] == name]
    namespaced = "watchNamespaces" in values
    # A Role per watched namespace plus the ClusterRole of the reviews, or one ClusterRole.
    assert len(roles) == (len(values["watchNamespaces"]) + 1 if namespaced else 1)
    for role in roles:
        granted = permissions(role["rules"])
        if role["kind"] == "Role":
            assert set(granted) == {("trainium.dev", "trainingjobs")}
        assert all(verbs <= {"get", "list", "watch", "create"} for verbs in granted.values())
        # Reviews are the only thing the UI creates.
        assert {key for key, verbs in granted.items() if "create" in verbs} <= {
            ("authentication.k8s.io", "tokenreviews"),
            ("authorization.k8s.io", "subjectaccessreviews"),
        }
    bindings = [
        m
        for m in manifests
        if m["kind"] in {"RoleBinding", "ClusterRoleBinding"} and m["metadata"]["name"] == name
    ]
    assert len(bindings) == len(roles)
    for binding in bindings:
        assert binding["subjects"][0]["name"] == name


def test_rbac_create_false_renders_no_rbac(tmp_path: Path) -> None:
    manifests = render({"rbac": {"create": False}, "profileUI": {"enabled": True}}, tmp_path)
    assert not [m for m in manifests if m["apiVersion"].startswith("rbac.authorization.k8s.io")]
