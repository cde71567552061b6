"""docs/api.md is generated from the CRD's schema and must not go stale."""

from __future__ import annotations

from pathlib import Path

from trainium_operator.api.crd import spec_schema, status_schema
from trainium_operator.api.reference import api_reference

ROOT = Path(__file__).resolve().parents[2]


def test_docs_api_page_is_the_generated_reference() -> None:
    committed = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert committed == api_reference(), (
        "docs/api.md is stale: run `trainium-operator render --api-doc > docs/api.md`"
    )


def test_api_reference_names_every_top_level_spec_and_status_field() -> None:
    page = api_reference()
    for schema in (spec_schema(), status_schema()):
        for name in schema["properties"]:
            assert f"| `{name}` |" in page


def test_api_reference_states_cel_rules_and_limits() -> None:
    page = api_reference()
    assert "spec.rendezvous.endpoint is required when spec.rendezvous.backend is etcd" in page
    assert "at most 512" in page  # spec.nodes' maximum
