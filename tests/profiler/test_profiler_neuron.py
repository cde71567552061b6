"""The Neuron runtime source, on hand-made fixtures that follow the documented JSON output.

Unverified on Trainium hardware: see fixtures/neuron/README.md.
"""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from profiler.neuron_capture import PID, SYNC, SYSTEM, fake_neuron_cli, rank_file, system_capture
from trainium_operator.contract.neuron_env import neuron_inspect_env
from trainium_operator.profiler.clock import WallToMonotonic
from trainium_operator.profiler.events import HOST_DEVICE, Event, EventKind
from trainium_operator.profiler.format import read_rank_file
from trainium_operator.profiler.sources.neuron import (
    FLOW_ID_BASE,
    NeuronProfileError,
    capture_dirs,
    convert_system_profile,
    load_system_profile,
    merge_profile_dir,
)

FIXTURE = SYSTEM


def _convert() -> list[Event]:
    return convert_system_profile(load_system_profile(FIXTURE), PID, WallToMonotonic([SYNC])).events


def _named(events: list[Event], name: str) -> list[Event]:
    return sorted((e for e in events if e.name == name), key=lambda e: e.start_ns)


def test_runtime_events_map_onto_our_kinds_and_tracks() -> None:
    events = _convert()
    kinds = {e.name: e.kind for e in events}
    assert kinds == {
        "nrt_load": EventKind.HOST_OP,
        "nrt_tensor_write": EventKind.MEMCPY,
        "nrt_execute": EventKind.LAUNCH,
        "nc_exec_running": EventKind.KERNEL,
        "cc_running": EventKind.COLLECTIVE,
        "cc_exec_barrier": EventKind.SYNC,
        "numerical_err": EventKind.COUNTER,
        "PjitFunction(matmul_allgather)": EventKind.HOST_OP,
    }
    write = _named(events, "nrt_tensor_write")[0]
    assert (write.value, write.thread_id, write.device) == (4, PID, HOST_DEVICE)
    collective = _named(events, "cc_running")[0]
    assert (collective.device, collective.thread_id, collective.value) == (0, 1, 1_048_576)
    assert {(e.device, e.thread_id) for e in _named(events, "nc_exec_running")} == {(0, 0), (1, 0)}
    framework = _named(events, "PjitFunction(matmul_allgather)")[0]
    assert framework.thread_id == 80375131


def test_only_this_process_is_kept_and_sync_points_are_dropped() -> None:
    events = _convert()
    assert len(_named(events, "nrt_execute")) == 3  # the 4th belongs to pid 701
    assert not _named(events, "timestamp_sync_point")


def test_timestamps_move_onto_the_rank_monotonic_clock() -> None:
    write = _named(_convert(), "nrt_tensor_write")[0]
    assert write.start_ns == 5_000_000_000 + 1_056_597_613
    assert write.duration_ns == 27094


def test_every_execution_links_to_the_launch_that_caused_it() -> None:
    events = _convert()
    launches = _named(events, "nrt_execute")
    runs = _named(events, "nc_exec_running")
    assert all(e.flow_id >= FLOW_ID_BASE for e in launches + runs)
    # Linked by flow_id, by exec_id and by timing respectively, in time order.
    assert [run.flow_id for run in runs] == [launch.flow_id for launch in launches]
    assert len({run.flow_id for run in runs}) == 3
    assert [run.device for run in runs] == [0, 1, 0]
    for launch, run in zip(launches, runs, strict=True):
        assert launch.start_ns <= run.start_ns


def test_links_by_flow_id_beat_timing() -> None:
    data = load_system_profile(FIXTURE)
    rows = data["trace_events"]
    # Make the explicitly linked execution start before a decoy launch on the same core.
    decoy = dict(rows[2], flow_id=[], timestamp=rows[3]["timestamp"] - 1, id=99)
    data = {"trace_events": [*rows, decoy]}
    result = convert_system_profile(data, PID, WallToMonotonic([SYNC]))
    first_run = _named(result.events, "nc_exec_running")[0]
    linked = [e for e in result.events if e.flow_id == first_run.flow_id and e is not first_run]
    assert linked[0].start_ns == 5_000_000_000 + 1_100_000_000
    assert result.heuristic_links == 1


def test_a_bare_event_list_is_accepted_and_garbage_is_named(tmp_path: Path) -> None:
    bare = tmp_path / "bare.json"
    bare.write_text('[{"name": "nrt_load", "process_id": "5", "timestamp": 7, "duration": 1}]')
    assert load_system_profile(bare)["trace_events"][0]["name"] == "nrt_load"
    bad = tmp_path / "bad.json"
    bad.write_text('{"trace_events": 3}')
    with pytest.raises(NeuronProfileError, match=str(bad)):
        load_system_profile(bad)


def test_inspect_environment_points_inside_the_profile_directory() -> None:
    env = neuron_inspect_env("/shared/profiles/ml/llama/0/", device_profile=True)
    assert env == {
        "NEURON_RT_INSPECT_ENABLE": "1",
        "NEURON_RT_INSPECT_OUTPUT_DIR": "/shared/profiles/ml/llama/0/$(TRAINIUM_NODE_NAME)/neuron",
        "NEURON_RT_INSPECT_SYSTEM_PROFILE": "1",
        "NEURON_RT_INSPECT_DEVICE_PROFILE": "1",
    }


def _profile_with_rank(tmp_path: Path) -> tuple[Path, Path, list[Event]]:
    profile_dir = tmp_path / "profile"
    rank_path, host = rank_file(profile_dir)
    return profile_dir, rank_path, host


