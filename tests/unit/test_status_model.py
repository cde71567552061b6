"""The status model is the CRD's status schema and the check on every status the machine writes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from trainium_operator.api.crd import training_job_crd
from trainium_operator.api.status import Phase, TrainingJobStatus, known_fields, validated_status
from unit.jobs import refused


def crd_status_schema() -> dict[str, Any]:
    version = training_job_crd()["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def test_crd_status_phase_enum_is_the_phase_list() -> None:
    assert crd_status_schema()["properties"]["phase"]["enum"] == [p.value for p in Phase]


def test_crd_status_schema_declares_every_model_field_by_its_json_name() -> None:
    names = {f.alias or n for n, f in TrainingJobStatus.model_fields.items()}
    assert set(crd_status_schema()["properties"]) == names
    failure = crd_status_schema()["properties"]["lastFailure"]
    assert failure["required"] == ["class"]
    assert failure["properties"]["class"]["enum"] == [
        "Application",
        "Infrastructure",
        "Stall",
        "Straggler",
        "Preflight",
    ]


def test_crd_status_schema_has_no_defaults_anywhere() -> None:
    def defaults(node: Any) -> list[Any]:
        if isinstance(node, dict):
            found = [node["default"]] if "default" in node else []
            return found + [d for v in node.values() for d in defaults(v)]
        if isinstance(node, list):
            return [d for v in node for d in defaults(v)]
        return []

    assert defaults(crd_status_schema()) == []


def test_conditions_are_a_list_map_keyed_by_type() -> None:
    conditions = crd_status_schema()["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_a_status_field_the_model_does_not_declare_is_refused() -> None:
    with pytest.raises(ValidationError, match="retries"):
        validated_status({"phase": "Pending", "retries": 3})


def test_a_phase_outside_the_list_is_refused() -> None:
    with pytest.raises(ValidationError, match="phase"):
        validated_status({"phase": "Running"})


def test_a_negative_restart_count_is_refused() -> None:
    with pytest.raises(ValidationError, match="total"):
        validated_status({"restarts": {"total": -1, "application": 0, "infrastructure": 0}})


def test_an_invalid_spec_decision_writes_a_status_the_model_accepts() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    decision = refused({}, 3, ["spec.nodes: must be at least 1"], now)
    status = TrainingJobStatus.model_validate(decision.status)
    assert status.phase is Phase.FAILED
    assert status.reason == "InvalidSpec"
    assert status.observed_generation == 3


def test_fields_another_operator_version_wrote_are_dropped_when_read_at_every_depth() -> None:
    stored = {
        "phase": "Training",
        "futureField": {"x": 1},
        "restarts": {"total": 1, "application": 1, "infrastructure": 0, "futureCount": 0},
        "conditions": [{"type": "Running", "status": "True", "severity": "Info"}],
    }
    assert known_fields(stored) == {
        "phase": "Training",
        "restarts": {"total": 1, "application": 1, "infrastructure": 0},
        "conditions": [{"type": "Running", "status": "True"}],
    }


def test_a_running_job_whose_status_has_an_unknown_field_is_still_decided() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    decision = refused({"phase": "Training", "legacy": True}, 2, ["spec.x: bad"], now)
    assert "legacy" not in decision.status
    assert decision.status["phase"] == "Failed"
