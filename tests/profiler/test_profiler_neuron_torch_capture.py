"""The native stack's device capture: the torch source opens TorchNeuron's torch.profiler
capture at the first step of the window and closes it after the last, as Neuron Explorer's
PyTorch guide documents the API. A stand-in `torch_neuronx.profiling` (no Trainium here)
records what the source asks for and writes the documented output layout; the post-run merge
then finds it.
"""

from __future__ import annotations

import enum
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from profiler.neuron_capture import SYSTEM
from profiler.profiler_helpers import start, stop_and_read
from trainium_operator import profiler
from trainium_operator.profiler.config import StepWindow
from trainium_operator.profiler.sources import torch_source

torch = pytest.importorskip("torch")
from torch._C._profiler import _ExperimentalConfig  # noqa: E402 - after the importorskip


class _Stand:
    """What the training loop and the stand-in module saw, in order."""

    def __init__(self) -> None:
        self.step = -1
        self.log: list[tuple[str, int]] = []
        self.configs: list[dict[str, Any]] = []
        self.activities: list[Any] = []


def _install(monkeypatch: pytest.MonkeyPatch, stand: _Stand) -> None:
    class ProfileMode(enum.Enum):
        DEVICE = "device"
        RUNTIME = "runtime"
        CPU_UTIL = "cpu_util"
        HOST_MEMORY = "host_memory"

    class NeuronConfig(_ExperimentalConfig):  # type: ignore[misc]
        def __init__(self, **options: Any) -> None:
            super().__init__()
            self.options = options
            stand.configs.append(options)

    class NeuronProfiler:
        def __init__(self, config: NeuronConfig) -> None:
            self.config = config

        def export_trace(self, prof: Any) -> None:
            # Where the runtime and the exporter put a window's files (the guide's "Expected
            # output"): <profile_output_dir>/<instance>_pid_<pid>/<timestamp>/.
            import os

            session = (
                Path(self.config.options["profile_output_dir"])
                / f"i-0f207fb2a99bd2d08_pid_{os.getpid()}"
                / f"window-at-step-{stand.step}"
            )
            session.mkdir(parents=True)
            for name in ("ntrace.pb", "trace_info.pb", "profile_nc_0_session_0.ntff"):
                (session / name).write_bytes(b"raw")
            (session / "trace.json").write_text("{}")
            stand.log.append(("export", stand.step))

    profiling = types.ModuleType("torch_neuronx.profiling")
    profiling.NeuronConfig = NeuronConfig  # type: ignore[attr-defined]
    profiling.NeuronProfiler = NeuronProfiler  # type: ignore[attr-defined]
    profiling.ProfileMode = ProfileMode  # type: ignore[attr-defined]
    package = types.ModuleType("torch_neuronx")
    package.profiling = profiling  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_neuronx", package)
    monkeypatch.setitem(sys.modules, "torch_neuronx.profiling", profiling)
    monkeypatch.setattr(
        torch,
        "neuron",
        types.SimpleNamespace(synchronize=lambda: stand.log.append(("synchronize", stand.step))),
        raising=False,
    )
    real_profile = torch.profiler.profile

    class RecordingProfile(real_profile):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            stand.activities = list(kwargs.get("activities", []))
            super().__init__(*args, **kwargs)

        def start(self) -> None:
            stand.log.append(("start", stand.step))
            super().start()

        def stop(self) -> None:
            stand.log.append(("stop", stand.step))
            super().stop()

    monkeypatch.setattr(torch.profiler, "profile", RecordingProfile)


def _train(stand: _Stand, steps: int) -> None:
    model = torch.nn.Linear(8, 2)
    data = torch.randn(4, 8)
    for n in range(steps):
        stand.step = n
        profiler.step(n)
        model(data).sum().backward()


def test_the_native_window_is_torchneurons_capture_and_nothing_outside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand = _Stand()
    _install(monkeypatch, stand)
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", "/data/neuron_cache/native/set_0/neff")
    rank_path = start(
        tmp_path, steps=StepWindow(3, 5), sources=frozenset({"torch"}), neuron_device=True
    )
    _train(stand, steps=40)
    result = stop_and_read(rank_path)

    # Opened as step 3 begins, device work synchronized, closed as step 6 begins: the run's
    # other 37 steps are never captured.
    assert stand.log == [("start", 3), ("synchronize", 6), ("stop", 6), ("export", 6)]
    (options,) = stand.configs
    assert [m.name for m in options["modes"]] == ["DEVICE", "RUNTIME", "CPU_UTIL", "HOST_MEMORY"]
    assert options["profile_output_dir"] == str(tmp_path / "node-a" / "neuron")
    assert options["neff_cache_dir"] == "/data/neuron_cache/native/set_0/neff"
    assert torch.profiler.ProfilerActivity.PrivateUse1 in stand.activities
    assert "torch" in result.header.sources
    (session,) = (tmp_path / "node-a" / "neuron").glob("i-*_pid_*/*")
    assert session.name == "window-at-step-6"


def test_the_capture_lands_where_the_post_run_merge_finds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from trainium_operator.profiler.sources.neuron import capture_dirs, merge_profile_dir

    stand = _Stand()
    _install(monkeypatch, stand)
    rank_path = start(
        tmp_path, steps=StepWindow(1, 2), sources=frozenset({"torch"}), neuron_device=True
    )
    _train(stand, steps=4)
    stop_and_read(rank_path)
    import os

    (session,) = capture_dirs(tmp_path / "node-a" / "neuron", os.getpid())
    # neuron-explorer's JSON export of the window (the fixture's events belong to another pid,
    # so only the merge's bookkeeping is checked here).
    shutil.copy(SYSTEM, session / "system_profile.json")
    report = merge_profile_dir(tmp_path, cli=None)
    assert report.merged == [rank_path]


def test_without_torch_neuronx_the_window_still_captures_what_torch_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)
    assert torch_source.neuron_capture_options(tmp_path) == {}
    stand = _Stand()
    rank_path = start(
        tmp_path, steps=StepWindow(1, 1), sources=frozenset({"torch"}), neuron_device=True
    )
    _train(stand, steps=3)
    result = stop_and_read(rank_path)
    assert "torch" in result.header.sources
    assert not (tmp_path / "node-a" / "neuron").exists()


def test_the_window_on_the_xla_stack_or_without_device_profiling_passes_no_neuron_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand = _Stand()
    _install(monkeypatch, stand)
    rank_path = start(tmp_path, steps=StepWindow(1, 1), sources=frozenset({"torch"}))
    _train(stand, steps=3)
    stop_and_read(rank_path)
    assert stand.configs == []
    assert torch.profiler.ProfilerActivity.PrivateUse1 not in stand.activities