def test_post_run_merge_adds_device_activity_to_the_rank_file(tmp_path: Path) -> None:
    profile_dir, rank_path, host = _profile_with_rank(tmp_path)
    system_capture(profile_dir)
    (profile_dir / "ip-1" / "neuron" / "i-0f207fb2a99bd2d08_pid_701").mkdir()

    report = merge_profile_dir(profile_dir)
    merged = read_rank_file(rank_path)

    assert report.merged == [rank_path]
    assert merged.header.sources[-1] == "neuron"
    assert merged.header.extra["neuron_device_profiles"] == "1"
    assert merged.header.complete
    assert [e for e in merged.events if e.kind == EventKind.STEP] == host
    assert len([e for e in merged.events if e.kind == EventKind.KERNEL]) == 3
    assert merged.track_names[(0, 1)] == "NeuronCore 1 executions"
    assert merged.track_names[(PID, HOST_DEVICE)] == "MainThread"
    # A second run changes nothing.
    assert merge_profile_dir(profile_dir).already == [rank_path]
    assert read_rank_file(rank_path).events == merged.events


def test_merge_runs_neuron_profile_view_when_only_raw_capture_exists(tmp_path: Path) -> None:
    profile_dir, rank_path, _ = _profile_with_rank(tmp_path)
    capture = profile_dir / "ip-1" / "neuron" / f"i-0abc_pid_{PID}"
    capture.mkdir(parents=True)
    (capture / "ntrace.pb").write_bytes(b"raw")
    (capture / "trace_info.pb").write_bytes(b"raw")
    cli = fake_neuron_cli(tmp_path / "neuron-profile", "json", SYSTEM, "system_profile.json")

    report = merge_profile_dir(profile_dir, cli=cli)
    assert report.merged == [rank_path]
    assert any(e.name == "nc_exec_running" for e in read_rank_file(rank_path).events)


def test_ranks_without_a_capture_are_reported_missing(tmp_path: Path) -> None:
    profile_dir, rank_path, _ = _profile_with_rank(tmp_path)
    report = merge_profile_dir(profile_dir, cli=None)
    assert report.missing == [rank_path]
    assert capture_dirs(profile_dir / "ip-1" / "neuron", PID) == []


def test_in_process_source_converts_at_the_final_collect(tmp_path: Path) -> None:
    from trainium_operator.profiler.config import ProfilerConfig
    from trainium_operator.profiler.sources.base import SourceContext
    from trainium_operator.profiler.sources.neuron import NeuronRuntimeSource

    neuron_dir = tmp_path / "neuron"
    capture = neuron_dir / f"i-1_pid_{PID}"
    capture.mkdir(parents=True)
    shutil.copy(FIXTURE, capture / "system_profile.json")
    context = SourceContext(
        config=ProfilerConfig(enabled=False), node_dir=tmp_path, pid=PID, start_sync=SYNC
    )
    source = NeuronRuntimeSource(context, neuron_dir)
    assert source.collect(final=False).events == []
    assert len(source.collect(final=True).events) == 12  # 14 rows - other pid - sync point
    assert source.collect(final=True).events == []  # converted once


EXPLORER_FIXTURE = FIXTURE.with_name("system_profile_explorer_schema.json")


def test_neuron_explorer_schema_rows_convert_like_the_json_export() -> None:
    """The same capture in the field names of Neuron Explorer's SystemProfileEvents table
    (schema 7.4.0, SDK 2.31.0: start_ts/end_ts/duration_ns, nc_idx, trace_event_source,
    integer process ids, attributes in extra_attributes_json) gives the very same events."""
    explorer = convert_system_profile(
        load_system_profile(EXPLORER_FIXTURE), PID, WallToMonotonic([SYNC])
    )
    assert explorer.events == _convert()
    assert (
        explorer.track_names
        == (
            convert_system_profile(load_system_profile(FIXTURE), PID, WallToMonotonic([SYNC]))
        ).track_names
    )
    sizes = {e.name: e.value for e in explorer.events if e.value}
    assert sizes["nrt_tensor_write"] == 4, "size read from extra_attributes_json"
    assert sizes["cc_running"] == 1_048_576


def test_an_event_without_duration_takes_end_minus_start() -> None:
    raw = {
        "name": "nc_exec_running",
        "start_ts": 1_729_888_371_000_000_000,
        "end_ts": 1_729_888_371_000_250_000,
        "trace_event_source": "neuron_hw",
        "process_id": PID,
        "nc_idx": 3,
    }
    (event,) = convert_system_profile({"trace_events": [raw]}, PID, WallToMonotonic([SYNC])).events
    assert (event.kind, event.device, event.duration_ns) == (EventKind.KERNEL, 3, 250_000)


def test_the_singular_trace_event_key_is_read_too(tmp_path: Path) -> None:
    path = tmp_path / "system_profile.json"
    path.write_text('{"trace_event": [{"name": "nrt_execute", "timestamp": 1, "process_id": "5"}]}')
    assert len(load_system_profile(path)["trace_events"]) == 1


def test_neuron_explorer_is_preferred_to_neuron_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainium_operator.profiler.sources import neuron

    for name in ("neuron-explorer", "neuron-profile"):
        tool = tmp_path / name
        tool.write_text("#!/bin/sh\nexit 0\n")
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert neuron.find_neuron_profile_cli() == str(tmp_path / "neuron-explorer")
    (tmp_path / "neuron-explorer").unlink()
    assert neuron.find_neuron_profile_cli() == str(tmp_path / "neuron-profile")
