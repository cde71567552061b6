"""The eksctl node-group example matches what the chart and the tutorial's jobs expect."""

from __future__ import annotations

from typing import Any

import yaml

from chart.chart_harness import CHART_DIR, ROOT

EXAMPLE = ROOT / "examples" / "eksctl-trn1-nodegroup.yaml"


def node_group() -> dict[str, Any]:
    config = yaml.safe_load(EXAMPLE.read_text())
    assert config["apiVersion"] == "eksctl.io/v1alpha5"
    assert config["kind"] == "ClusterConfig"
    (group,) = config["managedNodeGroups"]
    result: dict[str, Any] = group
    return result


def test_node_group_is_two_trn1_32xlarge_with_efa_in_one_zone() -> None:
    group = node_group()
    assert group["instanceType"] == "trn1.32xlarge"
    assert group["efaEnabled"] is True
    assert group["privateNetworking"] is True
    assert len(group["availabilityZones"]) == 1
    assert group["minSize"] == group["desiredCapacity"] == 2


def test_device_plugins_of_the_chart_select_the_node_groups_instance_type() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    instance_type = node_group()["instanceType"]
    assert instance_type in values["neuronDevicePlugin"]["instanceTypes"]
    assert instance_type in values["efaDevicePlugin"]["instanceTypes"]
