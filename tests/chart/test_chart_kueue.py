"""The chart's Kueue side as rendered: the operator's --kueue setting and the RBAC it needs, and
the queueing objects the chart may create (LocalQueue, ClusterQueue and its ResourceFlavors,
WorkloadPriorityClasses). Which verbs the operator gets is derived from the code in
test_chart_rbac_from_code.py; the objects' schemas are Kueue's own CRDs
(test_chart_render.py validates every scenario, `kueue` included)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chart.chart_harness import (
    FULLNAME,
    KUEUE_ON,
    TRN1_FLAVOR,
    Manifest,
    find,
    helm,
    one,
    render,
    template_args,
)
from trainium_operator.api import kueue
from trainium_operator.controller.settings import ENV_KUEUE

KUEUE_KINDS = {"LocalQueue", "ClusterQueue", "ResourceFlavor", "WorkloadPriorityClass"}
TRN2_FLAVOR: dict[str, Any] = {
    "name": "trn2-48xlarge",
    "instanceType": "trn2.48xlarge",
    "quota": {
        "cpu": 760,
        "memory": "1900Gi",
        "aws.amazon.com/neuron": 16,
        "vpc.amazonaws.com/efa": 16,
    },
}


def operator_env(manifests: list[Manifest]) -> dict[str, str]:
    deployment = one(manifests, "Deployment", FULLNAME)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def granted(role: Manifest) -> dict[tuple[str, str], set[str]]:
    verbs: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs.setdefault((group, resource), set()).update(rule["verbs"])
    return verbs


def cluster_queue_values(**fields: Any) -> dict[str, Any]:
    return {"kueue": {"clusterQueue": {"create": True, "flavors": [TRN1_FLAVOR], **fields}}}


def test_without_kueue_the_operator_is_told_so_and_gets_no_kueue_right(tmp_path: Path) -> None:
    manifests = render({}, tmp_path)

    assert operator_env(manifests)[ENV_KUEUE] == "false"
    rules = granted(one(manifests, "ClusterRole", FULLNAME))
    assert not [key for key in rules if key[0] == kueue.KUEUE_GROUP]
    assert "patch" not in rules[("", "pods")]
    assert not [m for m in manifests if m["kind"] in KUEUE_KINDS]


def test_kueue_on_sets_the_env_the_operator_reads_and_grants_its_watches_and_pod_patch(
    tmp_path: Path,
) -> None:
    manifests = render({"kueue": {"enabled": True}}, tmp_path)

    assert operator_env(manifests)[ENV_KUEUE] == "true"
    rules = granted(one(manifests, "ClusterRole", FULLNAME))
    assert rules[(kueue.KUEUE_GROUP, "workloads")] == {"list", "watch"}
    assert rules[(kueue.KUEUE_GROUP, "localqueues")] == {"list", "watch"}
    assert "patch" in rules[("", "pods")]
    # The operator's side only: the queues are their own switches.
    assert not [m for m in manifests if m["kind"] in KUEUE_KINDS]


def test_a_namespaced_operator_gets_kueues_kinds_in_each_watched_namespaces_role(
    tmp_path: Path,
) -> None:
    manifests = render({"kueue": {"enabled": True}, "watchNamespaces": ["a", "b"]}, tmp_path)

    roles = find(manifests, "Role", FULLNAME)
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["a", "b"]
    for role in roles:
        assert granted(role)[(kueue.KUEUE_GROUP, "workloads")] == {"list", "watch"}
        assert "patch" in granted(role)[("", "pods")]
    cluster_rules = granted(one(manifests, "ClusterRole", FULLNAME))
    assert not [key for key in cluster_rules if key[0] == kueue.KUEUE_GROUP]


def test_the_local_queue_sits_in_the_workload_namespace_and_submits_to_the_cluster_queue(
    tmp_path: Path,
) -> None:
    values = {
        "workloadNamespace": "team-a",
        "kueue": {"localQueue": {"create": True, "name": "ml", "clusterQueue": "shared"}},
    }
    local = one(render(values, tmp_path), "LocalQueue", "ml")

    assert local["apiVersion"] == f"{kueue.KUEUE_GROUP}/{kueue.KUEUE_VERSION}"
    assert local["metadata"]["namespace"] == "team-a"
    assert local["spec"] == {"clusterQueue": "shared"}


def test_the_cluster_queue_covers_every_flavors_resources_with_their_quotas(
    tmp_path: Path,
) -> None:
    manifests = render(cluster_queue_values(flavors=[TRN1_FLAVOR, TRN2_FLAVOR]), tmp_path)
    queue = one(manifests, "ClusterQueue", "trainium")

    (group,) = queue["spec"]["resourceGroups"]
    covered = ["aws.amazon.com/neuron", "cpu", "memory", "vpc.amazonaws.com/efa"]
    assert group["coveredResources"] == covered
    assert [f["name"] for f in group["flavors"]] == ["trn1-32xlarge", "trn2-48xlarge"]
    trn1, trn2 = group["flavors"]
    # Kueue wants each flavor's resources in the order of coveredResources.
    assert [r["name"] for r in trn1["resources"]] == covered
    assert {r["name"]: r["nominalQuota"] for r in trn1["resources"]} == {
        "aws.amazon.com/neuron": "32",
        "cpu": "250",
        "memory": "950Gi",
        "vpc.amazonaws.com/efa": "16",
    }
    assert [r["name"] for r in trn2["resources"]] == covered
    assert queue["spec"]["preemption"] == {"withinClusterQueue": "LowerPriority"}
    assert "namespace" not in queue["metadata"]
    for flavor in (TRN1_FLAVOR, TRN2_FLAVOR):
        resource_flavor = one(manifests, "ResourceFlavor", flavor["name"])
        assert resource_flavor["spec"] == {
            "nodeLabels": {"node.kubernetes.io/instance-type": flavor["instanceType"]}
        }


def test_a_large_whole_quota_is_written_as_an_integer_not_in_exponent_form(
    tmp_path: Path,
) -> None:
    flavor = {**TRN1_FLAVOR, "quota": {**TRN1_FLAVOR["quota"], "cpu": 1000000}}
    queue = one(render(cluster_queue_values(flavors=[flavor]), tmp_path), "ClusterQueue")

    (resources,) = [f["resources"] for f in queue["spec"]["resourceGroups"][0]["flavors"]]
    assert {"name": "cpu", "nominalQuota": "1000000"} in resources


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        pytest.param(
            None,
            {"matchLabels": {"kubernetes.io/metadata.name": "trainium-jobs"}},
            id="workload-namespace",
        ),
        pytest.param({}, {}, id="every-namespace"),
        pytest.param({"matchLabels": {"team": "ml"}}, {"matchLabels": {"team": "ml"}}, id="own"),
    ],
)
def test_the_cluster_queue_takes_workloads_from_the_workload_namespace_unless_told_otherwise(
    selector: dict[str, Any] | None, expected: dict[str, Any], tmp_path: Path
) -> None:
    values = cluster_queue_values(namespaceSelector=selector)
    queue = one(render(values, tmp_path), "ClusterQueue", "trainium")

    assert queue["spec"]["namespaceSelector"] == expected


def test_flavors_listing_different_resources_fail_the_render_naming_both(tmp_path: Path) -> None:
    no_efa = {
        "name": "trn1-2xlarge",
        "instanceType": "trn1.2xlarge",
        "quota": {"cpu": 8, "memory": "32Gi", "aws.amazon.com/neuron": 1},
    }
    result = helm(
        *template_args(cluster_queue_values(flavors=[TRN1_FLAVOR, no_efa]), tmp_path),
        check=False,
    )

    assert result.returncode != 0
    assert "flavor trn1-2xlarge has quota for aws.amazon.com/neuron, cpu, memory" in result.stderr
    assert "but flavor trn1-32xlarge for aws.amazon.com/neuron, cpu, memory, vpc" in result.stderr
    assert "every flavor must list the same resources" in result.stderr


def test_a_cluster_queue_without_flavors_fails_the_render(tmp_path: Path) -> None:
    result = helm(*template_args(cluster_queue_values(flavors=[]), tmp_path), check=False)

    assert result.returncode != 0
    assert "kueue.clusterQueue.create needs at least one entry" in result.stderr


def test_the_listed_workload_priority_classes_are_created(tmp_path: Path) -> None:
    manifests = render({"kueue": KUEUE_ON}, tmp_path)

    high = one(manifests, "WorkloadPriorityClass", "high")
    assert high["apiVersion"] == f"{kueue.KUEUE_GROUP}/{kueue.KUEUE_VERSION}"
    assert (high["value"], high["description"]) == (1000, "production runs")
    low = one(manifests, "WorkloadPriorityClass", "low")
    assert low["value"] == 100
    assert "description" not in low
    assert {m["kind"] for m in manifests} >= KUEUE_KINDS


@pytest.mark.parametrize(
    "flag",
    [
        pytest.param("kueue.clusterQueue.flavors[0].name=trn1", id="flavor-without-type"),
        pytest.param("kueue.clusterQueue.preemption.withinClusterQueue=Always", id="preemption"),
        pytest.param("kueue.localQueue.name=Not_A_Name", id="queue-name"),
        pytest.param("kueue.workloadPriorityClasses[0].name=high", id="class-without-value"),
        pytest.param("kueue.enable=true", id="misspelled-switch"),
    ],
)
def test_an_invalid_kueue_value_is_refused_by_the_schema(flag: str, tmp_path: Path) -> None:
    result = helm(*template_args({}, tmp_path), "--set", flag, check=False)

    assert result.returncode != 0
    assert "schema" in result.stderr
