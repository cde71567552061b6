"""The torch.profiler source on a real CPU training loop (skipped only without torch)."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from pathlib import Path

import pytest

from profiler.profiler_helpers import of_kind, ranges_by_name, start, stop_and_read
from trainium_operator import profiler
from trainium_operator.profiler.config import StepWindow
from trainium_operator.profiler.events import HOST_DEVICE, EventKind
from trainium_operator.profiler.format import RankProfile
from trainium_operator.profiler.sources.torch_source import FlowIds, convert_kineto_events


def _train(steps: int) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.randn(16, 32)
    target = torch.randn(16, 4)
    for n in range(steps):
        profiler.step(n)
        with profiler.annotate("forward"):
            loss = torch.nn.functional.mse_loss(model(data), target)
        with profiler.annotate("backward"):
            loss.backward()
        with profiler.annotate("optimizer"):
            optimizer.step()
            optimizer.zero_grad()


def _run_with_torch_source(tmp_path: Path, steps: int, window: StepWindow) -> RankProfile:
    pytest.importorskip("torch")
    # The default source selection, as in a training pod: the config asks for torch.
    rank_file = start(tmp_path, steps=window, sources=frozenset({"torch"}))
    _train(steps)
    return stop_and_read(rank_file)


def test_cpu_run_records_real_operators_inside_the_step_window(tmp_path: Path) -> None:
    result = _run_with_torch_source(tmp_path, steps=6, window=StepWindow(2, 3))
    events = result.events
    steps = {s.value: s for s in of_kind(events, EventKind.STEP)}
    ops = of_kind(events, EventKind.HOST_OP)
    names = {op.name for op in ops}

    assert "torch" in result.header.sources
    assert {"aten::addmm", "aten::relu", "aten::mse_loss"} <= names
    assert any(n.startswith("autograd::engine::evaluate_function") for n in names)
    window_start, window_end = steps[2].start_ns, steps[3].end_ns
    assert all(window_start <= op.start_ns and op.end_ns <= window_end for op in ops)
    assert all(op.device == HOST_DEVICE for op in ops)
    # Our own annotations and torch's record_function ranges (optimizer) both arrive.
    assert len(ranges_by_name(events)["forward"]) == 2
    assert any(name.startswith("Optimizer.step") for name in ranges_by_name(events))


def test_forward_operators_link_to_their_backward_pass(tmp_path: Path) -> None:
    result = _run_with_torch_source(tmp_path, steps=4, window=StepWindow(1, 1))
    by_flow = collections.defaultdict(list)
    for ev in result.events:
        if ev.flow_id:
            by_flow[ev.flow_id].append(ev)

    assert len(by_flow) >= 4  # two Linear layers, relu, loss: at least one link each
    for pair in by_flow.values():
        forward, backward = sorted(pair, key=lambda e: e.start_ns)
        assert len(pair) == 2
        assert forward.name.startswith("aten::")
        assert "Backward" in backward.name
        assert forward.end_ns <= backward.start_ns


def test_operators_nest_under_their_callers(tmp_path: Path) -> None:
    result = _run_with_torch_source(tmp_path, steps=3, window=StepWindow(1, 1))
    ops = of_kind(result.events, EventKind.HOST_OP)
    linear = next(op for op in ops if op.name == "aten::linear")
    addmm = next(op for op in ops if op.name == "aten::addmm" and op.start_ns >= linear.start_ns)
    assert linear.start_ns <= addmm.start_ns
    assert addmm.end_ns <= linear.end_ns
    assert addmm.depth == linear.depth + 1


@dataclass
class _FakeKinetoEvent:
    _name: str
    _start: int
    _duration: int
    _device: str
    _correlation: int
    _resource: int = 7
    _index: int = 0

    def name(self) -> str:
        return self._name

    def start_ns(self) -> int:
        return self._start

    def duration_ns(self) -> int:
        return self._duration

    def device_type(self) -> str:
        return f"DeviceType.{self._device}"

    def device_index(self) -> int:
        return self._index

    def device_resource_id(self) -> int:
        return self._resource

    def start_thread_id(self) -> int:
        return 1

    def fwd_thread_id(self) -> int:
        return 0

    def sequence_nr(self) -> int:
        return -1

    def correlation_id(self) -> int:
        return self._correlation

    def is_user_annotation(self) -> bool:
        return False

    def is_hidden_event(self) -> bool:
        return False

    def is_async(self) -> bool:
        return False


def test_gpu_launches_link_to_their_kernels_by_correlation_id() -> None:
    # No GPU here: Kineto's CUDA activity is faked at the converter's input.
    kineto = [
        _FakeKinetoEvent("cudaLaunchKernel", 1_000, 50, "CPU", 11),
        _FakeKinetoEvent("cudaMemcpyAsync", 2_000, 20, "CPU", 12),
        _FakeKinetoEvent("ampere_sgemm_128x64_nn", 1_300, 900, "CUDA", 11, _resource=7, _index=1),
        _FakeKinetoEvent("Memcpy HtoD (Pageable -> Device)", 2_100, 400, "CUDA", 12, _index=1),
        _FakeKinetoEvent("ncclDevKernel_AllReduce_Sum_f32", 3_000, 5_000, "CUDA", 13, _index=1),
        _FakeKinetoEvent("cudaStreamSynchronize", 9_000, 10, "CPU", 14),
        _FakeKinetoEvent("ProfilerStep#3", 0, 10_000, "CPU", 15),
    ]
    batch = convert_kineto_events(kineto, wall_to_mono_offset=-1_000, flows=FlowIds())
    kinds = {e.name: e.kind for e in batch.events}
    by_name = {e.name: e for e in batch.events}

    assert "ProfilerStep#3" not in kinds
    assert kinds["cudaLaunchKernel"] == EventKind.LAUNCH
    assert kinds["ampere_sgemm_128x64_nn"] == EventKind.KERNEL
    assert kinds["Memcpy HtoD (Pageable -> Device)"] == EventKind.MEMCPY
    assert kinds["ncclDevKernel_AllReduce_Sum_f32"] == EventKind.COLLECTIVE
    assert kinds["cudaStreamSynchronize"] == EventKind.SYNC
    assert by_name["cudaLaunchKernel"].flow_id == by_name["ampere_sgemm_128x64_nn"].flow_id != 0
    assert by_name["cudaMemcpyAsync"].flow_id == by_name["Memcpy HtoD (Pageable -> Device)"].flow_id
    assert by_name["ncclDevKernel_AllReduce_Sum_f32"].flow_id == 0  # its launch is not in view
    kernel = by_name["ampere_sgemm_128x64_nn"]
    assert (kernel.device, kernel.thread_id, kernel.start_ns) == (1, 7, 300)
    assert batch.track_names[(7, 1)] == "stream 7"
