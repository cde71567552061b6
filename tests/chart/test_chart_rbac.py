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
    find,
    one,
    render,
)

Permissions = dict[tuple[str, str], set[str]]

# What the operator calls in the namespaces it watches.
NAMESPACED: Permissions = {
    ("trainium.dev", "trainingjobs"): {"get", "list", "watch", "patch", "update"},
    ("trainium.dev", "trainingjobs/status"): {"get", "patch", "update"},
    ("", "pods"): {"get", "list", "watch", "create", "delete", "patch"},
    ("", "services"): {"get", "list", "watch", "create", "delete"},
    ("scheduling.volcano.sh", "podgroups"): {"get", "list", "watch", "create", "delete", "patch"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
    # What can lift an admission refusal: watched instead of retrying on a timer.
    ("", "resourcequotas"): {"list", "watch"},
    ("", "limitranges"): {"list", "watch"},
    ("", "serviceaccounts"): {"list", "watch"},
}
# Cluster-scoped reads needed in every mode.
CLUSTER: Permissions = {
    ("", "nodes"): {"get", "list", "watch"},
    ("scheduling.volcano.sh", "queues"): {"list", "watch"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "namespaces"): {"list", "watch"},
    ("scheduling.k8s.io", "priorityclasses"): {"list", "watch"},
}
PEERING_VERBS = {"get", "list", "watch", "patch"}


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


def test_cluster_wide_install_grants_exactly_the_contract_in_one_cluster_role(
    tmp_path: Path,
) -> None:
    manifests = render({}, tmp_path)
    assert not find(manifests, "Role")
    role = one(manifests, "ClusterRole", FULLNAME)
    assert permissions(role["rules"]) == NAMESPACED | CLUSTER


def test_cluster_wide_peering_adds_cluster_kopf_peerings(tmp_path: Path) -> None:
    role = one(render({"peering": {"enabled": True}}, tmp_path), "ClusterRole", FULLNAME)
    assert permissions(role["rules"]) == NAMESPACED | CLUSTER | {
        ("kopf.dev", "clusterkopfpeerings"): PEERING_VERBS
    }


@pytest.mark.parametrize("peering", [False, True], ids=["standalone", "peering"])
def test_namespace_install_grants_namespaced_rules_only_in_watched_namespaces(
    peering: bool, tmp_path: Path
) -> None:
    values = {"watchNamespaces": ["team-a", "team-b"], "peering": {"enabled": peering}}
    manifests = render(values, tmp_path)
    expected_role = NAMESPACED | ({("kopf.dev", "kopfpeerings"): PEERING_VERBS} if peering else {})
    roles = find(manifests, "Role", FULLNAME)
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert permissions(role["rules"]) == expected_role
    # The only cluster-wide grant: cluster-scoped reads, nothing on pods or jobs.
    cluster_role = one(manifests, "ClusterRole", FULLNAME)
    assert permissions(cluster_role["rules"]) == CLUSTER


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
        assert granted.get(("", "nodes"), set()) <= {"get", "list", "watch"}
        # Queues are read to report a missing or closed one, never written.
        assert granted.get(("scheduling.volcano.sh", "queues"), set()) <= {"get", "list", "watch"}


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="cluster-wide"),
        pytest.param({"watchNamespaces": ["team-a", "team-b"]}, id="namespaced"),
    ],
)
def test_profile_ui_can_only_read_training_jobs_and_review_its_users(
    values: dict[str, Any], tmp_path: Path
) -> None:
    manifests = render({**values, "profileUI": {"enabled": True}}, tmp_path)
    name = f"{FULLNAME}-profile-ui"
    roles = [m for m in rbac_objects(manifests) if m["metadata"]["name"] == name]
    namespaced = "watchNamespaces" in values
    # A Role per watched namespace plus the ClusterRole of the reviews, or one ClusterRole.
    assert len(roles) == (len(values["watchNamespaces"]) + 1 if namespaced else 1)
    reviews = {
        ("authentication.k8s.io", "tokenreviews"): {"create"},
        ("authorization.k8s.io", "subjectaccessreviews"): {"create"},
    }
    jobs = {("trainium.dev", "trainingjobs"): {"get", "list", "watch"}}
    granted: dict[tuple[str, str], set[str]] = {}
    for role in roles:
        for key, verbs in permissions(role["rules"]).items():
            granted.setdefault(key, set()).update(verbs)
        if role["kind"] == "Role":
            assert permissions(role["rules"]) == jobs
    assert granted == {**jobs, **reviews}
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
