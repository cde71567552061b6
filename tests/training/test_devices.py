"""The device layer's choices: which stack and device a run gets, and the native backend's
pieces in one process (the two-rank runs are in test_native_stack_runs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from trainium_operator.contract import workload_env
from trainium_training import checkpoints, devices
from trainium_training.pretrain import resolve_precision

pytestmark = pytest.mark.training

NATIVE = {workload_env.NEURON_STACK: "native"}


def test_an_absent_or_empty_stack_variable_reads_as_the_xla_stack() -> None:
    assert devices.neuron_stack({}) == "xla"
    assert devices.neuron_stack({workload_env.NEURON_STACK: ""}) == "xla"
    assert devices.neuron_stack(NATIVE) == "native"


def test_an_unknown_stack_is_refused_naming_the_variable_and_the_choices() -> None:
    with pytest.raises(ValueError, match=r"TRAINIUM_NEURON_STACK='jax' is unknown.*'native'"):
        devices.neuron_stack({workload_env.NEURON_STACK: "jax"})


def test_the_native_stack_without_a_neuron_device_runs_on_the_cpu() -> None:
    if devices.neuron_available():
        pytest.skip("torch-neuronx is installed here")
    assert devices.resolve_device("auto", NATIVE) == "cpu"
    assert devices.resolve_device("cpu", NATIVE) == "cpu"


def test_each_stack_refuses_the_other_stacks_device() -> None:
    with pytest.raises(ValueError, match="--device xla is the XLA stack's device"):
        devices.resolve_device("xla", NATIVE)
    with pytest.raises(ValueError, match="--device neuron is the native stack's device"):
        devices.resolve_device("neuron", {})


def test_asking_for_the_neuron_device_where_there_is_none_fails_instead_of_using_the_cpu() -> None:
    if devices.neuron_available():
        pytest.skip("torch-neuronx is installed here")
    with pytest.raises(ValueError, match="PyTorch has no neuron device"):
        devices.resolve_device("neuron", NATIVE)


def test_torch_compile_defaults_to_neuron_on_the_device_and_off_on_the_cpu() -> None:
    assert devices.resolve_compile_backend("auto", "neuron") == "neuron"
    assert devices.resolve_compile_backend("auto", "cpu") is None
    assert devices.resolve_compile_backend("off", "neuron") is None
    assert devices.resolve_compile_backend("aot_eager", "cpu") == "aot_eager"
    with pytest.raises(ValueError, match="needs the Neuron device"):
        devices.resolve_compile_backend("neuron", "cpu")


def test_the_process_group_is_neuron_on_the_device_and_gloo_on_the_cpu() -> None:
    assert devices.native_process_group_backend("neuron") == "neuron"
    assert devices.native_process_group_backend("cpu") == "gloo"


def test_the_xla_stack_refuses_a_torch_compile_backend() -> None:
    with pytest.raises(ValueError, match="is for the native stack"):
        devices.create_backend("cpu", {}, torch.float32, compile_backend="eager")


def test_the_xla_stack_keeps_its_cpu_backend_and_the_native_stack_gets_its_own() -> None:
    xla_cpu = devices.create_backend("cpu", {}, torch.float32)
    native = devices.create_backend("cpu", NATIVE, torch.float32)
    assert (xla_cpu.name, xla_cpu.stack, xla_cpu.process_group_backend) == ("cpu", "xla", None)
    assert (native.name, native.stack, native.device.type) == ("native", "native", "cpu")
    assert native.compile_backend is None


def test_auto_precision_is_bf16_on_the_neuron_device_too() -> None:
    assert resolve_precision("auto", "neuron") == "bf16"


def test_the_compile_wrapper_compiles_with_a_cpu_backend_and_computes_the_same(
    tmp_path: Path,
) -> None:
    backend = devices.create_backend("cpu", NATIVE, torch.float32, compile_backend="eager")
    assert backend.compile_backend == "eager"
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    prepared = backend.prepare_model(model)
    assert prepared is not model
    assert getattr(prepared, "_orig_mod", None) is model, "torch.compile's wrapper of the model"
    inputs = torch.randn(3, 4)
    assert torch.allclose(prepared(inputs), model(inputs))
    with backend.accumulating(prepared, last=False):  # one process: no DDP, nothing to defer
        prepared(inputs).sum().backward()
    assert model.weight.grad is not None

    path = backend.save_checkpoint({"model": model.state_dict()}, tmp_path, step=1)
    assert path == tmp_path / checkpoints.checkpoint_name(1)
    assert set(torch.load(path, weights_only=True)["model"]) == {"weight", "bias"}
