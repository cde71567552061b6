"""The report says what the Neuron capture contributed: a merged system profile alone is not
called a device profile, device-relative timestamps are called approximate, and a CPU-only
run mentions no Neuron capture. Rank files and captures are built from the documented formats
(tests/profiler/fixtures/neuron)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from profiler import perfetto_fixture
from profiler.neuron_capture import rank_file, system_capture
from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_operator.analysis.loading import load_profile
from trainium_operator.analysis.report import dashboard, text_report
from trainium_operator.profiler.manifest import ProfileManifest, write_manifest
from trainium_operator.profiler.sources.neuron import merge_profile_dir


def merged_native_profile(tmp_path: Path, export: Path | None) -> dict[str, Any]:
    root = tmp_path / "ml" / "bert-trn2" / "0"
    rank_path, _ = rank_file(root, rank=0, world_size=1, step_ns=6_000_000_000)
    capture = system_capture(root)
    if export is not None:
        shutil.copy(export, capture / export.name)
    write_manifest(root, ProfileManifest(job_name="bert-trn2", namespace="ml", finished=True))
    assert merge_profile_dir(root, cli=None).merged == [rank_path]
    return dashboard(load_profile(root, workers=1))


def test_a_system_profile_without_a_device_profile_is_reported_as_such(tmp_path: Path) -> None:
    data = merged_native_profile(tmp_path, export=None)
    neuron = data["accelerator"]["neuron"]
    assert (neuron["system_profile_ranks"], neuron["device_profile_ranks"]) == (1, 0)
    assert "no device profile" in neuron["note"]
    assert "1 rank(s) have .ntff files that were not exported" in neuron["note"]
    assert "Neuron capture: the Neuron system profile was merged" in text_report(data)


def test_device_relative_device_profiles_are_called_approximate(tmp_path: Path) -> None:
    data = merged_native_profile(tmp_path, export=perfetto_fixture.RELATIVE_FIXTURE)
    neuron = data["accelerator"]["neuron"]
    assert neuron["device_profile_ranks"] == 1
    assert neuron["device_time_bases"] == ["anchored"]
    assert "approximate" in neuron["note"]


def test_a_device_profile_in_unix_time_needs_no_note(tmp_path: Path) -> None:
    data = merged_native_profile(tmp_path, export=perfetto_fixture.UNIX_FIXTURE)
    neuron = data["accelerator"]["neuron"]
    assert (neuron["device_profile_ranks"], neuron["device_time_bases"]) == (1, ["unix"])
    assert neuron["note"] is None
    assert "Neuron capture:" not in text_report(data)


def test_a_profile_without_neuron_capture_mentions_none(tmp_path: Path) -> None:
    root = write_synthetic_profile(tmp_path / "p", SyntheticSpec(nodes=1, ranks_per_node=2))
    data = dashboard(load_profile(root, workers=1))
    assert data["accelerator"]["neuron"] == {
        "system_profile_ranks": 0,
        "device_profile_ranks": 0,
        "device_time_bases": [],
        "note": None,
    }
