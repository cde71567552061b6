"""The UI's JSON API and the `profile` commands, against a generated multi-node profile."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from trainium_operator.analysis.loading import load_profile
from trainium_operator.analysis.report import format_ns
from trainium_operator.analysis.stats import (
    rank_step_matrix,
    step_table,
    stragglers,
    top_operations,
    transfer_breakdown,
)
from trainium_operator.cli import main
from trainium_operator.ui.profiles import ProfileStore, find_profiles
from ui_serving import get_json, post_json

PROFILE_ID = "ml/llama-pretrain/0"  # written by conftest.profile_root


def test_profiles_are_found_below_the_root_without_descending_into_them(
    profile_root: Path, tmp_path: Path
) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    found = find_profiles(profile_root)

    assert [p.relative_to(profile_root).as_posix() for p in found] == [PROFILE_ID]
    assert find_profiles(tmp_path) == []


def test_profile_ids_cannot_escape_the_root(profile_root: Path) -> None:
    store = ProfileStore(profile_root / "ml")
    with pytest.raises(KeyError):
        store.resolve("../../..")
    with pytest.raises(KeyError):
        store.resolve("/etc")


def test_listing_includes_jobs_from_the_injected_lister(live_server: str) -> None:
    listing = get_json(f"{live_server}/api/profiles")

    assert [p["id"] for p in listing["profiles"]] == [PROFILE_ID]
    assert listing["profiles"][0]["ranks"] == 16
    assert listing["profiles"][0]["nodes"] == 2
    jobs = {job["name"]: job for job in listing["jobs"]}
    assert jobs["llama-pretrain"]["profile_id"] == PROFILE_ID
    assert jobs["bert-finetune"]["profile_id"] is None


def test_load_dashboard_window_event_and_unload(live_server: str, profile_root: Path) -> None:
    loaded = post_json(f"{live_server}/api/profiles/load?id={PROFILE_ID}&wait=1")
    assert loaded["state"] == "loaded"

    dashboard = get_json(f"{live_server}/api/dashboard?id={PROFILE_ID}")
    expected = load_profile(profile_root / PROFILE_ID, workers=1)
    assert dashboard["overview"]["events"] == len(expected.columns)
    assert [row["step"] for row in dashboard["steps"]["rows"]] == [
        row.step for row in step_table(expected.columns)
    ]
    assert dashboard["kernels"]["by_time"][0]["name"] == top_operations(expected.columns, 1)[0].name

    tracks = get_json(f"{live_server}/api/tracks?id={PROFILE_ID}")
    device = next(
        t["id"] for t in tracks["nodes"][0]["ranks"][0]["tracks"] if t["kind"] == "device"
    )
    window = get_json(
        f"{live_server}/api/window?id={PROFILE_ID}&start=0&end={tracks['end_ns']}&width=800&tracks={device}"
    )
    shown = window["tracks"][0]
    assert len(shown["ids"]) + sum(shown["agg"]["count"]) > 0
    event_id = shown["ids"][0] if shown["ids"] else 0
    detail = get_json(f"{live_server}/api/event?id={PROFILE_ID}&event={event_id}")
    assert detail["node"] == expected.nodes[0]

    assert post_json(f"{live_server}/api/profiles/unload?id={PROFILE_ID}")["unloaded"] is True
    with pytest.raises(urllib.error.HTTPError) as missing:
        get_json(f"{live_server}/api/dashboard?id={PROFILE_ID}")
    assert missing.value.code == 404


def test_bad_window_parameters_are_rejected(live_server: str) -> None:
    post_json(f"{live_server}/api/profiles/load?id={PROFILE_ID}&wait=1")
    with pytest.raises(urllib.error.HTTPError) as bad:
        get_json(f"{live_server}/api/window?id={PROFILE_ID}&start=x&end=1&width=10")
    assert bad.value.code == 400


def test_pages_are_served_with_a_self_only_content_policy(live_server: str) -> None:
    with urllib.request.urlopen(f"{live_server}/", timeout=30) as response:
        html = response.read().decode()
        policy = response.headers["Content-Security-Policy"]
    assert "default-src 'self'" in policy
    assert "http://" not in html.replace("http-equiv", "")
    assert "https://" not in html
    with urllib.request.urlopen(
        f"{live_server}/static/vendor/uplot/LICENSE", timeout=30
    ) as response:
        assert b"MIT License" in response.read()


def test_report_command_prints_every_section_of_the_analysis(profile_root: Path) -> None:
    result = CliRunner().invoke(
        main, ["profile", "report", str(profile_root / PROFILE_ID), "--workers", "1"]
    )

    assert result.exit_code == 0, result.output
    columns = load_profile(profile_root / PROFILE_ID, workers=1).columns
    slowest = max(step_table(columns), key=lambda row: row.max_ns)
    assert "2 nodes, 16 ranks" in result.output
    assert format_ns(slowest.max_ns) in result.output
    for section in (
        "Stragglers",
        "Device time: active",
        "Host CPU",
        "Memory operations",
        "Top kernels by time",
        "Top kernels by count",
        "Top host ops by time",
        "Precision",
        "Launch -> execution latency",
        "Annotations",
    ):
        assert section in result.output
    straggler_line = result.output.split("Stragglers")[1].splitlines()[3]
    assert straggler_line.split()[0] == str(stragglers(columns, rank_step_matrix(columns))[0].rank)


def test_report_json_holds_the_same_numbers_as_the_analysis_library(profile_root: Path) -> None:
    result = CliRunner().invoke(
        main, ["profile", "report", str(profile_root / PROFILE_ID), "--json", "--workers", "1"]
    )

    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    columns = load_profile(profile_root / PROFILE_ID, workers=1).columns
    by_count = top_operations(columns, order="count")
    assert [row["name"] for row in data["kernels"]["by_count"]] == [r.name for r in by_count]
    assert data["kernels"]["by_time"][0]["total_ns"] == top_operations(columns)[0].total_ns
    assert [row["name"] for row in data["memory_ops"]] == [
        row.name for row in transfer_breakdown(columns)
    ]
    assert data["steps"]["heatmap"]["ranks"] == list(range(16))
    assert len(data["utilisation"]["device_busy"]) == 16  # one row per NeuronCore in use
    assert data["cpu"][0]["host_mean_cores"] > data["cpu"][0]["process_mean_cores"] > 0


def export(profile_root: Path, target: Path, *options: str) -> Result:
    """`trainium-operator profile export <the UI's profile> --perfetto target [options]`."""
    command = ["profile", "export", str(profile_root / PROFILE_ID), "--perfetto", str(target)]
    return CliRunner().invoke(main, [*command, *options])


def test_export_command_writes_a_perfetto_trace(profile_root: Path, tmp_path: Path) -> None:
    target = tmp_path / "trace.perfetto-trace"
    steps = ("--from-step", "3", "--to-step", "3")
    result = export(profile_root, target, *steps, "--ranks", "0-1,8", "--workers", "1")

    assert result.exit_code == 0, result.output
    assert target.stat().st_size > 1000
    assert "flows" in result.output


def test_export_command_rejects_a_step_range_without_steps(
    profile_root: Path, tmp_path: Path
) -> None:
    result = export(profile_root, tmp_path / "t", "--from-step", "999")

    assert result.exit_code != 0
    assert "no step markers" in result.output


def test_ls_command_lists_profiles(profile_root: Path) -> None:
    result = CliRunner().invoke(main, ["profile", "ls", str(profile_root)])

    assert result.exit_code == 0
    assert result.output.startswith(f"{PROFILE_ID}\tml/llama-pretrain")


def test_serve_refuses_namespaces_without_the_job_list(profile_root: Path) -> None:
    result = CliRunner().invoke(
        main, ["profile", "serve", str(profile_root), "--namespace", "team-a"]
    )

    assert result.exit_code == 2
    assert "--namespace only applies with --list-jobs" in result.output
