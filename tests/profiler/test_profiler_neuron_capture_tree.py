"""The Neuron runtime's output tree on the shared claim, as the post-run merge walks it: the
documented native layout (`<instance>_pid_<pid>/<timestamp>/`), several windows of one process,
and the bounds every tenant-written tree gets (entries, sessions, depth, size, no symlinks).

The tree and files are built from the documented layout and formats
(tests/profiler/neuron_capture.py, fixtures/neuron/README.md), not captured on hardware.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from profiler import perfetto_fixture
from profiler.neuron_capture import (
    NATIVE_SESSION_FILES,
    PID,
    SYSTEM,
    fake_neuron_cli,
    native_capture,
    rank_file,
)
from trainium_operator.profiler.events import EventKind
from trainium_operator.profiler.format import read_rank_file
from trainium_operator.profiler.sources import neuron
from trainium_operator.profiler.sources.neuron import capture_dirs, merge_profile_dir

INSTANCE_DIR = f"i-0f207fb2a99bd2d08_pid_{PID}"


def _profile(tmp_path: Path) -> tuple[Path, Path]:
    profile_dir = tmp_path / "profile"
    rank_path, _ = rank_file(profile_dir)
    return profile_dir, rank_path


def _neuron_dir(profile_dir: Path) -> Path:
    return profile_dir / "ip-1" / "neuron"


def test_the_documented_native_layout_is_found_and_merged_through_neuron_explorer(
    tmp_path: Path,
) -> None:
    profile_dir, rank_path = _profile(tmp_path)
    session = native_capture(profile_dir)
    assert sorted(p.name for p in session.iterdir()) == sorted(NATIVE_SESSION_FILES)
    cli = fake_neuron_cli(tmp_path / "neuron-explorer", "json", SYSTEM, "system_profile.json")

    assert capture_dirs(_neuron_dir(profile_dir), PID) == [session]
    report = merge_profile_dir(profile_dir, cli=cli)

    assert report.merged == [rank_path]
    merged = read_rank_file(rank_path)
    assert any(e.name == "nc_exec_running" for e in merged.events)
    extra = merged.header.extra
    assert extra["neuron_capture_dir"] == f"ip-1/neuron/{INSTANCE_DIR}/{session.name}"
    assert extra["neuron_capture_sessions"] == "1"
    assert extra["neuron_device_profiles"] == "1", "profile_nc_0_session_0.ntff"


def test_two_windows_of_one_process_both_merge_with_flows_that_never_collide(
    tmp_path: Path,
) -> None:
    profile_dir, rank_path = _profile(tmp_path)
    first = native_capture(profile_dir, "20261204T101500", exported=True)
    second = native_capture(profile_dir, "20261204T111500", exported=True)
    for session in (first, second):
        shutil.copy(perfetto_fixture.UNIX_FIXTURE, session / perfetto_fixture.UNIX_FIXTURE.name)

    report = merge_profile_dir(profile_dir, cli=None)

    assert report.merged == [rank_path]
    merged = read_rank_file(rank_path)
    assert merged.header.extra["neuron_capture_sessions"] == "2"
    flows = [e.flow_id for e in merged.events if e.kind == EventKind.LAUNCH and e.flow_id]
    one_window, _ = _profile(tmp_path / "one")
    native_capture(one_window, exported=True)
    merge_profile_dir(one_window, cli=None)
    single = read_rank_file(one_window / "ip-1" / "rank-3.trnprof")
    linked = [e for e in single.events if e.kind == EventKind.LAUNCH and e.flow_id]
    assert len(flows) == 2 * len(linked), "each window links its own launches"
    assert len(set(flows)) == len(flows), "no flow id is reused by the second window"
    device_streams = {e.thread_id for e in merged.events if e.thread_id >= 16 and e.device >= 0}
    assert len(device_streams) == 2 * 3, "each window's three Perfetto tracks on their own streams"


def test_a_symlinked_process_directory_session_or_file_is_never_followed(tmp_path: Path) -> None:
    profile_dir, rank_path = _profile(tmp_path)
    elsewhere = native_capture(tmp_path / "elsewhere", exported=True)
    neuron_dir = _neuron_dir(profile_dir)
    neuron_dir.mkdir(parents=True)
    (neuron_dir / INSTANCE_DIR).symlink_to(elsewhere.parent, target_is_directory=True)
    assert capture_dirs(neuron_dir, PID) == []

    (neuron_dir / INSTANCE_DIR).unlink()
    process_dir = neuron_dir / INSTANCE_DIR
    process_dir.mkdir()
    (process_dir / "20261204T101500").symlink_to(elsewhere, target_is_directory=True)
    assert capture_dirs(neuron_dir, PID) == []

    real = process_dir / "20261204T111500"
    real.mkdir()
    (real / "ntrace.pb").write_bytes(b"raw")
    (real / "system_profile.json").symlink_to(elsewhere / "system_profile.json")
    (real / "device_profile_model_1.pftrace").symlink_to(perfetto_fixture.UNIX_FIXTURE)
    assert capture_dirs(neuron_dir, PID) == [real]
    assert neuron.system_profile_json(real, cli=None) is None
    assert neuron.device_profile_traces(real, cli=None) == []
    with pytest.raises(OSError, match="symbolic link"):  # ELOOP from O_NOFOLLOW
        neuron.read_regular(real / "system_profile.json")

    report = merge_profile_dir(profile_dir, cli=None)
    assert report.missing == [rank_path], "nothing was read through a symlink"


def test_a_process_keeps_at_most_max_sessions_and_a_directory_max_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile_dir, rank_path = _profile(tmp_path)
    for window in range(neuron.MAX_SESSIONS + 3):
        native_capture(profile_dir, f"20261204T10{window:02d}00", exported=True)

    report = merge_profile_dir(profile_dir, cli=None)
    extra = read_rank_file(rank_path).header.extra
    assert report.merged == [rank_path]
    assert extra["neuron_capture_sessions"] == str(neuron.MAX_SESSIONS)

    monkeypatch.setattr(neuron, "MAX_DIR_ENTRIES", 4)
    assert len(capture_dirs(_neuron_dir(profile_dir), PID)) <= 4


def test_exports_are_searched_in_the_session_and_one_directory_below_only(tmp_path: Path) -> None:
    session = native_capture(tmp_path / "profile")
    (session / "perfetto" / "deeper").mkdir(parents=True)
    name = perfetto_fixture.UNIX_FIXTURE.name
    shutil.copy(perfetto_fixture.UNIX_FIXTURE, session / "perfetto" / "deeper" / name)
    assert neuron.device_profile_traces(session, cli=None) == []
    shutil.copy(perfetto_fixture.UNIX_FIXTURE, session / "perfetto" / name)
    assert neuron.device_profile_traces(session, cli=None) == [session / "perfetto" / name]


def test_a_file_above_the_size_cap_is_reported_damaged_and_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile_dir, rank_path = _profile(tmp_path)
    session = native_capture(profile_dir, exported=True)
    monkeypatch.setattr(neuron, "MAX_FILE_BYTES", 64)

    report = merge_profile_dir(profile_dir, cli=None)

    assert report.missing == [rank_path]
    ((path, reason),) = report.damaged
    assert path == session
    assert "larger than 64 bytes" in reason


def test_directories_that_only_look_like_a_process_of_the_rank_are_ignored(
    tmp_path: Path,
) -> None:
    profile_dir, _ = _profile(tmp_path)
    neuron_dir = _neuron_dir(profile_dir)
    for name in (f"i-0abc_pid_{PID}0", f"../i-0abc_pid_{PID}x", f"i-0abc_pid_{PID}.d", "pid_"):
        (neuron_dir / Path(name).name).mkdir(parents=True, exist_ok=True)
        (neuron_dir / Path(name).name / "ntrace.pb").write_bytes(b"raw")
    (neuron_dir / f"i-0abc_pid_{PID}").write_bytes(b"a file, not a directory")
    assert capture_dirs(neuron_dir, PID) == []
