"""The Neuron source on the native stack (TorchNeuron): Neuron Explorer's capture env, and its
device profiles read from their Perfetto export into the rank files.

Fixtures are built from the documented formats (tests/profiler/perfetto_fixture.py and
fixtures/neuron/README.md), not captured on Trainium hardware.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from profiler import perfetto_fixture
from profiler.neuron_capture import (
    PID,
    SYNC,
    SYSTEM,
    fake_neuron_cli,
    native_capture,
    rank_file,
)
from trainium_operator.contract import neuron_env, workload_env
from trainium_operator.contract.neuron_env import neuron_inspect_env
from trainium_operator.profiler.clock import WallToMonotonic
from trainium_operator.profiler.events import Event, EventKind
from trainium_operator.profiler.format import read_rank_file
from trainium_operator.profiler.sources import perfetto_reader
from trainium_operator.profiler.sources.neuron import (
    DEVICE_PROFILE_STREAM_BASE,
    convert_device_profile,
    convert_system_profile,
    first_execution_ns,
    load_system_profile,
    merge_profile_dir,
    rank_neuron_core,
)


def _system_events() -> list[Event]:
    data = load_system_profile(SYSTEM)
    return convert_system_profile(data, PID, WallToMonotonic([SYNC])).events


def _trace(path: Path) -> perfetto_reader.PerfettoTrace:
    return perfetto_reader.read_trace(path.read_bytes())


def test_the_native_stack_is_never_captured_through_the_runtimes_environment() -> None:
    """Environment capture records the whole run on TorchNeuron (session mode is required on
    PJRT runtimes, and warm-up counts only work in model mode); the window is captured through
    torch.profiler instead, which a single variable of ours turns on."""
    with pytest.raises(ValueError, match="records the whole run"):
        neuron_inspect_env("/p", stack="native", device_profile=True)
    assert neuron_env.torch_capture_env() == {"TRAINIUM_PROFILE_NEURON_DEVICE": "1"}


def test_the_xla_stacks_capture_env_is_what_it_was() -> None:
    env = neuron_inspect_env("/p", "node-a", stack="xla", device_profile=True)
    assert env == {
        "NEURON_RT_INSPECT_ENABLE": "1",
        "NEURON_RT_INSPECT_OUTPUT_DIR": "/p/node-a/neuron",
        "NEURON_RT_INSPECT_SYSTEM_PROFILE": "1",
        "NEURON_RT_INSPECT_DEVICE_PROFILE": "1",
    }
    assert neuron_inspect_env("/p", "node-a", device_profile=True) == env
    assert neuron_inspect_env("/p")["NEURON_RT_INSPECT_DEVICE_PROFILE"] == "0"


def test_the_capture_contract_refuses_a_stack_it_does_not_know() -> None:
    assert "xla" in workload_env.NEURON_STACKS
    with pytest.raises(ValueError, match="unknown Neuron stack 'jax'"):
        neuron_inspect_env("/p", stack="jax")


def test_the_committed_perfetto_fixtures_are_what_the_generator_writes() -> None:
    unix = perfetto_fixture.device_profile(perfetto_fixture.UNIX_BASE_NS)
    assert perfetto_fixture.UNIX_FIXTURE.read_bytes() == unix
    assert perfetto_fixture.RELATIVE_FIXTURE.read_bytes() == perfetto_fixture.device_profile(0)


def test_the_perfetto_reader_pairs_nested_slices_resolves_names_and_counts_strays() -> None:
    trace = _trace(perfetto_fixture.UNIX_FIXTURE)
    base = perfetto_fixture.UNIX_BASE_NS
    assert trace.track_names[101] == "engine A (placeholder)"
    assert trace.track_parents == {101: 100, 102: 100, 103: 100}
    got = [(s.track_uuid, s.name, s.start_ns - base, s.duration_ns) for s in trace.slices]
    assert got == [
        (101, "matmul", 1_000, 8_000),  # interned name; the outer slice of a nested pair
        (101, "activation", 2_000, 3_000),
        (102, "dma copy", 3_000, 4_000),  # name given inline
        (102, "semaphore", 8_000, 0),  # an instant
    ]
    assert trace.unmatched == 1, "the end without a begin"
    (sample,) = trace.counters
    assert (sample.track_uuid, sample.value) == (103, 42.0)


@pytest.mark.parametrize("garbage", [b"\x0a\xff", b"\x0f", b"\x0a\x05\x08"])
def test_the_perfetto_reader_rejects_bytes_that_are_not_a_trace(garbage: bytes) -> None:
    with pytest.raises(perfetto_reader.PerfettoFormatError):
        perfetto_reader.read_trace(garbage)


def test_device_profile_slices_land_on_the_ranks_neuron_core_in_its_clock() -> None:
    system = _system_events()
    nc = rank_neuron_core(system)
    assert nc is not None
    converted = convert_device_profile(
        _trace(perfetto_fixture.UNIX_FIXTURE), nc, WallToMonotonic([SYNC]), None
    )
    assert converted.time_base == "unix"
    kernels = [e for e in converted.events if e.kind == EventKind.KERNEL]
    assert [e.name for e in kernels] == ["matmul", "activation", "dma copy", "semaphore"]
    assert {e.device for e in converted.events} == {nc}
    offset = perfetto_fixture.UNIX_BASE_NS - SYNC.wall_ns
    assert kernels[0].start_ns == SYNC.monotonic_ns + offset + 1_000
    streams = {e.thread_id for e in kernels}
    assert min(streams) >= DEVICE_PROFILE_STREAM_BASE
    assert converted.track_names[(DEVICE_PROFILE_STREAM_BASE, nc)] == (
        f"NeuronCore {nc} device: engine A (placeholder)"
    )
    (counter,) = [e for e in converted.events if e.kind == EventKind.COUNTER]
    assert counter.value == 42


def test_device_relative_timestamps_start_with_the_ranks_first_execution() -> None:
    system = _system_events()
    anchor = first_execution_ns(system)
    assert anchor is not None
    trace = _trace(perfetto_fixture.RELATIVE_FIXTURE)
    converted = convert_device_profile(trace, 0, WallToMonotonic([SYNC]), anchor)
    assert converted.time_base == "anchored"
    assert min(e.start_ns for e in converted.events) == anchor
    unplaced = convert_device_profile(trace, 0, WallToMonotonic([SYNC]), None)
    assert (unplaced.time_base, unplaced.events) == ("none", [])


def _native_capture(tmp_path: Path) -> tuple[Path, Path, Path]:
    profile_dir = tmp_path / "profile"
    rank_path, _ = rank_file(profile_dir)
    capture = native_capture(profile_dir, exported=True)
    return profile_dir, rank_path, capture


def test_the_merge_adds_a_native_captures_system_and_device_profiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile_dir, rank_path, capture = _native_capture(tmp_path)
    shutil.copy(perfetto_fixture.UNIX_FIXTURE, capture / perfetto_fixture.UNIX_FIXTURE.name)
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", "/shared/neff-cache/set-a")

    report = merge_profile_dir(profile_dir, cli=None)

    assert report.merged == [rank_path]
    merged = read_rank_file(rank_path)
    device_streams = [
        e for e in merged.events if e.device >= 0 and e.thread_id >= DEVICE_PROFILE_STREAM_BASE
    ]
    assert len(device_streams) == 5, "four slices and a counter sample"
    assert any(e.name == "nc_exec_running" for e in merged.events), "the system profile too"
    extra = merged.header.extra
    assert extra["neuron_device_profiles"] == "1"
    assert extra["neuron_device_profile_exports"] == "1"
    assert extra["neuron_device_profile_events"] == "5"
    assert extra["neuron_device_time_base"] == "unix"
    assert extra["neuron_neff_cache_dir"] == "/shared/neff-cache/set-a"


def test_the_merge_exports_device_profiles_to_perfetto_with_neuron_explorer(
    tmp_path: Path,
) -> None:
    profile_dir, rank_path, _ = _native_capture(tmp_path)
    cli = fake_neuron_cli(tmp_path / "neuron-explorer", "perfetto", perfetto_fixture.UNIX_FIXTURE)

    report = merge_profile_dir(profile_dir, cli=cli)

    assert report.merged == [rank_path]
    assert read_rank_file(rank_path).header.extra["neuron_device_profile_events"] == "5"


def test_an_unreadable_device_profile_export_is_reported_and_the_system_profile_kept(
    tmp_path: Path,
) -> None:
    profile_dir, rank_path, capture = _native_capture(tmp_path)
    broken = capture / "device_profile_model_9.pftrace"
    broken.write_bytes(b"\x0a\xff")

    report = merge_profile_dir(profile_dir, cli=None)

    assert report.merged == [rank_path]
    assert [path for path, _ in report.damaged] == [broken]
    extra = read_rank_file(rank_path).header.extra
    assert (extra["neuron_device_profile_exports"], extra["neuron_device_profile_events"]) == (
        "0",
        "0",
    )
