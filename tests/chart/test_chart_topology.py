"""The chart's network-topology side: the operator's --topology setting from topology.*, the
RBAC only when on, and the ClusterQueue listing the operator's TAS flavors. Which verbs are
granted is derived from the code in test_chart_rbac_from_code.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from chart.chart_harness import FULLNAME, KUEUE_ON, find, helm, one, render, template_args
from chart.test_chart_kueue import granted, operator_env
from trainium_operator.api import kueue, topology
from trainium_operator.builders.topology import kueue_name
from trainium_operator.controller.settings import ENV_TOPOLOGY


def test_off_by_default_the_operator_writes_no_topology_and_gets_no_right_to(
    tmp_path: Path,
) -> None:
    manifests = render({"kueue": KUEUE_ON}, tmp_path)

    assert operator_env(manifests)[ENV_TOPOLOGY] == ""
    rules = granted(one(manifests, "ClusterRole", FULLNAME))
    assert (topology.HYPERNODE_GROUP, topology.HYPERNODES) not in rules
    assert (kueue.KUEUE_GROUP, topology.KUEUE_TOPOLOGIES) not in rules


def test_on_it_writes_hypernodes_and_for_kueue_only_beside_kueue_enabled(tmp_path: Path) -> None:
    without_kueue = render({"topology": {"enabled": True}}, tmp_path)
    with_kueue = render({"topology": {"enabled": True}, "kueue": {"enabled": True}}, tmp_path)

    assert operator_env(without_kueue)[ENV_TOPOLOGY] == "volcano"
    assert operator_env(with_kueue)[ENV_TOPOLOGY] == "volcano,kueue"
    rules = granted(one(with_kueue, "ClusterRole", FULLNAME))
    assert rules[(topology.HYPERNODE_GROUP, topology.HYPERNODES)] == {
        "list",
        "create",
        "update",
        "delete",
    }
    for resource in (topology.KUEUE_TOPOLOGIES, topology.RESOURCE_FLAVORS):
        assert rules[(kueue.KUEUE_GROUP, resource)] == {"list", "create", "delete"}
    assert (kueue.KUEUE_GROUP, topology.KUEUE_TOPOLOGIES) not in granted(
        one(without_kueue, "ClusterRole", FULLNAME)
    )


def test_kueue_only_topology_writes_no_hypernodes(tmp_path: Path) -> None:
    manifests = render(
        {"topology": {"enabled": True, "volcano": False}, "kueue": {"enabled": True}}, tmp_path
    )

    assert operator_env(manifests)[ENV_TOPOLOGY] == "kueue"
    assert (topology.HYPERNODE_GROUP, topology.HYPERNODES) not in granted(
        one(manifests, "ClusterRole", FULLNAME)
    )


def test_a_namespaced_operator_gets_the_cluster_scoped_topology_kinds_in_its_cluster_role(
    tmp_path: Path,
) -> None:
    manifests = render(
        {"topology": {"enabled": True}, "kueue": {"enabled": True}, "watchNamespaces": ["a"]},
        tmp_path,
    )

    rules = granted(one(manifests, "ClusterRole", FULLNAME))
    assert (topology.HYPERNODE_GROUP, topology.HYPERNODES) in rules
    for role in find(manifests, "Role", FULLNAME):
        assert (topology.HYPERNODE_GROUP, topology.HYPERNODES) not in granted(role)


def test_with_kueue_topology_the_cluster_queue_lists_the_operators_flavors_and_makes_none(
    tmp_path: Path,
) -> None:
    manifests = render({"topology": {"enabled": True}, "kueue": KUEUE_ON}, tmp_path)

    queue = one(manifests, "ClusterQueue", "trainium")
    (group,) = queue["spec"]["resourceGroups"]
    assert [f["name"] for f in group["flavors"]] == [kueue_name("trn1.32xlarge")]
    assert [f["name"] for f in group["flavors"]] == ["trainium-trn1-32xlarge"]
    assert not [m for m in manifests if m["kind"] == "ResourceFlavor"]


def test_without_topology_the_chart_still_makes_its_own_flavors(tmp_path: Path) -> None:
    manifests = render({"kueue": KUEUE_ON}, tmp_path)

    assert [m["metadata"]["name"] for m in manifests if m["kind"] == "ResourceFlavor"] == [
        "trn1-32xlarge"
    ]


@pytest.mark.parametrize("flag", ["topology.enable=true", "topology.volcano=yes"])
def test_an_invalid_topology_value_is_refused_by_the_schema(flag: str, tmp_path: Path) -> None:
    result = helm(*template_args({}, tmp_path), "--set-string", flag, check=False)

    assert result.returncode != 0
    assert "schema" in result.stderr
