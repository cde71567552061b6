"""The two Neuron stacks: per-instance defaults, refusals, the instance table, the renders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from pydantic import ValidationError

from trainium_operator.api.crd import training_job_crd
from trainium_operator.api.instance_types import (
    INSTANCE_TYPES,
    UNCONFIRMED_SHAPES,
)
from trainium_operator.api.spec import NeuronStack, TrainingJobSpec
from trainium_operator.cli import main

GOLDEN = Path(__file__).parent / "golden"
HEALTH_URL = "https://trainium-operator.trainium-system.svc:8443"


def _spec(**fields: Any) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate(
        {"image": "example.com/train:1", "command": {"script": "/train.py"}, **fields}
    )


@pytest.mark.parametrize(
    ("instance_type", "stack"),
    [
        ("trn1.2xlarge", NeuronStack.XLA),
        ("trn1.32xlarge", NeuronStack.XLA),
        ("trn1n.32xlarge", NeuronStack.XLA),
        ("trn2.48xlarge", NeuronStack.NATIVE),
        ("trn2u.48xlarge", NeuronStack.NATIVE),
    ],
)
def test_the_stack_defaults_by_instance_type(instance_type: str, stack: NeuronStack) -> None:
    assert _spec(instanceType=instance_type).effective_neuron_stack is stack


def test_a_trn2_job_may_ask_for_the_xla_stack() -> None:
    spec = _spec(instanceType="trn2.48xlarge", neuron={"stack": "xla"})
    assert spec.effective_neuron_stack is NeuronStack.XLA


@pytest.mark.parametrize("instance_type", ["trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge"])
def test_the_native_stack_on_trn1_is_refused_naming_the_field_and_the_fix(
    instance_type: str,
) -> None:
    with pytest.raises(ValidationError) as refused:
        _spec(instanceType=instance_type, neuron={"stack": "native"})
    message = str(refused.value)
    assert "spec.neuron.stack is not supported on spec.instanceType" in message
    assert "remove spec.neuron.stack" in message
    assert "(got native)" in message


@pytest.mark.parametrize("control", ["compileOnly", "hloCache"])
def test_native_compile_controls_on_the_xla_stack_are_refused(control: str) -> None:
    with pytest.raises(ValidationError, match="are native-stack controls"):
        _spec(instanceType="trn1.32xlarge", neuron={control: True})
    with pytest.raises(ValidationError, match="are native-stack controls"):
        _spec(instanceType="trn2.48xlarge", neuron={"stack": "xla", control: True})
    assert _spec(instanceType="trn2.48xlarge", neuron={control: True})


def test_the_crd_refuses_unsupported_stacks_with_the_models_messages() -> None:
    spec_schema = training_job_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"
    ]["spec"]
    rules = {r.get("fieldPath"): r for r in spec_schema["x-kubernetes-validations"]}
    stack_rule = rules[".neuron.stack"]
    assert (
        "self.neuron.stack == 'native' && self.instanceType in ['trn2.48xlarge'"
        in (stack_rule["rule"])
    )
    assert "trn1" not in stack_rule["rule"].split("'native'")[1]
    assert "native-stack controls" in rules[".neuron"]["message"]
    neuron = spec_schema["properties"]["neuron"]
    assert neuron["default"] == {}
    stack = neuron["properties"]["stack"]
    assert stack["enum"] == ["xla", "native"]
    assert "default" not in stack, "defaulted per instance type by the operator, not the schema"
    for implied in ("neuron_parallel_compile", "TorchNeuron", "NEFF cache", "trn1"):
        assert implied in stack["description"]


def test_trn2_48xlarge_runs_64_ranks_per_node_at_lnc_2_and_128_at_lnc_1() -> None:
    trn2 = INSTANCE_TYPES["trn2.48xlarge"]
    assert (trn2.logical_cores(2), trn2.logical_cores(1)) == (64, 128)
    assert (trn2.neuron_devices, trn2.efa_interfaces) == (16, 16)
    assert _spec(instanceType="trn2.48xlarge").effective_processes_per_node == 64
    assert _spec(instanceType="trn2.48xlarge", lnc=1).effective_processes_per_node == 128
    trn1 = INSTANCE_TYPES["trn1.32xlarge"]
    assert (trn1.neuron_cores, trn1.neuron_devices, trn1.efa_interfaces) == (32, 16, 8)
    assert INSTANCE_TYPES["trn1n.32xlarge"].efa_interfaces == 16


def test_trn3_shapes_are_marked_unconfirmed_and_not_admitted() -> None:
    for shape in UNCONFIRMED_SHAPES.values():
        assert {"name", "efa_interfaces"} <= set(shape.unconfirmed)
        assert shape.neuron_stacks == ("native",)
        assert shape.name not in INSTANCE_TYPES
        with pytest.raises(ValidationError):
            _spec(instanceType=shape.name)
    gen1, gen2 = UNCONFIRMED_SHAPES["trn3-gen1-server"], UNCONFIRMED_SHAPES["trn3-gen2-server"]
    assert (gen1.logical_cores(2), gen1.logical_cores(1)) == (64, 128)
    assert (gen2.logical_cores(2), gen2.logical_cores(1)) == (16, 32)
    assert all(not t.unconfirmed for t in INSTANCE_TYPES.values())


def test_a_trn1_job_renders_byte_identically_to_main_before_the_native_stack() -> None:
    # render-trn1-xla-main.yaml is main's render (8593f8c) of these jobs, before spec.neuron.
    result = CliRunner().invoke(
        main,
        ["render", "-f", str(GOLDEN / "render-trn1-xla-input.yaml"), "--health-url", HEALTH_URL],
    )
    assert result.exit_code == 0, result.output
    assert result.output == (GOLDEN / "render-trn1-xla-main.yaml").read_text()
    pods = [o for o in yaml.safe_load_all(result.output) if o["kind"] == "Pod"]
    assert pods[0]["spec"]["containers"][0]["command"][0] == "neuron_parallel_compile"
