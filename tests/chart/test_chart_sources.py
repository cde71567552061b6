"""The chart's generated parts are in step with their sources (CRDs, value docs, schema)."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chart.chart_harness import CHART_DIR, ROOT, chartctl
from trainium_devcluster import versions

SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())


def test_chart_crds_are_byte_for_byte_the_top_level_crds() -> None:
    top = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART_DIR / "crds").glob("*.yaml")}
    assert "kopf.dev_peerings.yaml" in top
    assert "trainium.dev_trainingjobs.yaml" in top
    assert chart == top, "run: python charts/chartctl.py sync"


def test_chart_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]


def test_kopf_peering_crds_define_both_scopes() -> None:
    crds = list(yaml.safe_load_all((ROOT / "crds" / "kopf.dev_peerings.yaml").read_text()))
    scopes = {crd["spec"]["names"]["kind"]: crd["spec"]["scope"] for crd in crds if crd}
    assert scopes == {"ClusterKopfPeering": "Cluster", "KopfPeering": "Namespaced"}


def test_chartctl_check_finds_nothing_stale() -> None:
    assert chartctl().check() == []


def test_chartctl_detects_a_crd_copy_that_drifted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = chartctl()
    top, chart = tmp_path / "top", tmp_path / "chart"
    top.mkdir()
    chart.mkdir()
    (top / "a.yaml").write_text("kind: A\n")
    (top / "b.yaml").write_text("kind: B\n")
    (chart / "a.yaml").write_text("kind: A # edited\n")
    (chart / "old.yaml").write_text("kind: Old\n")
    monkeypatch.setattr(module, "TOP_CRDS", top)
    monkeypatch.setattr(module, "CHART_CRDS", chart)
    assert module.crd_drift() == [
        "chart crds/ lacks b.yaml",
        "chart crds/ has old.yaml, top-level crds/ does not",
        "chart crds/a.yaml differs from crds/a.yaml",
    ]
    module.sync_crds()
    assert module.crd_drift() == []
    assert sorted(p.name for p in chart.iterdir()) == ["a.yaml", "b.yaml"]


def test_value_docs_are_read_from_helm_docs_comments() -> None:
    text = """\
# -- Top.
top: 1
group:
  # -- Nested key,
  # continued.
  nested: true
  # plain comment, not documentation
  plain: 2

  # -- Separated by a blank line from its key: dropped.

  orphan: 3
list:
  - name: x
    # -- Inside a list item: not a values key.
    field: y
"""
    docs = chartctl().parse_value_docs(text)
    assert [(d.dotted, d.description) for d in docs] == [
        ("top", "Top."),
        ("group.nested", "Nested key, continued."),
    ]


def test_every_value_is_documented() -> None:
    module = chartctl()
    values_text = (CHART_DIR / "values.yaml").read_text()
    docs = module.parse_value_docs(values_text)
    assert module.undocumented_keys(yaml.safe_load(values_text), docs) == []
    undocumented = module.undocumented_keys({"a": {"b": 1, "c": 2}}, [])
    assert undocumented == ["a.b", "a.c"]


def _objects(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if (
            node.get("type") == "object"
            or "object" in (node.get("type") or [])
            or ("properties" in node)
        ):
            yield path, node
        for key, value in node.items():
            yield from _objects(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _objects(value, f"{path}/{index}")


def test_every_object_in_the_values_schema_is_closed() -> None:
    open_objects = [
        path
        for path, node in _objects(SCHEMA)
        if "additionalProperties" not in node
        and "x-kubernetes-preserve-unknown-fields" not in node
        and path not in {"", "/properties/global"}
        # if/then branches only add constraints to objects declared closed elsewhere
        and not path.startswith("/allOf/")
    ]
    assert open_objects == []
    assert SCHEMA["additionalProperties"] is False


def test_every_schema_key_has_a_description_and_default() -> None:
    module = chartctl()
    docs = module.parse_value_docs((CHART_DIR / "values.yaml").read_text())
    for doc in docs:
        node = module._schema_node(SCHEMA, doc.path)
        assert node is not None, doc.dotted
        assert node["description"] == doc.description
        assert "default" in node


def test_schema_checks_kubernetes_objects_of_the_release_the_dev_cluster_runs() -> None:
    dev_cluster_minor = ".".join(versions.KUBERNETES_VERSION.lstrip("v").split(".")[:2])
    assert chartctl().KUBERNETES_SCHEMA_VERSION.startswith(dev_cluster_minor + ".")
    assert "io.k8s.api.core.v1.SecurityContext" in SCHEMA["definitions"]
